/*
 * The generation-scoped key-value store against the real daemon: a KvGet
 * with wait parks until another rank sets the key (how rank 0 hands out
 * the NCCL unique id); without wait a missing key answers NOT_FOUND; a
 * parked KvGet is aborted when its generation ends.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"
#include "ranks.h"

struct fixture {
  struct harness_daemon *d;
  struct rank r[2];
};

static int setup(void **state) {
  struct fixture *f = calloc(1, sizeof(*f));
  *state = f;
  f->d = harness_daemon_start(NULL);
  if (!f->d) return -1;
  struct stk_client *op = harness_client(f->d);
  if (!op || harness_create_job(op, "kv", 2, 2, 100, 200)) return -1;
  stk_client_free(op);
  if (ranks_new(f->r, 2, f->d, "kv", "w")) return -1;
  ranks_join_start(f->r, 2, 30000);
  return ranks_join_wait(f->r, 2) ? -1 : 0;
}

static int teardown(void **state) {
  struct fixture *f = *state;
  ranks_free(f->r, 2);
  harness_daemon_free(f->d);
  free(f);
  return 0;
}

static void test_wait_woken_by_set(void **state) {
  struct fixture *f = *state;
  struct ranks_latch l;
  ranks_latch_init(&l);
  assert_int_equal(
      stk_kv_get_async(f->r[1].client, "nccl-id", true, 10000, ranks_latch_kv_done, &l), 0);
  assert_false(ranks_latch_wait(&l, 300));
  assert_int_equal(stk_kv_set(f->r[0].client, "nccl-id", "unique-id-42", 12, 5000), 0);
  assert_true(ranks_latch_wait(&l, 5000));
  assert_int_equal(l.err, 0);
  assert_int_equal(l.len, 12);
  assert_string_equal(l.value, "unique-id-42");
  ranks_latch_close(&l);
  /* Once set, a plain get sees it at once. */
  uint8_t *v = NULL;
  size_t len = 0;
  assert_int_equal(stk_kv_get(f->r[1].client, "nccl-id", false, 5000, &v, &len), 0);
  assert_int_equal(len, 12);
  assert_memory_equal(v, "unique-id-42", 12);
  free(v);
}

static void test_missing_not_found(void **state) {
  struct fixture *f = *state;
  uint8_t *v = NULL;
  size_t len = 0;
  assert_int_equal(stk_kv_get(f->r[0].client, "absent", false, 5000, &v, &len), STK_ENOENT);
  assert_null(v);
  struct rpc_client *rc = harness_rpc(f->d);
  assert_non_null(rc);
  Stoker__V1__KvGetRequest req = STOKER__V1__KV_GET_REQUEST__INIT;
  req.job = "kv";
  req.generation = f->r[0].m.generation;
  req.key = "absent";
  assert_int_equal(
      harness_call(rc, "KvGet", &req.base, &stoker__v1__kv_get_response__descriptor, NULL, NULL, 0),
      RPC_NOT_FOUND);
  rpc_client_free(rc);
}

static void test_parked_get_aborted_by_new_generation(void **state) {
  struct fixture *f = *state;
  struct ranks_latch l;
  ranks_latch_init(&l);
  assert_int_equal(stk_kv_get_async(f->r[1].client, "never", true, 20000, ranks_latch_kv_done, &l),
                   0);
  assert_false(ranks_latch_wait(&l, 200));
  assert_int_equal(stk_leave(f->r[0].client), 0);
  assert_true(ranks_latch_wait(&l, 5000));
  assert_int_equal(l.err, STK_EABORTED);
  ranks_latch_close(&l);
}

int main(int argc, char **argv) {
  if (harness_init(argc, argv)) return 2;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_wait_woken_by_set, setup, teardown),
      cmocka_unit_test_setup_teardown(test_missing_not_found, setup, teardown),
      cmocka_unit_test_setup_teardown(test_parked_get_aborted_by_new_generation, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
