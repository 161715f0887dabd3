/*
 * strbuf: a growable byte string for building text (log lines, the
 * Prometheus render, help output). Appends never fail loudly: on out of
 * memory the buffer remembers it (failed) and further appends are no-ops,
 * so a builder checks once at the end instead of after every append.
 */
#ifndef STK_STRBUF_H
#define STK_STRBUF_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

struct strbuf {
  char *buf;   /* NUL-terminated when len > 0 or after any append; may be NULL. */
  size_t len;  /* Bytes used, excluding the NUL. */
  size_t cap;  /* Bytes allocated. */
  bool failed; /* An allocation failed; the content is incomplete. */
};

#define STRBUF_INIT                                                                                \
  { NULL, 0, 0, false }

void strbuf_append(struct strbuf *sb, const char *data, size_t len);
void strbuf_puts(struct strbuf *sb, const char *s);
void strbuf_putc(struct strbuf *sb, char c);
void strbuf_printf(struct strbuf *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void strbuf_vprintf(struct strbuf *sb, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));
/* Appends s as the inside of a JSON string (quotes, backslashes, control
 * characters escaped; other bytes, UTF-8 included, copied). */
void strbuf_json_escape(struct strbuf *sb, const char *s);

/* Hands the buffer to the caller (free() it): NULL if an append failed.
 * Leaves sb empty. An empty buffer yields "". */
char *strbuf_take(struct strbuf *sb, size_t *ret_len);
/* Frees the content. */
void strbuf_release(struct strbuf *sb);

#endif
