/*
 * log_fields: "key=value ..." messages split into JSON fields (the rules
 * are in log_fields.h). One pass builds the fields in a scratch buffer and
 * checks each word; the caller's line gets them only if every word passed.
 */
#include "log_fields.h"

#include <stdlib.h>
#include <string.h>

#include "strbuf.h"

#define MAX_FIELDS 64

static bool key_char(char c, bool first) {
  bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  return alpha || (!first && ((c >= '0' && c <= '9') || c == '.' || c == '-'));
}

static bool reserved(const char *key, size_t len) {
  static const char *const names[] = {"ts", "level", "event", "msg"};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    if (strlen(names[i]) == len && memcmp(names[i], key, len) == 0) return true;
  return false;
}

/* Reads one value at *p (quoted or bare) into val; advances *p. False for
 * an unterminated quote or a quote not followed by a space or the end. */
static bool read_value(const char **p, struct strbuf *val) {
  const char *s = *p;
  if (*s != '"') {
    size_t n = strcspn(s, " ");
    strbuf_append(val, s, n);
    *p = s + n;
    return true;
  }
  for (s++; *s && *s != '"'; s++) {
    if (*s == '\\' && (s[1] == '"' || s[1] == '\\')) s++;
    strbuf_putc(val, *s);
  }
  if (*s != '"' || (s[1] != ' ' && s[1] != '\0')) return false;
  *p = s + 1;
  return true;
}

/* Parses every word of msg into fields (JSON text, leading commas). */
static bool split(const char *msg, struct strbuf *fields) {
  const char *keys[MAX_FIELDS];
  size_t key_lens[MAX_FIELDS], n = 0;
  for (const char *p = msg; *p;) {
    if (*p == ' ') {
      p++;
      continue;
    }
    const char *key = p;
    while (key_char(*p, p == key)) p++;
    size_t len = (size_t)(p - key);
    if (len == 0 || *p != '=' || reserved(key, len) || n == MAX_FIELDS) return false;
    for (size_t i = 0; i < n; i++)
      if (key_lens[i] == len && memcmp(keys[i], key, len) == 0) return false;
    keys[n] = key, key_lens[n++] = len;
    p++;
    struct strbuf val = STRBUF_INIT;
    bool ok = read_value(&p, &val);
    if (ok) {
      strbuf_printf(fields, ",\"%.*s\":\"", (int)len, key);
      strbuf_json_escape(fields, val.buf ? val.buf : "");
      strbuf_putc(fields, '"');
    }
    strbuf_release(&val);
    if (!ok) return false;
  }
  return n > 0;
}

bool log_fields_json(struct strbuf *sb, const char *msg) {
  struct strbuf fields = STRBUF_INIT;
  bool ok = split(msg, &fields) && !fields.failed;
  if (ok) strbuf_append(sb, fields.buf, fields.len);
  strbuf_release(&fields);
  return ok;
}
