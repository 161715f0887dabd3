/*
 * log: one line per event, to stderr. Text lines read
 *   2026-11-21T08:00:00.123Z INFO  coordinator.join job=a member=b rank=3
 * and JSON lines (one object per line) carry the same, the message whole in
 * "msg" and, when every word of it is key=value, each as a string field:
 *   {"ts":"2026-11-21T08:00:00.123Z","level":"info","event":"coordinator.join",
 *    "msg":"job=a member=b rank=3","job":"a","member":"b","rank":"3"}
 * Library code logs at debug only; daemons log once, at the top.
 * Thread-safe: each line is written with a single write().
 */
#ifndef STK_LOG_H
#define STK_LOG_H

#include <stdbool.h>

enum log_level { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_OFF };

/* Default: LOG_INFO, text. */
void log_init(enum log_level min_level, bool json);
/* Parses "debug", "info", "warn", "error", "off"; -1 if unknown. */
int log_level_parse(const char *name);
bool log_enabled(enum log_level level);

void log_event(enum log_level level, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define log_debug(event, ...) log_event(LOG_DEBUG, event, __VA_ARGS__)
#define log_info(event, ...)  log_event(LOG_INFO, event, __VA_ARGS__)
#define log_warn(event, ...)  log_event(LOG_WARN, event, __VA_ARGS__)
#define log_error(event, ...) log_event(LOG_ERROR, event, __VA_ARGS__)

#endif
