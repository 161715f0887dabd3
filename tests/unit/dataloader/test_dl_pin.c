/*
 * test_dl_pin: pins the exact bytes the core serves. The checksums below
 * were taken from the straightforward per-token implementation before the
 * serve path was optimised (borrowed llm.c runs, vectorised delimiter
 * scans); any change to the tokens, document starts or provenance of the
 * first steps of these jobs fails here. The tokens and document starts
 * alone (want_bytes) are still those first checksums; Explain's (want) were
 * re-taken when it started naming real documents (file, index in the file)
 * with one entry per document piece (test_dl_explain checks them against
 * the files). Jobs: a synthetic corpus; llm.c
 * uint32 files (delimiters dropped, small blocks so documents straddle
 * them); an llm.c uint16 file with strip ids at document edges; the same
 * with BOS/EOS inserted. Also: batches split over two threads are the
 * same bytes as those made on one.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <sys/stat.h>

#include "dl_internal.h"
#include "dl_synthetic.h"
#include "dl_test.h"
#include "stk_error.h"

#define STEPS    24
#define U16_EOT  50256u
#define U16_TOKS 20000u

static const uint32_t STRIP[] = {9, 7};

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * UINT64_C(0x100000001b3);
  return h;
}

/* Opens llm.c datasets with the delimiter and strip ids the test needs
 * (the default opener knows neither). */
static int open_test_source(void *arg, const Stoker__V1__DatasetSpec *spec,
                            struct dl_source **ret) {
  (void)arg;
  const char *uri = spec->source->uri;
  if (strncmp(uri, "synthetic:", 10) == 0) return dl_default_open_source(NULL, spec, ret);
  size_t n = strlen(uri);
  bool u16 = n > 8 && strcmp(uri + n - 8, "/u16.bin") == 0;
  struct dl_source_opts o = {.name = spec->name,
                             .path = uri,
                             .format = DL_FORMAT_LLMC,
                             .block_tokens = spec->block_tokens,
                             .eot_id = u16 ? (int64_t)U16_EOT : (int64_t)DL_SYNTHETIC_EOT,
                             .strip_ids = u16 ? STRIP : NULL,
                             .n_strip_ids = u16 ? 2 : 0};
  return dl_source_open(&o, ret);
}

/* A uint16 llm.c file of small token ids (so strip ids are frequent at
 * document edges) with delimiters at pseudo-random gaps, some adjacent. */
static void write_u16(const char *path) {
  uint16_t *t = malloc(U16_TOKS * sizeof *t);
  uint64_t x = 12345;
  for (uint32_t i = 0; i < U16_TOKS; i++) {
    uint32_t r = t_lcg(&x);
    t[i] = r % 97 == 0 ? U16_EOT : (uint16_t)(r % 12);
  }
  t_write_llmc(path, t, U16_TOKS, 2);
  free(t);
}

struct job {
  const char *name, *uri;
  uint32_t block_tokens;
  bool markers;
  uint64_t want_bytes; /* tokens and document starts only */
  uint64_t want;       /* the same with Explain's fields */
};

static void create(struct dl *dl, const struct job *jb) {
  Stoker__V1__StorageRef src = STOKER__V1__STORAGE_REF__INIT;
  Stoker__V1__DatasetSpec ds = STOKER__V1__DATASET_SPEC__INIT, *dsp = &ds;
  Stoker__V1__LoaderSpec s = STOKER__V1__LOADER_SPEC__INIT;
  src.uri = (char *)jb->uri;
  ds.name = "d";
  ds.source = &src;
  ds.weight = 1;
  ds.format = STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_LLMC;
  ds.block_tokens = jb->block_tokens;
  s.job = (char *)jb->name;
  s.datasets = &dsp;
  s.n_datasets = 1;
  s.seq_len = 45;
  s.global_batch = 16;
  s.seed = 99;
  s.logical_shards = 16;
  s.lanes = 4;
  s.add_bos = s.add_eos = jb->markers;
  s.bos_id = 60001;
  s.eos_id = 60002;
  assert_int_equal(dl_create_job(dl, &s), 0);
}

static uint64_t hash_step(struct dl *dl, const char *job, int64_t step, uint64_t h, bool explain) {
  struct dl_batch b;
  Stoker__V1__ExplainResponse *e;
  assert_int_equal(dl_get_batch(dl, job, step, 0, 1, &b), 0);
  h = fnv(h, b.tokens, (size_t)b.lines * b.line_tokens * 4);
  h = fnv(h, b.doc_starts, b.n_doc_starts * 4);
  dl_batch_free(&b);
  if (!explain) return h;
  assert_int_equal(dl_explain(dl, job, step, 0, 1, &e), 0);
  for (size_t i = 0; i < e->n_sources; i++) {
    const Stoker__V1__LineSource *r = e->sources[i];
    uint64_t f[8] = {r->line, r->document, r->token_begin,     r->token_end,
                     r->unit, r->epoch,    r->doc_token_begin, r->doc_token_end};
    h = fnv(h, f, sizeof f);
    h = fnv(h, r->file, strlen(r->file));
  }
  dl_explain_free(e);
  return h;
}

static void test_pinned_bytes(void **state) {
  (void)state;
  char *dir = t_tmpdir(), path[512], u32dir[256], db[256];
  snprintf(u32dir, sizeof u32dir, "%s/u32", dir);
  assert_int_equal(mkdir(u32dir, 0755), 0);
  for (int f = 0; f < 2; f++) {
    snprintf(path, sizeof path, "%s/part_%d.bin", u32dir, f);
    assert_int_equal(dl_synthetic_write_llmc(path, (uint64_t)f * 150, 150, 1, 90, 5), 0);
  }
  char u16[256];
  snprintf(u16, sizeof u16, "%s/u16.bin", dir);
  write_u16(u16);
  snprintf(db, sizeof db, "%s/db", dir);
  struct dl_opts o = {.dir = db, .open_source = open_test_source};
  struct dl *dl;
  assert_int_equal(dl_open(&o, &dl), 0);
  const struct job jobs[] = {
      {"syn", "synthetic:400:8:64:7", 0, false, UINT64_C(0x07809e84a5cf49af),
       UINT64_C(0x35c6a11578cc967a)},
      {"u32", u32dir, 37, false, UINT64_C(0x7d3862a91264c735), UINT64_C(0x09c0cf4daad152a4)},
      {"u32big", u32dir, 1000, false, UINT64_C(0x559afe77d2c7585c), UINT64_C(0xb34ea10af73b1c84)},
      {"u16", u16, 29, false, UINT64_C(0x34507b959480808f), UINT64_C(0xa38e287218dd3f77)},
      {"u16m", u16, 64, true, UINT64_C(0xa94755d6e56482f1), UINT64_C(0x4ac6cbc4eec9bf86)},
  };
  bool bad = false;
  for (size_t i = 0; i < sizeof jobs / sizeof jobs[0]; i++) {
    create(dl, &jobs[i]);
    uint64_t h[2];
    for (int x = 0; x < 2; x++) {
      h[x] = UINT64_C(0xcbf29ce484222325);
      for (int64_t s = 0; s < STEPS; s++) h[x] = hash_step(dl, jobs[i].name, s, h[x], x);
      h[x] = hash_step(dl, jobs[i].name, 3, h[x], x); /* a replay from a snapshot */
    }
    fprintf(stderr, "%-7s 0x%016llx 0x%016llx\n", jobs[i].name, (unsigned long long)h[0],
            (unsigned long long)h[1]);
    bad |= h[0] != jobs[i].want_bytes || h[1] != jobs[i].want;
  }
  dl_close(dl);
  snprintf(path, sizeof path, "rm -rf %s", dir);
  assert_int_equal(system(path), 0);
  free(dir);
  assert_false(bad);
}

/* Batches big enough to be split between the caller and the helper thread
 * are the same bytes as those generated on one thread. */
static void test_two_threads_same_bytes(void **state) {
  (void)state;
  char *dir = t_tmpdir(), db[2][300];
  struct dl *dl[2];
  const struct tspec t = {.job = "big",
                          .seq_len = 1023,
                          .global_batch = 32,
                          .shards = 64,
                          .lanes = 8,
                          .seed = 3,
                          .n_ds = 1,
                          .names = {"web"},
                          .uris = {"synthetic:3000:100:3000:1"},
                          .weights = {1}};
  for (int k = 0; k < 2; k++) {
    snprintf(db[k], sizeof db[k], "%s/db%d", dir, k);
    struct dl_opts o = {.dir = db[k], .gen_threads = k ? 2 : 1};
    assert_int_equal(dl_open(&o, &dl[k]), 0);
    assert_int_equal(t_create(dl[k], &t), 0);
  }
  for (int64_t step = 0; step < 12; step++) {
    struct dl_batch b[2];
    for (int k = 0; k < 2; k++)
      assert_int_equal(dl_get_batch(dl[k], "big", step % 5 == 4 ? step - 3 : step, 1, 2, &b[k]), 0);
    assert_int_equal(b[0].n_doc_starts, b[1].n_doc_starts);
    assert_memory_equal(b[0].tokens, b[1].tokens, (size_t)b[0].lines * b[0].line_tokens * 4);
    assert_memory_equal(b[0].doc_starts, b[1].doc_starts, b[0].n_doc_starts * 4);
    for (int k = 0; k < 2; k++) dl_batch_free(&b[k]);
  }
  for (int k = 0; k < 2; k++) dl_close(dl[k]);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_pinned_bytes),
                                     cmocka_unit_test(test_two_threads_same_bytes)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
