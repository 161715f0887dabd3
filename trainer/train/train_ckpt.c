/*
 * Saving checkpoints, off the training loop. At step S the loop only notes
 * where this rank's FSDP shards are (param, Adam m and v of every unit:
 * 1-D flat shards of the padded global size, box [rank*count,
 * (rank+1)*count)) and starts the checkpoint's pipeline thread, which:
 * shares the attempt (rank 0 begins it and hands its id to the others
 * through the KV store), exports the dataloader state (rank 0), stages the
 * shards with stk_ckpt_stage_start straight from the live shards (no
 * snapshot), waits until the shard is staged, meets the other ranks
 * (barrier) and (rank 0) commits, then commits the loader at S on every
 * part. Meanwhile the next step's forward and backward only read the
 * shards; its optimizer update is the first write, and it fences first
 * (fsdp_set_before_update -> train_ckpt_fence: until the stage has copied
 * every byte), so the checkpoint holds exactly the state after step S.
 * Rank 0 also saves "trainer/state" (step, optimizer steps, seed, loader
 * blob length) and "loader/state" (the dataloader export: with several
 * dataloader parts, every part's state in the client library's envelope).
 * The loop reaps the pipeline after each step once it is done (its error
 * fails the generation as a failed step does), before the next checkpoint
 * starts, and at the end.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "train.h"

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
                            char (*names)[32]) { /* On the loop's thread: fsdp is its own. */
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
  p->state[0] = (uint64_t)step; /* state[1], the optimizer steps, noted at start. */
  p->state[2] = t->o.seed, p->state[3] = len;
  dims[0] = sizeof(p->state), dims[1] = 0, dims[2] = sizeof(p->state);
  dims[3] = len, dims[4] = 0, dims[5] = len;
  ts[0] = (struct stk_ckpt_tensor){"trainer/state",         STK_DTYPE_BYTES, &dims[0],
                                   {1, &dims[1], &dims[2]}, p->state,        sizeof(p->state)};
  ts[1] = (struct stk_ckpt_tensor){"loader/state",          STK_DTYPE_BYTES, &dims[3],
                                   {1, &dims[4], &dims[5]}, p->loader_blob,  len};
  return len ? 2 : 1;
}

/* The test interleaving of --ckpt-stage-test slow:MS: before its first
 * tensor the staging thread waits until the next update is at the fence
 * (or the pipeline is being reaped), then sleeps MS, and sleeps MS again
 * before its middle tensor, so the update surely waits for the copy. */
static void sleep_ms(int64_t ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

static void hold_before_tensor(void *arg, size_t i) {
  struct train *t = arg;
  struct train_pending *p = &t->pend;
  if (i != 0 && i != p->middle_tensor) return;
  if (i == 0) {
    pthread_mutex_lock(&p->mu);
    while (!p->at_fence) pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
  }
  sleep_ms(t->o.ckpt_test_delay_ms);
}

/* Pipeline: the attempt, the loader export (rank 0), the stage started. */
static int stage(struct train *t, int64_t step) {
  struct train_pending *p = &t->pend;
  int err = share_attempt(t, step);
  if (err || !strcmp(p->attempt, "-")) return err; /* "-": committed already (a restart). */
  size_t n = p->n_shard_tensors, blob_len = 0;
  if (t->m.rank == 0)
    err = stk_loader_export_all(t->loader, t->o.data_job, step - 1, 30000, &p->loader_blob,
                                &blob_len);
  if (!err && t->m.rank == 0) n += state_tensors(t, step, p->ts + n, p->dims + 3 * n, blob_len);
  struct stk_ckpt_stage_opts so = {.low_priority = t->o.ckpt_low_priority};
  if (t->o.ckpt_test_delay_ms > 0) {
    p->middle_tensor = n / 2;
    so.before_tensor = hold_before_tensor, so.hook_arg = t;
  }
  struct stk_ckpt_stage *s = NULL;
  if (!err) err = stk_ckpt_stage_start(t->ckpt, p->attempt, t->m.rank, p->ts, n, &so, &s);
  pthread_mutex_lock(&p->mu);
  p->stage = s;
  pthread_mutex_unlock(&p->mu);
  return err;
}

/* Rank 0: the commit, then the loader's. The generation's last checkpoint
 * (a stop: preemption, pause, resize) is committed detached: rank 0 leaves
 * once the service has decided the commit, as the others leave once staged,
 * and the service finishes it without them (the coordinator's next round
 * waits for its report). */
static int commit(struct train *t) {
  struct stk_ckpt_ref ref;
  int64_t t0 = train_now_ms();
  int err = t->pend.last ? stk_ckpt_commit_detached(t->ckpt, t->pend.attempt, 60000, &ref)
                         : stk_ckpt_commit(t->ckpt, t->pend.attempt, 60000, &ref);
  if (err) return err;
  if (ref.uri[0])
    printf("[%s] checkpoint committed at step %" PRId64 " (%s)\n", t->o.member, t->pend.step,
           ref.uri);
  else
    printf("[%s] checkpoint commit accepted at step %" PRId64 " (detached, %" PRId64
           " ms): the service commits it after this rank is gone\n",
           t->o.member, t->pend.step, train_now_ms() - t0);
  fflush(stdout);
  return stk_loader_commit_all(t->loader, t->o.data_job, t->pend.step - 1, 30000);
}

static void set_state(struct train_pending *p, bool started, bool done, int err) {
  pthread_mutex_lock(&p->mu);
  p->started |= started, p->done |= done;
  if (err && !p->err) {
    p->err = err; /* The failing call ran on this thread: its message is here. */
    snprintf(p->msg, sizeof(p->msg), "%s", train_client_why(err));
  }
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

static void *pipeline_main(void *arg) {
  struct train *t = arg;
  struct train_pending *p = &t->pend;
  int err = stage(t, p->step);
  set_state(p, true, false, err);
  if (!err && p->stage) {
    err = stk_ckpt_stage_wait(p->stage, NULL);
    if (err)
      fprintf(stderr, "checkpoint save failed: %s (%s)\n", stk_strerror(err),
              stk_client_last_error(NULL));
    char name[48];
    snprintf(name, sizeof(name), "ckpt-%" PRId64, p->step);
    if (!err) err = stk_barrier(t->coord, name, 60000);
    if (!err && t->m.rank == 0) err = commit(t);
  }
  set_state(p, true, true, err);
  return NULL;
}

int train_ckpt_fence(void *arg) {
  struct train *t = arg;
  struct train_pending *p = &t->pend;
  if (!p->running) return 0;
  int64_t t0 = train_now_us();
  pthread_mutex_lock(&p->mu);
  p->at_fence = true;
  pthread_cond_broadcast(&p->cv);
  while (!p->started) pthread_cond_wait(&p->cv, &p->mu);
  struct stk_ckpt_stage *s = p->stage; /* Freed only by this thread, after the join. */
  pthread_mutex_unlock(&p->mu);
  int err = s ? stk_ckpt_stage_fence(s) : 0;
  if (p->fence_wait_us < 0) p->fence_wait_us = train_now_us() - t0;
  return err;
}

/* Joins the pipeline (if wait, or once it is done) and frees it. */
static int reap(struct train *t, bool wait) {
  struct train_pending *p = &t->pend;
  if (!p->running) return 0;
  pthread_mutex_lock(&p->mu);
  bool done = p->done;
  if (wait) p->at_fence = true; /* No update will come: a held stage goes on. */
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  if (!done && !wait) return 0;
  pthread_join(p->thread, NULL);
  p->running = false;
  (void)stk_ckpt_stage_finish(p->stage, NULL); /* Its outcome is in p->err. */
  if (t->m.rank == 0 && !p->err && p->fence_wait_us >= 0)
    printf("[%s] checkpoint at step %" PRId64 " staged; the next update waited %" PRId64
           " us for it\n",
           t->o.member, p->step, p->fence_wait_us);
  free(p->loader_blob), free(p->ts), free(p->dims), free(p->names);
  int err = train_why(t, p->err, "checkpoint of step %" PRId64 ": %s", p->step, p->msg);
  *p = (struct train_pending){.mu = p->mu, .cv = p->cv};
  return err;
}

void train_ckpt_drop(struct train *t) {
  (void)reap(t, true); /* Never leave a stage reading the shards. */
}

int train_ckpt_finish(struct train *t, bool wait) {
  return reap(t, wait);
}

int train_ckpt_start(struct train *t, int64_t step, bool last) {
  int err = reap(t, true); /* The previous checkpoint (long done, as a rule). */
  if (err) return err;
  struct train_pending *p = &t->pend;
  size_t nt = 3 * (size_t)fsdp_unit_count(t->fsdp) + 2;
  p->ts = calloc(nt, sizeof(*p->ts));
  p->dims = calloc(3 * nt, sizeof(*p->dims));
  p->names = calloc(nt, sizeof(*p->names));
  if (!p->ts || !p->dims || !p->names) err = STK_ENOMEM;
  if (!err) {
    p->n_shard_tensors = shard_tensors(t, p->ts, p->dims, p->names);
    p->state[1] = (uint64_t)fsdp_steps_done(t->fsdp);
    p->step = step;
    p->last = last;
    p->fence_wait_us = -1;
    p->started = p->done = p->at_fence = false, p->err = 0, p->stage = NULL;
    if (pthread_create(&p->thread, NULL, pipeline_main, t)) err = STK_ENOMEM;
  }
  if (err) {
    free(p->ts), free(p->dims), free(p->names);
    *p = (struct train_pending){.mu = p->mu, .cv = p->cv};
    return err;
  }
  p->running = true;
  if (t->o.ckpt_test_early) { /* Staging done before the next step starts. */
    pthread_mutex_lock(&p->mu);
    while (!p->started) pthread_cond_wait(&p->cv, &p->mu);
    struct stk_ckpt_stage *s = p->stage;
    pthread_mutex_unlock(&p->mu);
    if (s) (void)stk_ckpt_stage_fence(s);
  }
  return 0;
}
