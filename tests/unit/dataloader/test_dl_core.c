/*
 * test_dl_core: the dataloader's guarantees, proven on synthetic corpora
 * whose tokens encode (document, position): same bytes on retry and after
 * reopen, exact resume after a crash, rescaling with identical global
 * batches, epoch coverage (every token once), a new order every epoch,
 * seq_len / global_batch changes without loss or repeat, export/import.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dl_test.h"
#include "stk_error.h"

#define DOCS 400
#define LO   8
#define HI   64
#define SEED 7
#define URI  "synthetic:400:8:64:7"

static const char *const WEB[1] = {"web"};

static const struct tspec BASE = {.job = "j",
                                  .seq_len = 31,
                                  .global_batch = 24,
                                  .shards = 32,
                                  .lanes = 4,
                                  .seed = 42,
                                  .n_ds = 1,
                                  .names = {"web"},
                                  .uris = {URI},
                                  .weights = {1}};

static void rmdir_all(char *dir) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
  free(dir);
}

/* The reference: steps [0, n) at world 1 from a fresh store. */
static uint32_t **reference(const struct tspec *t, int n, size_t *ret_len) {
  char *dir = t_tmpdir();
  struct dl *dl = t_open(dir, 0);
  assert_int_equal(t_create(dl, t), 0);
  uint32_t **ref = calloc(n, sizeof *ref);
  for (int s = 0; s < n; s++) ref[s] = t_global(dl, t->job, s, 1, ret_len);
  dl_close(dl);
  rmdir_all(dir);
  return ref;
}

static void free_ref(uint32_t **ref, int n) {
  for (int s = 0; s < n; s++) free(ref[s]);
  free(ref);
}

static void assert_step(struct dl *dl, uint32_t **ref, int64_t step, uint32_t world, size_t len) {
  size_t n;
  uint32_t *g = t_global(dl, "j", step, world, &n);
  assert_int_equal(n, len);
  assert_memory_equal(g, ref[step], n * sizeof *g);
  free(g);
}

/* (1) identical bytes on retry, at any world size, and after close/reopen. */
static void test_retry_and_reopen(void **state) {
  size_t len;
  uint32_t **ref = reference(&BASE, 12, &len);
  char *dir = t_tmpdir();
  struct dl *dl = t_open(dir, 0);
  assert_int_equal(t_create(dl, &BASE), 0);
  for (int s = 11; s >= 0; s--) assert_step(dl, ref, s, 2, len); /* backwards: replays */
  assert_step(dl, ref, 5, 4, len);
  assert_step(dl, ref, 5, 4, len);
  assert_int_equal(dl_commit(dl, "j", 6), 0);
  dl_close(dl);
  dl = t_open(dir, 0);
  for (int s = 0; s < 12; s++) assert_step(dl, ref, s, 3, len);
  Stoker__V1__LoaderInfo *info;
  assert_int_equal(dl_get_info(dl, "j", &info), 0);
  assert_int_equal(info->committed_step, 6);
  assert_int_equal(info->spec->global_batch, 24);
  dl_info_free(info);
  dl_close(dl);
  rmdir_all(dir);
  free_ref(ref, 12);
}

/* (2) a crash after serving past the commit resumes with the same stream. */
static void test_exact_resume(void **state) {
  size_t len;
  uint32_t **ref = reference(&BASE, 40, &len);
  char *dir = t_tmpdir();
  struct dl *dl = t_open(dir, 0);
  assert_int_equal(t_create(dl, &BASE), 0);
  for (int s = 0; s < 25; s++) assert_step(dl, ref, s, 4, len);
  assert_int_equal(dl_commit(dl, "j", 17), 0);
  dl_close(dl); /* "crash": steps 18..24 served, never committed */
  dl = t_open(dir, 0);
  for (int s = 18; s < 40; s++) assert_step(dl, ref, s, 4, len);
  dl_close(dl);
  rmdir_all(dir);
  free_ref(ref, 40);
}

/* (3) rescale 4 -> 3 -> 8 -> 2 at committed steps: same global batches,
 * and over the first epoch every token exactly once. */
static void test_rescale_and_coverage(void **state) {
  size_t len;
  uint32_t **ref = reference(&BASE, 90, &len);
  char *dir = t_tmpdir();
  struct dl *dl = t_open(dir, 0);
  assert_int_equal(t_create(dl, &BASE), 0);
  const uint32_t worlds[] = {4, 3, 8, 2};
  for (int phase = 0; phase < 4; phase++) {
    for (int s = phase * 20; s < phase * 20 + 20; s++) assert_step(dl, ref, s, worlds[phase], len);
    assert_int_equal(dl_commit(dl, "j", phase * 20 + 19), 0);
    dl_close(dl); /* a restart at the new size */
    dl = t_open(dir, 0);
  }
  struct cover cv, *CV[1] = {&cv};
  cover_init(&cv, DOCS, LO, HI, SEED, 1);
  for (int s = 0; s < 90; s++) t_trace_step(dl, "j", s, WEB, 1, CV, NULL);
  uint64_t total = cv.start[DOCS];
  assert_true(90 * 24 * 32 > total + total / 4); /* every lane finished epoch 0 */
  for (uint64_t t = 0; t < total; t++) assert_int_equal(cv.count[t], 1);
  cover_free(&cv);
  dl_close(dl);
  rmdir_all(dir);
  free_ref(ref, 90);
}

/* (7) epochs: epoch 1 visits the units in another order, again fully. */
static void test_epoch_rollover(void **state) {
  char *dir = t_tmpdir();
  struct dl *dl = t_open(dir, 0);
  assert_int_equal(t_create(dl, &BASE), 0);
  struct cover cv, *CV[1] = {&cv};
  cover_init(&cv, DOCS, LO, HI, SEED, 2);
  uint64_t order[2][DOCS];
  size_t n_order[2] = {0, 0};
  for (int s = 0; s < 200; s++) {
    t_trace_step(dl, "j", s, WEB, 1, CV, NULL);
    Stoker__V1__ExplainResponse *e;
    assert_int_equal(dl_explain(dl, "j", s, 0, 1, &e), 0);
    for (size_t i = 0; i < e->n_sources; i++) {
      const Stoker__V1__LineSource *r = e->sources[i];
      if (r->lane == 0 && r->epoch < 2 && r->token_begin == 0 && n_order[r->epoch] < DOCS)
        order[r->epoch][n_order[r->epoch]++] = r->unit;
    }
    dl_explain_free(e);
  }
  uint64_t total = cv.start[DOCS];
  for (uint64_t t = 0; t < 2 * total; t++) assert_int_equal(cv.count[t], 1);
  assert_int_equal(n_order[0], n_order[1]);
  assert_true(n_order[0] > 50);
  assert_memory_not_equal(order[0], order[1], n_order[0] * sizeof(uint64_t));
  cover_free(&cv);
  dl_close(dl);
  rmdir_all(dir);
}

/* (5) seq_len and global_batch changed at a step: nothing lost or repeated. */
static void test_shape_change(void **state) {
  char *dir = t_tmpdir();
  struct dl *dl = t_open(dir, 0);
  assert_int_equal(t_create(dl, &BASE), 0);
  struct cover cv, *CV[1] = {&cv};
  cover_init(&cv, DOCS, LO, HI, SEED, 1);
  for (int s = 0; s < 10; s++) t_trace_step(dl, "j", s, WEB, 1, CV, NULL);
  assert_int_equal(dl_commit(dl, "j", 9), 0);
  assert_int_equal(t_update(dl, "j", 12, NULL, 15, 40), 0);
  for (int s = 10; s < 140; s++) t_trace_step(dl, "j", s, WEB, 1, CV, NULL);
  struct dl_batch b;
  assert_int_equal(dl_get_batch(dl, "j", 12, 0, 5, &b), 0);
  assert_int_equal(b.lines, 8);
  assert_int_equal(b.line_tokens, 16);
  dl_batch_free(&b);
  for (uint64_t t = 0; t < cv.start[DOCS]; t++) assert_int_equal(cv.count[t], 1);
  cover_free(&cv);
  dl_close(dl);
  rmdir_all(dir);
}

/* Export at a step, import into another store: the same batches follow. */
static void test_export_import(void **state) {
  size_t len;
  uint32_t **ref = reference(&BASE, 30, &len);
  char *d1 = t_tmpdir(), *d2 = t_tmpdir();
  struct dl *a = t_open(d1, 0), *b = t_open(d2, 0);
  assert_int_equal(t_create(a, &BASE), 0);
  for (int s = 0; s < 15; s++) assert_step(a, ref, s, 2, len);
  uint8_t *blob;
  size_t blen;
  int64_t step = -1;
  assert_int_equal(dl_export_state(a, "j", 12, &blob, &blen), 0);
  assert_int_equal(dl_import_state(b, blob, blen, &step), 0);
  assert_int_equal(step, 12);
  for (int s = 13; s < 30; s++) assert_step(b, ref, s, 3, len);
  /* Importing over an existing job rolls it back to the blob's state. */
  assert_int_equal(dl_import_state(a, blob, blen, NULL), 0);
  assert_step(a, ref, 13, 1, len);
  blob[blen / 2] ^= 0x55;
  assert_true(dl_import_state(b, blob, blen - 3, NULL) < 0);
  free(blob);
  dl_close(b);
  b = t_open(d2, 0); /* the import was durable */
  assert_step(b, ref, 20, 4, len);
  dl_close(a);
  dl_close(b);
  rmdir_all(d1);
  rmdir_all(d2);
  free_ref(ref, 30);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_retry_and_reopen),     cmocka_unit_test(test_exact_resume),
      cmocka_unit_test(test_rescale_and_coverage), cmocka_unit_test(test_epoch_rollover),
      cmocka_unit_test(test_shape_change),         cmocka_unit_test(test_export_import),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
