/*
 * fsdp_comm: the communication thread. A coll group is driven by one
 * thread at a time, so one thread per step runs the plan's collectives in
 * their fixed order while the caller's thread computes. Each op waits for
 * what it needs (a limiter slot for an all-gather, the compute step that
 * produced a gradient for a reduce-scatter), runs, and publishes its result
 * under f->mu. The first failure on either side stops both.
 * Without a group (one rank) the collectives are plain copies.
 */
#include <stdlib.h>
#include <string.h>

#include "fsdp_internal.h"
#include "stk_error.h"

void fsdp_fail(struct fsdp *f, int err) {
  pthread_mutex_lock(&f->mu);
  if (!f->error) f->error = err;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
  fsdp_limiter_abort(&f->lim);
}

/* Bytes this rank sends for a ring collective over chunks of `count` f32. */
static uint64_t ring_bytes(const struct fsdp *f, size_t count) {
  return (uint64_t)(f->world - 1) * count * sizeof(float);
}

int fsdp_coll_gather(struct fsdp *f, int unit, float *ret_full) {
  const struct fsdp_unit *u = &f->units[unit];
  if (!f->group) {
    memcpy(ret_full, u->param, u->count * sizeof(float));
    return 0;
  }
  f->bytes_moved += ring_bytes(f, u->count);
  return coll_all_gather(f->group, u->param, ret_full, u->count, COLL_F32);
}

static int reduce_scatter(struct fsdp *f, int unit, const float *grad) {
  struct fsdp_unit *u = &f->units[unit];
  if (!f->group) {
    memcpy(u->gshard, grad, u->count * sizeof(float));
    return 0;
  }
  f->bytes_moved += ring_bytes(f, u->count);
  int rc = coll_reduce_scatter(f->group, grad, u->gshard, u->count, COLL_F32);
  if (rc) return rc;
  optim_scale(u->gshard, u->count, 1.0f / (float)f->world);
  return 0;
}

/* Blocks until `steps` compute steps are done; the step's error otherwise. */
static int wait_steps(struct fsdp *f, int steps) {
  pthread_mutex_lock(&f->mu);
  while (!f->error && f->done_steps < steps) pthread_cond_wait(&f->cv, &f->mu);
  int rc = f->error;
  pthread_mutex_unlock(&f->mu);
  return rc;
}

static int run_gather(struct fsdp *f, int g) {
  int unit = f->plan.gathers[g].unit;
  size_t bytes = f->units[unit].padded * sizeof(float);
  int rc = fsdp_limiter_acquire(&f->lim, bytes);
  if (rc) return rc;
  float *buf = malloc(bytes);
  if (!buf) {
    fsdp_limiter_release(&f->lim, bytes);
    return STK_ENOMEM;
  }
  rc = fsdp_coll_gather(f, unit, buf);
  pthread_mutex_lock(&f->mu);
  f->bufs[g] = buf; /* Freed by the compute side, or at the step's end on error. */
  f->ready[g] = !rc;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
  return rc;
}

static int run_reduce_scatter(struct fsdp *f, int unit, int after_steps) {
  int rc = wait_steps(f, after_steps);
  if (rc) return rc;
  rc = reduce_scatter(f, unit, f->grads[unit]);
  pthread_mutex_lock(&f->mu);
  free(f->grads[unit]);
  f->grads[unit] = NULL;
  f->rs_done += !rc;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
  return rc;
}

static int run_all_reduce(struct fsdp *f, int after_steps) {
  int rc = wait_steps(f, after_steps);
  if (rc) return rc;
  if (f->group) {
    f->bytes_moved += 2 * ring_bytes(f, 1);
    rc = coll_all_reduce(f->group, f->red, 2, COLL_F32);
  }
  pthread_mutex_lock(&f->mu);
  f->ar_done = !rc;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
  return rc;
}

void *fsdp_comm_main(void *arg) {
  struct fsdp *f = arg;
  for (int i = 0; i < f->plan.nops; i++) {
    const struct fsdp_op *op = &f->plan.ops[i];
    int rc = 0;
    switch (op->kind) {
    case FSDP_OP_GATHER:
      rc = run_gather(f, op->index);
      break;
    case FSDP_OP_REDUCE_SCATTER:
      rc = run_reduce_scatter(f, op->index, op->after_steps);
      break;
    case FSDP_OP_ALL_REDUCE:
      rc = run_all_reduce(f, op->after_steps);
      break;
    }
    if (rc) {
      fsdp_fail(f, rc);
      break;
    }
  }
  return NULL;
}
