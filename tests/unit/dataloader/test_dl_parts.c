/*
 * test_dl_parts: scale-out of the dataloader core over several instances
 * (dl_opts.part/parts), all in-process. The partial batches of P parts,
 * placed at their positions, must give exactly the bytes (tokens and
 * document starts) one whole instance gives, for many (step, rank, world),
 * across a world change and a configuration version; each part generates
 * only its lanes; Explain names slice positions; commits survive a reopen;
 * blobs exported by 2 parts at a committed step, imported into 3 parts (or
 * into 1), continue with identical bytes; a missing part's blob is refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dl_test.h"
#include "stk_error.h"

#define MAXP 3

static const struct tspec SPEC = {.job = "sc",
                                  .seq_len = 15,
                                  .global_batch = 12,
                                  .shards = 24,
                                  .lanes = 6,
                                  .seed = 11,
                                  .n_ds = 1,
                                  .names = {"web"},
                                  .uris = {"synthetic:300:4:40:5"},
                                  .weights = {1}};

struct inst {
  char *dir;
  struct dl *dl;
  uint32_t part, parts;
};

static struct dl *open_part(const char *dir, uint32_t part, uint32_t parts) {
  struct dl_opts o = {.dir = dir, .part = part, .parts = parts};
  struct dl *dl = NULL;
  assert_int_equal(dl_open(&o, &dl), 0);
  return dl;
}

/* Instance i of n, with the job created unless create is false. */
static void inst_open(struct inst *in, uint32_t part, uint32_t parts, bool create) {
  in->dir = t_tmpdir();
  in->part = part;
  in->parts = parts;
  in->dl = open_part(in->dir, part, parts);
  if (create) assert_int_equal(t_create(in->dl, &SPEC), 0);
}

static void inst_close(struct inst *in) {
  char cmd[300];
  dl_close(in->dl);
  snprintf(cmd, sizeof cmd, "rm -rf %s", in->dir);
  assert_int_equal(system(cmd), 0);
  free(in->dir);
}

static int u32_cmp(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x > y) - (x < y);
}

/* The whole slice from n parts' partial batches, checked as we go. */
static void assemble(struct inst *parts, uint32_t n, int64_t step, uint32_t rank, uint32_t world,
                     struct dl_batch *ret) {
  memset(ret, 0, sizeof *ret);
  uint32_t *seen = NULL;
  for (uint32_t i = 0; i < n; i++) {
    struct dl_batch b;
    assert_int_equal(dl_get_batch(parts[i].dl, SPEC.job, step, rank, world, &b), 0);
    assert_int_equal(b.parts, n);
    assert_int_equal(b.part, i);
    if (i == 0) {
      ret->lines = b.slice_lines;
      ret->line_tokens = b.line_tokens;
      ret->tokens = calloc((size_t)b.slice_lines * b.line_tokens, 4);
      ret->doc_starts = calloc((size_t)b.slice_lines * b.line_tokens, 4);
      seen = calloc(b.slice_lines, 4);
    }
    assert_int_equal(b.slice_lines, ret->lines);
    uint32_t t = b.line_tokens;
    for (uint32_t k = 0; k < b.lines; k++) {
      uint32_t p = b.positions[k];
      assert_true(p < ret->lines);
      assert_int_equal(seen[p]++, 0);
      memcpy(ret->tokens + (size_t)p * t, b.tokens + (size_t)k * t, t * 4);
    }
    for (size_t d = 0; d < b.n_doc_starts; d++)
      ret->doc_starts[ret->n_doc_starts++] =
          b.positions[b.doc_starts[d] / t] * t + b.doc_starts[d] % t;
    dl_batch_free(&b);
  }
  for (uint32_t p = 0; p < ret->lines; p++) assert_int_equal(seen[p], 1);
  free(seen);
  qsort(ret->doc_starts, ret->n_doc_starts, 4, u32_cmp);
}

static void assert_same_slice(struct dl *whole, struct inst *parts, uint32_t n, int64_t step,
                              uint32_t rank, uint32_t world) {
  struct dl_batch want, got;
  assert_int_equal(dl_get_batch(whole, SPEC.job, step, rank, world, &want), 0);
  assert_null(want.positions);
  assemble(parts, n, step, rank, world, &got);
  assert_int_equal(got.lines, want.lines);
  assert_memory_equal(got.tokens, want.tokens, (size_t)want.lines * want.line_tokens * 4);
  assert_int_equal(got.n_doc_starts, want.n_doc_starts);
  if (want.n_doc_starts)
    assert_memory_equal(got.doc_starts, want.doc_starts, want.n_doc_starts * 4);
  dl_batch_free(&want);
  dl_batch_free(&got);
}

/* Steps [from, to) at every rank of each world size. */
static void assert_range(struct dl *whole, struct inst *parts, uint32_t n, int64_t from,
                         int64_t to) {
  static const uint32_t worlds[] = {1, 2, 3, 4};
  for (int64_t s = from; s < to; s++) {
    uint32_t world = worlds[s % 4]; /* the world changes every step */
    for (uint32_t r = 0; r < world; r++) assert_same_slice(whole, parts, n, s, r, world);
  }
}

/* Lanes a part does not serve were never generated there. */
static void assert_own_lanes_only(struct inst *in) {
  for (uint32_t c = 0; c < SPEC.lanes; c++) {
    uint64_t n = 0;
    assert_int_equal(dl_lane_lines_generated(in->dl, SPEC.job, c, &n), 0);
    if (c % in->parts == in->part)
      assert_true(n > 0);
    else
      assert_int_equal(n, 0);
  }
}

static void test_parts_match_whole(void **state) {
  (void)state;
  struct inst whole, p[MAXP];
  inst_open(&whole, 0, 1, true);
  for (uint32_t n = 2; n <= 3; n++) {
    for (uint32_t i = 0; i < n; i++) inst_open(&p[i], i, n, true);
    assert_range(whole.dl, p, n, 0, 24);
    /* A new version from step 30 (global batch 24): the lines still split. */
    for (uint32_t i = 0; i < n; i++)
      assert_int_equal(t_update(p[i].dl, SPEC.job, 30, NULL, 0, 24), 0);
    if (n == 2) assert_int_equal(t_update(whole.dl, SPEC.job, 30, NULL, 0, 24), 0);
    assert_range(whole.dl, p, n, 26, 36);
    for (uint32_t i = 0; i < n; i++) {
      assert_own_lanes_only(&p[i]);
      inst_close(&p[i]);
    }
  }
  inst_close(&whole);
}

/* Explain on a part names slice positions, only of the lanes it serves. */
static void test_explain_positions(void **state) {
  (void)state;
  struct inst whole, p[2];
  inst_open(&whole, 0, 1, true);
  for (uint32_t i = 0; i < 2; i++) inst_open(&p[i], i, 2, true);
  Stoker__V1__ExplainResponse *w, *e;
  assert_int_equal(dl_explain(whole.dl, SPEC.job, 3, 1, 2, &w), 0);
  size_t matched = 0;
  for (uint32_t i = 0; i < 2; i++) {
    assert_int_equal(dl_explain(p[i].dl, SPEC.job, 3, 1, 2, &e), 0);
    for (size_t k = 0; k < e->n_sources; k++) {
      const Stoker__V1__LineSource *s = e->sources[k];
      assert_int_equal(s->lane % 2, i);
      for (size_t m = 0; m < w->n_sources; m++)
        if (w->sources[m]->line == s->line && w->sources[m]->unit == s->unit &&
            w->sources[m]->token_begin == s->token_begin && w->sources[m]->lane == s->lane)
          matched++;
    }
    dl_explain_free(e);
  }
  assert_int_equal(matched, w->n_sources);
  dl_explain_free(w);
  for (uint32_t i = 0; i < 2; i++) inst_close(&p[i]);
  inst_close(&whole);
}

/* A part commits only its lanes; reopened, it serves the same bytes. */
static void test_commit_reopen(void **state) {
  (void)state;
  struct inst whole, p[2];
  inst_open(&whole, 0, 1, true);
  for (uint32_t i = 0; i < 2; i++) inst_open(&p[i], i, 2, true);
  assert_range(whole.dl, p, 2, 0, 8);
  for (uint32_t i = 0; i < 2; i++) {
    assert_int_equal(dl_commit(p[i].dl, SPEC.job, 7), 0);
    assert_own_lanes_only(&p[i]);
    dl_close(p[i].dl);
    p[i].dl = open_part(p[i].dir, i, 2);
  }
  assert_range(whole.dl, p, 2, 8, 14);
  for (uint32_t i = 0; i < 2; i++) {
    assert_own_lanes_only(&p[i]);
    inst_close(&p[i]);
  }
  inst_close(&whole);
}

/* Exports of every part at step 9 (from n_old parts). */
static void export_all(struct inst *old, uint32_t n_old, uint8_t **blobs, size_t *lens) {
  for (uint32_t i = 0; i < n_old; i++) {
    assert_int_equal(dl_commit(old[i].dl, SPEC.job, 9), 0);
    assert_int_equal(dl_export_state(old[i].dl, SPEC.job, 9, &blobs[i], &lens[i]), 0);
  }
}

static void test_scale_2_to_3_and_1(void **state) {
  (void)state;
  struct inst whole, old[2], nw[3], one;
  inst_open(&whole, 0, 1, true);
  for (uint32_t i = 0; i < 2; i++) inst_open(&old[i], i, 2, true);
  assert_range(whole.dl, old, 2, 0, 10);
  uint8_t *blobs[2];
  size_t lens[2];
  export_all(old, 2, blobs, lens);
  for (uint32_t i = 0; i < 3; i++) {
    inst_open(&nw[i], i, 3, false);
    /* Part 1 of 2's lanes are 1, 3, 5: part 0 of 3 (lanes 0, 3) needs both blobs. */
    if (i == 0) {
      assert_int_equal(dl_import_state(nw[i].dl, blobs[0], lens[0], NULL), STK_EINVAL);
      assert_non_null(strstr(stk_detail(), "lane 3"));
    }
    int64_t step = -1;
    assert_int_equal(
        dl_import_states(nw[i].dl, NULL, (const uint8_t *const *)blobs, lens, 2, &step), 0);
    assert_int_equal(step, 9);
  }
  assert_range(whole.dl, nw, 3, 10, 22);
  for (uint32_t i = 0; i < 3; i++) assert_own_lanes_only(&nw[i]);
  /* Scale in to one process: every lane from the two blobs. */
  inst_open(&one, 0, 1, false);
  assert_int_equal(dl_import_states(one.dl, NULL, (const uint8_t *const *)blobs, lens, 2, NULL), 0);
  for (int64_t s = 10; s < 16; s++) {
    size_t n1, n2;
    uint32_t *a = t_global(whole.dl, SPEC.job, s, 2, &n1),
             *b = t_global(one.dl, SPEC.job, s, 2, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1 * 4);
    free(a);
    free(b);
  }
  for (uint32_t i = 0; i < 2; i++) free(blobs[i]);
  for (uint32_t i = 0; i < 2; i++) inst_close(&old[i]);
  for (uint32_t i = 0; i < 3; i++) inst_close(&nw[i]);
  inst_close(&one);
  inst_close(&whole);
}

/* Blobs of different steps (or jobs) are not mixed. */
static void test_import_mismatch(void **state) {
  (void)state;
  struct inst old[2], nw;
  for (uint32_t i = 0; i < 2; i++) inst_open(&old[i], i, 2, true);
  uint8_t *blobs[2];
  size_t lens[2];
  assert_int_equal(dl_commit(old[0].dl, SPEC.job, 4), 0);
  assert_int_equal(dl_export_state(old[0].dl, SPEC.job, 4, &blobs[0], &lens[0]), 0);
  assert_int_equal(dl_commit(old[1].dl, SPEC.job, 5), 0);
  assert_int_equal(dl_export_state(old[1].dl, SPEC.job, 5, &blobs[1], &lens[1]), 0);
  inst_open(&nw, 0, 1, false);
  assert_int_equal(dl_import_states(nw.dl, NULL, (const uint8_t *const *)blobs, lens, 2, NULL),
                   STK_EINVAL);
  Stoker__V1__LoaderInfo *info;
  assert_int_equal(dl_get_info(nw.dl, SPEC.job, &info), STK_ENOENT); /* nothing changed */
  blobs[1][lens[1] - 1] ^= 1;
  lens[1]--; /* truncated */
  assert_int_equal(dl_import_states(nw.dl, NULL, (const uint8_t *const *)blobs, lens, 2, NULL),
                   STK_ECORRUPT);
  for (uint32_t i = 0; i < 2; i++) {
    free(blobs[i]);
    inst_close(&old[i]);
  }
  inst_close(&nw);
}

static void test_bad_parts(void **state) {
  (void)state;
  char *dir = t_tmpdir();
  struct dl_opts o = {.dir = dir, .part = 2, .parts = 2};
  struct dl *dl = NULL;
  assert_int_equal(dl_open(&o, &dl), STK_EINVAL);
  assert_null(dl);
  dl = open_part(dir, 0, 8); /* more processes than the job's 6 lanes */
  assert_int_equal(t_create(dl, &SPEC), STK_EINVAL);
  dl_close(dl);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parts_match_whole), cmocka_unit_test(test_explain_positions),
      cmocka_unit_test(test_commit_reopen),     cmocka_unit_test(test_scale_2_to_3_and_1),
      cmocka_unit_test(test_import_mismatch),   cmocka_unit_test(test_bad_parts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
