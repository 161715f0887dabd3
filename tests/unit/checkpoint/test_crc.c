/*
 * Tests for ckpt_crc: the CRC32C conventions (standard check values), the
 * streaming block accumulator against one-shot CRCs for random splits, and
 * partial-read verification (fetch range widening, flipped bytes detected).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ckpt_crc.h"
#include "stk_error.h"

#define MIB CKPT_CRC_BLOCK_BYTES

static void test_check_values(void **state) {
  assert_int_equal(ckpt_crc32c("123456789", 9), 0xE3069283u);
  assert_int_equal(ckpt_crc32c("", 0), 0);
  /* RFC 3720 B.4 vectors. */
  unsigned char buf[32];
  memset(buf, 0, sizeof(buf));
  assert_int_equal(ckpt_crc32c(buf, 32), 0x8A9136AAu);
  memset(buf, 0xFF, sizeof(buf));
  assert_int_equal(ckpt_crc32c(buf, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; i++) buf[i] = (unsigned char)i;
  assert_int_equal(ckpt_crc32c(buf, 32), 0x46DD794Eu);
  /* Extending a finished CRC equals the CRC of the concatenation. */
  assert_int_equal(ckpt_crc32c_extend(ckpt_crc32c("1234", 4), "56789", 5), 0xE3069283u);
}

static unsigned char *random_bytes(size_t n, unsigned seed) {
  unsigned char *p = malloc(n ? n : 1);
  srand(seed);
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)rand();
  return p;
}

/* Feeds data in random pieces and compares with one-shot block CRCs. */
static void stream_matches(const unsigned char *data, size_t n, unsigned seed) {
  struct ckpt_crc_stream s;
  ckpt_crc_stream_init(&s);
  srand(seed);
  for (size_t at = 0; at < n;) {
    size_t piece = (size_t)rand() % (rand() % 4 == 0 ? 3 * MIB : 70000) + 1;
    if (piece > n - at) piece = n - at;
    assert_int_equal(ckpt_crc_stream_feed(&s, data + at, piece), 0);
    at += piece;
  }
  uint32_t *crcs;
  size_t count;
  assert_int_equal(ckpt_crc_stream_finish(&s, &crcs, &count), 0);
  assert_int_equal(count, ckpt_crc_block_count(n));
  for (size_t b = 0; b < count; b++) {
    size_t len = n - b * MIB < MIB ? n - b * MIB : MIB;
    assert_int_equal(crcs[b], ckpt_crc32c(data + b * MIB, len));
  }
  free(crcs);
  ckpt_crc_stream_close(&s);
}

static void test_stream_random_splits(void **state) {
  size_t sizes[] = {0, 1, MIB - 1, MIB, MIB + 1, 2 * MIB, 3 * MIB + MIB / 2};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    unsigned char *data = random_bytes(sizes[i], (unsigned)i + 7);
    for (unsigned seed = 1; seed <= 5; seed++) stream_matches(data, sizes[i], seed * 31 + i);
    free(data);
  }
}

static void test_block_count(void **state) {
  assert_int_equal(ckpt_crc_block_count(0), 0);
  assert_int_equal(ckpt_crc_block_count(1), 1);
  assert_int_equal(ckpt_crc_block_count(MIB), 1);
  assert_int_equal(ckpt_crc_block_count(MIB + 1), 2);
}

static void test_fetch_range(void **state) {
  struct ckpt_crc_range r;
  uint64_t size = 3 * MIB + 100;
  assert_int_equal(ckpt_crc_fetch_range(size, MIB + 5, 10, &r), 0);
  assert_int_equal(r.offset, MIB);
  assert_int_equal(r.len, MIB);
  assert_int_equal(r.first_block, 1);
  assert_int_equal(r.blocks, 1);
  /* Crossing a block boundary needs both blocks. */
  assert_int_equal(ckpt_crc_fetch_range(size, MIB - 1, 2, &r), 0);
  assert_int_equal(r.offset, 0);
  assert_int_equal(r.len, 2 * MIB);
  assert_int_equal(r.blocks, 2);
  /* The last block ends at the object's end. */
  assert_int_equal(ckpt_crc_fetch_range(size, 3 * MIB + 50, 50, &r), 0);
  assert_int_equal(r.offset, 3 * MIB);
  assert_int_equal(r.len, 100);
  assert_int_equal(r.first_block, 3);
  /* Outside the object. */
  assert_int_equal(ckpt_crc_fetch_range(size, size - 10, 11, &r), STK_ERANGE);
  assert_int_equal(ckpt_crc_fetch_range(size, UINT64_MAX, 2, &r), STK_ERANGE);
}

static void test_partial_verify_detects_flip(void **state) {
  size_t n = 3 * MIB + MIB / 2;
  unsigned char *data = random_bytes(n, 99);
  struct ckpt_crc_stream s;
  ckpt_crc_stream_init(&s);
  assert_int_equal(ckpt_crc_stream_feed(&s, data, n), 0);
  uint32_t *crcs;
  size_t count;
  assert_int_equal(ckpt_crc_stream_finish(&s, &crcs, &count), 0);
  /* A partial read of 1000 bytes at 2.2 MiB needs block 2 only. */
  struct ckpt_crc_range r;
  assert_int_equal(ckpt_crc_fetch_range(n, 2 * MIB + MIB / 5, 1000, &r), 0);
  assert_int_equal(r.first_block, 2);
  assert_int_equal(r.blocks, 1);
  assert_int_equal(ckpt_crc_verify(crcs, count, n, r.offset, data + r.offset, r.len), 0);
  /* A flipped byte inside the fetched blocks is caught... */
  data[r.offset + 12345] ^= 0x10;
  assert_int_equal(ckpt_crc_verify(crcs, count, n, r.offset, data + r.offset, r.len), STK_ECORRUPT);
  assert_non_null(strstr(stk_detail(), "block 2"));
  data[r.offset + 12345] ^= 0x10;
  /* ...and one outside them is not looked at. */
  data[10] ^= 1;
  assert_int_equal(ckpt_crc_verify(crcs, count, n, r.offset, data + r.offset, r.len), 0);
  assert_int_equal(ckpt_crc_verify(crcs, count, n, 0, data, n), STK_ECORRUPT);
  data[10] ^= 1;
  /* The final partial block verifies. */
  assert_int_equal(ckpt_crc_verify(crcs, count, n, 3 * MIB, data + 3 * MIB, MIB / 2), 0);
  /* Misaligned ranges and wrong CRC counts are refused. */
  assert_int_equal(ckpt_crc_verify(crcs, count, n, 5, data + 5, MIB), STK_EINVAL);
  assert_int_equal(ckpt_crc_verify(crcs, count, n, 0, data, MIB + 1), STK_EINVAL);
  assert_int_equal(ckpt_crc_verify(crcs, count - 1, n, 0, data, MIB), STK_EINVAL);
  free(crcs);
  free(data);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_check_values),
      cmocka_unit_test(test_stream_random_splits),
      cmocka_unit_test(test_block_count),
      cmocka_unit_test(test_fetch_range),
      cmocka_unit_test(test_partial_verify_detects_flip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
