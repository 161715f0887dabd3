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
  /* Runs rq (checked by storage.c) and calls storage_answer once. */
  void (*submit)(void *impl, const struct storage_req *rq, storage_done_fn done, void *arg);
  int (*list)(void *impl, const char *prefix, storage_list_cb cb, void *arg);
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

/* Ends a request: takes the detail from stk_detail() when res has an error
 * and none, calls done, then frees what res still owns (storage_base.c). */
void storage_answer(storage_done_fn done, void *arg, struct storage_result *res);

#endif
