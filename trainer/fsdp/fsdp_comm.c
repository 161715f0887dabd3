/*
 * fsdp_comm: the communication thread. A coll group is driven by one
 * thread at a time, so one thread per step runs the plan's collectives in
 * their fixed order while the caller's thread computes. Each op waits for
 * what it needs (a limiter slot for an all-gather, the compute step that
 * produced a gradient for a reduce-scatter), runs, and publishes its result
 * under f->mu. The first failure on either side stops both.
 * Without a group (one rank) the collectives are plain copies. With bf16
 * mixed precision the step's all-gathers and reduce-scatters narrow to bf16
 * around the collective and widen back (one rank rounds the same way).
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

/* Bytes this rank sends for a ring collective over chunks of `count` elements. */
static uint64_t ring_bytes(const struct fsdp *f, size_t count, enum coll_dtype dt) {
  return (uint64_t)(f->world - 1) * count * coll_dtype_size(dt);
}

int fsdp_coll_gather(struct fsdp *f, int unit, float *ret_full) {
  const struct fsdp_unit *u = &f->units[unit];
  if (!f->group) {
    memcpy(ret_full, u->param, u->count * sizeof(float));
    return 0;
  }
  f->bytes_moved += ring_bytes(f, u->count, COLL_F32);
  f->gather_bytes += ring_bytes(f, u->count, COLL_F32);
  return coll_all_gather(f->group, u->param, ret_full, u->count, COLL_F32);
}

/* The step's all-gather in bf16: this rank's shard narrowed, everybody's
 * gathered, the whole unit widened into ret_full (padded elements). */
static int gather_bf16(struct fsdp *f, int unit, float *ret_full) {
  const struct fsdp_unit *u = &f->units[unit];
  uint16_t *all = malloc((u->padded + u->count) * sizeof(uint16_t)); /* [padded] + [count] */
  if (!all) return STK_ENOMEM;
  uint16_t *mine = all + u->padded;
  coll_bf16_from_f32(mine, u->param, u->count);
  int rc = 0;
  if (!f->group) {
    memcpy(all, mine, u->count * sizeof(uint16_t));
  } else {
    f->bytes_moved += ring_bytes(f, u->count, COLL_BF16);
    f->gather_bytes += ring_bytes(f, u->count, COLL_BF16);
    rc = coll_all_gather(f->group, mine, all, u->count, COLL_BF16);
  }
  if (!rc) coll_f32_from_bf16(ret_full, all, u->padded);
  free(all);
  return rc;
}

static int step_gather(struct fsdp *f, int unit, float *ret_full) {
  if (f->opts.precision == FSDP_PRECISION_BF16) return gather_bf16(f, unit, ret_full);
  return fsdp_coll_gather(f, unit, ret_full);
}

/* The gradient's sum over ranks into this rank's f32 shard, in bf16. */
static int reduce_scatter_bf16(struct fsdp *f, struct fsdp_unit *u, const float *grad) {
  uint16_t *half = malloc((u->padded + u->count) * sizeof(uint16_t)); /* [padded] + [count] */
  if (!half) return STK_ENOMEM;
  uint16_t *sum = half + u->padded;
  coll_bf16_from_f32(half, grad, u->padded);
  int rc = 0;
  if (!f->group) {
    memcpy(sum, half, u->count * sizeof(uint16_t));
  } else {
    f->bytes_moved += ring_bytes(f, u->count, COLL_BF16);
    rc = coll_reduce_scatter(f->group, half, sum, u->count, COLL_BF16);
  }
  if (!rc) coll_f32_from_bf16(u->gshard, sum, u->count);
  free(half);
  return rc;
}

static int reduce_scatter(struct fsdp *f, int unit, const float *grad) {
  struct fsdp_unit *u = &f->units[unit];
  int rc = 0;
  if (f->opts.precision == FSDP_PRECISION_BF16) {
    rc = reduce_scatter_bf16(f, u, grad);
  } else if (!f->group) {
    memcpy(u->gshard, grad, u->count * sizeof(float));
  } else {
    f->bytes_moved += ring_bytes(f, u->count, COLL_F32);
    rc = coll_reduce_scatter(f->group, grad, u->gshard, u->count, COLL_F32);
  }
  if (rc || !f->group) return rc;
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
  int root = f->plan.gathers[g].root;
  int rc = root ? fsdp_limiter_acquire_root(&f->lim, bytes) : fsdp_limiter_acquire(&f->lim, bytes);
  if (rc) return rc;
  float *buf = malloc(bytes);
  if (!buf) {
    if (root)
      fsdp_limiter_release_root(&f->lim, bytes);
    else
      fsdp_limiter_release(&f->lim, bytes);
    return STK_ENOMEM;
  }
  int64_t t0 = fsdp_now_ns();
  rc = step_gather(f, unit, buf);
  f->coll_busy_ns += fsdp_now_ns() - t0;
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
  int64_t t0 = fsdp_now_ns();
  rc = reduce_scatter(f, unit, f->grads[unit]);
  f->coll_busy_ns += fsdp_now_ns() - t0;
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
    f->bytes_moved += 2 * ring_bytes(f, 1, COLL_F32);
    int64_t t0 = fsdp_now_ns();
    rc = coll_all_reduce(f->group, f->red, 3, COLL_F32);
    f->coll_busy_ns += fsdp_now_ns() - t0;
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
