/*
 * dl_docs_bench: what document identities and document blocklists cost on
 * llm.c data. Usage: dl_docs_bench WORK [ROUNDS]. Writes (once) WORK/docs.bin,
 * a synthetic llm.c file of about 110 M uint32 tokens in 200,000 documents,
 * then per round (JSON lines on stdout):
 *   read_units_s    baseline: every unit read once with its pieces
 *                   (dl_source_read_unit_runs: the delimiter scan of a whole read)
 *   index_build_s   the file's document index built from nothing (one scan)
 *   lookup_us       dl_source_unit_docs per unit once the index exists
 *   serve_tps       tokens/s of dl_get_batch, 64 lines x 2049 tokens, no blocklist
 *   serve_blocked_tps  the same job with 1% of the documents blocked from step 0
 * and a summary line with medians, spreads (max - min) and the ratios
 * index_build / read_units and serve_blocked / serve.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_stats.h"
#include "dl_core.h"
#include "dl_source.h"
#include "dl_synthetic.h"

#define DOCS      200000u
#define STEPS     400
#define MAX_ROUND 32

static char g_path[512];

static int open_file(void *arg, const Stoker__V1__DatasetSpec *spec, struct dl_source **ret) {
  (void)arg;
  struct dl_source_opts o = {.name = spec->name,
                             .path = g_path,
                             .format = DL_FORMAT_LLMC,
                             .eot_id = (int64_t)DL_SYNTHETIC_EOT};
  return dl_source_open(&o, ret);
}

/* Seconds to read every unit, to build the index, and per-unit lookups (us). */
static int source_round(double *read_s, double *build_s, double *lookup_us) {
  struct dl_source_opts o = {
      .name = "d", .path = g_path, .format = DL_FORMAT_LLMC, .eot_id = (int64_t)DL_SYNTHETIC_EOT};
  struct dl_source *s;
  if (dl_source_open(&o, &s) < 0) return -1;
  uint64_t units = dl_source_units(s), sum = 0, docs = 0;
  double t0 = bench_now_s();
  for (uint64_t u = 0; u < units; u++) {
    struct dl_unit x;
    if (dl_source_read_unit_runs(s, u, &x) < 0) return -1;
    sum += x.n_tokens;
    dl_unit_free(&x);
  }
  double t1 = bench_now_s();
  if (dl_source_file_docs(s, 0, &docs) < 0 || docs != DOCS) return -1;
  double t2 = bench_now_s();
  for (uint64_t u = 0; u < units; u++) {
    struct dl_unit_docs d;
    if (dl_source_unit_docs(s, u, &d) < 0) return -1;
    sum += d.base;
  }
  double t3 = bench_now_s();
  dl_source_free(s);
  *read_s = t1 - t0;
  *build_s = t2 - t1;
  *lookup_us = (t3 - t2) * 1e6 / (double)units;
  return sum > 0 ? 0 : -1;
}

/* Tokens/s of STEPS steps of a fresh job (1% of documents blocked or not). */
static double serve_round(const char *work, int round, int blocked) {
  char dir[600];
  snprintf(dir, sizeof dir, "%s/db-%d-%d-%d", work, (int)getpid(), round, blocked);
  struct dl_opts o = {.dir = dir, .open_source = open_file};
  struct dl *dl;
  if (dl_open(&o, &dl) < 0) return -1;
  Stoker__V1__StorageRef src = STOKER__V1__STORAGE_REF__INIT;
  Stoker__V1__DatasetSpec ds = STOKER__V1__DATASET_SPEC__INIT, *dsp = &ds;
  Stoker__V1__LoaderSpec spec = STOKER__V1__LOADER_SPEC__INIT;
  src.uri = g_path;
  ds.name = "d";
  ds.source = &src;
  ds.weight = 1;
  spec.job = "b";
  spec.datasets = &dsp;
  spec.n_datasets = 1;
  spec.seq_len = 2048;
  spec.global_batch = 64;
  spec.seed = 1;
  if (dl_create_job(dl, &spec) < 0) return -1;
  if (blocked) {
    static Stoker__V1__DocumentRef refs[DOCS / 100], *ptrs[DOCS / 100];
    for (uint32_t i = 0; i < DOCS / 100; i++) {
      stoker__v1__document_ref__init(&refs[i]);
      refs[i].dataset = "d";
      refs[i].file = "docs.bin";
      refs[i].document = (uint64_t)i * 100 + 37;
      ptrs[i] = &refs[i];
    }
    Stoker__V1__UpdateMixtureRequest r = STOKER__V1__UPDATE_MIXTURE_REQUEST__INIT;
    r.job = "b";
    r.from_step = 0;
    r.block_documents = ptrs;
    r.n_block_documents = DOCS / 100;
    if (dl_update_mixture(dl, &r) < 0) return -1; /* builds the index: outside the timing */
  }
  double t0 = bench_now_s();
  uint64_t tokens = 0;
  for (int64_t step = 0; step < STEPS; step++) {
    struct dl_batch b;
    if (dl_get_batch(dl, "b", step, 0, 1, &b) < 0) return -1;
    tokens += (uint64_t)b.lines * b.line_tokens;
    dl_batch_free(&b);
  }
  double tps = (double)tokens / (bench_now_s() - t0);
  dl_close(dl);
  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd) == 0 ? tps : -1;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: dl_docs_bench WORK [ROUNDS]\n");
    return 2;
  }
  int rounds = argc > 2 ? atoi(argv[2]) : 5;
  if (rounds < 1 || rounds > MAX_ROUND) rounds = 5;
  snprintf(g_path, sizeof g_path, "%s/docs.bin", argv[1]);
  struct stat st;
  if (stat(g_path, &st) != 0 && dl_synthetic_write_llmc(g_path, 0, DOCS, 100, 1000, 3) < 0) {
    fprintf(stderr, "cannot write %s\n", g_path);
    return 1;
  }
  double rd[MAX_ROUND], bd[MAX_ROUND], lk[MAX_ROUND], sv[MAX_ROUND], sb[MAX_ROUND];
  for (int r = 0; r < rounds; r++) {
    if (source_round(&rd[r], &bd[r], &lk[r]) < 0) return 1;
    /* Alternating which job goes first: neither always finds warmer caches. */
    if (r % 2) sb[r] = serve_round(argv[1], r, 1);
    sv[r] = serve_round(argv[1], r, 0);
    if (r % 2 == 0) sb[r] = serve_round(argv[1], r, 1);
    if (sv[r] < 0 || sb[r] < 0) return 1;
    printf("{\"round\":%d,\"read_units_s\":%.4f,\"index_build_s\":%.4f,\"lookup_us\":%.3f,"
           "\"serve_tps\":%.0f,\"serve_blocked_tps\":%.0f}\n",
           r, rd[r], bd[r], lk[r], sv[r], sb[r]);
  }
  double ratio_build[MAX_ROUND], ratio_serve[MAX_ROUND];
  for (int r = 0; r < rounds; r++) {
    ratio_build[r] = bd[r] / rd[r];
    ratio_serve[r] = sb[r] / sv[r];
  }
  double lo_b = ratio_build[0], hi_b = ratio_build[0], lo_s = ratio_serve[0], hi_s = ratio_serve[0];
  for (int r = 1; r < rounds; r++) {
    lo_b = ratio_build[r] < lo_b ? ratio_build[r] : lo_b;
    hi_b = ratio_build[r] > hi_b ? ratio_build[r] : hi_b;
    lo_s = ratio_serve[r] < lo_s ? ratio_serve[r] : lo_s;
    hi_s = ratio_serve[r] > hi_s ? ratio_serve[r] : hi_s;
  }
  printf("{\"summary\":true,\"rounds\":%d,\"index_build_over_read_units\":%.3f,"
         "\"index_build_over_read_units_spread\":[%.3f,%.3f],"
         "\"serve_blocked_over_serve\":%.3f,\"serve_blocked_over_serve_spread\":[%.3f,%.3f],"
         "\"index_build_s\":%.4f,\"lookup_us\":%.3f}\n",
         rounds, bench_median(ratio_build, rounds), lo_b, hi_b, bench_median(ratio_serve, rounds),
         lo_s, hi_s, bench_median(bd, rounds), bench_median(lk, rounds));
  return 0;
}
