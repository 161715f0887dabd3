/*
 * Tests for the synthetic source: lengths are deterministic and in range,
 * every token decodes to its (document, position), limits are enforced.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "dl_synthetic.h"
#include "stk_error.h"

static void test_token_round_trip(void **state) {
  uint64_t docs[] = {0, 1, 12, 4095, 4096, DL_SYNTHETIC_MAX_DOCS - 1};
  uint32_t poss[] = {0, 1, 1104, 4095};
  for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++) {
    for (size_t j = 0; j < sizeof poss / sizeof poss[0]; j++) {
      uint32_t t = dl_synthetic_token(docs[i], poss[j]);
      uint64_t d;
      uint32_t p;
      dl_synthetic_decode(t, &d, &p);
      assert_int_equal(d, docs[i]);
      assert_int_equal(p, poss[j]);
      assert_int_not_equal(t, DL_SYNTHETIC_EOT);
    }
  }
}

static void test_units_trace(void **state) {
  struct dl_source *s = NULL;
  assert_int_equal(dl_source_open_synthetic("syn", 500, 3, 70, 42, &s), 0);
  assert_string_equal(dl_source_name(s), "syn");
  assert_int_equal(dl_source_units(s), 500);
  uint64_t total = 0, distinct_lens = 0, seen[71] = {0};
  for (uint64_t u = 0; u < 500; u++) {
    uint64_t w = dl_source_unit_weight(s, u);
    assert_in_range(w, 3, 70);
    assert_int_equal(w, dl_synthetic_doc_len(42, 3, 70, u));
    if (!seen[w]++) distinct_lens++;
    total += w;
    struct dl_unit unit;
    assert_int_equal(dl_source_read_unit(s, u, &unit), 0);
    assert_int_equal(unit.n_tokens, w);
    assert_int_equal(unit.n_docs, 1);
    assert_int_equal(unit.doc_starts[0], 0);
    struct dl_unit_docs docs;
    assert_int_equal(dl_source_unit_docs(s, u, &docs), 0);
    assert_int_equal(unit.file, 0);
    assert_int_equal(docs.base, u); /* unit u is document u of the one file */
    for (size_t p = 0; p < unit.n_tokens; p++) {
      uint64_t d;
      uint32_t pos;
      dl_synthetic_decode(unit.tokens[p], &d, &pos);
      assert_int_equal(d, u);
      assert_int_equal(pos, p);
    }
    dl_unit_free(&unit);
  }
  assert_int_equal(dl_source_total_weight(s), total);
  assert_true(distinct_lens > 30); /* lengths really vary */
  struct dl_unit unit;
  assert_int_equal(dl_source_read_unit(s, 500, &unit), STK_ERANGE);
  dl_source_free(s);
}

static void test_seed_changes_lengths(void **state) {
  int differ = 0;
  for (uint64_t d = 0; d < 100; d++)
    differ += dl_synthetic_doc_len(1, 1, 4096, d) != dl_synthetic_doc_len(2, 1, 4096, d);
  assert_true(differ > 90);
  assert_int_equal(dl_synthetic_doc_len(7, 5, 5, 3), 5);
}

static void test_limits(void **state) {
  struct dl_source *s = NULL;
  assert_int_equal(dl_source_open_synthetic("x", DL_SYNTHETIC_MAX_DOCS + 1, 1, 2, 0, &s),
                   STK_EINVAL);
  assert_int_equal(dl_source_open_synthetic("x", 10, 1, DL_SYNTHETIC_MAX_LEN + 1, 0, &s),
                   STK_EINVAL);
  assert_int_equal(dl_source_open_synthetic("x", 10, 9, 8, 0, &s), STK_EINVAL);
  assert_null(s);
  assert_int_equal(dl_source_open_synthetic("x", 0, 0, 0, 0, &s), 0);
  assert_int_equal(dl_source_units(s), 0);
  dl_source_free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_token_round_trip),
      cmocka_unit_test(test_units_trace),
      cmocka_unit_test(test_seed_changes_lengths),
      cmocka_unit_test(test_limits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
