/*
 * test_ring.c: the ring collectives give the same answers as a local
 * reference for n = 2..5 ranks and sizes that do and do not divide by n
 * (including 0, 1 and a vector over 1 MiB), for f32 and bf16, with the
 * default segment size and a tiny one (many segments in flight per step).
 * All-gather also runs in place and with its send buffer elsewhere inside the
 * output (the next rank's slot, our slot shifted by one element), and must
 * leave an out-of-place send buffer untouched. The segment size may change
 * between calls (from 1 MiB down to a few bytes).
 * Reductions use integer-valued data, so every summation order is exact;
 * one test uses random floats and compares within a tolerance.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "coll.h"
#include "ring.h"
#include "ring_harness.h"

#define TIMEOUT_MS 60000

struct job {
  enum coll_dtype dt;
  size_t segment_bytes; /* 0: default. */
  int random_floats;
  int failures; /* Counted by every rank (atomic). */
};

static size_t sizes[] = {0, 1, 7, 0 /* n-1 */, 0 /* n+1 */, 1000, (1u << 20) + 3};

static float value(int rank, size_t i) {
  return (float)((int)((rank * 31 + i * 7) % 17) - 8);
}

static float random_value(int rank, size_t i) {
  uint32_t x = (uint32_t)(rank * 2654435761u) ^ (uint32_t)(i * 40503u + 12345u);
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  x ^= x >> 15;
  return (float)(x % 20000) / 1000.0f - 10.0f;
}

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16); /* Exact for our small integers. */
}

static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Fills count elements of rank's data starting at element `first`. */
static void fill(const struct job *j, int rank, void *buf, size_t first, size_t count) {
  for (size_t i = 0; i < count; i++) {
    float v = j->random_floats ? random_value(rank, first + i) : value(rank, first + i);
    if (j->dt == COLL_F32)
      ((float *)buf)[i] = v;
    else
      ((uint16_t *)buf)[i] = to_bf16(v);
  }
}

static float get(const struct job *j, const void *buf, size_t i) {
  return j->dt == COLL_F32 ? ((const float *)buf)[i] : from_bf16(((const uint16_t *)buf)[i]);
}

/* Sum over ranks of element i, in double. */
static double expected_sum(const struct job *j, int n, size_t i) {
  double s = 0;
  for (int q = 0; q < n; q++) s += j->random_floats ? random_value(q, i) : value(q, i);
  return s;
}

static int close_enough(const struct job *j, float got, double want) {
  if (!j->random_floats) return got == (float)want;
  return fabs(got - want) <= 1e-4 * (1 + fabs(want));
}

static int check_all_gather(struct coll_group *g, const struct job *j, size_t count) {
  size_t es = coll_dtype_size(j->dt), n = (size_t)g->size;
  uint8_t *send = malloc(count * es + 1), *recv = malloc(n * count * es + 1);
  uint8_t *want = malloc(n * count * es + 1);
  fill(j, g->rank, send, 0, count);
  for (size_t q = 0; q < n; q++) fill(j, (int)q, want + q * count * es, 0, count);
  int rc = coll_all_gather(g, send, recv, count, j->dt);
  int ok = rc == 0 && memcmp(recv, want, n * count * es) == 0;
  fill(j, g->rank, want, 0, count); /* The send buffer is read, never written. */
  ok = ok && memcmp(send, want, count * es) == 0;
  free(send), free(recv), free(want);
  return ok;
}

/* Where an aliased all-gather's send buffer lies inside its output. */
enum alias {
  ALIAS_OWN,   /* In place: our own slot (sent from there, no copy). */
  ALIAS_NEXT,  /* The next rank's slot: overwritten by a receive, copied first. */
  ALIAS_SHIFT, /* Our slot shifted by one element: overlaps it partly. */
};

static int check_all_gather_aliased(struct coll_group *g, const struct job *j, size_t count,
                                    enum alias a) {
  size_t es = coll_dtype_size(j->dt), n = (size_t)g->size, r = (size_t)g->rank;
  uint8_t *buf = malloc((n + 1) * count * es + es), *want = malloc(n * count * es + 1);
  size_t at = a == ALIAS_OWN ? r * count : a == ALIAS_NEXT ? (r + 1) % n * count : r * count + 1;
  memset(buf, 0x5a, (n + 1) * count * es + es);
  fill(j, g->rank, buf + at * es, 0, count);
  for (size_t q = 0; q < n; q++) fill(j, (int)q, want + q * count * es, 0, count);
  int rc = coll_all_gather(g, buf + at * es, buf, count, j->dt);
  int ok = rc == 0 && memcmp(buf, want, n * count * es) == 0;
  free(buf), free(want);
  return ok;
}

static int check_reduce_scatter(struct coll_group *g, const struct job *j, size_t count) {
  size_t es = coll_dtype_size(j->dt), n = (size_t)g->size;
  uint8_t *send = malloc(n * count * es + 1), *recv = malloc(count * es + 1);
  fill(j, g->rank, send, 0, n * count);
  int rc = coll_reduce_scatter(g, send, recv, count, j->dt);
  int ok = rc == 0;
  for (size_t i = 0; ok && i < count; i++)
    ok = close_enough(j, get(j, recv, i), expected_sum(j, g->size, g->rank * count + i));
  free(send), free(recv);
  return ok;
}

static int check_all_reduce(struct coll_group *g, const struct job *j, size_t count) {
  size_t es = coll_dtype_size(j->dt);
  uint8_t *buf = malloc(count * es + 1);
  fill(j, g->rank, buf, 0, count);
  int rc = coll_all_reduce(g, buf, count, j->dt);
  int ok = rc == 0;
  for (size_t i = 0; ok && i < count; i++)
    ok = close_enough(j, get(j, buf, i), expected_sum(j, g->size, i));
  free(buf);
  return ok;
}

/* One rank: every collective at every size, on one group. */
static int body(struct coll_group *g, void *arg) {
  struct job *j = arg;
  if (j->segment_bytes) ring_set_segment_bytes(g, j->segment_bytes);
  int bad = 0;
  for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
    size_t count = k == 3 ? (size_t)g->size - 1 : k == 4 ? (size_t)g->size + 1 : sizes[k];
    int ag = check_all_gather(g, j, count), rs = check_reduce_scatter(g, j, count);
    int ar = check_all_reduce(g, j, count);
    for (enum alias a = ALIAS_OWN; a <= ALIAS_SHIFT; a++)
      if (!check_all_gather_aliased(g, j, count, a)) {
        print_error("n=%d rank=%d count=%zu: aliased all-gather %d BAD\n", g->size, g->rank, count,
                    (int)a);
        bad++;
      }
    if (!ag || !rs || !ar)
      print_error("n=%d rank=%d count=%zu: all-gather %s, reduce-scatter %s, all-reduce %s\n",
                  g->size, g->rank, count, ag ? "ok" : "BAD", rs ? "ok" : "BAD", ar ? "ok" : "BAD");
    bad += !ag + !rs + !ar;
  }
  __atomic_add_fetch(&j->failures, bad, __ATOMIC_SEQ_CST);
  return bad ? 1000 : 0;
}

static void run_job(struct job *j) {
  for (int n = 2; n <= 5; n++) {
    void *args[HARNESS_MAX_RANKS];
    for (int r = 0; r < n; r++) args[r] = j;
    struct harness_result res;
    j->failures = 0;
    harness_run(n, TIMEOUT_MS, body, args, &res);
    for (int r = 0; r < n; r++) {
      assert_int_equal(res.join_rc[r], 0);
      assert_int_equal(res.body_rc[r], 0);
    }
    assert_int_equal(j->failures, 0);
  }
}

static void test_f32(void **state) {
  struct job j = {.dt = COLL_F32};
  run_job(&j);
}

static void test_bf16(void **state) {
  struct job j = {.dt = COLL_BF16};
  run_job(&j);
}

static void test_small_segments_f32(void **state) {
  struct job j = {.dt = COLL_F32, .segment_bytes = 4096};
  run_job(&j);
}

static void test_small_segments_bf16(void **state) {
  struct job j = {.dt = COLL_BF16, .segment_bytes = 1000};
  run_job(&j);
}

static void test_random_floats(void **state) {
  struct job j = {.dt = COLL_F32, .random_floats = 1, .segment_bytes = 65536};
  run_job(&j);
}

/* The segment size may change between collectives on one group. */
static int segment_change_body(struct coll_group *g, void *arg) {
  static const size_t segs[] = {4096, 1u << 20, 1000, 12};
  struct job j = {.dt = COLL_F32};
  int bad = 0;
  for (size_t k = 0; k < sizeof segs / sizeof *segs; k++) {
    ring_set_segment_bytes(g, segs[k]);
    size_t count = (1u << 14) + 5 + k;
    bad += !check_reduce_scatter(g, &j, count) + !check_all_reduce(g, &j, count);
  }
  return bad ? 1000 : 0;
}

static void test_segment_change(void **state) {
  for (int n = 2; n <= 3; n++) {
    struct harness_result res;
    harness_run(n, TIMEOUT_MS, segment_change_body, NULL, &res);
    for (int r = 0; r < n; r++) assert_int_equal(res.body_rc[r], 0);
  }
}

/* A group of one is legal: copies, no sockets. */
static void test_single_rank(void **state) {
  struct coll_group *g;
  assert_int_equal(ring_group_new(0, 1, NULL, 1000, -1, &g), 0);
  float send[3] = {1, 2, 3}, recv[3] = {0};
  assert_int_equal(coll_all_gather(g, send, recv, 3, COLL_F32), 0);
  assert_memory_equal(send, recv, sizeof send);
  memset(recv, 0, sizeof recv);
  assert_int_equal(coll_reduce_scatter(g, send, recv, 3, COLL_F32), 0);
  assert_memory_equal(send, recv, sizeof send);
  assert_int_equal(coll_all_reduce(g, send, 3, COLL_F32), 0);
  assert_float_equal(send[2], 3, 0);
  assert_string_equal(g->ops->name, "ring");
  coll_free(g);
}

/* In-place all-gather: the send buffer is this rank's slot of recv. */
static int in_place_body(struct coll_group *g, void *arg) {
  float buf[4 * 5];
  for (int i = 0; i < 5; i++) buf[g->rank * 5 + i] = (float)(g->rank * 100 + i);
  int rc = coll_all_gather(g, buf + g->rank * 5, buf, 5, COLL_F32);
  for (int q = 0; rc == 0 && q < g->size; q++)
    for (int i = 0; i < 5; i++)
      if (buf[q * 5 + i] != (float)(q * 100 + i)) rc = 1000;
  return rc;
}

static void test_all_gather_in_place(void **state) {
  struct harness_result res;
  harness_run(4, TIMEOUT_MS, in_place_body, NULL, &res);
  for (int r = 0; r < 4; r++) assert_int_equal(res.body_rc[r], 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_single_rank),
      cmocka_unit_test(test_f32),
      cmocka_unit_test(test_bf16),
      cmocka_unit_test(test_small_segments_f32),
      cmocka_unit_test(test_small_segments_bf16),
      cmocka_unit_test(test_random_floats),
      cmocka_unit_test(test_all_gather_in_place),
      cmocka_unit_test(test_segment_change),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
