/*
 * dl_take: the fused drop-delimiter copy gives exactly the kept tokens, the
 * document starts and the end position that a plain reading of the rules
 * gives (kept = not the delimiter; a start = a kept token that is t[0] or
 * follows a delimiter), for every start, end and `want` around the 8-token
 * vector steps, with no, single, adjacent and leading delimiters; the
 * CPU-specific version (AVX2 where present) agrees with the portable one;
 * reading a range in pieces gives what one call gives; counting agrees.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dl_take.h"

#define N     200
#define DELIM 50256u

typedef size_t (*take_fn)(const uint32_t *, uint64_t *, uint64_t, uint32_t, size_t, uint32_t *,
                          uint32_t *, size_t *);

/* Delimiters at every `every`-th place from `phase`, doubled when `pairs`. */
static void fill(uint32_t *t, unsigned every, unsigned phase, int pairs) {
  for (unsigned k = 0; k < N; k++) {
    t[k] = 1 + (k * 2654435761u) % 50000;
    if (every && k % every == phase % every) {
      t[k] = DELIM;
      if (pairs && k + 1 < N) t[++k] = DELIM;
    }
  }
}

struct expect {
  uint32_t tokens[N], starts[N];
  size_t n, n_starts;
  uint64_t end_pos;
};

/* The rules, read one index at a time: taking stops right after the
 * want-th kept token (delimiters after it are left), or at end. */
static void expected(const uint32_t *t, uint64_t pos, uint64_t end, size_t want, struct expect *e) {
  memset(e, 0, sizeof *e);
  e->end_pos = want == 0 ? pos : end;
  for (uint64_t k = pos; k < end && e->n < want; k++) {
    if (t[k] == DELIM) continue;
    if (k == 0 || t[k - 1] == DELIM) e->starts[e->n_starts++] = (uint32_t)e->n;
    e->tokens[e->n++] = t[k];
    if (e->n == want) e->end_pos = k + 1;
  }
}

static void check(take_fn take, const uint32_t *t, uint64_t pos, uint64_t end, size_t want) {
  struct expect e;
  expected(t, pos, end, want, &e);
  uint32_t dst[N + 8], starts[N + 8];
  size_t n_starts = 0;
  uint64_t p = pos;
  size_t n = take(t, &p, end, DELIM, want, dst, starts, &n_starts);
  assert_int_equal(n, e.n);
  assert_int_equal(p, e.end_pos);
  assert_int_equal(n_starts, e.n_starts);
  if (n) assert_memory_equal(dst, e.tokens, n * sizeof *dst);
  if (n_starts) assert_memory_equal(starts, e.starts, n_starts * sizeof *starts);
  /* Counting only: the same count and position, nothing written. */
  p = pos;
  assert_int_equal(take(t, &p, end, DELIM, want, NULL, NULL, NULL), e.n);
  assert_int_equal(p, e.end_pos);
}

static void test_every_window(void **state) {
  (void)state;
  uint32_t t[N];
  const unsigned everies[] = {0, 1, 2, 7, 8, 9, 16, 17, 33, 150};
  const size_t wants[] = {0, 1, 5, 8, 9, 16, 23, 64, N};
  for (size_t e = 0; e < sizeof everies / sizeof everies[0]; e++) {
    for (int pairs = 0; pairs < 2; pairs++) {
      fill(t, everies[e], (unsigned)e * 3, pairs);
      for (uint64_t pos = 0; pos <= N; pos += 3)
        for (uint64_t end = pos; end <= N; end += 7)
          for (size_t w = 0; w < sizeof wants / sizeof wants[0]; w++) {
            check(dl_take_u32, t, pos, end, wants[w]);
            check(dl_take_u32_portable, t, pos, end, wants[w]);
          }
    }
  }
}

/* A range read in pieces of varying size is the range read at once. */
static void test_pieces(void **state) {
  (void)state;
  uint32_t t[N];
  fill(t, 13, 4, 1);
  t[0] = DELIM; /* a leading delimiter: the first kept token starts a document */
  struct expect e;
  expected(t, 0, N, N, &e);
  uint32_t dst[N + 8], starts[N + 8];
  size_t n = 0, n_starts = 0;
  uint64_t p = 0;
  for (size_t piece = 1; n < e.n; piece = piece * 3 % 29 + 1) {
    size_t before = n_starts;
    size_t got = dl_take_u32(t, &p, N, DELIM, piece, dst + n, starts, &n_starts);
    for (size_t i = before; i < n_starts; i++) starts[i] += (uint32_t)n;
    assert_true(got > 0);
    n += got;
  }
  assert_int_equal(n, e.n);
  assert_int_equal(n_starts, e.n_starts);
  assert_memory_equal(dst, e.tokens, n * sizeof *dst);
  assert_memory_equal(starts, e.starts, n_starts * sizeof *starts);
}

static void test_count(void **state) {
  (void)state;
  uint32_t t[N];
  for (unsigned every = 0; every < 20; every++) {
    fill(t, every, every, (int)(every & 1));
    for (uint64_t pos = 0; pos <= N; pos += 5)
      for (uint64_t end = pos; end <= N; end += 3) {
        uint64_t want = 0;
        for (uint64_t k = pos; k < end; k++) want += t[k] != DELIM;
        assert_int_equal(dl_take_count_u32(t, pos, end, DELIM), want);
        assert_int_equal(dl_take_count_u32_portable(t, pos, end, DELIM), want);
      }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_window),
      cmocka_unit_test(test_pieces),
      cmocka_unit_test(test_count),
  };
  return cmocka_run_group_tests_name("dl_take", tests, NULL, NULL);
}
