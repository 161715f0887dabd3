/*
 * ckpt_store: a pool task that waits for a storage request without holding
 * its worker. The upload and restore tasks (ckpt_upload.c, ckpt_restore.c)
 * do their CRCs and copies on the pool and hand the bytes to the store
 * here: the task is parked, the request goes to the store's engine (the S3
 * client's loop; file:// answers inline), and its answer puts the task back
 * on the pool, where its work runs again with the result. A leaf over
 * ckpt_pool and storage.
 */
#include "ckpt_service_int.h"

#include <string.h>

static void on_stored(void *arg, struct storage_result *res);

void ckpt__store(struct ckpt_store_call *c, struct ckpt_pool *pool, struct ckpt_task *t,
                 struct storage *st, const struct storage_req *rq) {
  storage_result_clear(&c->res);
  c->pool = pool;
  c->t = t;
  ckpt_pool_park();
  storage_submit(st, rq, on_stored, c); /* c and t are the answer's from here. */
}

/* The store's answer (its engine's thread, or inline): moved into the call,
 * and the task back on its pool. */
static void on_stored(void *arg, struct storage_result *res) {
  struct ckpt_store_call *c = arg;
  c->res = *res;
  memset(res, 0, sizeof(*res));
  ckpt_pool_resume(c->pool, c->t);
}
