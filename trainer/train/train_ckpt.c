/*
 * Saving checkpoints. At step S rank 0 begins an attempt and hands its id
 * to the others through the KV store; every rank starts staging its FSDP
 * shards (param, Adam m and v of every unit: 1-D flat shards of the padded
 * global size, box [rank*count, (rank+1)*count)) in the background with
 * stk_ckpt_stage_start, straight from the live shards: no snapshot. The
 * next step's forward and backward only read the shards; its optimizer
 * update is the first write, and it fences on the stage first
 * (fsdp_set_before_update -> train_ckpt_fence), so the checkpoint holds
 * exactly the state after step S. Rank 0 also saves "trainer/state" (step,
 * optimizer steps, seed, loader blob length) and "loader/state" (the
 * dataloader export: with several dataloader parts, every part's state in
 * the client library's envelope). After the next step (or at the end):
 * wait until staged, barrier, rank 0 commits and commits the loader at S
 * on every part.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "train.h"

void train_tensor_name(int unit, const char *kind, char *ret_name, size_t len) {
  snprintf(ret_name, len, "unit%d/%s", unit, kind);
}

/* Rank 0 begins the attempt and publishes it; the others read it. */
static int share_attempt(struct train *t, int64_t step) {
  char key[48];
  snprintf(key, sizeof(key), "ckpt/%" PRId64, step);
  if (t->m.rank == 0) {
    int err = stk_ckpt_begin(t->ckpt, t->o.data_job, step, t->m.world_size, 30000, t->pend.attempt);
    if (err == STK_EEXIST)
      snprintf(t->pend.attempt, sizeof(t->pend.attempt), "-");
    else if (err)
      return err;
    return stk_kv_set(t->coord, key, t->pend.attempt, strlen(t->pend.attempt), 10000);
  }
  uint8_t *v = NULL;
  size_t len = 0;
  int err = stk_kv_get(t->coord, key, true, 30000, &v, &len);
  if (err) return err;
  snprintf(t->pend.attempt, sizeof(t->pend.attempt), "%.*s", (int)len, (const char *)v);
  free(v);
  return 0;
}

/* Fills the shard tensors (3 per unit) into ts, pointing at the live shards. */
static size_t shard_tensors(struct train *t, struct stk_ckpt_tensor *ts, uint64_t *dims,
                            char (*names)[32]) {
  int U = fsdp_unit_count(t->fsdp);
  size_t n = 0;
  for (int u = 0; u < U; u++) {
    struct fsdp_shard s;
    fsdp_shard(t->fsdp, u, &s);
    const float *src[3] = {s.param, s.adam_m, s.adam_v};
    const char *kinds[3] = {"param", "m", "v"};
    for (int k = 0; k < 3; k++, n++) {
      uint64_t *d = dims + 3 * n; /* global, offset, size */
      d[0] = s.padded_numel, d[1] = s.offset, d[2] = s.count;
      train_tensor_name(u, kinds[k], names[n], sizeof(names[n]));
      ts[n] = (struct stk_ckpt_tensor){.name = names[n],
                                       .dtype = STK_DTYPE_F32,
                                       .global_shape = &d[0],
                                       .box = {1, &d[1], &d[2]},
                                       .data = src[k],
                                       .len = s.count * sizeof(float)};
    }
  }
  return n;
}

/* Rank 0's extra tensors: trainer state and the loader export. */
static size_t state_tensors(struct train *t, int64_t step, struct stk_ckpt_tensor *ts,
                            uint64_t *dims, size_t len) {
  struct train_pending *p = &t->pend;
  p->state[0] = (uint64_t)step, p->state[1] = (uint64_t)fsdp_steps_done(t->fsdp);
  p->state[2] = t->o.seed, p->state[3] = len;
  dims[0] = sizeof(p->state), dims[1] = 0, dims[2] = sizeof(p->state);
  dims[3] = len, dims[4] = 0, dims[5] = len;
  ts[0] = (struct stk_ckpt_tensor){"trainer/state",         STK_DTYPE_BYTES, &dims[0],
                                   {1, &dims[1], &dims[2]}, p->state,        sizeof(p->state)};
  ts[1] = (struct stk_ckpt_tensor){"loader/state",          STK_DTYPE_BYTES, &dims[3],
                                   {1, &dims[4], &dims[5]}, p->loader_blob,  len};
  return len ? 2 : 1;
}

/* The test interleavings of --ckpt-stage-test slow:MS: the staging thread
 * sleeps before the first and the middle tensor. */
struct slow_hook {
  int64_t ms;
  size_t middle;
};
static struct slow_hook slow_hook;

static void sleep_before_tensor(void *arg, size_t i) {
  const struct slow_hook *h = arg;
  if (i != 0 && i != h->middle) return;
  struct timespec ts = {.tv_sec = h->ms / 1000, .tv_nsec = (h->ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

static int stage(struct train *t, int64_t step) {
  size_t nt = 3 * (size_t)fsdp_unit_count(t->fsdp) + 2, blob_len = 0;
  struct stk_ckpt_tensor *ts = calloc(nt, sizeof(*ts));
  uint64_t *dims = calloc(3 * nt, sizeof(*dims));
  char(*names)[32] = calloc(nt, 32);
  int err = (!ts || !dims || !names) ? STK_ENOMEM : 0;
  if (!err && t->m.rank == 0)
    err = stk_loader_export_all(t->loader, t->o.data_job, step - 1, 30000, &t->pend.loader_blob,
                                &blob_len);
  if (!err) {
    size_t n = shard_tensors(t, ts, dims, names);
    if (t->m.rank == 0) n += state_tensors(t, step, ts + n, dims + 3 * n, blob_len);
    struct stk_ckpt_stage_opts so = {.low_priority = t->o.ckpt_low_priority};
    if (t->o.ckpt_test_delay_ms > 0) {
      slow_hook = (struct slow_hook){.ms = t->o.ckpt_test_delay_ms, .middle = n / 2};
      so.before_tensor = sleep_before_tensor, so.hook_arg = &slow_hook;
    }
    err = stk_ckpt_stage_start(t->ckpt, t->pend.attempt, t->m.rank, ts, n, &so, &t->pend.stage);
  }
  free(ts), free(dims), free(names); /* The stage copied them. */
  t->pend.step = err ? 0 : step;
  t->pend.fence_wait_us = -1;
  if (!err && t->o.ckpt_test_early) err = stk_ckpt_stage_fence(t->pend.stage);
  return err;
}

int train_ckpt_fence(void *arg) {
  struct train *t = arg;
  if (!t->pend.stage) return 0;
  int64_t t0 = train_now_us();
  int err = stk_ckpt_stage_fence(t->pend.stage);
  t->pend.fence_wait_us = train_now_us() - t0;
  return err;
}

void train_ckpt_drop(struct train *t) {
  struct train_pending *p = &t->pend;
  (void)stk_ckpt_stage_finish(p->stage, NULL); /* Never leave a stage reading the shards. */
  p->stage = NULL;
  free(p->loader_blob);
  p->loader_blob = NULL;
  p->step = 0;
}

int train_ckpt_start(struct train *t, int64_t step) {
  train_ckpt_drop(t);
  int err = share_attempt(t, step);
  if (err) return err;
  if (!strcmp(t->pend.attempt, "-")) return 0; /* Committed already (before a restart). */
  err = stage(t, step);
  if (err) train_ckpt_drop(t);
  return err;
}

/* Rank 0: the commit, then the loader's. */
static int commit(struct train *t) {
  struct stk_ckpt_ref ref;
  int err = stk_ckpt_commit(t->ckpt, t->pend.attempt, 60000, &ref);
  if (err) return err;
  printf("[%s] checkpoint committed at step %" PRId64 " (%s)\n", t->o.member, t->pend.step,
         ref.uri);
  return stk_loader_commit_all(t->loader, t->o.data_job, t->pend.step - 1, 30000);
}

int train_ckpt_finish(struct train *t) {
  struct train_pending *p = &t->pend;
  if (!p->step) return 0;
  int err = stk_ckpt_stage_finish(p->stage, NULL);
  p->stage = NULL;
  if (err)
    fprintf(stderr, "checkpoint save failed: %s (%s)\n", stk_strerror(err),
            stk_client_last_error(NULL));
  if (t->m.rank == 0 && p->fence_wait_us >= 0)
    printf("[%s] checkpoint at step %" PRId64 " staged; the next update waited %" PRId64
           " us for it\n",
           t->o.member, p->step, p->fence_wait_us);
  char name[48];
  snprintf(name, sizeof(name), "ckpt-%" PRId64, p->step);
  if (!err) err = stk_barrier(t->coord, name, 60000);
  if (!err && t->m.rank == 0) err = commit(t);
  train_ckpt_drop(t);
  return err;
}
