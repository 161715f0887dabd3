/*
 * Tests for ckpt_box_coverage: exact tilings pass; gaps, overlaps and boxes
 * out of bounds are found and named; thousands of chunks (a 2-D grid, a
 * column split, FSDP flat shards) are handled quickly.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "ckpt_box.h"
#include "stk_error.h"

/* A rows x cols grid of equal tiles over shape (rows*th, cols*tw). */
static struct ckpt_box *grid(size_t rows, size_t cols, uint64_t th, uint64_t tw) {
  struct ckpt_box *v = calloc(rows * cols, sizeof(*v));
  for (size_t r = 0; r < rows; r++)
    for (size_t c = 0; c < cols; c++)
      v[r * cols + c] = (struct ckpt_box){2, {r * th, c * tw}, {th, tw}};
  return v;
}

static void test_exact_and_gap(void **state) {
  struct ckpt_shape s = {2, {8, 9}};
  struct ckpt_box *v = grid(4, 3, 2, 3);
  struct ckpt_cover_report rep;
  assert_int_equal(ckpt_box_coverage(&s, v, 12, &rep), 0);
  assert_int_equal(rep.result, CKPT_COVER_OK);
  assert_int_equal(rep.covered, 72);
  /* Drop one tile: a gap of 6 elements. */
  assert_int_equal(ckpt_box_coverage(&s, v, 11, &rep), STK_EINVAL);
  assert_int_equal(rep.result, CKPT_COVER_GAP);
  assert_int_equal(rep.covered, 66);
  assert_int_equal(rep.total, 72);
  assert_non_null(strstr(stk_detail(), "66 of 72"));
  free(v);
}

static void test_overlap_named(void **state) {
  struct ckpt_shape s = {2, {8, 9}};
  struct ckpt_box *v = grid(4, 3, 2, 3);
  /* Tile 7 grows one column into tile 8; total volume stays wrong either way. */
  v[7].sizes[1] = 4;
  struct ckpt_cover_report rep;
  assert_int_equal(ckpt_box_coverage(&s, v, 12, &rep), STK_EINVAL);
  assert_int_equal(rep.result, CKPT_COVER_OVERLAP);
  assert_int_equal(rep.a, 7);
  assert_int_equal(rep.b, 8);
  /* Overlap plus gap with the same total volume is still an overlap. */
  v[7].sizes[1] = 3;
  v[5] = v[4];
  assert_int_equal(ckpt_box_coverage(&s, v, 12, &rep), STK_EINVAL);
  assert_int_equal(rep.result, CKPT_COVER_OVERLAP);
  assert_int_equal(rep.a, 4);
  assert_int_equal(rep.b, 5);
  free(v);
}

static void test_out_of_bounds(void **state) {
  struct ckpt_shape s = {2, {8, 9}};
  struct ckpt_box *v = grid(4, 3, 2, 3);
  v[11].sizes[0] = 3; /* Rows 6..9 of 8. */
  struct ckpt_cover_report rep;
  assert_int_equal(ckpt_box_coverage(&s, v, 12, &rep), STK_EINVAL);
  assert_int_equal(rep.result, CKPT_COVER_BAD_BOX);
  assert_int_equal(rep.a, 11);
  v[11].sizes[0] = 2;
  v[11].offsets[1] = UINT64_MAX - 1; /* Wraps around. */
  assert_int_equal(ckpt_box_coverage(&s, v, 12, &rep), STK_EINVAL);
  assert_int_equal(rep.result, CKPT_COVER_BAD_BOX);
  free(v);
}

static double seconds_since(const struct timespec *t0) {
  struct timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) / 1e9;
}

static void test_thousands(void **state) {
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  /* A 100 x 100 grid: 10,000 chunks of a tensor with 10^10 elements. */
  struct ckpt_shape s = {2, {100000, 100000}};
  struct ckpt_box *v = grid(100, 100, 1000, 1000);
  struct ckpt_cover_report rep;
  assert_int_equal(ckpt_box_coverage(&s, v, 10000, &rep), 0);
  /* One overlap hidden among them is found. */
  v[5555].offsets[1] -= 1;
  assert_int_equal(ckpt_box_coverage(&s, v, 10000, &rep), STK_EINVAL);
  assert_int_equal(rep.result, CKPT_COVER_OVERLAP);
  assert_int_equal(rep.a, 5554);
  assert_int_equal(rep.b, 5555);
  free(v);
  /* 20,000 column slabs: every box spans all of dim 0. */
  struct ckpt_shape cs = {2, {4096, 20000}};
  v = grid(1, 20000, 4096, 1);
  assert_int_equal(ckpt_box_coverage(&cs, v, 20000, &rep), 0);
  free(v);
  /* 8,192 FSDP flat shards, some empty (padding only). */
  struct ckpt_shape fs = {1, {1000003}};
  v = calloc(8192, sizeof(*v));
  uint64_t shard;
  for (uint32_t r = 0; r < 8192; r++)
    assert_int_equal(ckpt_shard_flat(1000003, r, 8192, &v[r], &shard), 0);
  assert_int_equal(ckpt_box_coverage(&fs, v, 8192, &rep), 0);
  free(v);
  assert_true(seconds_since(&t0) < 5.0);
}

/* A staircase tiling: quadratic to sweep along dim 0, linear along dim 1. */
static void test_picks_cheap_dim(void **state) {
  enum { N = 20000 };
  struct ckpt_shape s = {2, {N, N}};
  struct ckpt_box *v = calloc(2 * N, sizeof(*v));
  size_t n = 0;
  for (uint64_t i = 0; i < N; i++) {
    v[n++] = (struct ckpt_box){2, {i, i}, {N - i, 1}};
    if (i > 0) v[n++] = (struct ckpt_box){2, {0, i}, {i, 1}};
  }
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  assert_int_equal(ckpt_box_coverage(&s, v, n, NULL), 0);
  assert_true(seconds_since(&t0) < 2.0);
  free(v);
}

/* Layouts that would take too long to verify are refused, not ground through. */
static void test_budget(void **state) {
  enum { N = 30000 };
  struct ckpt_shape s = {2, {N, N}};
  struct ckpt_box *v = calloc(N, sizeof(*v));
  for (size_t i = 0; i < N; i++) v[i] = (struct ckpt_box){2, {0, 0}, {N, N}};
  struct ckpt_cover_report rep;
  assert_int_equal(ckpt_box_coverage(&s, v, N, &rep), STK_ETOOBIG);
  assert_int_equal(rep.result, CKPT_COVER_TOO_COMPLEX);
  free(v);
}

static void test_scalar_and_empty(void **state) {
  struct ckpt_shape scalar = {0, {0}};
  struct ckpt_box one = {0};
  assert_int_equal(ckpt_box_coverage(&scalar, &one, 1, NULL), 0);
  struct ckpt_box two[2] = {{0}, {0}};
  assert_int_equal(ckpt_box_coverage(&scalar, two, 2, NULL), STK_EINVAL);
  assert_int_equal(ckpt_box_coverage(&scalar, NULL, 0, NULL), STK_EINVAL);
  /* A tensor with no elements is covered by nothing. */
  struct ckpt_shape empty = {1, {0}};
  assert_int_equal(ckpt_box_coverage(&empty, NULL, 0, NULL), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exact_and_gap),    cmocka_unit_test(test_overlap_named),
      cmocka_unit_test(test_out_of_bounds),    cmocka_unit_test(test_thousands),
      cmocka_unit_test(test_picks_cheap_dim),  cmocka_unit_test(test_budget),
      cmocka_unit_test(test_scalar_and_empty),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
