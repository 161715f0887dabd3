/*
 * test_dl_perm: the keyed permutation is a bijection on [0, n) for every n
 * (powers of two, odd sizes, 1, 2), different keys give different orders,
 * and the order is not the identity.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dl_perm.h"

static void test_bijection(void **state) {
  const uint64_t sizes[] = {1, 2, 3, 7, 64, 100, 1000, 4097, 65536};
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    uint64_t n = sizes[s];
    uint8_t *seen = calloc(n, 1);
    for (uint64_t i = 0; i < n; i++) {
      uint64_t p = dl_perm(0x1234 + s, n, i);
      assert_true(p < n);
      assert_int_equal(seen[p], 0);
      seen[p] = 1;
    }
    free(seen);
  }
}

static void test_keys_differ(void **state) {
  const uint64_t n = 1000;
  size_t same = 0, fixed = 0;
  for (uint64_t i = 0; i < n; i++) {
    same += dl_perm(1, n, i) == dl_perm(2, n, i);
    fixed += dl_perm(1, n, i) == i;
  }
  assert_true(same < 20); /* about n/n = 1 expected */
  assert_true(fixed < 20);
  assert_int_equal(dl_perm(99, n, 17), dl_perm(99, n, 17)); /* deterministic */
  assert_true(dl_hash_str("web") != dl_hash_str("code"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bijection),
      cmocka_unit_test(test_keys_differ),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
