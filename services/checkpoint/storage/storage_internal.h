/*
 * The backend table behind storage.h: each backend fills one and
 * storage.c validates arguments once before dispatching. The backends call
 * down to storage_base.c (storage_wrap, the key rules), never up to
 * storage.c.
 */
#ifndef STK_STORAGE_INTERNAL_H
#define STK_STORAGE_INTERNAL_H

#include "storage.h"

struct storage_backend {
  int (*put)(void *impl, const char *key, const void *data, size_t len, unsigned flags);
  int (*get)(void *impl, const char *key, uint64_t offset, void *buf, size_t len, size_t *ret_len);
  int (*head)(void *impl, const char *key, uint64_t *ret_size);
  int (*del)(void *impl, const char *key);
  int (*list)(void *impl, const char *prefix, storage_list_cb cb, void *arg);
  int (*mpu_begin)(void *impl, const char *key, char **ret_upload_id);
  int (*mpu_part)(void *impl, const char *key, const char *upload_id, int number, const void *data,
                  size_t len, char **ret_etag);
  int (*mpu_complete)(void *impl, const char *key, const char *upload_id,
                      const struct storage_part *parts, size_t n_parts, unsigned flags);
  int (*mpu_abort)(void *impl, const char *key, const char *upload_id);
  int (*mpu_list)(void *impl, const char *prefix, storage_upload_cb cb, void *arg);
  void (*free)(void *impl);
};

struct storage {
  const struct storage_backend *be;
  void *impl;
  struct storage_caps caps;
};

/* Backend constructor of fs_backend.c (storage_s3.c's is storage_open_s3). */
int fs_backend_open(const char *root_dir, struct storage **ret);

/* Wraps a backend in a new struct storage; NULL on out of memory
 * (storage_base.c, below every backend; so is storage_key_check). */
struct storage *storage_wrap(const struct storage_backend *be, void *impl,
                             const struct storage_caps *caps);

#endif
