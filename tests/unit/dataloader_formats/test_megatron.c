/*
 * Tests for the Megatron reader: every integer dtype with documents spanning
 * several sequences, the synthetic corpus written to disk, strip ids,
 * directories, each kind of corrupt file (rejected with the file named), and
 * that open never reads the token file.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "dl_source.h"
#include "dl_synthetic.h"
#include "fmt_test.h"
#include "stk_error.h"

/* Six sequences (one empty) in three documents: {0,1} {2} {3,4,5}. */
static const int32_t seq_len[6] = {3, 2, 4, 1, 0, 2};
static const uint32_t tokens[12] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
static const int64_t doc_idx[4] = {0, 2, 3, 6};

static size_t dtype_size(uint8_t d) {
  return d == 1 || d == 2 ? 1 : d == 3 || d == 8 ? 2 : d == 4 ? 4 : 8;
}

static void write_small(const char *prefix, uint8_t dtype) {
  size_t ts = dtype_size(dtype);
  uint8_t bin[12 * 8 + 16] = {0};
  int64_t ptr[6], off = ts; /* one unused token first: pointers are not 0-based */
  for (int i = 0, t = 0; i < 6; i++) {
    ptr[i] = off;
    for (int j = 0; j < seq_len[i]; j++, t++) {
      uint64_t v = tokens[t];
      memcpy(bin + off + (int64_t)j * ts, &v, ts); /* little-endian truncation */
    }
    off += seq_len[i] * (int64_t)ts;
  }
  char p[600];
  snprintf(p, sizeof p, "%s.bin", prefix);
  write_file(p, bin, (size_t)off);
  snprintf(p, sizeof p, "%s.idx", prefix);
  write_megatron_idx(p, dtype, 6, seq_len, ptr, 4, doc_idx);
}

static struct dl_source *open_mm(const char *path, int expect) {
  struct dl_source_opts o = {.name = "mm", .path = path, .format = DL_FORMAT_MEGATRON};
  struct dl_source *s = NULL;
  assert_int_equal(dl_source_open(&o, &s), expect);
  return s;
}

static void check_unit(struct dl_source *s, uint64_t u, const uint32_t *want, size_t n) {
  struct dl_unit unit;
  assert_int_equal(dl_source_read_unit(s, u, &unit), 0);
  assert_int_equal(unit.n_tokens, n);
  assert_memory_equal(unit.tokens, want, n * sizeof *want);
  assert_int_equal(unit.n_docs, 1);
  assert_int_equal(unit.doc_starts[0], 0);
  struct dl_unit_docs docs;
  assert_int_equal(dl_source_unit_docs(s, u, &docs), 0);
  /* Three documents per file here: unit u is document u % 3 of file u / 3. */
  assert_int_equal(unit.file, u / 3);
  assert_int_equal(docs.base, u % 3);
  dl_unit_free(&unit);
}

static void test_dtypes(void **state) {
  char *dir = tmpdir_new();
  uint8_t dtypes[] = {1, 2, 3, 4, 5, 8};
  for (size_t i = 0; i < sizeof dtypes; i++) {
    write_small(path_in(dir, "ds"), dtypes[i]);
    struct dl_source *s = open_mm(path_in(dir, "ds"), 0);
    assert_int_equal(dl_source_units(s), 3);
    assert_int_equal(dl_source_total_weight(s), 12);
    assert_int_equal(dl_source_unit_weight(s, 0), 5);
    assert_int_equal(dl_source_unit_weight(s, 1), 4);
    assert_int_equal(dl_source_unit_weight(s, 2), 3);
    check_unit(s, 0, tokens, 5);
    check_unit(s, 1, tokens + 5, 4); /* 11 inside a document stays */
    check_unit(s, 2, tokens + 9, 3);
    dl_source_free(s);
  }
  /* The .bin or .idx name works as the prefix too. */
  dl_source_free(open_mm(path_in(dir, "ds.idx"), 0));
  tmpdir_remove(dir);
}

static void test_synthetic_files(void **state) {
  char *dir = tmpdir_new();
  for (int dtype = 4; dtype <= 5; dtype++) {
    assert_int_equal(dl_synthetic_write_megatron(path_in(dir, "syn"), 300, 1, 40, 9, dtype, 7), 0);
    struct dl_source *s = open_mm(path_in(dir, "syn"), 0);
    assert_int_equal(dl_source_units(s), 300);
    for (uint64_t u = 0; u < 300; u++) {
      struct dl_unit unit;
      assert_int_equal(dl_source_read_unit(s, u, &unit), 0);
      assert_int_equal(unit.n_tokens, dl_synthetic_doc_len(9, 1, 40, u));
      for (size_t p = 0; p < unit.n_tokens; p++)
        assert_int_equal(unit.tokens[p], dl_synthetic_token(u, (uint32_t)p));
      dl_unit_free(&unit);
    }
    dl_source_free(s);
  }
  tmpdir_remove(dir);
}

static void test_strip_and_directory(void **state) {
  char *dir = tmpdir_new();
  write_small(path_in(dir, "a"), 4);
  write_small(path_in(dir, "b"), 8);
  uint32_t strip[] = {11, 14, 16};
  struct dl_source_opts o = {
      .path = dir, .format = DL_FORMAT_MEGATRON, .strip_ids = strip, .n_strip_ids = 3};
  struct dl_source *s = NULL;
  assert_int_equal(dl_source_open(&o, &s), 0);
  assert_int_equal(dl_source_units(s), 6);
  assert_int_equal(dl_source_total_weight(s), 24);
  check_unit(s, 1, tokens + 5, 4); /* 11 inside a document stays */
  uint32_t doc2[] = {15};
  check_unit(s, 5, doc2, 1);               /* 14 15 16: first and last stripped */
  assert_int_equal(dl_source_files(s), 2); /* files are named as blocklists name them */
  assert_string_equal(dl_source_file_name(s, 0), "a");
  assert_string_equal(dl_source_file_name(s, 1), "b");
  uint32_t file = 9;
  assert_int_equal(dl_source_find_file(s, "b", &file), 0);
  assert_int_equal(file, 1);
  assert_int_equal(dl_source_find_file(s, "c", &file), STK_ENOENT);
  uint64_t docs = 0;
  assert_int_equal(dl_source_file_docs(s, 1, &docs), 0);
  assert_int_equal(docs, 3);
  dl_source_free(s);
  tmpdir_remove(dir);
}

/* Opens prefix expecting STK_ECORRUPT with a detail naming the file. */
static void expect_corrupt(const char *prefix, const char *ext, const char *words) {
  assert_null(open_mm(prefix, STK_ECORRUPT));
  char want[600];
  snprintf(want, sizeof want, "%s%s", prefix, ext);
  if (!strstr(stk_detail(), want) || !strstr(stk_detail(), words))
    fail_msg("detail '%s' lacks '%s' or '%s'", stk_detail(), want, words);
}

static void test_corrupt_files(void **state) {
  char *dir = tmpdir_new();
  const char *pre = path_in(dir, "bad");
  char idx[600], bin[600];
  snprintf(idx, sizeof idx, "%s.idx", pre);
  snprintf(bin, sizeof bin, "%s.bin", pre);
  int64_t ptr[6] = {0, 12, 20, 36, 40, 40};
  write_small(pre, 4);
  assert_int_equal(truncate(idx, 20), 0);
  expect_corrupt(pre, ".idx", "truncated header");
  write_small(pre, 4);
  assert_int_equal(truncate(idx, 34 + 6 * 12 + 16), 0);
  expect_corrupt(pre, ".idx", "size disagrees");
  write_small(pre, 4);
  assert_int_equal(truncate(bin, 30), 0);
  expect_corrupt(pre, ".bin", "beyond the end");
  write_small(pre, 4);
  ptr[5] = 1000;
  write_megatron_idx(idx, 4, 6, seq_len, ptr, 4, doc_idx);
  expect_corrupt(pre, ".bin", "beyond the end");
  ptr[5] = 40;
  write_megatron_idx(idx, 7, 6, seq_len, ptr, 4, doc_idx);
  expect_corrupt(pre, ".idx", "float dtype");
  int64_t not_mono[4] = {0, 3, 2, 6}, bad_start[4] = {1, 2, 3, 6}, bad_end[4] = {0, 2, 3, 5};
  write_megatron_idx(idx, 4, 6, seq_len, ptr, 4, not_mono);
  expect_corrupt(pre, ".idx", "non-decreasing");
  write_megatron_idx(idx, 4, 6, seq_len, ptr, 4, bad_start);
  expect_corrupt(pre, ".idx", "start at 0");
  write_megatron_idx(idx, 4, 6, seq_len, ptr, 4, bad_end);
  expect_corrupt(pre, ".idx", "end at");
  write_megatron_idx(idx, 4, 6, seq_len, ptr, 4, doc_idx);
  int fd = open(idx, O_WRONLY);
  assert_int_equal(pwrite(fd, "MMIDIDY", 7, 0), 7);
  close(fd);
  expect_corrupt(pre, ".idx", "bad magic");
  assert_null(open_mm(path_in(dir, "missing"), STK_ENOENT));
  assert_non_null(strstr(stk_detail(), "missing.idx"));
  tmpdir_remove(dir);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A 1 GiB sparse .bin (one document of 2^28 int32 tokens) opens at once and
 * none of its pages enter the page cache. */
static void test_open_does_not_read_tokens(void **state) {
  char *dir = tmpdir_new();
  const char *pre = path_in(dir, "big");
  char p[600];
  snprintf(p, sizeof p, "%s.bin", pre);
  const size_t size = (size_t)1 << 30;
  int fd = open(p, O_CREAT | O_RDWR, 0644);
  assert_int_equal(ftruncate(fd, (off_t)size), 0);
  int32_t len[1] = {1 << 28};
  int64_t ptr[1] = {0}, di[2] = {0, 1};
  snprintf(p, sizeof p, "%s.idx", pre);
  write_megatron_idx(p, 4, 1, len, ptr, 2, di);
  double t0 = now_s();
  struct dl_source *s = open_mm(pre, 0);
  double open_s = now_s() - t0;
  assert_int_equal(dl_source_total_weight(s), 1 << 28);
  assert_true(open_s < 0.05);
  uint8_t *m = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
  assert_true(m != MAP_FAILED);
  size_t pages = size / (size_t)sysconf(_SC_PAGESIZE), resident = 0;
  unsigned char *vec = malloc(pages);
  assert_int_equal(mincore(m, size, vec), 0);
  for (size_t i = 0; i < pages; i++) resident += vec[i] & 1;
  assert_true(resident < pages / 100);
  free(vec);
  munmap(m, size);
  close(fd);
  dl_source_free(s);
  tmpdir_remove(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dtypes),
      cmocka_unit_test(test_synthetic_files),
      cmocka_unit_test(test_strip_and_directory),
      cmocka_unit_test(test_corrupt_files),
      cmocka_unit_test(test_open_does_not_read_tokens),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
