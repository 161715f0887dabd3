/*
 * storage_base: what the storage facade and its backends share — the key
 * rules (storage_key_check), wrapping a backend's state and vtable as a
 * struct storage (storage_wrap) and ending a request (storage_answer). It calls no other file of
 * the storage library: storage.c dispatches to the backends (fs_backend.c, storage_s3.c) and all of
 * them call down to here.
 */
#include "storage_internal.h"

#include "stk_error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int segment_check(const char *seg, size_t len) {
  if (len == 0) return STK_EINVAL;
  if (len > STORAGE_SEGMENT_MAX) return STK_EINVAL;
  if ((len == 1 && seg[0] == '.') || (len == 2 && seg[0] == '.' && seg[1] == '.'))
    return STK_EINVAL;
  if (len >= 5 && memcmp(seg, ".stk-", 5) == 0) return STK_EINVAL;
  return 0;
}

int storage_key_check(const char *key) {
  if (!key || !key[0]) {
    stk_set_detail("empty key");
    return STK_EINVAL;
  }
  size_t len = strlen(key);
  if (len > STORAGE_KEY_MAX) {
    stk_set_detail("key longer than %d bytes", STORAGE_KEY_MAX);
    return STK_EINVAL;
  }
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)key[i];
    if (c < 0x20 || c == 0x7f) {
      stk_set_detail("control character in key");
      return STK_EINVAL;
    }
  }
  const char *seg = key;
  for (;;) {
    const char *slash = strchr(seg, '/');
    size_t n = slash ? (size_t)(slash - seg) : strlen(seg);
    if (segment_check(seg, n)) {
      stk_set_detail("bad key segment in \"%.64s\"", key);
      return STK_EINVAL;
    }
    if (!slash) return 0;
    seg = slash + 1;
  }
}

struct storage *storage_wrap(const struct storage_backend *be, void *impl,
                             const struct storage_caps *caps) {
  struct storage *st = calloc(1, sizeof(*st));
  if (!st) return NULL;
  st->be = be;
  st->impl = impl;
  st->caps = *caps;
  return st;
}

void storage_result_clear(struct storage_result *res) {
  free(res->upload_id);
  free(res->etag);
  memset(res, 0, sizeof(*res));
}

void storage_answer(storage_done_fn done, void *arg, struct storage_result *res) {
  if (res->err && !res->detail[0]) {
    const char *d = stk_detail();
    snprintf(res->detail, sizeof(res->detail), "%s", d && d[0] ? d : stk_strerror(res->err));
  }
  done(arg, res);
  storage_result_clear(res);
}
