/*
 * utf8: whether bytes are UTF-8 as RFC 3629 defines it, the one check of
 * the daemons. proto3 strings must be UTF-8 and protobuf's other parsers
 * (Python's among them) refuse a message holding one that is not, so a
 * daemon refuses such a string where it enters (rpc_unpack.c) and the
 * coordinator checks the free text it stores and shows back.
 */
#ifndef STK_UTF8_H
#define STK_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

/* p[0..n) holds no overlong form, no surrogate, nothing over U+10FFFF. */
bool utf8_valid(const void *p, size_t n);

/* The same for a NUL-terminated string. */
static inline bool utf8_valid_str(const char *s) {
  return utf8_valid(s, strlen(s));
}

#endif
