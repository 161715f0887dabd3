/*
 * ckpt_restore_bench: what a resharded restore of an FSDP checkpoint costs
 * in requests and time, against a whole-object read of the same objects
 * (issue 26, item 2). Run by `tests/bench/run checkpoint` after
 * checkpoint_bench, on the same daemon and s3rver:
 *
 *   ckpt_restore_bench ADDR STORAGE_URL REQUEST_LOG [save|restore|whole]
 *
 * The checkpoint, as FSDP writes one: N_TENSORS f32 tensors of ROWS x COLS
 * (a model's parameters and optimizer state, 7.5 MiB), each sharded by rows
 * over 4 ranks, every rank saving its row-block of every tensor (160 chunks
 * of 12 KiB a rank, one object a rank). Restored at world 3: each rank (a
 * thread with its own client) reads its third of every tensor in one
 * stk_ckpt_read, as a restoring trainer does; its boxes cross two ranks'
 * chunks. Every element is checked.
 *
 * Requests are counted in s3rver's request log (REQUEST_LOG, written by
 * s3rver_launch.js): ranged GETs of the rank objects during the restore,
 * over the objects each restoring rank touches, summed over the ranks. The
 * baseline: the same ranks, threads at once, each GETting whole the objects
 * its box touches (the service's own S3 client, storage_get), so the same
 * objects are read with the same parallelism in one request each.
 *
 * The headline restore does what a restoring rank does (DCP's StokerReader:
 * GetManifest on its client, then the Read, on the connection GetManifest
 * used): each reader's client is connected before the timer, as the
 * baseline's S3 connections are (kept for the run, connected by an untimed
 * restore first), and the timer holds its GetManifest and its Read. Each
 * round also restores through a new client per rank, connected inside the
 * timed Read (the headline until 2026-11-29, kept as a second figure).
 * Rounds (BENCH_ROUNDS, default 3, at most MAX_ROUNDS) rotate the order;
 * the JSON holds medians, the ratios' quartiles and every round's figures.
 *
 * A phase argument runs one part alone, for profiling each side's process
 * by itself (valgrind --tool=callgrind on the daemon or on this program):
 * `save` saves the checkpoint and exits; `restore` and `whole` run only
 * BENCH_ROUNDS restores, or whole-object reads, of the checkpoint a `save`
 * left, and print their median time (`restore`: through a new client per
 * rank and round, Read only, as the instruction counts before 2026-11-29
 * were taken).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_stats.h"
#include "stk_error.h"
#include "stoker_admin.h"
#include "stoker_ckpt.h"
#include "storage.h"

#define N_TENSORS  160
#define ROWS       64
#define COLS       192 /* 48 KiB a tensor, 12 KiB a chunk of a saving rank. */
#define SAVERS     4
#define READERS    3
#define MAX_ROUNDS 64
#define JOB        "restore-bench"
#define STEP       7

static const char *addr;
static float *model; /* [N_TENSORS][ROWS][COLS] */
static float *back;  /* The same, restored. */
static struct storage *st;
/* The checkpoint's objects and the saving rank of each. */
#define MAX_OBJECTS 64
static struct object {
  char key[STORAGE_KEY_MAX + 1];
  uint32_t saver;
} objects[MAX_OBJECTS];
static unsigned n_objects;

/* Each restoring rank's client kept for the run (connected by a first,
 * untimed restore), as a trainer's rank has its own connected when it reads
 * (StokerReader's GetManifest came first); unless use_kept, each restore
 * connects a new one (its channel's connection inside the timed read). */
static struct stk_client *kept[READERS];
static bool use_kept;

static float value(uint64_t i) {
  return (float)(uint32_t)(i * 2654435761u + 12345u);
}

static struct stk_client *client(void) {
  struct stk_client_opts o = {.address = addr, .default_timeout_ms = 600000};
  struct stk_client *c;
  if (stk_ckpt_connect(&o, &c) < 0) {
    fprintf(stderr, "connect: %s\n", stk_client_last_error(NULL));
    exit(1);
  }
  return c;
}

/* Rows [lo, hi) of rank r in world w. */
static void split(uint32_t r, uint32_t w, uint64_t *lo, uint64_t *hi) {
  *lo = (uint64_t)ROWS * r / w;
  *hi = (uint64_t)ROWS * (r + 1) / w;
}

static void tensor_name(size_t i, char *buf, size_t len) {
  snprintf(buf, len, "layers.%zu.%s", i / 3,
           (const char *[]){"weight", "exp_avg", "exp_avg_sq"}[i % 3]);
}

struct job {
  uint32_t rank;
  const char *attempt;
  double secs;
  int err;
};

/* ---- Save: 4 ranks, a row-block of every tensor each ---- */

static void *save_rank(void *arg) {
  struct job *j = arg;
  struct stk_client *c = client();
  uint64_t lo, hi, shape[2] = {ROWS, COLS};
  split(j->rank, SAVERS, &lo, &hi);
  static char names[SAVERS][N_TENSORS][32];
  uint64_t off[2] = {lo, 0}, sz[2] = {hi - lo, COLS};
  struct stk_ckpt_tensor *t = calloc(N_TENSORS, sizeof(*t));
  for (size_t i = 0; i < N_TENSORS; i++) {
    tensor_name(i, names[j->rank][i], sizeof(names[0][0]));
    t[i] = (struct stk_ckpt_tensor){
        names[j->rank][i],   STK_DTYPE_F32, shape, {2, off, sz}, model + (i * ROWS + lo) * COLS,
        (hi - lo) * COLS * 4};
  }
  j->err = stk_ckpt_save(c, j->attempt, j->rank, t, N_TENSORS, NULL);
  if (j->err) fprintf(stderr, "save rank %u: %s\n", j->rank, stk_client_last_error(NULL));
  free(t);
  stk_client_free(c);
  return NULL;
}

/* ---- Restore: 3 ranks, one read of every tensor each ---- */

static void *read_rank(void *arg) {
  struct job *j = arg;
  struct stk_client *c = use_kept ? kept[j->rank] : client();
  uint64_t lo, hi;
  split(j->rank, READERS, &lo, &hi);
  static char names[READERS][N_TENSORS][32];
  uint64_t off[2] = {lo, 0}, sz[2] = {hi - lo, COLS};
  struct stk_ckpt_want *w = calloc(N_TENSORS, sizeof(*w));
  for (size_t i = 0; i < N_TENSORS; i++) {
    tensor_name(i, names[j->rank][i], sizeof(names[0][0]));
    w[i] = (struct stk_ckpt_want){
        names[j->rank][i], {2, off, sz}, back + (i * ROWS + lo) * COLS, (hi - lo) * COLS * 4};
  }
  double t0 = bench_now_s();
  Stoker__V1__Manifest *m = NULL;
  if (use_kept) j->err = stk_ckpt_get_manifest(c, JOB, STEP, 0, &m); /* As StokerReader. */
  if (!j->err) j->err = stk_ckpt_read(c, JOB, STEP, w, N_TENSORS, 0, NULL);
  j->secs = bench_now_s() - t0;
  if (m) protobuf_c_message_free_unpacked(&m->base, NULL);
  if (j->err) fprintf(stderr, "read rank %u: %s\n", j->rank, stk_client_last_error(NULL));
  free(w);
  if (!use_kept) stk_client_free(c);
  return NULL;
}

/* ---- Baseline: the objects each reader touches, GET whole ---- */

static bool touches(uint32_t reader, uint32_t saver) {
  uint64_t rlo, rhi, slo, shi;
  split(reader, READERS, &rlo, &rhi);
  split(saver, SAVERS, &slo, &shi);
  return rlo < shi && slo < rhi;
}

static void *whole_rank(void *arg) {
  struct job *j = arg;
  size_t cap = (size_t)N_TENSORS * ROWS * COLS * 4;
  uint8_t *buf = malloc(cap);
  memset(buf, 0, cap); /* Touched, as the restore's destination is. */
  double t0 = bench_now_s();
  for (unsigned i = 0; i < n_objects && !j->err; i++) {
    size_t got;
    if (touches(j->rank, objects[i].saver))
      j->err = storage_get(st, objects[i].key, 0, buf, cap, &got);
  }
  j->secs = bench_now_s() - t0;
  if (j->err) fprintf(stderr, "whole read: %s\n", stk_strerror(j->err));
  free(buf);
  return NULL;
}

/* Runs fn on n threads; the slowest one's time (its call alone: thread
 * start and connecting are left out). */
static double run_ranks(void *(*fn)(void *), uint32_t n, const char *attempt) {
  pthread_t th[SAVERS];
  struct job jobs[SAVERS];
  for (uint32_t r = 0; r < n; r++) {
    jobs[r] = (struct job){.rank = r, .attempt = attempt};
    pthread_create(&th[r], NULL, fn, &jobs[r]);
  }
  double slowest = 0;
  for (uint32_t r = 0; r < n; r++) {
    pthread_join(th[r], NULL);
    if (jobs[r].err) exit(1);
    if (jobs[r].secs > slowest) slowest = jobs[r].secs;
  }
  return slowest;
}

/* ---- Counting requests ---- */

/* Ranged GETs of the checkpoint's rank objects in the log from byte *at on
 * (moved to its end). */
static uint64_t count_gets(const char *log, long *at) {
  FILE *fp = fopen(log, "r");
  if (!fp || fseek(fp, *at, SEEK_SET) != 0) {
    fprintf(stderr, "request log %s: cannot read\n", log);
    exit(1);
  }
  char line[4096];
  uint64_t gets = 0;
  while (fgets(line, sizeof(line), fp))
    if (strncmp(line, "GET ", 4) == 0 && strstr(line, JOB) && strstr(line, "/rank-")) gets++;
  *at = ftell(fp);
  fclose(fp);
  return gets;
}

static int find_key(void *arg, const char *key, uint64_t size_bytes) {
  (void)arg;
  (void)size_bytes;
  const char *r = strstr(key, "/rank-");
  unsigned rank;
  if (!strstr(key, JOB "/") || !r || sscanf(r, "/rank-%5u-", &rank) != 1 || rank >= SAVERS)
    return 0;
  if (n_objects == MAX_OBJECTS) return STK_ENOMEM;
  objects[n_objects].saver = rank;
  snprintf(objects[n_objects++].key, sizeof(objects[0].key), "%s", key);
  return 0;
}

static void save(struct stk_client *c) {
  char attempt[STK_CKPT_ATTEMPT_MAX];
  if (stk_ckpt_begin(c, JOB, STEP, SAVERS, 0, attempt) < 0) exit(1);
  run_ranks(save_rank, SAVERS, attempt);
  if (stk_ckpt_commit(c, attempt, 600000, NULL) < 0) {
    fprintf(stderr, "commit: %s\n", stk_client_last_error(NULL));
    exit(1);
  }
}

/* The checkpoint's rank objects, from the store's listing. */
static void find_objects(void) {
  if (storage_list(st, "", find_key, NULL) != 0 || n_objects < SAVERS) {
    fprintf(stderr, "the checkpoint's objects: %u found\n", n_objects);
    exit(1);
  }
}

/* A restore by every reader, checked; the slowest reader's time. With
 * kept_clients, through the clients kept for the run, GetManifest and Read
 * (the headline); else a new client each, Read only. */
static double restore(bool kept_clients) {
  use_kept = kept_clients;
  memset(back, 0, (size_t)N_TENSORS * ROWS * COLS * 4);
  double secs = run_ranks(read_rank, READERS, NULL);
  for (uint64_t i = 0; i < (uint64_t)N_TENSORS * ROWS * COLS; i++)
    if (back[i] != model[i]) {
      fprintf(stderr, "restore: element %" PRIu64 " differs\n", i);
      exit(1);
    }
  return secs;
}

/* One part alone (the phase argument), for profiling: its rounds' median. */
static int run_phase(const char *phase, int rounds) {
  bool is_save = strcmp(phase, "save") == 0, is_restore = strcmp(phase, "restore") == 0;
  if (!is_save && !is_restore && strcmp(phase, "whole") != 0) {
    fprintf(stderr, "phase %s: save, restore or whole\n", phase);
    return 2;
  }
  if (is_save) {
    struct stk_client *c = client();
    save(c);
    stk_client_free(c);
    return 0;
  }
  find_objects();
  double secs[MAX_ROUNDS];
  for (int k = 0; k < rounds; k++)
    secs[k] = is_restore ? restore(false) : run_ranks(whole_rank, READERS, NULL);
  printf("{\"bench\":\"checkpoint_restore\",\"phase\":\"%s\",\"rounds\":%d,\"%s_s\":%.4f}\n", phase,
         rounds, is_restore ? "restore" : "whole_read", bench_median(secs, rounds));
  return 0;
}

/* Every round's figure as a JSON list. */
static void print_list(const char *key, const double *v, int n) {
  printf(",\"%s\":[", key);
  for (int k = 0; k < n; k++) printf("%s%.3g", k ? "," : "", v[k]);
  printf("]");
}

int main(int argc, char **argv) {
  if (argc != 4 && argc != 5) {
    fprintf(stderr, "usage: %s ADDR STORAGE_URL REQUEST_LOG [save|restore|whole]\n", argv[0]);
    return 2;
  }
  addr = argv[1];
  const char *log = argv[3];
  int rounds = getenv("BENCH_ROUNDS") ? atoi(getenv("BENCH_ROUNDS")) : 3;
  if (rounds < 1 || rounds > MAX_ROUNDS) {
    fprintf(stderr, "BENCH_ROUNDS: 1 to %d\n", MAX_ROUNDS);
    return 2;
  }
  if (storage_open(argv[2], &st) != 0) {
    fprintf(stderr, "storage %s: %s\n", argv[2], stk_detail());
    return 1;
  }
  uint64_t n = (uint64_t)N_TENSORS * ROWS * COLS;
  model = malloc(n * 4);
  back = malloc(n * 4);
  for (uint64_t i = 0; i < n; i++) model[i] = value(i);
  if (argc == 5) {
    int rc = run_phase(argv[4], rounds);
    storage_free(st);
    free(model);
    free(back);
    return rc;
  }
  struct stk_client *c = client();
  save(c);
  find_objects();
  unsigned touched = 0; /* Objects the readers touch, summed over them. */
  for (uint32_t r = 0; r < READERS; r++)
    for (unsigned i = 0; i < n_objects; i++) touched += touches(r, objects[i].saver);
  for (uint32_t r = 0; r < READERS; r++) kept[r] = client();
  restore(true); /* Connects the kept clients (untimed). */
  double ratio[MAX_ROUNDS], rest[MAX_ROUNDS], whole[MAX_ROUNDS], gets[MAX_ROUNDS];
  double fratio[MAX_ROUNDS], frest[MAX_ROUNDS];
  long at = 0;
  count_gets(log, &at);
  for (int k = 0; k < rounds; k++) {
    /* Whole read, restore, restore through new clients: the order rotates
     * by round. */
    for (int i = 0; i < 3; i++) {
      switch ((i + k) % 3) {
      case 0:
        whole[k] = run_ranks(whole_rank, READERS, NULL);
        count_gets(log, &at);
        break;
      case 1:
        rest[k] = restore(true);
        gets[k] = (double)count_gets(log, &at);
        break;
      default:
        frest[k] = restore(false);
        count_gets(log, &at);
        break;
      }
    }
    ratio[k] = rest[k] / whole[k];
    fratio[k] = frest[k] / whole[k];
    fprintf(stderr,
            "restore round %d: %.0f GETs of %u objects, %.3f s (new clients %.3f s); whole-object "
            "read %.3f s\n",
            k, gets[k], touched, rest[k], frest[k], whole[k]);
  }
  double sorted[MAX_ROUNDS];
  memcpy(sorted, ratio, sizeof(ratio));
  double q1 = bench_quantile_sort(sorted, rounds, 0.25);
  double q3 = bench_quantile_sort(sorted, rounds, 0.75);
  memcpy(sorted, fratio, sizeof(fratio));
  double fq1 = bench_quantile_sort(sorted, rounds, 0.25);
  double fq3 = bench_quantile_sort(sorted, rounds, 0.75);
  printf("{\"bench\":\"checkpoint_restore\",\"tensors\":%d,\"bytes\":%" PRIu64
         ",\"saved_ranks\":%d,\"restore_ranks\":%d,\"rounds\":%d,\"objects_touched\":%u,"
         "\"objects\":%u,\"restore_gets\":%.0f,\"restore_gets_per_object\":%.2f,\"restore_s\":%.4f,"
         "\"whole_read_s\":%.4f,\"restore_vs_whole_read_ratio\":%.2f,"
         "\"restore_vs_whole_read_ratio_spread\":[%.2f,%.2f],\"restore_fresh_client_s\":%.4f,"
         "\"restore_fresh_client_vs_whole_read_ratio\":%.2f,"
         "\"restore_fresh_client_vs_whole_read_ratio_spread\":[%.2f,%.2f]",
         N_TENSORS, n * 4, SAVERS, READERS, rounds, touched, n_objects, bench_median(gets, rounds),
         bench_median(gets, rounds) / touched, bench_median(rest, rounds),
         bench_median(whole, rounds), bench_median(ratio, rounds), q1, q3,
         bench_median(frest, rounds), bench_median(fratio, rounds), fq1, fq3);
  print_list("restore_vs_whole_read_ratio_rounds", ratio, rounds);
  print_list("restore_fresh_client_vs_whole_read_ratio_rounds", fratio, rounds);
  print_list("restore_s_rounds", rest, rounds);
  print_list("restore_fresh_client_s_rounds", frest, rounds);
  print_list("whole_read_s_rounds", whole, rounds);
  printf("}\n");
  for (uint32_t r = 0; r < READERS; r++) stk_client_free(kept[r]);
  stk_client_free(c);
  storage_free(st);
  free(model);
  free(back);
  return 0;
}
