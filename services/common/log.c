/*
 * log: one line per event on stderr, as text for people or JSON lines for
 * collectors. Lines from many threads must never interleave, so each line
 * is built in memory and handed to the kernel with one write(2); the only
 * shared state is the level and format, kept in atomics. A JSON line
 * carries the message whole in "msg" and, when it is all key=value words,
 * each as a field of its own (log_fields.h).
 */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "log_fields.h"
#include "strbuf.h"

static atomic_int min_level = LOG_INFO;
static atomic_bool json_lines = false;

static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};
static const char *const level_tags[] = {"DEBUG", "INFO ", "WARN ", "ERROR", "OFF  "};

void log_init(enum log_level level, bool json) {
  atomic_store(&min_level, (int)level);
  atomic_store(&json_lines, json);
}

int log_level_parse(const char *name) {
  for (int i = LOG_DEBUG; i <= LOG_OFF; i++)
    if (name && strcasecmp(name, level_names[i]) == 0) return i;
  return -1;
}

bool log_enabled(enum log_level level) {
  return level >= LOG_DEBUG && level < LOG_OFF && (int)level >= atomic_load(&min_level);
}

/* "2026-11-21T08:00:00.123Z": ISO-8601 UTC with milliseconds. */
static void format_time(char out[32]) {
  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  size_t n = strftime(out, 32, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(out + n, 32 - n, ".%03ldZ", ts.tv_nsec / 1000000);
}

/* Text lines stay one line: control characters are escaped as in JSON. */
static void append_text_safe(struct strbuf *sb, const char *s) {
  for (const char *p = s; *p; p++) {
    if ((unsigned char)*p < 0x20) {
      char one[2] = {*p, '\0'};
      strbuf_json_escape(sb, one);
    } else {
      strbuf_putc(sb, *p);
    }
  }
}

static void build_line(struct strbuf *sb, enum log_level level, const char *event,
                       const char *msg) {
  char ts[32];
  format_time(ts);
  if (atomic_load(&json_lines)) {
    strbuf_printf(sb, "{\"ts\":\"%s\",\"level\":\"%s\",\"event\":\"", ts, level_names[level]);
    strbuf_json_escape(sb, event);
    strbuf_puts(sb, "\",\"msg\":\"");
    strbuf_json_escape(sb, msg);
    strbuf_putc(sb, '"');
    log_fields_json(sb, msg); /* "job=a rank=3": "job":"a","rank":"3" too. */
    strbuf_puts(sb, "}\n");
  } else {
    strbuf_printf(sb, "%s %s ", ts, level_tags[level]);
    append_text_safe(sb, event);
    if (*msg) strbuf_putc(sb, ' ');
    append_text_safe(sb, msg);
    strbuf_putc(sb, '\n');
  }
}

/* One write(2); loops only if the kernel takes part of the line. */
static void write_all(const char *p, size_t len) {
  while (len > 0) {
    ssize_t n = write(STDERR_FILENO, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    p += n;
    len -= (size_t)n;
  }
}

void log_event(enum log_level level, const char *event, const char *fmt, ...) {
  if (!log_enabled(level)) return;
  struct strbuf msg = STRBUF_INIT, line = STRBUF_INIT;
  va_list ap;
  va_start(ap, fmt);
  strbuf_vprintf(&msg, fmt, ap);
  va_end(ap);
  build_line(&line, level, event ? event : "", msg.buf ? msg.buf : "");
  if (!line.failed) write_all(line.buf, line.len);
  strbuf_release(&msg);
  strbuf_release(&line);
}
