/*
 * checkpoint_bench: the checkpoint service's write and restore paths
 * through a real stoker-checkpoint daemon, against baselines measured in
 * the same run, in rounds that interleave baseline and subject (see
 * README.md).
 *
 *   checkpoint_bench --write-file PATH BYTES     the bytes, for curl/the SDK
 *   checkpoint_bench ADDR BYTES BLOB ENDPOINT [SDK_JS MODULES]
 *
 * One tensor "model" [ROWS x 262144] f32 (1 MiB rows), ROWS = BYTES / 1 MiB,
 * split by rows over 4 ranks (threads, each with its own client/channel,
 * kept for the whole run as a trainer rank keeps its client). Every
 * element's value is a function of its index, so restores are checked.
 * BLOB holds the same bytes (--write-file) for the peer clients: `curl -T`
 * and the AWS SDK's multipart Upload (node SDK_JS MODULES ENDPOINT ...).
 *
 * Saves: step 1 over gRPC (STOKER_CKPT_SHM=off: the stall of bytes over
 * the wire), step 2 the first through shared memory (fresh tmpfs pages),
 * then BENCH_ROUNDS (default 3) rounds of the steady state a training job
 * sees from its second checkpoint on (segments recycled, still mapped by
 * the client). Each round runs the curl PUT, the SDK upload and one
 * service checkpoint close together (odd rounds in reverse order), and the
 * memcpy baseline right before the checkpoint; restores alternate the same
 * world and the resharded one the same way. Every ratio is taken within
 * its round and the JSON holds the medians, so a drift of the machine's
 * speed (other processes on the cores) lands on both sides of a ratio.
 * Per-round figures go to stderr.
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
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_stats.h"
#include "stoker_ckpt.h"

#define COLS       262144 /* f32 per row: 1 MiB rows. */
#define RANKS      4
#define MAX_ROUNDS 9
#define REPS       3 /* memcpy baseline repetitions per round. */

static const char *addr;
static uint64_t rows;
static float *arena; /* [rows x COLS] */
static char attempt[STK_CKPT_ATTEMPT_MAX];
static struct stk_client *rank_client[RANKS]; /* One per saving rank, kept. */

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

struct job {
  uint32_t rank, world;
  double secs; /* Save: call -> staged. Read: call -> last byte. */
  int err;
};

/* The last save's page faults and stall per rank (stderr only). */
static long save_faults[RANKS];
static double save_secs[RANKS];

static void *save_rank(void *arg) {
  struct job *j = arg;
  uint64_t lo, hi, shape[2] = {rows, COLS};
  split(j->rank, RANKS, &lo, &hi);
  uint64_t off[2] = {lo, 0}, sz[2] = {hi - lo, COLS};
  struct stk_ckpt_tensor t = {"model",      STK_DTYPE_F32,     shape,
                              {2, off, sz}, arena + lo * COLS, (hi - lo) * COLS * 4};
  struct rusage ru0, ru1;
  getrusage(RUSAGE_THREAD, &ru0);
  double t0 = bench_now_s();
  j->err = stk_ckpt_save(rank_client[j->rank], attempt, j->rank, &t, 1, NULL);
  j->secs = bench_now_s() - t0;
  getrusage(RUSAGE_THREAD, &ru1);
  save_faults[j->rank] = ru1.ru_minflt - ru0.ru_minflt + ru1.ru_majflt - ru0.ru_majflt;
  save_secs[j->rank] = j->secs;
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
  double t0 = bench_now_s();
  j->err = stk_ckpt_read(c, "bench", save_step, &w, 1, 0, NULL);
  j->secs = bench_now_s() - t0;
  if (j->err) fprintf(stderr, "read rank %u: %s\n", j->rank, stk_client_last_error(NULL));
  stk_client_free(c);
  return NULL;
}

/* Runs fn on world threads; returns the wall time and the slowest rank. */
static double run_ranks(void *(*fn)(void *), uint32_t world, double *ret_max) {
  pthread_t th[RANKS];
  struct job jobs[RANKS];
  double t0 = bench_now_s();
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
  return bench_now_s() - t0;
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

static struct mc mcs[RANKS]; /* Destinations allocated and touched once. */

static void *memcpy_thread(void *arg) {
  struct mc *m = arg;
  double t0 = bench_now_s();
  memcpy(m->dst, m->src, m->n);
  m->secs = bench_now_s() - t0;
  return NULL;
}

static void memcpy_init(void) {
  for (int r = 0; r < RANKS; r++) {
    uint64_t lo, hi;
    split((uint32_t)r, RANKS, &lo, &hi);
    size_t n = (hi - lo) * COLS * 4;
    mcs[r] = (struct mc){.dst = malloc(n), .src = (const char *)(arena + lo * COLS), .n = n};
    if (!mcs[r].dst) exit(1);
    memset(mcs[r].dst, 1, n);
  }
}

/* The first `threads` ranks' shards (the same bytes as save_rank's)
 * memcpy'd by that many threads at once; the slowest thread's time,
 * median of REPS runs. */
static double memcpy_shards(int threads) {
  pthread_t th[RANKS];
  double slowest[REPS];
  for (int k = 0; k < REPS; k++) {
    for (int r = 0; r < threads; r++) pthread_create(&th[r], NULL, memcpy_thread, &mcs[r]);
    slowest[k] = 0;
    for (int r = 0; r < threads; r++) {
      pthread_join(th[r], NULL);
      if (mcs[r].secs > slowest[k]) slowest[k] = mcs[r].secs;
    }
  }
  return bench_median(slowest, REPS);
}

/* One checkpoint (Begin, 4 ranks save, Commit): the slowest rank's save
 * call until staged in *ret_stall; returns the whole time. */
static double checkpoint(struct stk_client *c, int64_t step, double *ret_stall) {
  double t0 = bench_now_s();
  if (stk_ckpt_begin(c, "bench", step, RANKS, 0, attempt) < 0) exit(1);
  run_ranks(save_rank, RANKS, ret_stall);
  if (stk_ckpt_commit(c, attempt, 3600000, NULL) < 0) {
    fprintf(stderr, "commit: %s\n", stk_client_last_error(NULL));
    exit(1);
  }
  save_step = step;
  return bench_now_s() - t0;
}

/* ---- peer clients (child processes) ---- */

struct peers {
  const char *blob, *endpoint, *sdk_js, *modules; /* sdk_js NULL: no SDK. */
};

/* Runs argv to its end; its stdout (first line) into out. Returns the
 * wall time, or a negative value if it failed. */
static double run_child(char *const argv[], char *out, size_t out_len) {
  int fd[2];
  if (pipe(fd) != 0) return -1;
  double t0 = bench_now_s();
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fd[1], 1);
    close(fd[0]);
    close(fd[1]);
    execvp(argv[0], argv);
    _exit(127);
  }
  close(fd[1]);
  size_t n = 0;
  ssize_t k;
  while (pid > 0 && (k = read(fd[0], out + n, out_len - 1 - n)) > 0 && n + (size_t)k < out_len - 1)
    n += (size_t)k;
  out[n] = 0;
  close(fd[0]);
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return -1;
  return bench_now_s() - t0;
}

/* One `curl -T` PUT of the blob (unsigned payload, as the service signs). */
static double curl_put(const struct peers *p, double mb) {
  char url[512], out[256];
  snprintf(url, sizeof(url), "%s/bench/curl-put.bin", p->endpoint);
  char *argv[] = {"curl",        "-sf",
                  "-o",          "/dev/null",
                  "-T",          (char *)p->blob,
                  "--aws-sigv4", "aws:amz:us-east-1:s3",
                  "--user",      "S3RVER:S3RVER",
                  "-H",          "x-amz-content-sha256: UNSIGNED-PAYLOAD",
                  url,           NULL};
  double s = run_child(argv, out, sizeof(out));
  if (s <= 0) {
    fprintf(stderr, "curl PUT failed\n");
    exit(1);
  }
  return mb / s;
}

/* The SDK's multipart Upload; its own MB/s (node's start-up excluded),
 * or 0 if it failed. */
static double sdk_upload(const struct peers *p) {
  if (!p->sdk_js) return 0;
  char out[256];
  char *argv[] = {"node",
                  "--no-warnings",
                  (char *)p->sdk_js,
                  (char *)p->modules,
                  (char *)p->endpoint,
                  "bench",
                  "sdk.bin",
                  (char *)p->blob,
                  NULL};
  if (run_child(argv, out, sizeof(out)) < 0) {
    fprintf(stderr, "SDK upload failed\n");
    return 0;
  }
  return atof(out);
}

/* ---- rounds ---- */

struct round {
  double curl, sdk, service;      /* MB/s */
  double stall, memcpy_s, single; /* s */
  double restore, reshard;        /* s */
};

struct figures {
  double upload_grpc_s, stall_grpc, stall_first;
  int n;
  struct round r[MAX_ROUNDS];
};

/* Every timed phase starts with the disk quiet: s3rver keeps objects in
 * files, and the kernel's write-back of the gigabytes the previous upload
 * left dirty would otherwise take cores and memory bandwidth from the next
 * phase (the memcpy baselines and a stall of a fraction of a second
 * included). */
static void quiesce(void) {
  sync();
}

/* The service's part of a round: the memcpy baselines right before one
 * steady-state checkpoint. */
static void service_round(struct stk_client *c, int64_t step, double mb, struct round *r) {
  quiesce();
  r->memcpy_s = memcpy_shards(RANKS);
  r->single = memcpy_shards(1);
  r->service = mb / checkpoint(c, step, &r->stall);
}

/* Round k: curl, SDK, service; odd rounds the other way round. */
static void upload_round(struct stk_client *c, const struct peers *p, int k, double mb,
                         struct round *r) {
  if (k % 2) service_round(c, 3 + k, mb, r);
  quiesce();
  r->curl = curl_put(p, mb);
  quiesce();
  r->sdk = sdk_upload(p);
  if (k % 2 == 0) service_round(c, 3 + k, mb, r);
  double peer = r->sdk > r->curl ? r->sdk : r->curl;
  fprintf(stderr,
          "round %d: service %.1f MB/s, curl %.1f, sdk %.1f (ratio %.3f); stall %.3f s, "
          "memcpy %.4f s (ratio %.2f), one thread %.4f s; ranks %.3f %.3f %.3f %.3f s, "
          "faults %ld %ld %ld %ld\n",
          k, r->service, r->curl, r->sdk, r->service / peer, r->stall, r->memcpy_s,
          r->stall / r->memcpy_s, r->single, save_secs[0], save_secs[1], save_secs[2], save_secs[3],
          save_faults[0], save_faults[1], save_faults[2], save_faults[3]);
}

/* Step 1 over gRPC, step 2 the first shm checkpoint, then the rounds. */
static void checkpoints(const struct peers *p, double mb, struct figures *f) {
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
  double first = checkpoint(c, 2, &f->stall_first);
  fprintf(stderr, "gRPC checkpoint %.1f MB/s, stall %.3f s; first shm %.1f MB/s, stall %.3f s\n",
          mb / f->upload_grpc_s, f->stall_grpc, mb / first, f->stall_first);
  for (int k = 0; k < f->n; k++) upload_round(c, p, k, mb, &f->r[k]);
  for (int r = 0; r < RANKS; r++) stk_client_free(rank_client[r]);
  stk_client_free(c);
}

/* Same-world and resharded restores of the last step, alternating. */
static void restores(double mb, struct figures *f) {
  quiesce();
  for (int k = 0; k < f->n; k++) {
    struct round *r = &f->r[k];
    if (k % 2) r->reshard = restore(3);
    r->restore = restore(RANKS);
    if (k % 2 == 0) r->reshard = restore(3);
    fprintf(stderr, "restore round %d: 4 ranks %.1f MB/s, 3 ranks %.1f MB/s (ratio %.3f)\n", k,
            mb / r->restore, mb / r->reshard, r->restore / r->reshard);
  }
}

static int write_file(const char *path, uint64_t bytes) {
  rows = bytes >> 20;
  arena = malloc(rows * COLS * 4);
  fill(0, rows * COLS);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(arena, 4, rows * COLS, f) != rows * COLS || fclose(f) != 0) return 1;
  return 0;
}

/* The median over rounds of one figure. */
#define MEDIAN_OF(f, expr)                                                                         \
  ({                                                                                               \
    double v_[MAX_ROUNDS];                                                                         \
    for (int k_ = 0; k_ < (f)->n; k_++) {                                                          \
      const struct round *r = &(f)->r[k_];                                                         \
      v_[k_] = (expr);                                                                             \
    }                                                                                              \
    bench_median(v_, (size_t)(f)->n);                                                              \
  })

static void print_json(uint64_t bytes, double mb, bool sdk_ok, const struct figures *f) {
  double service = MEDIAN_OF(f, r->service), curl = MEDIAN_OF(f, r->curl);
  double sdk = MEDIAN_OF(f, r->sdk), stall = MEDIAN_OF(f, r->stall);
  double mc = MEDIAN_OF(f, r->memcpy_s), single = MEDIAN_OF(f, r->single);
  char sdk_txt[32];
  snprintf(sdk_txt, sizeof(sdk_txt), sdk_ok ? "%.1f" : "null", sdk);
  printf("{\"bench\":\"checkpoint\",\"bytes\":%" PRIu64 ",\"ranks\":%d,\"rounds\":%d,"
         "\"service_upload_mb_per_s\":%.1f,\"service_upload_grpc_mb_per_s\":%.1f,"
         "\"curl_put_mb_per_s\":%.1f,\"sdk_multipart_mb_per_s\":%s,\"upload_ratio\":%.3f,"
         "\"stall_s\":%.3f,\"memcpy_s\":%.4f,\"stall_ratio\":%.2f,"
         "\"memcpy_single_s\":%.4f,\"stall_single_ratio\":%.2f,"
         "\"stall_first_shm_s\":%.3f,\"stall_grpc_s\":%.3f,\"stall_grpc_ratio\":%.1f,"
         "\"restore_mb_per_s\":%.1f,\"reshard_restore_mb_per_s\":%.1f,\"reshard_ratio\":%.3f}\n",
         bytes, RANKS, f->n, service, mb / f->upload_grpc_s, curl, sdk_txt,
         MEDIAN_OF(f, r->service / (r->sdk > r->curl ? r->sdk : r->curl)), stall, mc,
         MEDIAN_OF(f, r->stall / r->memcpy_s), single, MEDIAN_OF(f, r->stall / r->single),
         f->stall_first, f->stall_grpc, f->stall_grpc / mc, mb / MEDIAN_OF(f, r->restore),
         mb / MEDIAN_OF(f, r->reshard), MEDIAN_OF(f, r->restore / r->reshard));
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--write-file") == 0)
    return write_file(argv[2], strtoull(argv[3], NULL, 10));
  if (argc != 5 && argc != 7) {
    fprintf(stderr, "usage: %s ADDR BYTES BLOB ENDPOINT [SDK_JS MODULES]\n", argv[0]);
    return 2;
  }
  addr = argv[1];
  rows = strtoull(argv[2], NULL, 10) >> 20;
  if (rows < RANKS) return 2;
  struct peers p = {argv[3], argv[4], argc == 7 ? argv[5] : NULL, argc == 7 ? argv[6] : NULL};
  struct figures f = {.n = getenv("BENCH_ROUNDS") ? atoi(getenv("BENCH_ROUNDS")) : 3};
  if (f.n < 1 || f.n > MAX_ROUNDS) return 2;
  uint64_t bytes = rows * COLS * 4;
  double mb = (double)bytes / 1e6;
  arena = malloc(bytes);
  fill(0, rows * COLS);
  memcpy_init();

  checkpoints(&p, mb, &f);
  restores(mb, &f);
  print_json(bytes, mb, p.sdk_js != NULL, &f);
  return 0;
}
