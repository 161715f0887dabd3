/*
 * page: listing pages and their tokens (see page.h).
 */
#include "page.h"

#include <stdlib.h>
#include <string.h>

#include "stk_error.h"

#define TOKEN_TAG "p1."

uint32_t page_size(uint32_t asked) {
  if (asked == 0) return PAGE_DEFAULT_SIZE;
  return asked > PAGE_MAX_SIZE ? PAGE_MAX_SIZE : asked;
}

int page_token_encode(const char *last_key, char **ret_token) {
  static const char hex[] = "0123456789abcdef";
  size_t n = strlen(last_key), tag = strlen(TOKEN_TAG);
  if (n > PAGE_MAX_KEY_BYTES) return STK_EINVAL;
  char *t = malloc(tag + 2 * n + 1);
  if (!t) return STK_ENOMEM;
  memcpy(t, TOKEN_TAG, tag);
  for (size_t i = 0; i < n; i++) {
    t[tag + 2 * i] = hex[(unsigned char)last_key[i] >> 4];
    t[tag + 2 * i + 1] = hex[(unsigned char)last_key[i] & 15];
  }
  t[tag + 2 * n] = '\0';
  *ret_token = t;
  return 0;
}

static int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

int page_token_decode(const char *token, char **ret_key) {
  if (!token || !*token) {
    *ret_key = NULL;
    return 0;
  }
  size_t tag = strlen(TOKEN_TAG), n = strlen(token);
  if (n < tag || memcmp(token, TOKEN_TAG, tag) != 0 || (n - tag) % 2 ||
      (n - tag) / 2 > PAGE_MAX_KEY_BYTES) {
    stk_set_detail("page_token is not a token this service gave");
    return STK_EINVAL;
  }
  size_t len = (n - tag) / 2;
  char *k = malloc(len + 1);
  if (!k) return STK_ENOMEM;
  for (size_t i = 0; i < len; i++) {
    int hi = hex_digit(token[tag + 2 * i]), lo = hex_digit(token[tag + 2 * i + 1]);
    if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
      free(k);
      stk_set_detail("page_token is not a token this service gave");
      return STK_EINVAL;
    }
    k[i] = (char)(hi << 4 | lo);
  }
  k[len] = '\0';
  *ret_key = k;
  return 0;
}
