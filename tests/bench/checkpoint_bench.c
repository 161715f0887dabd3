/*
 * checkpoint_bench: the checkpoint service's write and restore paths
 * through a real stoker-checkpoint daemon, against baselines measured in
 * the same run (see README.md).
 *
 *   checkpoint_bench --write-file PATH BYTES     the bytes, for curl/the SDK
 *   checkpoint_bench ADDR BYTES CURL_MBPS SDK_MBPS|null
 *
 * One tensor "model" [ROWS x 262144] f32 (1 MiB rows), ROWS = BYTES / 1 MiB,
 * split by rows over 4 ranks (threads, each with its own client/channel,
 * kept for the whole run as a trainer rank keeps its client). Every
 * element's value is a function of its index, so restores are checked.
 *
 * Saves: step 1 over gRPC (STOKER_CKPT_SHM=off: the stall of bytes over
 * the wire), then steps 2..2+STEADY through shared memory (the default when
 * the service is on this host): step 2 is the first shm checkpoint (fresh
 * tmpfs pages), the later ones the steady state a training job sees from
 * its second checkpoint on (segments recycled, still mapped by the
 * client). stall_s and the upload rate are the medians of the steady
 * state; restores read the last step.
 *
 * The stall baseline copies the same bytes with the same parallelism: the
 * 4 shards memcpy'd by 4 threads at once into ordinary buffers touched
 * beforehand (the slowest thread, median of 3), as the 4 ranks stage at
 * once; the single-thread copy of one shard is printed as well.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stoker_ckpt.h"

#define COLS   262144 /* f32 per row: 1 MiB rows. */
#define RANKS  4
#define STEADY 3 /* Steady-state shm checkpoints timed. */
#define REPS   3 /* memcpy baseline repetitions. */

static const char *addr;
static uint64_t rows;
static float *arena; /* [rows x COLS] */
static char attempt[STK_CKPT_ATTEMPT_MAX];
static struct stk_client *rank_client[RANKS]; /* One per saving rank, kept. */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static float value(uint64_t i) {
  return (float)(uint32_t)(i * 2654435761u);
}

static void fill(uint64_t from, uint64_t n) {
  for (uint64_t i = from; i < from + n; i++) arena[i] = value(i);
}

static struct stk_client *client(void) {
  struct stk_client_opts o = {.address = addr, .default_timeout_ms = 3600000};
  struct stk_client *c;
  if (stk_ckpt_connect(&o, &c) < 0) {
    fprintf(stderr, "connect: %s\n", stk_client_last_error(NULL));
    exit(1);
  }
  return c;
}

/* Rows [lo, hi) of a world-w split. */
static void split(uint32_t r, uint32_t w, uint64_t *lo, uint64_t *hi) {
  *lo = rows * r / w;
  *hi = rows * (r + 1) / w;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, size_t n) {
  qsort(v, n, sizeof(*v), cmp_double);
  return v[n / 2];
}

struct job {
  uint32_t rank, world;
  double secs; /* Save: call -> staged. Read: call -> last byte. */
  int err;
};

static void *save_rank(void *arg) {
  struct job *j = arg;
  uint64_t lo, hi, shape[2] = {rows, COLS};
  split(j->rank, RANKS, &lo, &hi);
  uint64_t off[2] = {lo, 0}, sz[2] = {hi - lo, COLS};
  struct stk_ckpt_tensor t = {"model",           STOKER__V1__DTYPE__DTYPE_F32, shape, {2, off, sz},
                              arena + lo * COLS, (hi - lo) * COLS * 4};
  double t0 = now_s();
  j->err = stk_ckpt_save(rank_client[j->rank], attempt, j->rank, &t, 1, NULL);
  j->secs = now_s() - t0;
  if (j->err) fprintf(stderr, "save rank %u: %s\n", j->rank, stk_client_last_error(NULL));
  return NULL;
}

static int64_t save_step = 1;

static void *read_rank(void *arg) {
  struct job *j = arg;
  struct stk_client *c = client();
  uint64_t lo, hi;
  split(j->rank, j->world, &lo, &hi);
  uint64_t off[2] = {lo, 0}, sz[2] = {hi - lo, COLS};
  struct stk_ckpt_want w = {"model", {2, off, sz}, arena + lo * COLS, (hi - lo) * COLS * 4};
  double t0 = now_s();
  j->err = stk_ckpt_read(c, "bench", save_step, &w, 1, 0, NULL);
  j->secs = now_s() - t0;
  if (j->err) fprintf(stderr, "read rank %u: %s\n", j->rank, stk_client_last_error(NULL));
  stk_client_free(c);
  return NULL;
}

/* Runs fn on world threads; returns the wall time and the slowest rank. */
static double run_ranks(void *(*fn)(void *), uint32_t world, double *ret_max) {
  pthread_t th[RANKS];
  struct job jobs[RANKS];
  double t0 = now_s();
  for (uint32_t r = 0; r < world; r++) {
    jobs[r] = (struct job){.rank = r, .world = world};
    pthread_create(&th[r], NULL, fn, &jobs[r]);
  }
  *ret_max = 0;
  for (uint32_t r = 0; r < world; r++) {
    pthread_join(th[r], NULL);
    if (jobs[r].err) exit(1);
    if (jobs[r].secs > *ret_max) *ret_max = jobs[r].secs;
  }
  return now_s() - t0;
}

/* A restore at world ranks, checked element by element. */
static double restore(uint32_t world) {
  memset(arena, 0, rows * COLS * 4);
  double slowest, secs = run_ranks(read_rank, world, &slowest);
  for (uint64_t i = 0; i < rows * COLS; i++)
    if (arena[i] != value(i)) {
      fprintf(stderr, "restore at %u: element %" PRIu64 " differs\n", world, i);
      exit(1);
    }
  return secs;
}

/* ---- memcpy baselines ---- */

struct mc {
  char *dst;
  const char *src;
  size_t n;
  double secs;
};

static void *memcpy_thread(void *arg) {
  struct mc *m = arg;
  double t0 = now_s();
  memcpy(m->dst, m->src, m->n);
  m->secs = now_s() - t0;
  return NULL;
}

/* Each rank's shard (the same bytes as save_rank's) memcpy'd by `threads`
 * threads at once into buffers touched beforehand; the slowest thread's
 * time, median of REPS runs. */
static double memcpy_shards(int threads) {
  pthread_t th[RANKS];
  struct mc m[RANKS];
  double best[REPS];
  for (int r = 0; r < threads; r++) {
    uint64_t lo, hi;
    split((uint32_t)r, RANKS, &lo, &hi);
    size_t n = (hi - lo) * COLS * 4;
    m[r] = (struct mc){.dst = malloc(n), .src = (const char *)(arena + lo * COLS), .n = n};
    if (!m[r].dst) exit(1);
    memset(m[r].dst, 1, n);
  }
  for (int k = 0; k < REPS; k++) {
    for (int r = 0; r < threads; r++) pthread_create(&th[r], NULL, memcpy_thread, &m[r]);
    best[k] = 0;
    for (int r = 0; r < threads; r++) {
      pthread_join(th[r], NULL);
      if (m[r].secs > best[k]) best[k] = m[r].secs;
    }
  }
  for (int r = 0; r < threads; r++) free(m[r].dst);
  return median(best, REPS);
}

/* One checkpoint (Begin, 4 ranks save, Commit): the slowest rank's save
 * call until staged in *ret_stall; returns the whole time. */
static double checkpoint(struct stk_client *c, int64_t step, double *ret_stall) {
  double t0 = now_s();
  if (stk_ckpt_begin(c, "bench", step, RANKS, 0, attempt) < 0) exit(1);
  run_ranks(save_rank, RANKS, ret_stall);
  if (stk_ckpt_commit(c, attempt, 3600000, NULL) < 0) {
    fprintf(stderr, "commit: %s\n", stk_client_last_error(NULL));
    exit(1);
  }
  double secs = now_s() - t0;
  fprintf(stderr, "checkpoint step %" PRId64 ": %.3f s, stall %.3f s\n", step, secs, *ret_stall);
  return secs;
}

static int write_file(const char *path, uint64_t bytes) {
  rows = bytes >> 20;
  arena = malloc(rows * COLS * 4);
  fill(0, rows * COLS);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(arena, 4, rows * COLS, f) != rows * COLS || fclose(f) != 0) return 1;
  return 0;
}

struct figures {
  double upload_grpc_s, upload_s, stall_grpc, stall_first, stall;
};

/* Step 1 over gRPC, step 2 the first shm checkpoint, then STEADY more. */
static void checkpoints(struct figures *f) {
  struct stk_client *c = client();
  for (int r = 0; r < RANKS; r++) rank_client[r] = client();
  const char *mode = getenv(STK_CKPT_SHM_ENV);
  char *saved = mode ? strdup(mode) : NULL;
  setenv(STK_CKPT_SHM_ENV, "off", 1);
  f->upload_grpc_s = checkpoint(c, 1, &f->stall_grpc);
  if (saved)
    setenv(STK_CKPT_SHM_ENV, saved, 1);
  else
    unsetenv(STK_CKPT_SHM_ENV);
  free(saved);
  checkpoint(c, 2, &f->stall_first);
  double up[STEADY], st[STEADY];
  for (int k = 0; k < STEADY; k++) up[k] = checkpoint(c, 3 + k, &st[k]);
  save_step = 2 + STEADY;
  f->upload_s = median(up, STEADY);
  f->stall = median(st, STEADY);
  for (int r = 0; r < RANKS; r++) stk_client_free(rank_client[r]);
  stk_client_free(c);
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--write-file") == 0)
    return write_file(argv[2], strtoull(argv[3], NULL, 10));
  if (argc != 5) {
    fprintf(stderr, "usage: %s ADDR BYTES CURL_MBPS SDK_MBPS|null\n", argv[0]);
    return 2;
  }
  addr = argv[1];
  rows = strtoull(argv[2], NULL, 10) >> 20;
  if (rows < RANKS) return 2;
  uint64_t bytes = rows * COLS * 4;
  double mb = (double)bytes / 1e6, curl = atof(argv[3]);
  bool sdk_ok = strcmp(argv[4], "null") != 0;
  double sdk = sdk_ok ? atof(argv[4]) : 0;
  arena = malloc(bytes);
  fill(0, rows * COLS);
  double memcpy_s = memcpy_shards(RANKS), memcpy_single_s = memcpy_shards(1);

  struct figures f;
  checkpoints(&f);
  double restore_s = restore(RANKS), reshard_s = restore(3);

  double service = mb / f.upload_s, peer = sdk_ok && sdk > curl ? sdk : curl;
  char sdk_txt[32];
  snprintf(sdk_txt, sizeof(sdk_txt), sdk_ok ? "%.1f" : "null", sdk);
  printf("{\"bench\":\"checkpoint\",\"bytes\":%" PRIu64 ",\"ranks\":%d,"
         "\"service_upload_mb_per_s\":%.1f,\"service_upload_grpc_mb_per_s\":%.1f,"
         "\"curl_put_mb_per_s\":%.1f,\"sdk_multipart_mb_per_s\":%s,\"upload_ratio\":%.3f,"
         "\"stall_s\":%.3f,\"memcpy_s\":%.4f,\"stall_ratio\":%.2f,"
         "\"memcpy_single_s\":%.4f,\"stall_single_ratio\":%.2f,"
         "\"stall_first_shm_s\":%.3f,\"stall_grpc_s\":%.3f,\"stall_grpc_ratio\":%.1f,"
         "\"restore_mb_per_s\":%.1f,\"reshard_restore_mb_per_s\":%.1f,\"reshard_ratio\":%.3f}\n",
         bytes, RANKS, service, mb / f.upload_grpc_s, curl, sdk_txt, peer > 0 ? service / peer : 0,
         f.stall, memcpy_s, f.stall / memcpy_s, memcpy_single_s, f.stall / memcpy_single_s,
         f.stall_first, f.stall_grpc, f.stall_grpc / memcpy_s, mb / restore_s, mb / reshard_s,
         restore_s / reshard_s);
  free(arena);
  return 0;
}
