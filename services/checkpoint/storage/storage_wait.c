/*
 * storage_wait: the blocking object calls, each a thin wait over
 * storage_submit (a condition variable the completion signals), for
 * callers that truly wait: startup recovery, the commit, the operator
 * calls and sweeps on the service's worker threads. The one file above
 * storage.c; the hot paths (upload, restore) submit and do not wait.
 */
#include "storage_internal.h"

#include "stk_error.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct waiter {
  pthread_mutex_t mu;
  pthread_cond_t cond;
  bool done;
  struct storage_result res;
};

static void on_done(void *arg, struct storage_result *res) {
  struct waiter *w = arg;
  pthread_mutex_lock(&w->mu);
  w->res = *res;
  memset(res, 0, sizeof(*res)); /* Moved: the waiter frees it. */
  w->done = true;
  pthread_cond_signal(&w->cond);
  pthread_mutex_unlock(&w->mu);
}

/* Runs rq to its end; the error's detail becomes this thread's. The caller
 * clears *ret. */
static int wait_for(struct storage *st, const struct storage_req *rq, struct storage_result *ret) {
  struct waiter w = {0};
  pthread_mutex_init(&w.mu, NULL);
  pthread_cond_init(&w.cond, NULL);
  storage_submit(st, rq, on_done, &w);
  pthread_mutex_lock(&w.mu);
  while (!w.done) pthread_cond_wait(&w.cond, &w.mu);
  pthread_mutex_unlock(&w.mu);
  pthread_cond_destroy(&w.cond);
  pthread_mutex_destroy(&w.mu);
  *ret = w.res;
  if (ret->err && ret->detail[0]) stk_set_detail("%s", ret->detail);
  return ret->err;
}

/* For the calls that return nothing but the error. */
static int wait_err(struct storage *st, const struct storage_req *rq) {
  struct storage_result res;
  int err = wait_for(st, rq, &res);
  storage_result_clear(&res);
  return err;
}

int storage_put(struct storage *st, const char *key, const void *data, size_t len, unsigned flags) {
  struct storage_req rq = {
      .op = STORAGE_OP_PUT, .key = key, .data = data, .len = len, .flags = flags};
  return wait_err(st, &rq);
}

int storage_get(struct storage *st, const char *key, uint64_t offset, void *buf, size_t len,
                size_t *ret_len) {
  struct storage_req rq = {
      .op = STORAGE_OP_GET, .key = key, .buf = buf, .len = len, .offset = offset};
  struct storage_result res;
  int err = wait_for(st, &rq, &res);
  if (!err) *ret_len = res.len;
  storage_result_clear(&res);
  return err;
}

int storage_head(struct storage *st, const char *key, uint64_t *ret_size_bytes) {
  struct storage_req rq = {.op = STORAGE_OP_HEAD, .key = key};
  struct storage_result res;
  int err = wait_for(st, &rq, &res);
  if (!err) *ret_size_bytes = res.size;
  storage_result_clear(&res);
  return err;
}

int storage_delete(struct storage *st, const char *key) {
  struct storage_req rq = {.op = STORAGE_OP_DELETE, .key = key};
  return wait_err(st, &rq);
}

int storage_mpu_begin(struct storage *st, const char *key, char **ret_upload_id) {
  struct storage_req rq = {.op = STORAGE_OP_MPU_BEGIN, .key = key};
  struct storage_result res;
  int err = wait_for(st, &rq, &res);
  if (!err) {
    *ret_upload_id = res.upload_id;
    res.upload_id = NULL;
  }
  storage_result_clear(&res);
  return err;
}

int storage_mpu_part(struct storage *st, const char *key, const char *upload_id, int number,
                     const void *data, size_t len, char **ret_etag) {
  struct storage_req rq = {.op = STORAGE_OP_MPU_PART,
                           .key = key,
                           .upload_id = upload_id,
                           .number = number,
                           .data = data,
                           .len = len};
  struct storage_result res;
  int err = wait_for(st, &rq, &res);
  if (!err) {
    *ret_etag = res.etag;
    res.etag = NULL;
  }
  storage_result_clear(&res);
  return err;
}

int storage_mpu_complete(struct storage *st, const char *key, const char *upload_id,
                         const struct storage_part *parts, size_t n_parts, unsigned flags) {
  struct storage_req rq = {.op = STORAGE_OP_MPU_COMPLETE,
                           .key = key,
                           .upload_id = upload_id,
                           .parts = parts,
                           .n_parts = n_parts,
                           .flags = flags};
  return wait_err(st, &rq);
}

int storage_mpu_abort(struct storage *st, const char *key, const char *upload_id) {
  struct storage_req rq = {.op = STORAGE_OP_MPU_ABORT, .key = key, .upload_id = upload_id};
  return wait_err(st, &rq);
}
