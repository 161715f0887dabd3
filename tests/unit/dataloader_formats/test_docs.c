/*
 * test_docs: the document identities an llm.c reader gives (dl_source_unit_docs
 * with the units' doc_starts and doc_rel) against a plain reading of the
 * file, one token at a time: documents are the runs between end-of-text
 * delimiters, numbered in file order; a strip id first or last in a
 * document is dropped, and a document of one strip id leaves no token but
 * keeps its number. Files of uint16 and uint32 tokens (copied and borrowed
 * reads), longer than the index stride, block sizes that do and do not
 * divide it, several files, and the document count per file.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dl_source.h"
#include "fmt_test.h"

#define EOT   9999u
#define STRIP 10u /* strip ids: 10 and 11 */

/* A kept token of the reference: its value, document and offset. */
struct kept {
  uint32_t token;
  uint64_t doc;
  uint32_t off;
};

static uint32_t lcg(uint64_t *x) {
  *x = *x * 6364136223846793005u + 1442695040888963407u;
  return (uint32_t)(*x >> 33);
}

/* Tokens 0..11 with delimiters (some adjacent, a long run) every ~50. */
static uint32_t *make_tokens(size_t n, uint64_t seed) {
  uint32_t *t = malloc(n * sizeof *t);
  uint64_t x = seed;
  for (size_t i = 0; i < n; i++) {
    uint32_t r = lcg(&x);
    t[i] = r % 53 == 0 || r % 997 == 1 ? EOT : r % 12;
    if (r % 4001 == 2)
      for (size_t k = 0; k < 90 && i + 1 < n; k++) t[++i] = EOT;
  }
  return t;
}

static bool is_strip(uint32_t t) {
  return t == STRIP || t == STRIP + 1;
}

/* The plain reading: *ret_docs documents, the kept tokens in order. */
static struct kept *reference(const uint32_t *t, size_t n, bool strip, size_t *ret_n,
                              uint64_t *ret_docs) {
  struct kept *k = malloc((n + 1) * sizeof *k);
  size_t m = 0;
  uint64_t docs = 0;
  for (size_t i = 0; i < n;) {
    if (t[i] == EOT) {
      i++;
      continue;
    }
    size_t e = i;
    while (e < n && t[e] != EOT) e++;
    size_t b = i, last = e;
    if (strip && is_strip(t[b])) b++;
    if (strip && last > b && is_strip(t[last - 1])) last--;
    for (size_t p = b; p < last; p++) k[m++] = (struct kept){t[p], docs, (uint32_t)(p - b)};
    docs++;
    i = e;
  }
  *ret_n = m;
  *ret_docs = docs;
  return k;
}

static void write_llmc(const char *path, const uint32_t *t, size_t n, int token_bytes) {
  int32_t h[256] = {token_bytes == 2 ? 20240520 : 20240801, token_bytes == 2 ? 1 : 7, (int32_t)n};
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(h, sizeof h, 1, f), 1);
  for (size_t i = 0; i < n; i++) {
    uint16_t v16 = (uint16_t)t[i];
    assert_int_equal(fwrite(token_bytes == 2 ? (const void *)&v16 : (const void *)&t[i],
                            (size_t)token_bytes, 1, f),
                     1);
  }
  assert_int_equal(fclose(f), 0);
}

/* Reads every unit of the source (copied or borrowed form) and checks each
 * kept token's value and identity against the references of its file. */
static void check_source(struct dl_source *s, bool runs, struct kept *const *want,
                         const size_t *n_want, const uint64_t *docs) {
  size_t at[2] = {0, 0};
  for (uint64_t u = 0; u < dl_source_units(s); u++) {
    struct dl_unit unit;
    struct dl_unit_docs d;
    assert_int_equal(
        runs ? dl_source_read_unit_runs(s, u, &unit) : dl_source_read_unit(s, u, &unit), 0);
    assert_int_equal(dl_source_unit_docs(s, u, &d), 0);
    uint32_t *tok = malloc((unit.n_tokens + 1) * sizeof *tok);
    dl_unit_copy(&unit, 0, unit.n_tokens, tok);
    size_t piece = 0; /* doc_starts[piece - 1] <= i */
    for (size_t i = 0; i < unit.n_tokens; i++) {
      while (piece < unit.n_docs && unit.doc_starts[piece] <= i) piece++;
      uint64_t doc, off;
      if (piece == 0) {
        doc = d.base - 1;
        off = d.lead_offset + i;
      } else {
        uint64_t rel = unit.doc_rel ? unit.doc_rel[piece - 1] : piece;
        doc = d.base + rel - 1;
        off = i - unit.doc_starts[piece - 1];
      }
      const struct kept *k = &want[unit.file][at[unit.file]++];
      assert_true(at[unit.file] <= n_want[unit.file]);
      assert_int_equal(tok[i], k->token);
      assert_int_equal(doc, k->doc);
      assert_int_equal(off, k->off);
    }
    free(tok);
    dl_unit_free(&unit);
  }
  for (uint32_t f = 0; f < dl_source_files(s); f++) {
    assert_int_equal(at[f], n_want[f]);
    uint64_t n = 0;
    assert_int_equal(dl_source_file_docs(s, f, &n), 0);
    assert_int_equal(n, docs[f]);
  }
}

static void run_case(int token_bytes, bool strip, const uint32_t *blocks, size_t n_blocks,
                     size_t n_tokens) {
  char *dir = tmpdir_new();
  uint32_t *t[2];
  struct kept *want[2];
  size_t n_want[2];
  uint64_t docs[2];
  for (int f = 0; f < 2; f++) {
    t[f] = make_tokens(n_tokens + (size_t)f * 777, 17 + (uint64_t)f);
    if (f == 1) t[f][0] = STRIP; /* a file that starts in a document with a strip id */
    want[f] = reference(t[f], n_tokens + (size_t)f * 777, strip, &n_want[f], &docs[f]);
    char name[32];
    snprintf(name, sizeof name, "part_%d.bin", f);
    write_llmc(path_in(dir, name), t[f], n_tokens + (size_t)f * 777, token_bytes);
  }
  const uint32_t strip_ids[] = {STRIP, STRIP + 1};
  for (size_t i = 0; i < n_blocks; i++) {
    struct dl_source_opts o = {.name = "l",
                               .path = dir,
                               .format = DL_FORMAT_LLMC,
                               .block_tokens = blocks[i],
                               .eot_id = EOT,
                               .strip_ids = strip ? strip_ids : NULL,
                               .n_strip_ids = strip ? 2 : 0};
    struct dl_source *s = NULL;
    assert_int_equal(dl_source_open(&o, &s), 0);
    assert_int_equal(dl_source_files(s), 2);
    assert_string_equal(dl_source_file_name(s, 1), "part_1.bin");
    check_source(s, false, want, n_want, docs);
    check_source(s, true, want, n_want, docs);
    dl_source_free(s);
  }
  for (int f = 0; f < 2; f++) {
    free(t[f]);
    free(want[f]);
  }
  tmpdir_remove(dir);
}

/* Files longer than the index stride, blocks that divide it or not. */
static void test_long_files(void **state) {
  (void)state;
  const uint32_t blocks[] = {37, 1000, 4096, 5000, 32768, 40000, 1000000};
  run_case(4, false, blocks, sizeof blocks / sizeof blocks[0], 90000);
  run_case(2, false, blocks, sizeof blocks / sizeof blocks[0], 90000);
}

/* Strip ids at document edges, documents left empty, tiny blocks. */
static void test_strip_ids_and_tiny_blocks(void **state) {
  (void)state;
  const uint32_t blocks[] = {1, 2, 3, 5, 64, 999};
  run_case(4, true, blocks, sizeof blocks / sizeof blocks[0], 3000);
  run_case(2, true, blocks, sizeof blocks / sizeof blocks[0], 3000);
  const uint32_t big[] = {4097, 32768, 50000};
  run_case(4, true, big, sizeof big / sizeof big[0], 70000);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_long_files),
      cmocka_unit_test(test_strip_ids_and_tiny_blocks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
