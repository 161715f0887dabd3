/*
 * kill -9 of stoker-checkpoint at random instants while 4 ranks upload and
 * while the checkpoint commits, then a restart on the same data directory:
 * every checkpoint the restarted daemon lists reads back bit-exactly (at a
 * different world size), and every Commit acknowledged before a kill is
 * among them. A trainer that goes away right after its bytes are staged
 * does not stop the attempt from committing.
 * argv: stoker-checkpoint.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_ckpt_helpers.h"

static const char *const ck_args[] = {
    "--part-size", "5MiB", "--staging-budget", "32MiB", "--upload-concurrency", "2", NULL};

struct round {
  const char *addr;
  int64_t step;
  int commit_code;
  pthread_t th;
};

static void *round_main(void *p) {
  struct round *r = p;
  struct rpc_client *rc = NULL;
  struct rpc_client_opts o = {.target = r->addr};
  r->commit_code = RPC_UNAVAILABLE;
  if (rpc_client_new(&o, &rc) != 0) return NULL;
  char attempt[64], msg[512];
  if (tck_begin(rc, "crash", r->step, 4, attempt) == RPC_OK &&
      tck_write_all(r->addr, attempt, 4) == RPC_OK)
    r->commit_code = tck_commit(rc, attempt, NULL, msg, sizeof(msg));
  rpc_client_free(rc);
  return NULL;
}

static void check_listed(struct harness_daemon *d, const int64_t *acked, size_t n_acked) {
  struct rpc_client *rc = harness_rpc(d);
  int64_t steps[64];
  int n = tck_list(rc, "crash", steps, 64);
  assert_true(n >= 0);
  for (size_t a = 0; a < n_acked; a++) {
    bool found = false;
    for (int i = 0; i < n; i++) found |= steps[i] == acked[a];
    if (!found) fail_msg("acknowledged step %lld lost after kill -9", (long long)acked[a]);
  }
  for (int i = 0; i < n; i++) assert_int_equal(tck_read_all(rc, "crash", steps[i], 2, 4), RPC_OK);
  rpc_client_free(rc);
}

static void test_kill_during_upload_and_commit(void **state) {
  struct harness_daemon *d = harness_daemon_start(ck_args);
  assert_non_null(d);
  int64_t acked[16];
  size_t n_acked = 0;
  srand(12345);
  for (int64_t step = 1; step <= 6; step++) {
    struct round r = {.addr = d->addr, .step = step};
    pthread_create(&r.th, NULL, round_main, &r);
    harness_sleep_ms(20 + rand() % 700);
    harness_daemon_kill(d);
    pthread_join(r.th, NULL);
    if (r.commit_code == RPC_OK) acked[n_acked++] = step;
    assert_int_equal(harness_daemon_restart(d), 0);
    check_listed(d, acked, n_acked);
  }
  fprintf(stderr, "commits acknowledged before a kill: %zu of 6\n", n_acked);
  harness_daemon_free(d);
}

/* Every rank's client is freed as soon as its Write answered "staged". */
static void test_trainer_gone_after_staged(void **state) {
  struct harness_daemon *d = harness_daemon_start(ck_args);
  assert_non_null(d);
  struct rpc_client *rc = harness_rpc(d);
  char attempt[64], msg[512];
  assert_int_equal(tck_begin(rc, "crash", 50, 4, attempt), RPC_OK);
  assert_int_equal(tck_write_all(d->addr, attempt, 4), RPC_OK);
  rpc_client_free(rc);
  rc = harness_rpc(d);
  assert_int_equal(tck_commit(rc, attempt, NULL, msg, sizeof(msg)), RPC_OK);
  assert_int_equal(tck_read_all(rc, "crash", 50, 4, 4), RPC_OK);
  rpc_client_free(rc);
  harness_daemon_free(d);
}

int main(int argc, char **argv) {
  if (harness_init(argc, argv) != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kill_during_upload_and_commit),
      cmocka_unit_test(test_trainer_gone_after_staged),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
