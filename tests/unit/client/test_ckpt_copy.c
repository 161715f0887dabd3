/*
 * test_ckpt_copy: the staging copy with non-temporal stores (ckpt_copy.c)
 * writes exactly what memcpy writes, for every alignment of source and
 * destination, lengths around the streaming threshold and the 64-byte
 * step, and never a byte outside the destination.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ckpt_copy.h"

#define GUARD 128

static void fill(uint8_t *p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    p[i] = (uint8_t)(seed >> 24);
  }
}

/* Copies n bytes from src + src_off to dst + dst_off and compares with
 * the expected buffer, guard bytes on both sides included. */
static void check(size_t n, size_t src_off, size_t dst_off) {
  size_t span = n + 2 * GUARD + 64;
  uint8_t *src = malloc(span), *dst = malloc(span), *want = malloc(span);
  assert_non_null(src);
  assert_non_null(dst);
  assert_non_null(want);
  fill(src, span, (uint32_t)(n * 31 + src_off));
  fill(dst, span, (uint32_t)(n * 17 + dst_off + 1));
  memcpy(want, dst, span);
  memcpy(want + GUARD + dst_off, src + GUARD + src_off, n);
  ckpt_copy_stream(dst + GUARD + dst_off, src + GUARD + src_off, n);
  assert_memory_equal(dst, want, span);
  free(src);
  free(dst);
  free(want);
}

static void test_small_copies(void **state) {
  (void)state;
  for (size_t n = 0; n < 300; n++) check(n, n % 7, n % 13);
}

static void test_alignments_around_threshold(void **state) {
  (void)state;
  const size_t base = CKPT_COPY_STREAM_MIN;
  const size_t lengths[] = {base - 1, base, base + 1, base + 63, base + 64, base + 65, base + 4097};
  for (size_t l = 0; l < sizeof lengths / sizeof lengths[0]; l++)
    for (size_t s = 0; s < 64; s += 5)
      for (size_t d = 0; d < 64; d += 3) check(lengths[l], s, d);
}

static void test_large_copy(void **state) {
  (void)state;
  check((size_t)9 << 20, 16, 0); /* A malloc'd source into a page-aligned segment. */
  check(((size_t)9 << 20) + 37, 3, 61);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_small_copies),
      cmocka_unit_test(test_alignments_around_threshold),
      cmocka_unit_test(test_large_copy),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
