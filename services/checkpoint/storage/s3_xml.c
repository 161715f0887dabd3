/*
 * A minimal scanner for S3's small XML responses (see s3_xml.h).
 */
#include "s3_xml.h"

#include "stk_error.h"
#include "strbuf.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* True if doc[i..] starts with "<tag" followed by '>', '/' or whitespace. */
static bool start_tag_at(struct s3_xml_span doc, size_t i, const char *tag, size_t tlen) {
  if (i + 1 + tlen >= doc.len || doc.data[i] != '<') return false;
  if (memcmp(doc.data + i + 1, tag, tlen) != 0) return false;
  char c = doc.data[i + 1 + tlen];
  return c == '>' || c == '/' || c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

static const char *find(struct s3_xml_span doc, size_t from, const char *needle) {
  size_t n = strlen(needle);
  for (size_t i = from; i + n <= doc.len; i++)
    if (memcmp(doc.data + i, needle, n) == 0) return doc.data + i;
  return NULL;
}

bool s3_xml_next(struct s3_xml_span doc, const char *tag, size_t *cursor,
                 struct s3_xml_span *ret_inner) {
  size_t tlen = strlen(tag);
  for (size_t i = *cursor; i < doc.len; i++) {
    if (!start_tag_at(doc, i, tag, tlen)) continue;
    const char *gt = memchr(doc.data + i, '>', doc.len - i);
    if (!gt) return false;
    size_t body = (size_t)(gt - doc.data) + 1;
    if (gt[-1] == '/') { /* <tag/> */
      *ret_inner = (struct s3_xml_span){doc.data + body, 0};
      *cursor = body;
      return true;
    }
    char close[80];
    if (tlen + 4 > sizeof(close)) return false;
    close[0] = '<';
    close[1] = '/';
    memcpy(close + 2, tag, tlen);
    close[2 + tlen] = '>';
    close[3 + tlen] = '\0';
    const char *end = find(doc, body, close);
    if (!end) return false;
    *ret_inner = (struct s3_xml_span){doc.data + body, (size_t)(end - doc.data) - body};
    *cursor = (size_t)(end - doc.data) + tlen + 3;
    return true;
  }
  return false;
}

static void put_utf8(struct strbuf *sb, unsigned long cp) {
  char b[4];
  size_t n;
  if (cp < 0x80) {
    b[0] = (char)cp;
    n = 1;
  } else if (cp < 0x800) {
    b[0] = (char)(0xc0 | (cp >> 6));
    b[1] = (char)(0x80 | (cp & 0x3f));
    n = 2;
  } else if (cp < 0x10000) {
    b[0] = (char)(0xe0 | (cp >> 12));
    b[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
    b[2] = (char)(0x80 | (cp & 0x3f));
    n = 3;
  } else {
    b[0] = (char)(0xf0 | (cp >> 18));
    b[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    b[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    b[3] = (char)(0x80 | (cp & 0x3f));
    n = 4;
  }
  strbuf_append(sb, b, n);
}

/* Decodes the entity at s (after '&', up to ';'); returns false if unknown. */
static bool decode_entity(struct strbuf *sb, const char *s, size_t len) {
  static const struct {
    const char *name;
    char c;
  } named[] = {{"amp", '&'}, {"lt", '<'}, {"gt", '>'}, {"quot", '"'}, {"apos", '\''}};
  for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++) {
    if (strlen(named[i].name) == len && memcmp(s, named[i].name, len) == 0) {
      strbuf_putc(sb, named[i].c);
      return true;
    }
  }
  if (len < 2 || len > 9 || s[0] != '#') return false;
  char num[10];
  memcpy(num, s + 1, len - 1);
  num[len - 1] = '\0';
  char *end;
  unsigned long cp = num[0] == 'x' ? strtoul(num + 1, &end, 16) : strtoul(num, &end, 10);
  if (*end || cp == 0 || cp > 0x10ffff) return false;
  put_utf8(sb, cp);
  return true;
}

char *s3_xml_decode(struct s3_xml_span text) {
  struct strbuf sb = STRBUF_INIT;
  strbuf_append(&sb, "", 0);
  for (size_t i = 0; i < text.len; i++) {
    if (text.data[i] != '&') {
      strbuf_putc(&sb, text.data[i]);
      continue;
    }
    const char *semi = memchr(text.data + i, ';', text.len - i);
    if (!semi || !decode_entity(&sb, text.data + i + 1, (size_t)(semi - text.data) - i - 1)) {
      strbuf_release(&sb);
      return NULL;
    }
    i = (size_t)(semi - text.data);
  }
  return strbuf_take(&sb, NULL);
}

char *s3_xml_text(struct s3_xml_span doc, const char *tag) {
  size_t cursor = 0;
  struct s3_xml_span inner;
  if (!s3_xml_next(doc, tag, &cursor, &inner)) return NULL;
  return s3_xml_decode(inner);
}

void s3_xml_escape(struct strbuf *sb, const char *s) {
  for (; *s; s++) {
    switch (*s) {
    case '&':
      strbuf_puts(sb, "&amp;");
      break;
    case '<':
      strbuf_puts(sb, "&lt;");
      break;
    case '>':
      strbuf_puts(sb, "&gt;");
      break;
    case '"':
      strbuf_puts(sb, "&quot;");
      break;
    case '\'':
      strbuf_puts(sb, "&apos;");
      break;
    default:
      strbuf_putc(sb, *s);
    }
  }
}

/* Reads exactly n decimal digits at *p. */
static bool digits(const char **p, int n, int *ret) {
  int v = 0;
  for (int i = 0; i < n; i++) {
    char c = (*p)[i];
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *p += n;
  *ret = v;
  return true;
}

static bool expect(const char **p, char c) {
  if (**p != c) return false;
  (*p)++;
  return true;
}

/* "Z", "+hh:mm" or "-hh:mm" at the end of the text: the offset in seconds. */
static bool zone(const char *p, long *ret_offset_s) {
  if (p[0] == 'Z' && p[1] == '\0') {
    *ret_offset_s = 0;
    return true;
  }
  int hh, mm;
  char sign = *p++;
  if ((sign != '+' && sign != '-') || !digits(&p, 2, &hh) || !expect(&p, ':') ||
      !digits(&p, 2, &mm) || *p || hh > 23 || mm > 59)
    return false;
  *ret_offset_s = (sign == '-' ? -1 : 1) * (long)(hh * 3600 + mm * 60);
  return true;
}

int s3_xml_time_ms(const char *text, int64_t *ret_ms) {
  const char *p = text;
  struct tm tm = {0};
  int ms = 0;
  bool ok = digits(&p, 4, &tm.tm_year) && expect(&p, '-') && digits(&p, 2, &tm.tm_mon) &&
            expect(&p, '-') && digits(&p, 2, &tm.tm_mday) && expect(&p, 'T') &&
            digits(&p, 2, &tm.tm_hour) && expect(&p, ':') && digits(&p, 2, &tm.tm_min) &&
            expect(&p, ':') && digits(&p, 2, &tm.tm_sec);
  if (ok && *p == '.') { /* Fraction: milliseconds from the first three digits. */
    p++;
    int n = 0;
    for (; *p >= '0' && *p <= '9'; p++, n++)
      if (n < 3) ms = ms * 10 + (*p - '0');
    ok = n > 0;
    for (; n < 3; n++) ms *= 10;
  }
  long offset_s = 0;
  ok = ok && zone(p, &offset_s) && tm.tm_mon >= 1 && tm.tm_mon <= 12 && tm.tm_mday >= 1 &&
       tm.tm_mday <= 31 && tm.tm_hour <= 23 && tm.tm_min <= 59 && tm.tm_sec <= 60;
  if (!ok) return STK_EINVAL;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  time_t t = timegm(&tm);
  if (t == (time_t)-1) return STK_EINVAL;
  *ret_ms = ((int64_t)t - offset_s) * 1000 + ms;
  return 0;
}
