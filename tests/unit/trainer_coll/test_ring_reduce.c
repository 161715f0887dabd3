/*
 * test_ring_reduce.c: the reduce kernels the ring applies to each segment:
 * f32 addition, and bf16 addition in f32 rounded to nearest even (ties go to
 * the even mantissa; NaN stays NaN; overflow goes to infinity), with outputs
 * aliasing an input as the ring uses them.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "ring_internal.h"

static uint16_t bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16); /* Exact for the values used below. */
}

static float fl(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static void test_f32_sum_in_place(void **state) {
  float a[5] = {1, 2, 3, 4, 5}, b[5] = {10, 20, 30, 40, 0.5f};
  ring_reduce(COLL_F32, a, a, b, sizeof a);
  float want[5] = {11, 22, 33, 44, 5.5f};
  assert_memory_equal(a, want, sizeof a);
}

static void test_bf16_ties_to_even(void **state) {
  /* bf16 has 8 significant bits: next to 1.0 the spacing is 2^-7. */
  uint16_t a[4] = {bf(1.0f), bf(1.0f), bf(256.0f), bf(-1.0f)};
  uint16_t b[4] = {bf(0x1p-8f), bf(0x1.8p-7f), bf(1.0f), bf(-0x1p-8f)};
  uint16_t out[4];
  ring_reduce(COLL_BF16, out, a, b, sizeof a);
  assert_true(fl(out[0]) == 1.0f);           /* 1 + 2^-8: tie, down to even 1.0. */
  assert_true(fl(out[1]) == 1.0f + 0x1p-6f); /* 1 + 3*2^-8: tie, up to even. */
  assert_true(fl(out[2]) == 256.0f);         /* 257: tie between 256 and 258, even is 256. */
  assert_true(fl(out[3]) == -1.0f);
}

static void test_bf16_round_nearest(void **state) {
  uint16_t a[2] = {bf(1.0f), bf(1.0f)};
  uint16_t b[2] = {bf(0x1.4p-7f), bf(0x1p-9f)};
  ring_reduce(COLL_BF16, b, a, b, sizeof a); /* Output aliases the second input. */
  assert_true(fl(b[0]) == 1.0f + 0x1p-7f);   /* 1 + 1.25 * 2^-7: nearest is 1 + 2^-7. */
  assert_true(fl(b[1]) == 1.0f);             /* 1 + 2^-9: below half, truncated. */
}

static void test_bf16_specials(void **state) {
  uint16_t a[3] = {0x7fc0 /* NaN */, bf(0x1.fep127f), bf(INFINITY)};
  uint16_t b[3] = {bf(1.0f), bf(0x1.fep127f), bf(-INFINITY)};
  uint16_t out[3];
  ring_reduce(COLL_BF16, out, a, b, sizeof a);
  assert_true(isnan(fl(out[0])));
  assert_true(isinf(fl(out[1])) && fl(out[1]) > 0); /* Max + max overflows. */
  assert_true(isnan(fl(out[2])));                   /* inf - inf. */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_f32_sum_in_place),
      cmocka_unit_test(test_bf16_ties_to_even),
      cmocka_unit_test(test_bf16_round_nearest),
      cmocka_unit_test(test_bf16_specials),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
