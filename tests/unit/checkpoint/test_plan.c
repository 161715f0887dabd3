/*
 * Tests for ckpt_plan: save a tensor at one world size into in-memory
 * "objects", restore every rank's box at another world size through the
 * planner's reads and copies, and compare with the original bytes (1-D FSDP
 * flat shards and 2-D row/column shards; 4 -> 3 and 4 -> 8). Also read
 * coalescing, alignment, and refusal of uncovered or overlapping input;
 * reads of several plans merged into spans (ckpt_plan_spans).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ckpt_box.h"
#include "ckpt_plan.h"
#include "stk_error.h"

#define ELEM    4  /* f32 */
#define HEADER  40 /* Bytes before the chunk in each object. */
#define TRAILER 24 /* Bytes after it. */

enum mode { FLAT, ROWS, COLS };

/* The box of rank r of world for a sharding mode. */
static struct ckpt_box shard(const struct ckpt_shape *s, enum mode m, uint32_t r, uint32_t world) {
  struct ckpt_box b;
  uint64_t shard_numel;
  if (m == FLAT) {
    assert_int_equal(ckpt_shard_flat(s->dims[0], r, world, &b, &shard_numel), 0);
  } else if (m == ROWS) {
    assert_int_equal(ckpt_shard_dim0(s, r, world, &b), 0);
  } else { /* Dim 1, by sharding the transposed shape. */
    struct ckpt_shape t = {2, {s->dims[1], s->dims[0]}};
    struct ckpt_box tb;
    assert_int_equal(ckpt_shard_dim0(&t, r, world, &tb), 0);
    b = (struct ckpt_box){2, {0, tb.offsets[0]}, {s->dims[0], tb.sizes[0]}};
  }
  return b;
}

/* The row-major bytes of box b cut out of the whole tensor. */
static unsigned char *extract(const struct ckpt_shape *s, const unsigned char *whole,
                              const struct ckpt_box *b) {
  struct ckpt_box all;
  ckpt_box_of_shape(s, &all);
  uint64_t n = ckpt_box_numel(b) * ELEM;
  unsigned char *out = malloc(n ? n : 1);
  struct ckpt_run *runs;
  size_t count;
  assert_int_equal(ckpt_box_runs_collect(b, &all, b, ELEM, &runs, &count), 0);
  for (size_t i = 0; i < count; i++)
    memcpy(out + runs[i].dst_offset, whole + runs[i].src_offset, runs[i].len);
  free(runs);
  return out;
}

struct saved {
  unsigned char *objects[16];
  uint64_t sizes[16];
  struct ckpt_stored_chunk chunks[16];
  size_t n;
};

/* Saves the tensor at world ranks: one object per rank. */
static void save(const struct ckpt_shape *s, const unsigned char *whole, enum mode m,
                 uint32_t world, struct saved *sv) {
  memset(sv, 0, sizeof(*sv));
  for (uint32_t r = 0; r < world; r++) {
    struct ckpt_box b = shard(s, m, r, world);
    uint64_t len = ckpt_box_numel(&b) * ELEM;
    unsigned char *bytes = extract(s, whole, &b);
    sv->sizes[r] = HEADER + len + TRAILER;
    sv->objects[r] = malloc(sv->sizes[r]);
    memset(sv->objects[r], 0xEE, sv->sizes[r]);
    memcpy(sv->objects[r] + HEADER, bytes, len);
    free(bytes);
    sv->chunks[r] = (struct ckpt_stored_chunk){b, r, HEADER, sv->sizes[r]};
  }
  sv->n = world;
}

static void release(struct saved *sv) {
  for (size_t i = 0; i < sv->n; i++) free(sv->objects[i]);
}

/* Restores box want through a plan; checks it equals the original bytes. */
static void restore_box(const struct ckpt_shape *s, const unsigned char *whole,
                        const struct saved *sv, const struct ckpt_box *want,
                        const struct ckpt_plan_opts *o, struct ckpt_plan *ret_plan) {
  assert_int_equal(ckpt_plan_build(sv->chunks, sv->n, ELEM, want, o, ret_plan), 0);
  unsigned char *dst = malloc(ret_plan->want_bytes ? ret_plan->want_bytes : 1);
  memset(dst, 0x55, ret_plan->want_bytes);
  for (size_t i = 0; i < ret_plan->n_reads; i++) {
    const struct ckpt_read *r = &ret_plan->reads[i];
    assert_true(r->offset + r->len <= sv->sizes[r->object]);
    ckpt_plan_apply(ret_plan, i, sv->objects[r->object] + r->offset, dst);
  }
  unsigned char *expect = extract(s, whole, want);
  assert_memory_equal(dst, expect, ret_plan->want_bytes);
  free(expect);
  free(dst);
}

/* Saves at `from` ranks, restores every rank at `to` ranks. */
static void reshard(const struct ckpt_shape *s, enum mode save_mode, uint32_t from,
                    enum mode load_mode, uint32_t to) {
  uint64_t numel;
  assert_int_equal(ckpt_shape_check(s, ELEM, &numel), 0);
  unsigned char *whole = malloc(numel * ELEM);
  srand((unsigned)(numel + from * 7 + to));
  for (uint64_t i = 0; i < numel * ELEM; i++) whole[i] = (unsigned char)rand();
  struct saved sv;
  save(s, whole, save_mode, from, &sv);
  for (uint32_t r = 0; r < to; r++) {
    struct ckpt_box want = shard(s, load_mode, r, to);
    struct ckpt_plan plan;
    restore_box(s, whole, &sv, &want, NULL, &plan);
    /* Exact reads: nothing fetched that is not needed. */
    assert_int_equal(plan.read_bytes, plan.want_bytes);
    ckpt_plan_close(&plan);
  }
  release(&sv);
  free(whole);
}

static void test_flat_4_to_3_and_8(void **state) {
  struct ckpt_shape s = {1, {10007}};
  reshard(&s, FLAT, 4, FLAT, 3);
  reshard(&s, FLAT, 4, FLAT, 8);
  reshard(&s, FLAT, 8, FLAT, 4);
}

static void test_2d_rows_4_to_3_and_8(void **state) {
  struct ckpt_shape s = {2, {37, 23}};
  reshard(&s, ROWS, 4, ROWS, 3);
  reshard(&s, ROWS, 4, ROWS, 8);
}

static void test_2d_cols_and_rows(void **state) {
  struct ckpt_shape s = {2, {29, 41}};
  reshard(&s, COLS, 4, ROWS, 3);
  reshard(&s, ROWS, 4, COLS, 8);
  reshard(&s, COLS, 4, COLS, 3);
}

/* Row-sharded storage read by columns: strided runs, coalesced on request. */
static void test_coalescing_and_alignment(void **state) {
  struct ckpt_shape s = {2, {16, 32}};
  unsigned char whole[16 * 32 * ELEM];
  for (size_t i = 0; i < sizeof(whole); i++) whole[i] = (unsigned char)(i * 13 + 1);
  struct saved sv;
  save(&s, whole, ROWS, 4, &sv);
  struct ckpt_box want = shard(&s, COLS, 1, 4); /* Columns 8..16. */
  struct ckpt_plan plan;
  restore_box(&s, whole, &sv, &want, NULL, &plan);
  assert_int_equal(plan.n_reads, 16); /* One per row: gaps are not read. */
  ckpt_plan_close(&plan);
  struct ckpt_plan_opts gap = {.max_gap_bytes = 24 * ELEM};
  restore_box(&s, whole, &sv, &want, &gap, &plan);
  assert_int_equal(plan.n_reads, 4); /* One per object. */
  assert_true(plan.read_bytes > plan.want_bytes);
  for (size_t i = 1; i < plan.n_reads; i++)
    assert_true(plan.reads[i].object > plan.reads[i - 1].object);
  ckpt_plan_close(&plan);
  struct ckpt_plan_opts cap = {.max_gap_bytes = 24 * ELEM, .max_read_bytes = 100};
  restore_box(&s, whole, &sv, &want, &cap, &plan);
  assert_int_equal(plan.n_reads, 16);
  ckpt_plan_close(&plan);
  struct ckpt_plan_opts align = {.align_bytes = 64};
  restore_box(&s, whole, &sv, &want, &align, &plan);
  for (size_t i = 0; i < plan.n_reads; i++) {
    const struct ckpt_read *r = &plan.reads[i];
    assert_int_equal(r->offset % 64, 0);
    assert_true((r->offset + r->len) % 64 == 0 || r->offset + r->len == sv.sizes[r->object]);
  }
  ckpt_plan_close(&plan);
  release(&sv);
}

static void test_refusals(void **state) {
  struct ckpt_shape s = {2, {8, 8}};
  unsigned char whole[8 * 8 * ELEM] = {0};
  struct saved sv;
  save(&s, whole, ROWS, 4, &sv);
  struct ckpt_box want;
  ckpt_box_of_shape(&s, &want);
  struct ckpt_plan plan;
  /* A missing chunk leaves the wanted box uncovered. */
  assert_int_equal(ckpt_plan_build(sv.chunks, 3, ELEM, &want, NULL, &plan), STK_ENOENT);
  assert_null(plan.reads);
  /* Overlapping chunks would write some bytes twice. */
  sv.chunks[1].box = sv.chunks[0].box;
  sv.chunks[1].box.sizes[0] += 1;
  sv.chunks[1].object_bytes += 8 * ELEM;
  assert_int_equal(ckpt_plan_build(sv.chunks, 4, ELEM, &want, NULL, &plan), STK_ECORRUPT);
  /* A chunk that claims bytes past its object. */
  release(&sv);
  save(&s, whole, ROWS, 4, &sv);
  sv.chunks[2].object_offset = sv.sizes[2] - 1;
  assert_int_equal(ckpt_plan_build(sv.chunks, 4, ELEM, &want, NULL, &plan), STK_EINVAL);
  /* Mismatched dims. */
  struct ckpt_box one_d = {.ndim = 1, .sizes = {8}};
  sv.chunks[2].object_offset = HEADER;
  assert_int_equal(ckpt_plan_build(sv.chunks, 4, ELEM, &one_d, NULL, &plan), STK_EINVAL);
  release(&sv);
}

/* A plan holding only reads (object, offset, len). */
static struct ckpt_plan reads_plan(struct ckpt_read *r, size_t n) {
  return (struct ckpt_plan){.reads = r, .n_reads = n};
}

static void test_spans(void **state) {
  (void)state;
  const uint64_t MiB = 1 << 20;
  /* Plan 0 wants object 1 at 0 and object 0 at 4 MiB; plan 1 object 1 at
   * 1 MiB (touching), object 1 at 3 MiB (a gap of 1 MiB: merged) and object
   * 0 at 0 (a gap of 3 MiB: its own span); plan 2 object 1 at 6 MiB (a gap
   * of 1 MiB, but merged the span would pass its limit of 8 MiB: a new one). */
  struct ckpt_read r0[] = {{1, 0, MiB, 0, 0}, {0, 4 * MiB, MiB, 0, 0}};
  struct ckpt_read r1[] = {{1, MiB, MiB, 0, 0}, {1, 3 * MiB, 2 * MiB, 0, 0}, {0, 0, MiB, 0, 0}};
  struct ckpt_read r2[] = {{1, 6 * MiB, 3 * MiB, 0, 0}};
  struct ckpt_plan plans[] = {reads_plan(r0, 2), reads_plan(r1, 3), reads_plan(r2, 1)};
  struct ckpt_span *spans;
  size_t n, *read_span;
  assert_int_equal(ckpt_plan_spans(plans, 3, MiB, 8 * MiB, &spans, &n, &read_span), 0);
  assert_int_equal(n, 4);
  struct ckpt_span expect[] = {
      {0, 0, MiB}, {0, 4 * MiB, MiB}, {1, 0, 5 * MiB}, {1, 6 * MiB, 3 * MiB}};
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(spans[i].object, expect[i].object);
    assert_int_equal(spans[i].offset, expect[i].offset);
    assert_int_equal(spans[i].len, expect[i].len);
  }
  size_t want[] = {2, 1, 2, 2, 0, 3};
  for (size_t i = 0; i < 6; i++) assert_int_equal(read_span[i], want[i]);
  free(spans);
  free(read_span);
  /* No reads: no spans. */
  assert_int_equal(ckpt_plan_spans(plans, 0, MiB, 0, &spans, &n, &read_span), 0);
  assert_int_equal(n, 0);
  free(spans);
  free(read_span);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_flat_4_to_3_and_8), cmocka_unit_test(test_2d_rows_4_to_3_and_8),
      cmocka_unit_test(test_2d_cols_and_rows),  cmocka_unit_test(test_coalescing_and_alignment),
      cmocka_unit_test(test_refusals),          cmocka_unit_test(test_spans),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
