/*
 * grpc.health.v1 and graceful shutdown of the real daemon: Check answers
 * SERVING; Watch sends SERVING, and on SIGTERM the watcher sees
 * NOT_SERVING or the end of the stream; the daemon exits 0 even with a
 * parked Join, and what it held is there after a restart.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "grpc/health/v1/health.pb-c.h"
#include "harness.h"
#include "ranks.h"

#define SERVING     GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
#define NOT_SERVING GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING

/* What a Watch stream delivered. */
struct watch {
  pthread_mutex_t mu;
  int statuses[16];
  size_t n;
  bool ended;
  int code;
};

static void on_msg(void *arg, ProtobufCMessage *msg) {
  struct watch *w = arg;
  Grpc__Health__V1__HealthCheckResponse *r = (Grpc__Health__V1__HealthCheckResponse *)msg;
  pthread_mutex_lock(&w->mu);
  if (w->n < 16) w->statuses[w->n++] = r->status;
  pthread_mutex_unlock(&w->mu);
  protobuf_c_message_free_unpacked(msg, NULL);
}

static void on_done(void *arg, const struct rpc_status *st) {
  struct watch *w = arg;
  pthread_mutex_lock(&w->mu);
  w->ended = true;
  w->code = st->code;
  pthread_mutex_unlock(&w->mu);
}

/* Waits until pred(w) holds; false after timeout_ms. */
static bool wait_for(struct watch *w, bool (*pred)(struct watch *), int64_t timeout_ms) {
  int64_t deadline = harness_now_ms() + timeout_ms;
  for (;;) {
    pthread_mutex_lock(&w->mu);
    bool ok = pred(w);
    pthread_mutex_unlock(&w->mu);
    if (ok || harness_now_ms() >= deadline) return ok;
    harness_sleep_ms(10);
  }
}

static bool got_serving(struct watch *w) {
  return w->n > 0 && w->statuses[0] == SERVING;
}

static bool saw_stop(struct watch *w) {
  return w->ended || (w->n > 0 && w->statuses[w->n - 1] == NOT_SERVING);
}

static int setup(void **state) {
  *state = harness_daemon_start(NULL);
  return *state ? 0 : -1;
}

static int teardown(void **state) {
  harness_daemon_free(*state);
  return 0;
}

static void test_check_serving(void **state) {
  struct harness_daemon *d = *state;
  struct stk_client *c = harness_client(d);
  int status = -1;
  assert_int_equal(stk_health_check(c, "", 3000, &status), 0);
  assert_int_equal(status, SERVING);
  assert_int_equal(stk_health_check(c, "stoker.v1.Coordinator", 3000, &status), 0);
  assert_int_equal(status, SERVING);
  assert_int_not_equal(stk_health_check(c, "no.such.Service", 3000, &status), 0);
  stk_client_free(c);
}

static void test_watch_and_sigterm(void **state) {
  struct harness_daemon *d = *state;
  struct stk_client *op = harness_client(d);
  assert_int_equal(harness_create_job(op, "term", 2, 2, 1000, 100), 0);
  struct rank r;
  assert_int_equal(ranks_new(&r, 1, d, "term", "w"), 0);
  ranks_join_start(&r, 1, 3000); /* Parks: min is 2. */

  struct rpc_client *rc = harness_rpc(d);
  struct watch w = {.mu = PTHREAD_MUTEX_INITIALIZER};
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  req.service = "";
  struct rpc_client_call *call = NULL;
  assert_int_equal(rpc_client_stream_async(rc, "/grpc.health.v1.Health/Watch", &req.base,
                                           &grpc__health__v1__health_check_response__descriptor,
                                           30000, on_msg, on_done, &w, &call),
                   0);
  assert_true(wait_for(&w, got_serving, 5000));
  assert_false(w.ended);

  int status = -1;
  int64_t t0 = harness_now_ms();
  assert_int_equal(harness_daemon_term(d, 20000, &status), 0);
  printf("SIGTERM to exit: %lld ms\n", (long long)(harness_now_ms() - t0));
  assert_int_equal(status, 0);
  assert_true(wait_for(&w, saw_stop, 5000));
  rpc_client_free(rc);

  /* The parked join ended (it cannot complete: min 2 and no daemon). */
  ranks_join_wait(&r, 1);
  assert_int_not_equal(r.err, 0);
  ranks_free(&r, 1);

  /* The job was flushed and is there after a restart. */
  assert_int_equal(harness_daemon_restart(d), 0);
  Stoker__V1__Job *job = harness_get_job(op, "term");
  assert_non_null(job);
  assert_int_equal(job->spec->min_ranks, 2);
  protobuf_c_message_free_unpacked(&job->base, NULL);
  stk_client_free(op);
}

int main(int argc, char **argv) {
  if (harness_init(argc, argv)) return 2;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_check_serving, setup, teardown),
      cmocka_unit_test_setup_teardown(test_watch_and_sigterm, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
