/*
 * Rendezvous against the real daemon: eight simulated ranks (threads, each
 * with its own client) form one generation; a rank that stops heartbeating
 * is noticed, the survivors are told RESTART and form the next generation
 * without it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "harness.h"
#include "ranks.h"

#define N 8

static int setup(void **state) {
  struct harness_daemon *d = harness_daemon_start(NULL);
  if (!d) return -1;
  *state = d;
  return 0;
}

static int teardown(void **state) {
  harness_daemon_free(*state);
  return 0;
}

/* Eight ranks get distinct ranks 0..7 in the same generation, world 8,
 * and the job shows RUNNING with eight members. */
static void test_eight_ranks(void **state) {
  struct harness_daemon *d = *state;
  struct stk_client *op = ranks_operator(d, "rdv8", N, N, 200, 300);
  struct rank r[N];
  ranks_form(r, N, d, "rdv8", "w", 30000);
  bool seen[N] = {false};
  for (int i = 0; i < N; i++) {
    assert_int_equal(r[i].m.world_size, N);
    assert_int_equal(r[i].m.generation, r[0].m.generation);
    assert_true(r[i].m.rank < N);
    assert_false(seen[r[i].m.rank]);
    seen[r[i].m.rank] = true;
  }
  Stoker__V1__Job *job = harness_get_job(op, "rdv8");
  assert_non_null(job);
  assert_int_equal(job->state, STOKER__V1__JOB_STATE__JOB_STATE_RUNNING);
  assert_int_equal(job->n_members, N);
  assert_int_equal(job->world_size, N);
  assert_int_equal(job->generation, r[0].m.generation);
  for (size_t i = 0; i < job->n_members; i++) assert_int_equal(job->members[i]->rank, i);
  protobuf_c_message_free_unpacked(&job->base, NULL);
  ranks_free(r, N);
  stk_client_free(op);
}

/* A rank that goes silent (client freed without Leave) loses its lease:
 * the others see RESTART carrying generation + 1, rejoin, and get world
 * size 3 in generation + 1. */
static void test_lost_rank_restarts(void **state) {
  struct harness_daemon *d = *state;
  struct stk_client *op = ranks_operator(d, "lost", 2, 4, 100, 300);
  struct rank r[4];
  ranks_form(r, 4, d, "lost", "w", 30000);
  uint64_t gen = r[0].m.generation;
  assert_int_equal(r[0].m.world_size, 4);

  stk_client_free(r[3].client);
  r[3].client = NULL;
  for (int i = 0; i < 3; i++) {
    assert_int_equal(ranks_wait_action(&r[i], STK_ACTION_RESTART, 10000), STK_ACTION_RESTART);
  }
  Stoker__V1__Job *job = harness_get_job(op, "lost");
  assert_non_null(job);
  assert_int_equal(job->generation, gen + 1);
  assert_int_equal(job->state, STOKER__V1__JOB_STATE__JOB_STATE_WAITING);
  protobuf_c_message_free_unpacked(&job->base, NULL);

  ranks_join_start(r, 3, 30000);
  assert_int_equal(ranks_join_wait(r, 3), 0);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(r[i].m.generation, gen + 1);
    assert_int_equal(r[i].m.world_size, 3);
    assert_int_equal(stk_generation(r[i].client), gen + 1);
  }
  ranks_free(r, 3);
  stk_client_free(op);
}

int main(int argc, char **argv) {
  if (harness_init(argc, argv)) return 2;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_eight_ranks, setup, teardown),
      cmocka_unit_test_setup_teardown(test_lost_rank_restarts, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
