/*
 * utf8: the RFC 3629 check of utf8.h, one byte sequence at a time: the
 * lead byte gives the length and the smallest code point that length may
 * carry (anything less is an overlong form), every continuation byte is
 * 10xxxxxx, and the code point is neither a surrogate nor over U+10FFFF.
 */
#include "utf8.h"

#include <stdint.h>

bool utf8_valid(const void *bytes, size_t n) {
  const uint8_t *p = bytes, *end = p + n;
  while (p < end) {
    unsigned c = *p++;
    if (c < 0x80) continue;
    unsigned more;
    uint32_t cp, min;
    if ((c & 0xe0) == 0xc0)
      more = 1, min = 0x80, cp = c & 0x1f;
    else if ((c & 0xf0) == 0xe0)
      more = 2, min = 0x800, cp = c & 0x0f;
    else if ((c & 0xf8) == 0xf0)
      more = 3, min = 0x10000, cp = c & 0x07;
    else
      return false;
    if ((size_t)(end - p) < more) return false;
    for (unsigned i = 0; i < more; i++, p++) {
      if ((*p & 0xc0) != 0x80) return false;
      cp = cp << 6 | (*p & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
  }
  return true;
}
