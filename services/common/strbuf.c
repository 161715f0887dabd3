/*
 * A growable string for the text builders in stk_base (log lines, metrics
 * render, config help). See strbuf.h.
 */
#include "strbuf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Makes room for extra more bytes plus a NUL. */
static bool reserve(struct strbuf *sb, size_t extra) {
  if (sb->failed) return false;
  if (sb->len + extra + 1 <= sb->cap) return true;
  size_t cap = sb->cap ? sb->cap : 64;
  while (cap < sb->len + extra + 1) cap *= 2;
  char *p = realloc(sb->buf, cap);
  if (!p) {
    sb->failed = true;
    return false;
  }
  sb->buf = p;
  sb->cap = cap;
  return true;
}

void strbuf_append(struct strbuf *sb, const char *data, size_t len) {
  if (!reserve(sb, len)) return;
  memcpy(sb->buf + sb->len, data, len);
  sb->len += len;
  sb->buf[sb->len] = '\0';
}

void strbuf_puts(struct strbuf *sb, const char *s) {
  strbuf_append(sb, s, strlen(s));
}

void strbuf_putc(struct strbuf *sb, char c) {
  strbuf_append(sb, &c, 1);
}

void strbuf_vprintf(struct strbuf *sb, const char *fmt, va_list ap) {
  va_list copy;
  va_copy(copy, ap);
  int n = vsnprintf(NULL, 0, fmt, copy);
  va_end(copy);
  if (n < 0 || !reserve(sb, (size_t)n)) return;
  vsnprintf(sb->buf + sb->len, (size_t)n + 1, fmt, ap);
  sb->len += (size_t)n;
}

void strbuf_printf(struct strbuf *sb, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  strbuf_vprintf(sb, fmt, ap);
  va_end(ap);
}

void strbuf_json_escape(struct strbuf *sb, const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    switch (*p) {
    case '"':
      strbuf_puts(sb, "\\\"");
      break;
    case '\\':
      strbuf_puts(sb, "\\\\");
      break;
    case '\n':
      strbuf_puts(sb, "\\n");
      break;
    case '\r':
      strbuf_puts(sb, "\\r");
      break;
    case '\t':
      strbuf_puts(sb, "\\t");
      break;
    default:
      if (*p < 0x20)
        strbuf_printf(sb, "\\u%04x", *p);
      else
        strbuf_putc(sb, (char)*p);
    }
  }
}

char *strbuf_take(struct strbuf *sb, size_t *ret_len) {
  if (sb->failed) {
    strbuf_release(sb);
    return NULL;
  }
  char *out = sb->buf ? sb->buf : strdup("");
  if (ret_len) *ret_len = sb->len;
  sb->buf = NULL;
  sb->len = sb->cap = 0;
  return out;
}

void strbuf_release(struct strbuf *sb) {
  free(sb->buf);
  sb->buf = NULL;
  sb->len = sb->cap = 0;
  sb->failed = false;
}
