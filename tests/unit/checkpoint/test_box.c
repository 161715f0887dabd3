/*
 * Tests for ckpt_box: checks (bounds, overflow), intersection, the runs of a
 * box between two layouts against a naive per-element reference, range
 * coalescing, and the even sharding rules.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ckpt_box.h"
#include "stk_error.h"

static struct ckpt_box box2(uint64_t o0, uint64_t o1, uint64_t s0, uint64_t s1) {
  return (struct ckpt_box){.ndim = 2, .offsets = {o0, o1}, .sizes = {s0, s1}};
}

static void test_checks(void **state) {
  struct ckpt_shape s = {2, {10, 20}};
  uint64_t numel;
  assert_int_equal(ckpt_shape_check(&s, 4, &numel), 0);
  assert_int_equal(numel, 200);
  struct ckpt_shape huge = {2, {UINT64_C(1) << 40, UINT64_C(1) << 30}};
  assert_int_equal(ckpt_shape_check(&huge, 4, &numel), STK_ERANGE);
  struct ckpt_shape deep = {CKPT_MAX_DIMS + 1, {0}};
  assert_int_equal(ckpt_shape_check(&deep, 4, &numel), STK_EINVAL);
  struct ckpt_box b = box2(2, 5, 8, 15);
  assert_int_equal(ckpt_box_check(&b, &s), 0);
  b = box2(2, 5, 9, 15); /* Past dim 0. */
  assert_int_equal(ckpt_box_check(&b, &s), STK_EINVAL);
  b = box2(UINT64_MAX - 1, 0, 4, 1); /* offset + size wraps around. */
  assert_int_equal(ckpt_box_check(&b, &s), STK_EINVAL);
  struct ckpt_box b1 = {.ndim = 1, .sizes = {10}};
  assert_int_equal(ckpt_box_check(&b1, &s), STK_EINVAL);
  struct ckpt_shape scalar = {0, {0}};
  assert_int_equal(ckpt_shape_check(&scalar, 8, &numel), 0);
  assert_int_equal(numel, 1);
}

static void test_intersect(void **state) {
  struct ckpt_box a = box2(0, 0, 4, 6), b = box2(2, 3, 5, 5), x;
  assert_true(ckpt_box_intersect(&a, &b, &x));
  assert_int_equal(x.offsets[0], 2);
  assert_int_equal(x.offsets[1], 3);
  assert_int_equal(x.sizes[0], 2);
  assert_int_equal(x.sizes[1], 3);
  struct ckpt_box touching = box2(4, 0, 2, 6);
  assert_false(ckpt_box_intersect(&a, &touching, &x));
  struct ckpt_box one_d = {.ndim = 1, .sizes = {4}};
  assert_false(ckpt_box_intersect(&a, &one_d, NULL));
  assert_true(ckpt_box_contains(&a, &(struct ckpt_box){2, {1, 1}, {3, 5}}));
  assert_false(ckpt_box_contains(&a, &(struct ckpt_box){2, {1, 1}, {3, 6}}));
}

static int count_run(void *ctx, const struct ckpt_run *run) {
  (*(size_t *)ctx)++;
  return 0;
}

static void test_run_counts(void **state) {
  struct ckpt_box chunk = box2(10, 0, 4, 8);
  size_t n = 0;
  /* Full rows of the chunk are one contiguous run. */
  struct ckpt_box rows = box2(11, 0, 2, 8);
  assert_int_equal(ckpt_box_runs(&rows, &chunk, &rows, 4, count_run, &n), 0);
  assert_int_equal(n, 1);
  /* A column slab is one run per row. */
  struct ckpt_box cols = box2(10, 2, 4, 3);
  struct ckpt_run *runs;
  assert_int_equal(ckpt_box_runs_collect(&cols, &chunk, &cols, 4, &runs, &n), 0);
  assert_int_equal(n, 4);
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(runs[i].src_offset, (i * 8 + 2) * 4);
    assert_int_equal(runs[i].dst_offset, i * 3 * 4);
    assert_int_equal(runs[i].len, 12);
  }
  free(runs);
  /* Rows of a 1-column layout: src and dst both contiguous -> merged. */
  struct ckpt_box thin = box2(0, 0, 5, 1);
  n = 0;
  assert_int_equal(ckpt_box_runs(&thin, &thin, &thin, 2, count_run, &n), 0);
  assert_int_equal(n, 1);
  /* A box outside its source is refused. */
  assert_int_equal(ckpt_box_runs(&rows, &cols, &rows, 4, count_run, &n), STK_EINVAL);
}

static uint64_t rnd(uint64_t n) {
  return n ? (uint64_t)rand() % n : 0;
}

static struct ckpt_box random_box(const struct ckpt_shape *s) {
  struct ckpt_box b = {.ndim = s->ndim};
  for (uint32_t d = 0; d < s->ndim; d++) {
    b.offsets[d] = rnd(s->dims[d]);
    b.sizes[d] = 1 + rnd(s->dims[d] - b.offsets[d]);
  }
  return b;
}

/* Global linear index of box-local element i (row-major in box b). */
static uint64_t global_index(const struct ckpt_shape *s, const struct ckpt_box *b, uint64_t i) {
  uint64_t g = 0, stride = 1;
  for (uint32_t d = s->ndim; d-- > 0;) {
    g += (b->offsets[d] + i % b->sizes[d]) * stride;
    i /= b->sizes[d];
    stride *= s->dims[d];
  }
  return g;
}

/* Fills a box's buffer with the global index of each element. */
static uint32_t *fill_box(const struct ckpt_shape *s, const struct ckpt_box *b) {
  uint64_t n = ckpt_box_numel(b);
  uint32_t *v = malloc(n * sizeof(*v));
  for (uint64_t i = 0; i < n; i++) v[i] = (uint32_t)global_index(s, b, i);
  return v;
}

static bool inside(const struct ckpt_shape *s, const struct ckpt_box *x, uint64_t g) {
  for (uint32_t d = s->ndim; d-- > 0;) {
    uint64_t c = g % s->dims[d];
    g /= s->dims[d];
    if (c < x->offsets[d] || c >= x->offsets[d] + x->sizes[d]) return false;
  }
  return true;
}

static void test_runs_match_reference(void **state) {
  struct ckpt_shape s = {3, {6, 7, 5}};
  srand(42);
  for (int trial = 0; trial < 300; trial++) {
    struct ckpt_box src = random_box(&s), dst = random_box(&s), x;
    if (!ckpt_box_intersect(&src, &dst, &x)) continue;
    uint32_t *sv = fill_box(&s, &src);
    uint64_t dn = ckpt_box_numel(&dst);
    uint32_t *dv = malloc(dn * sizeof(*dv));
    memset(dv, 0xFF, dn * sizeof(*dv));
    struct ckpt_run *runs;
    size_t n;
    assert_int_equal(ckpt_box_runs_collect(&x, &src, &dst, 4, &runs, &n), 0);
    for (size_t i = 0; i < n; i++) {
      if (i > 0) assert_true(runs[i].src_offset > runs[i - 1].src_offset);
      memcpy((char *)dv + runs[i].dst_offset, (char *)sv + runs[i].src_offset, runs[i].len);
    }
    for (uint64_t i = 0; i < dn; i++) {
      uint64_t g = global_index(&s, &dst, i);
      assert_int_equal(dv[i], inside(&s, &x, g) ? (uint32_t)g : 0xFFFFFFFFu);
    }
    free(runs);
    free(sv);
    free(dv);
  }
}

static void test_ranges_coalesce(void **state) {
  struct ckpt_range r[] = {{100, 10}, {0, 10}, {10, 5}, {50, 10}, {105, 20}};
  /* Touching and overlapping merge; gaps stay. */
  struct ckpt_range a[5];
  memcpy(a, r, sizeof(r));
  size_t n = ckpt_ranges_coalesce(a, 5, 0, 0);
  assert_int_equal(n, 3);
  assert_int_equal(a[0].offset, 0);
  assert_int_equal(a[0].len, 15);
  assert_int_equal(a[1].offset, 50);
  assert_int_equal(a[2].offset, 100);
  assert_int_equal(a[2].len, 25);
  /* A gap allowance of 40 joins everything... */
  memcpy(a, r, sizeof(r));
  assert_int_equal(ckpt_ranges_coalesce(a, 5, 40, 0), 1);
  assert_int_equal(a[0].len, 125);
  /* ...unless a merged read would exceed the size limit. */
  memcpy(a, r, sizeof(r));
  assert_int_equal(ckpt_ranges_coalesce(a, 5, 40, 70), 2);
  assert_int_equal(a[0].len, 60);
}

static void test_shard_dim0(void **state) {
  struct ckpt_shape s = {2, {10, 3}};
  struct ckpt_box b;
  uint64_t expect[][2] = {{0, 3}, {3, 3}, {6, 4}};
  for (uint32_t r = 0; r < 3; r++) {
    assert_int_equal(ckpt_shard_dim0(&s, r, 3, &b), 0);
    assert_int_equal(b.offsets[0], expect[r][0]);
    assert_int_equal(b.sizes[0], expect[r][1]);
    assert_int_equal(b.sizes[1], 3);
  }
  /* More ranks than rows: some are empty. */
  struct ckpt_shape small = {1, {2}};
  uint64_t total = 0;
  for (uint32_t r = 0; r < 8; r++) {
    assert_int_equal(ckpt_shard_dim0(&small, r, 8, &b), 0);
    total += b.sizes[0];
  }
  assert_int_equal(total, 2);
  assert_int_equal(ckpt_shard_dim0(&s, 3, 3, &b), STK_EINVAL);
  struct ckpt_shape scalar = {0, {0}};
  assert_int_equal(ckpt_shard_dim0(&scalar, 0, 4, &b), 0);
  assert_int_equal(ckpt_shard_dim0(&scalar, 1, 4, &b), STK_ENOENT);
}

static void test_shard_flat(void **state) {
  struct ckpt_box b;
  uint64_t shard;
  assert_int_equal(ckpt_shard_flat(10, 3, 4, &b, &shard), 0);
  assert_int_equal(shard, 3);
  assert_int_equal(b.offsets[0], 9);
  assert_int_equal(b.sizes[0], 1); /* 2 elements of padding. */
  assert_int_equal(ckpt_shard_flat(5, 6, 8, &b, &shard), 0);
  assert_int_equal(shard, 1);
  assert_int_equal(b.sizes[0], 0);
  assert_int_equal(ckpt_shard_flat(5, 0, 0, &b, &shard), STK_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_checks),          cmocka_unit_test(test_intersect),
      cmocka_unit_test(test_run_counts),      cmocka_unit_test(test_runs_match_reference),
      cmocka_unit_test(test_ranges_coalesce), cmocka_unit_test(test_shard_dim0),
      cmocka_unit_test(test_shard_flat),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
