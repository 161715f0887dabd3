/*
 * log_fields: a log message written as "key=value key=value" becomes the
 * JSON line's own fields, so a collector filters on "job" or "rank"
 * without parsing "msg". A value is the text up to the next space, or a
 * double-quoted string (backslash escapes \" and \\) as the effective
 * config writes values with spaces. Fields are strings: one key always has
 * one JSON type, whatever its value looks like.
 *
 * A message is split only when every word of it is key=value with a key
 * of letters, digits, '_', '.', '-' (starting with a letter or '_'),
 * none of them repeated and none of ts, level, event, msg; prose (or a
 * mix) stays in "msg" alone.
 */
#ifndef STK_LOG_FIELDS_H
#define STK_LOG_FIELDS_H

#include <stdbool.h>

struct strbuf;

/* Appends ,"key":"value" for every field of msg to sb and returns true
 * when msg splits; appends nothing and returns false otherwise. */
bool log_fields_json(struct strbuf *sb, const char *msg);

#endif
