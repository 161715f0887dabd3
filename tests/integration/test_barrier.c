/*
 * Barriers against the real daemon: a barrier completes when every member
 * of the generation has arrived and not before; a parked barrier fails
 * ABORTED when its generation ends (a newcomer joins, or a member is lost).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "harness.h"
#include "ranks.h"

struct fixture {
  struct harness_daemon *d;
  struct rank r[4]; /* r[3] is the newcomer; not joined by setup. */
};

/* Three ranks in job "bar" (min 3, max 4, heartbeat 500 ms: a 1.5 s lease,
 * so a loaded machine does not lose a member the tests keep). */
static int setup(void **state) {
  struct fixture *f = calloc(1, sizeof(*f));
  *state = f;
  f->d = harness_daemon_start(NULL);
  if (!f->d) return -1;
  struct stk_client *op = harness_client(f->d);
  if (!op || harness_create_job(op, "bar", 3, 4, 500, 200)) return -1;
  stk_client_free(op);
  if (ranks_new(f->r, 4, f->d, "bar", "w")) return -1;
  ranks_join_start(f->r, 3, 30000);
  return ranks_join_wait(f->r, 3) ? -1 : 0;
}

static int teardown(void **state) {
  struct fixture *f = *state;
  ranks_free(f->r, 4);
  harness_daemon_free(f->d);
  free(f);
  return 0;
}

static void test_completes_when_all_arrive(void **state) {
  struct fixture *f = *state;
  struct ranks_latch l[2];
  for (int i = 0; i < 2; i++) {
    ranks_latch_init(&l[i]);
    assert_int_equal(stk_barrier_async(f->r[i].client, "step-1", 10000, ranks_latch_done, &l[i]),
                     0);
  }
  /* Two of three arrived: both stay parked. */
  assert_false(ranks_latch_wait(&l[0], 300));
  assert_false(ranks_latch_wait(&l[1], 0));
  assert_int_equal(stk_barrier(f->r[2].client, "step-1", 10000), 0);
  for (int i = 0; i < 2; i++) {
    assert_true(ranks_latch_wait(&l[i], 5000));
    assert_int_equal(l[i].err, 0);
    ranks_latch_close(&l[i]);
  }
  /* The same ranks can pass a second barrier. */
  for (int i = 0; i < 2; i++) {
    ranks_latch_init(&l[i]);
    assert_int_equal(stk_barrier_async(f->r[i].client, "step-2", 10000, ranks_latch_done, &l[i]),
                     0);
  }
  assert_int_equal(stk_barrier(f->r[2].client, "step-2", 10000), 0);
  for (int i = 0; i < 2; i++) {
    assert_true(ranks_latch_wait(&l[i], 5000));
    assert_int_equal(l[i].err, 0);
    ranks_latch_close(&l[i]);
  }
}

/* Parks ranks 0 and 1 on barrier name; they must stay parked. */
static void park_two(struct fixture *f, struct ranks_latch *l, const char *name) {
  for (int i = 0; i < 2; i++) {
    ranks_latch_init(&l[i]);
    assert_int_equal(stk_barrier_async(f->r[i].client, name, 20000, ranks_latch_done, &l[i]), 0);
  }
  assert_false(ranks_latch_wait(&l[0], 200));
}

static void expect_aborted(struct ranks_latch *l) {
  for (int i = 0; i < 2; i++) {
    assert_true(ranks_latch_wait(&l[i], 10000));
    assert_int_equal(l[i].err, STK_EABORTED);
    ranks_latch_close(&l[i]);
  }
}

static void test_newcomer_aborts_parked(void **state) {
  struct fixture *f = *state;
  struct ranks_latch l[2];
  park_two(f, l, "sync");
  uint64_t gen = f->r[0].m.generation;
  ranks_join_start(&f->r[3], 1, 30000);
  expect_aborted(l);
  /* The old members rejoin; the next generation has all four. */
  ranks_join_start(f->r, 3, 30000);
  assert_int_equal(ranks_join_wait(f->r, 4), 0);
  for (int i = 0; i < 4; i++) {
    assert_int_equal(f->r[i].m.generation, gen + 1);
    assert_int_equal(f->r[i].m.world_size, 4);
  }
}

static void test_lost_member_aborts_parked(void **state) {
  struct fixture *f = *state;
  struct ranks_latch l[2];
  park_two(f, l, "sync");
  stk_client_free(f->r[2].client); /* Silent from now on: its lease expires. */
  f->r[2].client = NULL;
  expect_aborted(l);
}

int main(int argc, char **argv) {
  if (harness_init(argc, argv)) return 2;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_completes_when_all_arrive, setup, teardown),
      cmocka_unit_test_setup_teardown(test_newcomer_aborts_parked, setup, teardown),
      cmocka_unit_test_setup_teardown(test_lost_member_aborts_parked, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
