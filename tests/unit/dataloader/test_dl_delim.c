/*
 * test_dl_delim: llm.c units read while lines fill (delimited units,
 * dl_lane_take.c) serve exactly what units read whole serve. Two cores
 * serve the same jobs over the same uint32 files; the reference one opens
 * them with a strip id that never occurs, which makes the reader return
 * whole units (the path the pinned checksums of test_dl_pin guard). Both
 * go through the paths where the two differ — sequential steps, replays
 * from snapshots, Explain in between, mixture changes (a dataset added,
 * reweighted, removed) that fall in the middle of units, export/import,
 * commit and restart — and must agree on every token, every document
 * start, every provenance record and every exported state blob (the
 * mixing counters inside it included).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <sys/stat.h>

#include "dl_core.h"
#include "dl_source.h"
#include "dl_synthetic.h"
#include "dl_test.h"

#define EOT          DL_SYNTHETIC_EOT
#define NEVER_STRIP  UINT32_C(0xFFFFFFF0)
#define BLOCK_TOKENS 37

static const uint32_t never[] = {NEVER_STRIP};

/* arg points to a bool: open units whole (the reference) or not. */
static int open_llmc(void *arg, const Stoker__V1__DatasetSpec *spec, struct dl_source **ret) {
  bool whole = *(const bool *)arg;
  struct dl_source_opts o = {.name = spec->name,
                             .path = spec->source->uri,
                             .format = DL_FORMAT_LLMC,
                             .block_tokens = spec->block_tokens,
                             .eot_id = (int64_t)EOT,
                             .strip_ids = whole ? never : NULL,
                             .n_strip_ids = whole ? 1 : 0};
  return dl_source_open(&o, ret);
}

/* A uint32 llm.c file with short documents, adjacent delimiters and runs
 * of delimiters longer than a block (units with nothing to serve). */
static void write_file(const char *path, uint32_t n, uint64_t seed) {
  uint32_t *t = malloc(n * sizeof *t);
  uint64_t x = seed;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t r = t_lcg(&x);
    t[i] = r % 23 == 0 ? EOT : (uint32_t)(seed * 100000 + i);
    if (r % 997 == 0)
      for (uint32_t k = 0; k < 2 * BLOCK_TOKENS && i + 1 < n; k++) t[++i] = EOT;
  }
  t_write_llmc(path, t, n, 4);
  free(t);
}

struct fixture {
  char *dir;
  char a[300], b[300];
  bool whole[2];
  struct dl *dl[2]; /* [0] delimited units, [1] whole (reference) */
};

static struct dl *open_core(struct fixture *fx, int k, const char *name) {
  char db[400];
  snprintf(db, sizeof db, "%s/%s", fx->dir, name);
  struct dl_opts o = {.dir = db, .open_source = open_llmc, .open_source_arg = &fx->whole[k]};
  struct dl *dl = NULL;
  assert_int_equal(dl_open(&o, &dl), 0);
  return dl;
}

static void dataset(Stoker__V1__DatasetSpec *ds, Stoker__V1__StorageRef *src, const char *name,
                    const char *path, double weight) {
  stoker__v1__dataset_spec__init(ds);
  stoker__v1__storage_ref__init(src);
  src->uri = (char *)path;
  ds->name = (char *)name;
  ds->source = src;
  ds->weight = weight;
  ds->format = STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_LLMC;
  ds->block_tokens = BLOCK_TOKENS;
}

/* Job "j" over dataset "a" (block_tokens 0: the default unit size). */
static void create_shaped(struct dl *dl, const char *a, uint32_t block_tokens, uint32_t seq_len,
                          uint32_t global_batch) {
  Stoker__V1__StorageRef src;
  Stoker__V1__DatasetSpec ds, *dsp = &ds;
  Stoker__V1__LoaderSpec s = STOKER__V1__LOADER_SPEC__INIT;
  dataset(&ds, &src, "a", a, 1);
  ds.block_tokens = block_tokens;
  s.job = "j";
  s.datasets = &dsp;
  s.n_datasets = 1;
  s.seq_len = seq_len;
  s.global_batch = global_batch;
  s.seed = 17;
  s.logical_shards = 8;
  s.lanes = 4;
  assert_int_equal(dl_create_job(dl, &s), 0);
}

static void create(struct dl *dl, const char *a) {
  create_shaped(dl, a, BLOCK_TOKENS, 50, 8);
}

static void mix(struct dl *dl, int64_t from, const struct fixture *fx, double wa, double wb) {
  Stoker__V1__StorageRef src[2];
  Stoker__V1__DatasetSpec ds[2], *ptrs[2] = {&ds[0], &ds[1]};
  dataset(&ds[0], &src[0], "a", fx->a, wa);
  dataset(&ds[1], &src[1], "b", fx->b, wb);
  Stoker__V1__UpdateMixtureRequest r = STOKER__V1__UPDATE_MIXTURE_REQUEST__INIT;
  r.job = "j";
  r.from_step = from;
  r.datasets = ptrs;
  r.n_datasets = 2;
  assert_int_equal(dl_update_mixture(dl, &r), 0);
}

/* Both cores serve the same batch and the same provenance for the step. */
static void same_step(struct dl *fast, struct dl *ref, int64_t step, uint32_t rank,
                      uint32_t world) {
  struct dl_batch b[2];
  assert_int_equal(dl_get_batch(fast, "j", step, rank, world, &b[0]), 0);
  assert_int_equal(dl_get_batch(ref, "j", step, rank, world, &b[1]), 0);
  assert_int_equal(b[0].lines, b[1].lines);
  assert_memory_equal(b[0].tokens, b[1].tokens, (size_t)b[0].lines * b[0].line_tokens * 4);
  assert_int_equal(b[0].n_doc_starts, b[1].n_doc_starts);
  if (b[0].n_doc_starts)
    assert_memory_equal(b[0].doc_starts, b[1].doc_starts, b[0].n_doc_starts * 4);
  for (int k = 0; k < 2; k++) dl_batch_free(&b[k]);
  if (step % 3) return; /* provenance every third step: its replays move the generators */
  Stoker__V1__ExplainResponse *e[2];
  assert_int_equal(dl_explain(fast, "j", step, rank, world, &e[0]), 0);
  assert_int_equal(dl_explain(ref, "j", step, rank, world, &e[1]), 0);
  assert_int_equal(e[0]->n_sources, e[1]->n_sources);
  for (size_t i = 0; i < e[0]->n_sources; i++) {
    const Stoker__V1__LineSource *x = e[0]->sources[i], *y = e[1]->sources[i];
    assert_string_equal(x->dataset, y->dataset);
    uint64_t fx[6] = {x->line, x->document, x->token_begin, x->token_end, x->unit, x->epoch};
    uint64_t fy[6] = {y->line, y->document, y->token_begin, y->token_end, y->unit, y->epoch};
    assert_memory_equal(fx, fy, sizeof fx);
  }
  for (int k = 0; k < 2; k++) dl_explain_free(e[k]);
}

static void same_steps(struct fixture *fx, int64_t from, int64_t to) {
  for (int64_t s = from; s < to; s++) same_step(fx->dl[0], fx->dl[1], s, 0, 1);
}

/* The exported state blobs (configuration, lane positions, mixing
 * counters) are byte for byte the same. */
static void same_export(struct fixture *fx, int64_t step, uint8_t **ret_blob, size_t *ret_len) {
  uint8_t *blob[2];
  size_t len[2];
  for (int k = 0; k < 2; k++)
    assert_int_equal(dl_export_state(fx->dl[k], "j", step, &blob[k], &len[k]), 0);
  assert_int_equal(len[0], len[1]);
  assert_memory_equal(blob[0], blob[1], len[0]);
  free(blob[1]);
  *ret_blob = blob[0];
  *ret_len = len[0];
}

static void test_delimited_as_whole(void **state) {
  (void)state;
  struct fixture fx = {.dir = t_tmpdir(), .whole = {false, true}};
  snprintf(fx.a, sizeof fx.a, "%s/a.bin", fx.dir);
  snprintf(fx.b, sizeof fx.b, "%s/b.bin", fx.dir);
  write_file(fx.a, 9000, 1);
  write_file(fx.b, 7000, 2);
  for (int k = 0; k < 2; k++) {
    fx.dl[k] = open_core(&fx, k, k ? "ref" : "fast");
    create(fx.dl[k], fx.a);
  }
  same_steps(&fx, 0, 10);
  same_step(fx.dl[0], fx.dl[1], 2, 1, 2);                   /* a replay of another world's slice */
  for (int k = 0; k < 2; k++) mix(fx.dl[k], 12, &fx, 1, 3); /* b added */
  same_steps(&fx, 10, 20);
  for (int k = 0; k < 2; k++) mix(fx.dl[k], 21, &fx, 2, 1); /* reweighted */
  same_steps(&fx, 20, 24);
  for (int k = 0; k < 2; k++) mix(fx.dl[k], 24, &fx, 0, 1); /* a removed */
  same_steps(&fx, 24, 30);
  uint8_t *blob;
  size_t len;
  same_export(&fx, 27, &blob, &len);
  /* Imported into fresh cores, both continue as before. */
  struct dl *imported[2];
  for (int k = 0; k < 2; k++) {
    imported[k] = open_core(&fx, k, k ? "ref2" : "fast2");
    assert_int_equal(dl_import_state(imported[k], blob, len, NULL), 0);
  }
  free(blob);
  for (int64_t s = 28; s < 34; s++) {
    same_step(imported[0], imported[1], s, 0, 1);
    same_step(imported[0], fx.dl[1], s, 0, 1);
  }
  for (int k = 0; k < 2; k++) dl_close(imported[k]);
  /* Committed, closed and reopened: the same again. */
  for (int k = 0; k < 2; k++) {
    assert_int_equal(dl_commit(fx.dl[k], "j", 33), 0);
    dl_close(fx.dl[k]);
    fx.dl[k] = open_core(&fx, k, k ? "ref" : "fast");
  }
  same_steps(&fx, 34, 40);
  same_export(&fx, 39, &blob, &len);
  free(blob);
  for (int k = 0; k < 2; k++) dl_close(fx.dl[k]);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf %s", fx.dir);
  assert_int_equal(system(cmd), 0);
  free(fx.dir);
}

/* A spec that names no llm.c unit size gets DL_LLMC_BLOCK_TOKENS, and the
 * job stores that size: GetInfo shows it, before and after a restart, and
 * the units served are blocks of that size. */
static void test_default_block_stored(void **state) {
  (void)state;
  struct fixture fx = {.dir = t_tmpdir(), .whole = {false, false}};
  snprintf(fx.a, sizeof fx.a, "%s/a.bin", fx.dir);
  const uint32_t units = 9;
  write_file(fx.a, (units - 1) * DL_LLMC_BLOCK_TOKENS + 500, 3);
  struct dl *dl = open_core(&fx, 0, "default");
  create_shaped(dl, fx.a, 0, 4096, 4);
  for (int pass = 0; pass < 2; pass++) {
    Stoker__V1__LoaderInfo *info;
    assert_int_equal(dl_get_info(dl, "j", &info), 0);
    assert_int_equal(info->spec->datasets[0]->block_tokens, DL_LLMC_BLOCK_TOKENS);
    dl_info_free(info);
    uint64_t max_unit = 0;
    for (int64_t step = 0; step < 8; step++) {
      Stoker__V1__ExplainResponse *e;
      assert_int_equal(dl_explain(dl, "j", step, 0, 1, &e), 0);
      for (size_t i = 0; i < e->n_sources; i++)
        if (e->sources[i]->unit > max_unit) max_unit = e->sources[i]->unit;
      dl_explain_free(e);
    }
    /* 8 steps of 4 lines of 4097 tokens visit most of the 9 units; with
     * smaller blocks the unit numbers would run past 8. */
    assert_true(max_unit >= 4 && max_unit < units);
    dl_close(dl);
    dl = open_core(&fx, 0, "default");
  }
  dl_close(dl);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf %s", fx.dir);
  assert_int_equal(system(cmd), 0);
  free(fx.dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_delimited_as_whole),
      cmocka_unit_test(test_default_block_stored),
  };
  return cmocka_run_group_tests_name("dl_delim", tests, NULL, NULL);
}
