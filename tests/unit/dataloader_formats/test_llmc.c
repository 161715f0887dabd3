/*
 * Tests for the llm.c reader: uint16 and uint32 files, end-of-text tokens
 * falling on every possible block boundary, directories of files, strip ids,
 * corrupt headers rejected with the file named, and the fast reader (both
 * unit forms) against a per-token reference on random files.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dl_source.h"
#include "dl_synthetic.h"
#include "fmt_test.h"
#include "stk_error.h"

#define EOT 50256

static void write_llmc(const char *path, int32_t magic, int32_t version, int32_t count,
                       const uint32_t *toks, size_t n, size_t token_bytes) {
  size_t size = 1024 + n * token_bytes;
  uint8_t *buf = calloc(1, size);
  int32_t h[3] = {magic, version, count};
  memcpy(buf, h, sizeof h);
  for (size_t i = 0; i < n; i++) memcpy(buf + 1024 + i * token_bytes, &toks[i], token_bytes);
  write_file(path, buf, size);
  free(buf);
}

/* Reads every unit; returns the kept tokens and global document starts. */
static size_t read_all(struct dl_source *s, uint32_t *toks, uint32_t *starts,
                       size_t *ret_n_starts) {
  size_t n = 0, ns = 0;
  for (uint64_t u = 0; u < dl_source_units(s); u++) {
    struct dl_unit unit;
    assert_int_equal(dl_source_read_unit(s, u, &unit), 0);
    assert_true(unit.file < dl_source_files(s));
    for (size_t d = 0; d < unit.n_docs; d++) starts[ns++] = (uint32_t)n + unit.doc_starts[d];
    memcpy(toks + n, unit.tokens, unit.n_tokens * sizeof *toks);
    n += unit.n_tokens;
    dl_unit_free(&unit);
  }
  *ret_n_starts = ns;
  return n;
}

static void test_uint16_every_block_size(void **state) {
  char *dir = tmpdir_new();
  const uint32_t file[] = {EOT, 1, 2, 3, EOT, 4, 5, EOT, EOT, 6, 7, 8, 9, EOT, 65535};
  const uint32_t want[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 65535}, want_starts[] = {0, 3, 5, 9};
  const size_t n = sizeof file / sizeof file[0];
  write_llmc(path_in(dir, "a.bin"), 20240520, 1, (int32_t)n, file, n, 2);
  for (uint32_t bt = 1; bt <= n + 1; bt++) {
    struct dl_source_opts o = {
        .path = path_in(dir, "a.bin"), .format = DL_FORMAT_LLMC, .block_tokens = bt, .eot_id = -1};
    struct dl_source *s = NULL;
    assert_int_equal(dl_source_open(&o, &s), 0);
    assert_int_equal(dl_source_units(s), (n + bt - 1) / bt);
    assert_int_equal(dl_source_total_weight(s), n);
    assert_int_equal(dl_source_unit_weight(s, dl_source_units(s) - 1),
                     n - (dl_source_units(s) - 1) * bt);
    uint32_t toks[32], starts[32];
    size_t ns;
    assert_int_equal(read_all(s, toks, starts, &ns), 10);
    assert_memory_equal(toks, want, sizeof want);
    assert_int_equal(ns, 4);
    assert_memory_equal(starts, want_starts, sizeof want_starts);
    dl_source_free(s);
  }
  tmpdir_remove(dir);
}

static void test_uint32_synthetic_directory(void **state) {
  char *dir = tmpdir_new();
  assert_int_equal(dl_synthetic_write_llmc(path_in(dir, "s0.bin"), 0, 40, 1, 90, 5), 0);
  assert_int_equal(dl_synthetic_write_llmc(path_in(dir, "s1.bin"), 40, 1, 1, 90, 5), 0);
  assert_int_equal(dl_synthetic_write_llmc(path_in(dir, "s2.bin"), 41, 59, 1, 90, 5), 0);
  struct dl_source_opts o = {
      .path = dir, .format = DL_FORMAT_LLMC, .block_tokens = 37, .eot_id = DL_SYNTHETIC_EOT};
  struct dl_source *s = NULL;
  assert_int_equal(dl_source_open(&o, &s), 0);
  size_t cap = 100 * 91;
  uint32_t *toks = malloc(cap * 4), *starts = malloc(cap * 4);
  size_t ns, n = read_all(s, toks, starts, &ns);
  size_t k = 0, si = 0;
  for (uint64_t d = 0; d < 100; d++) {
    assert_int_equal(starts[si++], k); /* every document starts where expected */
    for (uint32_t p = 0; p < dl_synthetic_doc_len(5, 1, 90, d); p++)
      assert_int_equal(toks[k++], dl_synthetic_token(d, p));
  }
  assert_int_equal(n, k);
  assert_int_equal(ns, 100);
  free(toks);
  free(starts);
  dl_source_free(s);
  tmpdir_remove(dir);
}

static void test_strip_ids(void **state) {
  char *dir = tmpdir_new();
  const uint32_t file[] = {EOT, 1, 10, 11, 2, EOT, 1, 12, EOT, 1};
  const uint32_t want[] = {10, 11, 12}, want_starts[] = {0, 2};
  write_llmc(path_in(dir, "a.bin"), 20240801, 7, 10, file, 10, 4);
  uint32_t strip[] = {2, 1};
  for (uint32_t bt = 1; bt <= 11; bt++) {
    struct dl_source_opts o = {.path = path_in(dir, "a.bin"),
                               .format = DL_FORMAT_LLMC,
                               .block_tokens = bt,
                               .eot_id = -1,
                               .strip_ids = strip,
                               .n_strip_ids = 2};
    struct dl_source *s = NULL;
    assert_int_equal(dl_source_open(&o, &s), 0);
    uint32_t toks[16], starts[16];
    size_t ns;
    assert_int_equal(read_all(s, toks, starts, &ns), 3);
    assert_memory_equal(toks, want, sizeof want);
    assert_int_equal(ns, 2);
    assert_memory_equal(starts, want_starts, sizeof want_starts);
    dl_source_free(s);
  }
  tmpdir_remove(dir);
}

/* ---- the reference: the reader's rules, one token at a time ---- */

struct ref {
  const uint32_t *t;
  size_t n;
  const uint32_t *strip;
  size_t n_strip;
};

static bool ref_strip(const struct ref *r, uint32_t tok) {
  for (size_t k = 0; k < r->n_strip; k++)
    if (r->strip[k] == tok) return true;
  return false;
}

static bool ref_first(const struct ref *r, size_t i) {
  return i == 0 || r->t[i - 1] == EOT;
}

static bool ref_last(const struct ref *r, size_t i) {
  return i + 1 == r->n || r->t[i + 1] == EOT;
}

static bool ref_dropped(const struct ref *r, size_t i) {
  if (r->t[i] == EOT) return true;
  return ref_strip(r, r->t[i]) && (ref_first(r, i) || ref_last(r, i));
}

/* Unit [b, e): kept tokens into toks, document starts into starts. */
static size_t ref_unit(const struct ref *r, size_t b, size_t e, uint32_t *toks, uint32_t *starts,
                       size_t *ret_ns) {
  size_t n = 0, ns = 0;
  for (size_t i = b; i < e; i++) {
    if (ref_dropped(r, i)) continue;
    if (ref_first(r, i) || (ref_first(r, i - 1) && ref_dropped(r, i - 1))) starts[ns++] = n;
    toks[n++] = r->t[i];
  }
  *ret_ns = ns;
  return n;
}

/* Compares one unit, read in both forms, against the reference. */
static void check_unit(struct dl_source *s, const struct ref *r, uint64_t u, size_t b, size_t e) {
  uint32_t *want = malloc((e - b + 1) * 4), *ws = malloc((e - b + 1) * 4);
  size_t nws, nw = ref_unit(r, b, e, want, ws, &nws);
  for (int form = 0; form < 2; form++) {
    struct dl_unit unit;
    assert_int_equal(
        form ? dl_source_read_unit_runs(s, u, &unit) : dl_source_read_unit(s, u, &unit), 0);
    assert_int_equal(unit.n_tokens, nw);
    assert_int_equal(unit.n_docs, nws);
    if (nws) assert_memory_equal(unit.doc_starts, ws, nws * 4);
    uint32_t *got = malloc(nw * 4 + 4);
    dl_unit_copy(&unit, 0, nw, got);
    assert_memory_equal(got, want, nw * 4);
    if (nw > 2) { /* a copy from the middle crosses runs the same way */
      dl_unit_copy(&unit, 1, nw - 2, got);
      assert_memory_equal(got, want + 1, (nw - 2) * 4);
    }
    free(got);
    dl_unit_free(&unit);
  }
  free(want);
  free(ws);
}

/* Random files (uint16 and uint32; delimiters dense, adjacent, at the file
 * edges; strip ids frequent) read at many block sizes, both unit forms,
 * match the per-token reference. */
static void test_matches_reference(void **state) {
  char *dir = tmpdir_new();
  const uint32_t strip[] = {3, 1};
  uint64_t x = 77;
  for (int round = 0; round < 40; round++) {
    size_t n = 1 + (size_t)round * 13;
    uint32_t *t = malloc(n * sizeof *t);
    for (size_t i = 0; i < n; i++) {
      x = x * 6364136223846793005u + 1442695040888963407u;
      uint32_t v = (uint32_t)(x >> 33);
      t[i] = v % (round % 3 == 0 ? 4 : 29) == 0 ? EOT : v % 7;
    }
    size_t tb = round % 2 ? 4 : 2;
    write_llmc(path_in(dir, "r.bin"), tb == 4 ? 20240801 : 20240520, tb == 4 ? 7 : 1, (int32_t)n, t,
               n, tb);
    struct ref r = {t, n, strip, round % 4 < 2 ? 2 : 0};
    for (uint32_t bt = 1; bt <= 70; bt += 1 + bt / 8) {
      struct dl_source_opts o = {.path = path_in(dir, "r.bin"),
                                 .format = DL_FORMAT_LLMC,
                                 .block_tokens = bt,
                                 .eot_id = -1,
                                 .strip_ids = strip,
                                 .n_strip_ids = r.n_strip};
      struct dl_source *s = NULL;
      assert_int_equal(dl_source_open(&o, &s), 0);
      for (uint64_t u = 0; u < dl_source_units(s); u++)
        check_unit(s, &r, u, u * bt, (u + 1) * bt < n ? (u + 1) * bt : n);
      dl_source_free(s);
    }
    free(t);
  }
  tmpdir_remove(dir);
}

static void expect_corrupt(const char *path, const char *words) {
  struct dl_source_opts o = {.path = path, .format = DL_FORMAT_LLMC, .eot_id = -1};
  struct dl_source *s = NULL;
  assert_int_equal(dl_source_open(&o, &s), STK_ECORRUPT);
  assert_null(s);
  if (!strstr(stk_detail(), path) || !strstr(stk_detail(), words))
    fail_msg("detail '%s' lacks '%s' or '%s'", stk_detail(), path, words);
}

static void test_corrupt(void **state) {
  char *dir = tmpdir_new();
  const char *p = path_in(dir, "x.bin");
  uint32_t toks[4] = {EOT, 1, 2, 3};
  write_llmc(p, 20240521, 1, 4, toks, 4, 2);
  expect_corrupt(p, "bad magic");
  write_llmc(p, 20240520, 7, 4, toks, 4, 2);
  expect_corrupt(p, "bad magic");
  write_llmc(p, 20240520, 1, 5, toks, 4, 2);
  expect_corrupt(p, "token count");
  write_llmc(p, 20240801, 7, 3, toks, 4, 4);
  expect_corrupt(p, "token count");
  write_file(p, toks, 16);
  expect_corrupt(p, "truncated header");
  /* A directory holding one bad file fails as a whole, naming it. */
  write_llmc(path_in(dir, "a.bin"), 20240520, 1, 4, toks, 4, 2);
  expect_corrupt(dir, "x.bin");
  tmpdir_remove(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_uint16_every_block_size),
      cmocka_unit_test(test_uint32_synthetic_directory),
      cmocka_unit_test(test_strip_ids),
      cmocka_unit_test(test_matches_reference),
      cmocka_unit_test(test_corrupt),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
