/*
 * dl_scan: the delimiter scan finds exactly the first occurrence at or
 * after the start, or the end, for every start and end around the 32-token
 * steps and for arrays with no, one and many hits; the CPU-specific uint32
 * scan (AVX2 where present) agrees with the portable one and with a plain
 * loop, for uint32 and uint16 tokens.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "dl_scan.h"

#define N 300

static uint64_t naive32(const uint32_t *t, uint64_t i, uint64_t end, uint32_t id) {
  for (; i < end; i++)
    if (t[i] == id) return i;
  return end;
}

static uint64_t naive16(const uint16_t *t, uint64_t i, uint64_t end, uint16_t id) {
  for (; i < end; i++)
    if (t[i] == id) return i;
  return end;
}

/* Fills t with ids 1..50 and the delimiter 0 at every `every`-th place
 * (none when every is 0), shifted by `phase`. */
static void fill(uint32_t *t32, uint16_t *t16, unsigned every, unsigned phase) {
  for (unsigned k = 0; k < N; k++) {
    uint32_t v = 1 + (k * 2654435761u) % 50;
    if (every && k % every == phase % every) v = 0;
    t32[k] = v;
    t16[k] = (uint16_t)v;
  }
}

static void test_every_window(void **state) {
  (void)state;
  uint32_t t32[N];
  uint16_t t16[N];
  const unsigned everies[] = {0, 1, 7, 31, 32, 33, 64, 97, 250};
  for (size_t e = 0; e < sizeof(everies) / sizeof(everies[0]); e++) {
    fill(t32, t16, everies[e], (unsigned)e * 5);
    for (uint64_t i = 0; i <= N; i += 3) {
      for (uint64_t end = i; end <= N; end += 5) {
        uint64_t want = naive32(t32, i, end, 0);
        assert_int_equal(dl_scan_u32(t32, i, end, 0), want);
        assert_int_equal(dl_scan_u32_portable(t32, i, end, 0), want);
        assert_int_equal(dl_scan_u16(t16, i, end, 0), naive16(t16, i, end, 0));
      }
    }
  }
}

static void test_large_ids(void **state) {
  (void)state;
  uint32_t t[N];
  for (unsigned k = 0; k < N; k++) t[k] = 0x80000000u + k; /* Sign bit set: no signed surprises. */
  assert_int_equal(dl_scan_u32(t, 0, N, 0x80000000u + 200), 200);
  assert_int_equal(dl_scan_u32(t, 201, N, 0x80000000u + 200), N);
  assert_int_equal(dl_scan_u32(t, 0, N, 0xFFFFFFFFu), N);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_window),
      cmocka_unit_test(test_large_ids),
  };
  return cmocka_run_group_tests_name("dl_scan", tests, NULL, NULL);
}
