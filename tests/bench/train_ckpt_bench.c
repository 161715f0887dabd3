/*
 * train_ckpt_bench: what a checkpoint costs the FSDP training loop, against
 * a real stoker-checkpoint daemon on this host (shared-memory staging).
 * 4 ranks run as threads of this process, each with its own ring group on
 * loopback and its own checkpoint client, training a model whose shards
 * (parameters and Adam m, v) are large enough that one rank's memcpy takes
 * tens of milliseconds.
 *
 * Rounds; in each, the memcpy baseline (one rank's shard copied by one
 * thread alone into a buffer touched beforehand, median of 3, the ranks
 * idle), then every variant once (order rotating by round): PLAIN steps
 * without a checkpoint, then step S, after which the rank starts a
 * checkpoint, and step S + 1. The variants:
 *   background      what stoker-train does: a pipeline thread per rank
 *                   begins the attempt (rank 0; the others wait for its
 *                   id), stages the live shards (stk_ckpt_stage_start) and
 *                   waits until staged; the update of step S + 1 fences on
 *                   the stage (fsdp_set_before_update)
 *   background_low  the same with the staging thread at nice 19
 *   snapshot        the previous stoker-train: the attempt, a memcpy of
 *                   the shards into a buffer of the rank's and staging from
 *                   it, all in the loop; after step S + 1 the rank waits
 *                   until staged
 * A variant's checkpoint costs (t_S + t_S+1) - 2 x the median plain step
 * of the same round and variant, rank 0's wall times (step S's includes
 * starting the checkpoint, S + 1's the fence and, for snapshot, the wait);
 * the ratio is that over the memcpy baseline of the round, and the JSON
 * holds the median over rounds. Beside it, the blocked ratio: the time the
 * slowest rank's loop was held by the checkpoint itself (starting it, the
 * fence, snapshot's wait), the steps left out, over the memcpy. The pipeline's join, the commit and
 * the delete of each checkpoint run after step S + 1, untimed.
 *
 *   train_ckpt_bench ADDR ROUNDS   (env BENCH_CKPT_CHANNELS, default 1024;
 *                                   BENCH_CKPT_LAYERS, default 4;
 *                                   BENCH_CKPT_PLAIN, default 3)
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_batch.h"
#include "bench_stats.h"
#include "coll.h"
#include "fsdp.h"
#include "ring.h"
#include "stk_error.h"
#include "stoker_admin.h"
#include "stoker_ckpt.h"

#define W          4
#define MAX_ROUNDS 15
#define MAX_PLAIN  8
#define SEQ_LEN    8
#define REPS       3
#define JOB        "bench-train-ckpt"

enum variant { BACKGROUND, BACKGROUND_LOW, SNAPSHOT, NVARIANTS };
static const char *const variant_names[NVARIANTS] = {"background", "background_low", "snapshot"};

static struct model_config cfg = {.vocab_size = 256, .max_seq_len = SEQ_LEN, .n_head = 8};
static const char *addr;
static int rounds, plain;
static pthread_barrier_t bar;
static char attempt[STK_CKPT_ATTEMPT_MAX];
static pthread_mutex_t attempt_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t attempt_cv = PTHREAD_COND_INITIALIZER;
static int attempt_seq;
static int64_t ckpt_step;

/* Per round and variant: rank 0's times; the memcpy baseline per round. */
static double plain_s[MAX_ROUNDS][NVARIANTS][MAX_PLAIN], ckpt_s[MAX_ROUNDS][NVARIANTS];
static double fence_s[MAX_ROUNDS][NVARIANTS], memcpy_s[MAX_ROUNDS];
/* Per rank: the time its loop was held by the checkpoint itself (starting
 * it, the fence, snapshot's wait until staged), without the steps. */
static double blocked_s[MAX_ROUNDS][NVARIANTS][W];
static size_t shard_bytes;
static _Atomic int failed;

struct rank {
  int r, listener;
  const char *const *addrs;
  struct fsdp *f;
  struct stk_client *ckpt;
  enum variant variant;
  struct stk_ckpt_stage *pending; /* The checkpoint started at step S. */
  /* Background variants: the pipeline thread and what the fence needs. */
  pthread_t pipe;
  bool running, started;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct stk_ckpt_stage *stage; /* Set by the pipeline (under mu) once started. */
  int pipe_rc;
  int seen_seq; /* Attempts seen (share_attempt). */
  float *snap;  /* SNAPSHOT's copy of the shards. */
  double fence_wait;
};

static int fence(void *arg) {
  struct rank *k = arg;
  if (!k->running) return 0;
  double t0 = bench_now_s();
  pthread_mutex_lock(&k->mu);
  while (!k->started) pthread_cond_wait(&k->cv, &k->mu);
  struct stk_ckpt_stage *s = k->stage;
  pthread_mutex_unlock(&k->mu);
  int rc = s ? stk_ckpt_stage_fence(s) : 0;
  if (k->fence_wait == 0) k->fence_wait = bench_now_s() - t0;
  return rc;
}

static int step(struct rank *k, int i) {
  static __thread int32_t tokens[SEQ_LEN], targets[SEQ_LEN];
  bench_batch(i, (uint64_t)k->r, cfg.vocab_size, SEQ_LEN, tokens, targets);
  return fsdp_step(k->f, tokens, targets, 1, SEQ_LEN, NULL);
}

/* The rank's shard tensors (param, m, v of every unit), from src or snap. */
static size_t tensors(struct rank *k, bool from_snap, struct stk_ckpt_tensor *ts, uint64_t *dims,
                      char (*names)[32]) {
  size_t n = 0, at = 0;
  for (int u = 0; u < fsdp_unit_count(k->f); u++) {
    struct fsdp_shard sh;
    fsdp_shard(k->f, u, &sh);
    const float *src[3] = {sh.param, sh.adam_m, sh.adam_v};
    for (int j = 0; j < 3; j++, n++) {
      if (from_snap) {
        memcpy(k->snap + at, src[j], sh.count * sizeof(float));
        src[j] = k->snap + at;
        at += sh.count;
      }
      uint64_t *d = dims + 3 * n;
      d[0] = sh.padded_numel, d[1] = sh.offset, d[2] = sh.count;
      snprintf(names[n], 32, "unit%d/%d", u, j);
      ts[n] = (struct stk_ckpt_tensor){names[n],          STK_DTYPE_F32, &d[0],
                                       {1, &d[1], &d[2]}, src[j],        sh.count * sizeof(float)};
    }
  }
  return n;
}

/* Rank 0 begins the attempt and publishes its id; the others wait for it
 * (stoker-train hands it over through the coordinator's KV store). */
static int share_attempt(struct rank *k) {
  int rc = 0;
  pthread_mutex_lock(&attempt_mu);
  if (k->r == 0) {
    ckpt_step++;
    rc = stk_ckpt_begin(k->ckpt, JOB, ckpt_step, W, 30000, attempt);
    if (rc) fprintf(stderr, "begin: %s\n", stk_client_last_error(NULL)), failed = 1;
    attempt_seq++;
    pthread_cond_broadcast(&attempt_cv);
  }
  while (attempt_seq <= k->seen_seq) pthread_cond_wait(&attempt_cv, &attempt_mu);
  k->seen_seq = attempt_seq;
  pthread_mutex_unlock(&attempt_mu);
  return failed ? STK_EIO : rc;
}

static int stage(struct rank *k, bool from_snap, bool low) {
  struct stk_ckpt_tensor ts[3 * 64];
  uint64_t dims[9 * 64];
  char names[3 * 64][32];
  if (fsdp_unit_count(k->f) > 64) return STK_EINVAL;
  size_t n = tensors(k, from_snap, ts, dims, names);
  struct stk_ckpt_stage_opts so = {.low_priority = low};
  return stk_ckpt_stage_start(k->ckpt, attempt, (uint32_t)k->r, ts, n, &so, &k->pending);
}

/* The background variants' pipeline thread: attempt, stage, wait staged. */
static void *pipeline_main(void *arg) {
  struct rank *k = arg;
  int rc = share_attempt(k);
  if (!rc) rc = stage(k, false, k->variant == BACKGROUND_LOW);
  pthread_mutex_lock(&k->mu);
  k->stage = k->pending, k->started = true, k->pipe_rc = rc;
  pthread_cond_broadcast(&k->cv);
  pthread_mutex_unlock(&k->mu);
  if (!rc) rc = stk_ckpt_stage_wait(k->pending, NULL);
  if (rc) fprintf(stderr, "rank %d: stage: %s\n", k->r, stk_client_last_error(NULL));
  k->pipe_rc = rc;
  return NULL;
}

/* Step S's checkpoint: background: the pipeline thread; snapshot: the
 * previous stoker-train (attempt, memcpy of the shards, staged from it). */
static int start_ckpt(struct rank *k, enum variant v) {
  k->variant = v;
  if (v != SNAPSHOT) {
    k->started = false, k->stage = k->pending = NULL;
    k->running = pthread_create(&k->pipe, NULL, pipeline_main, k) == 0;
    return k->running ? 0 : STK_ENOMEM;
  }
  int rc = share_attempt(k);
  return rc ? rc : stage(k, true, false);
}

/* After step S + 1: snapshot waits until staged (the previous stoker-train
 * did, then met the others); background reaps its pipeline untimed later. */
static int after_next_step(struct rank *k) {
  if (k->variant != SNAPSHOT) return 0;
  int rc = stk_ckpt_stage_wait(k->pending, NULL);
  if (rc) fprintf(stderr, "rank %d: stage: %s\n", k->r, stk_client_last_error(NULL));
  return rc;
}

/* Untimed: the pipeline joined, the stage freed. */
static int reap(struct rank *k) {
  int rc = 0;
  if (k->running) pthread_join(k->pipe, NULL), rc = k->pipe_rc;
  k->running = false;
  int rc2 = stk_ckpt_stage_finish(k->pending, NULL);
  k->pending = k->stage = NULL;
  return rc ? rc : rc2;
}

/* Rank 0 commits and deletes the checkpoint (untimed). */
static int commit_ckpt(struct rank *k) {
  int rc = reap(k);
  if (rc) failed = 1;
  pthread_barrier_wait(&bar);
  if (!failed && k->r == 0) {
    rc = stk_ckpt_commit(k->ckpt, attempt, 120000, NULL);
    if (!rc) rc = stk_ckpt_delete(k->ckpt, JOB, ckpt_step, 60000);
    if (rc) fprintf(stderr, "commit: %s\n", stk_client_last_error(NULL)), failed = 1;
  }
  pthread_barrier_wait(&bar);
  return failed ? STK_EIO : 0;
}

/* PLAIN steps, then S (starts the checkpoint) and S + 1 (fences, waits staged). */
static int run_variant(struct rank *k, int round, enum variant v, int *i) {
  double t[MAX_PLAIN];
  for (int p = 0; p < plain; p++) {
    double t0 = bench_now_s();
    if (step(k, (*i)++)) return STK_EIO;
    t[p] = bench_now_s() - t0;
  }
  k->fence_wait = 0;
  double t0 = bench_now_s();
  int rc = step(k, (*i)++);
  double b0 = bench_now_s();
  if (!rc) rc = start_ckpt(k, v);
  double b1 = bench_now_s();
  if (!rc) rc = step(k, (*i)++);
  double b2 = bench_now_s();
  if (!rc) rc = after_next_step(k);
  double dt = bench_now_s() - t0;
  blocked_s[round][v][k->r] = (b1 - b0) + k->fence_wait + (bench_now_s() - b2);
  if (!rc && k->r == 0) {
    memcpy(plain_s[round][v], t, sizeof(t));
    ckpt_s[round][v] = dt;
    fence_s[round][v] = k->fence_wait;
  }
  return rc ? rc : commit_ckpt(k);
}

/* One shard (param, m, v) copied by one thread alone: the median of REPS. */
static double memcpy_shard(void) {
  static char *src, *dst;
  if (!src) {
    src = malloc(shard_bytes), dst = malloc(shard_bytes);
    if (!src || !dst) return -1;
    memset(src, 1, shard_bytes), memset(dst, 2, shard_bytes);
  }
  double v[REPS];
  for (int j = 0; j < REPS; j++) {
    double t0 = bench_now_s();
    memcpy(dst, src, shard_bytes);
    v[j] = bench_now_s() - t0;
  }
  return bench_median(v, REPS);
}

static int rank_body(struct rank *k, struct coll_group *g) {
  struct fsdp_opts fo;
  fsdp_opts_default(&fo);
  struct stk_client_opts co = {.address = addr, .default_timeout_ms = 60000};
  int rc = fsdp_new(&cfg, g, &fo, &k->f);
  if (!rc) rc = stk_ckpt_connect(&co, &k->ckpt);
  if (rc) return rc;
  fsdp_set_before_update(k->f, fence, k);
  size_t bytes = 0;
  for (int u = 0; u < fsdp_unit_count(k->f); u++) {
    struct fsdp_shard sh;
    fsdp_shard(k->f, u, &sh);
    bytes += 3 * sh.count * sizeof(float);
  }
  k->snap = malloc(bytes);
  if (!k->snap) return STK_ENOMEM;
  memset(k->snap, 0, bytes);
  if (k->r == 0) shard_bytes = bytes;
  int i = 0;
  rc = step(k, i++); /* Warm-up. */
  for (int round = 0; !rc && round < rounds; round++) {
    pthread_barrier_wait(&bar);
    if (k->r == 0) memcpy_s[round] = memcpy_shard();
    pthread_barrier_wait(&bar);
    for (int j = 0; !rc && j < NVARIANTS; j++)
      rc = run_variant(k, round, (enum variant)((round + j) % NVARIANTS), &i);
  }
  if (rc) failed = 1;
  free(k->snap);
  stk_client_free(k->ckpt);
  fsdp_free(k->f);
  return rc;
}

static void *rank_main(void *p) {
  struct rank *k = p;
  struct coll_group *g = NULL;
  int rc = ring_group_new(k->r, W, k->addrs, 60000, k->listener, &g);
  if (!rc) rc = rank_body(k, g);
  if (rc) fprintf(stderr, "rank %d: %s\n", k->r, stk_strerror(rc)), failed = 1;
  coll_free(g);
  return NULL;
}

static int env_int(const char *name, int dflt) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : dflt;
}

static double load_avg(void) {
  double l = -1;
  FILE *f = fopen("/proc/loadavg", "r");
  if (f && fscanf(f, "%lf", &l) != 1) l = -1;
  if (f) fclose(f);
  return l;
}

static void print_rounds(const double *v, int n) {
  printf("[");
  for (int j = 0; j < n; j++) printf("%s%.3f", j ? "," : "", v[j]);
  printf("]");
}

int main(int argc, char **argv) {
  addr = argc == 3 ? argv[1] : NULL;
  rounds = argc == 3 ? atoi(argv[2]) : 0;
  cfg.channels = env_int("BENCH_CKPT_CHANNELS", 1024);
  cfg.n_layer = env_int("BENCH_CKPT_LAYERS", 4);
  plain = env_int("BENCH_CKPT_PLAIN", 3);
  if (!addr || rounds < 1 || rounds > MAX_ROUNDS || plain < 1 || plain > MAX_PLAIN ||
      model_config_check(&cfg)) {
    fprintf(stderr, "usage: train_ckpt_bench ADDR ROUNDS (1..%d)\n", MAX_ROUNDS);
    return 2;
  }
  pthread_barrier_init(&bar, NULL, W);
  char addr_buf[W][RING_ADDR_MAX];
  const char *addrs[W];
  struct rank k[W];
  pthread_t th[W];
  double load0 = load_avg();
  for (int r = 0; r < W; r++) {
    k[r] = (struct rank){.r = r, .addrs = addrs};
    pthread_mutex_init(&k[r].mu, NULL);
    pthread_cond_init(&k[r].cv, NULL);
    if (ring_listen("127.0.0.1", &k[r].listener, addr_buf[r])) return 1;
    addrs[r] = addr_buf[r];
  }
  for (int r = 0; r < W; r++) pthread_create(&th[r], NULL, rank_main, &k[r]);
  for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
  if (failed) return 1;
  double ratio[NVARIANTS][MAX_ROUNDS], cost[NVARIANTS][MAX_ROUNDS],
      step_s[MAX_ROUNDS * NVARIANTS * MAX_PLAIN];
  int nsteps = 0;
  for (int round = 0; round < rounds; round++) {
    fprintf(stderr, "round %d: memcpy %.4f s", round, memcpy_s[round]);
    for (int v = 0; v < NVARIANTS; v++) {
      double pm = bench_median(plain_s[round][v], plain);
      for (int p = 0; p < plain; p++) step_s[nsteps++] = plain_s[round][v][p];
      cost[v][round] = ckpt_s[round][v] - 2 * pm;
      ratio[v][round] = cost[v][round] / memcpy_s[round];
      fprintf(stderr,
              "; %s: plain %.3f s, S+S1 %.3f s, cost %.4f s, ratio %.3f, fence %.4f s, "
              "blocked by rank %.4f %.4f %.4f %.4f s",
              variant_names[v], pm, ckpt_s[round][v], cost[v][round], ratio[v][round],
              fence_s[round][v], blocked_s[round][v][0], blocked_s[round][v][1],
              blocked_s[round][v][2], blocked_s[round][v][3]);
    }
    fprintf(stderr, "\n");
  }
  double plain_med = bench_median(step_s, nsteps), mc = bench_median(memcpy_s, rounds);
  printf("{\"bench\":\"trainer\",\"part\":\"checkpoint\",\"ranks\":%d,\"params\":%zu,"
         "\"shard_bytes\":%zu,\"seq_len\":%d,\"rounds\":%d,\"plain_steps\":%d,"
         "\"plain_step_s\":%.4f,\"memcpy_s\":%.4f,\"ckpt_overhead_ratio\":%.3f,"
         "\"ckpt_step_s\":%.4f",
         W, model_param_count(&cfg), shard_bytes, SEQ_LEN, rounds, plain, plain_med, mc,
         bench_median(ratio[BACKGROUND], rounds),
         plain_med + bench_median(cost[BACKGROUND], rounds));
  for (int v = 0; v < NVARIANTS; v++) {
    printf(",\"%s_ratio\":%.3f,\"%s_ratio_rounds\":", variant_names[v],
           bench_median(ratio[v], rounds), variant_names[v]);
    print_rounds(ratio[v], rounds);
    double f[MAX_ROUNDS], b[MAX_ROUNDS];
    for (int r = 0; r < rounds; r++) {
      f[r] = fence_s[r][v], b[r] = 0;
      for (int q = 0; q < W; q++)
        if (blocked_s[r][v][q] > b[r]) b[r] = blocked_s[r][v][q];
      b[r] /= memcpy_s[r];
    }
    printf(",\"%s_fence_s\":%.4f,\"%s_blocked_ratio\":%.3f,\"%s_blocked_ratio_rounds\":",
           variant_names[v], bench_median(f, rounds), variant_names[v], bench_median(b, rounds),
           variant_names[v]);
    print_rounds(b, rounds);
  }
  printf(",\"loadavg_start\":%.2f,\"loadavg_end\":%.2f}\n", load0, load_avg());
  return 0;
}
