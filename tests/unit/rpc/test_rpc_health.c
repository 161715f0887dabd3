/*
 * grpc.health.v1.Health as every server serves it: Check for the whole
 * server, a registered service and an unknown one, status changes, and
 * Watch streams that report the current status and then each change; the
 * reasons a daemon is unhealthy (rpc_server_set_unhealthy) combine.
 */
#include "rpc_fixture.h"

#include "grpc/health/v1/health.pb-c.h"
#include "stk_error.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

/* cmocka needs the headers above. */
#include <cmocka.h>

#define CHECK_PATH  "/grpc.health.v1.Health/Check"
#define WATCH_PATH  "/grpc.health.v1.Health/Watch"
#define SERVING     GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
#define NOT_SERVING GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING

/* Returns the status, or -(rpc code) on failure. */
static int check(struct rpc_client *c, const char *service) {
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  req.service = (char *)service;
  ProtobufCMessage *resp = NULL;
  struct rpc_status st;
  if (rpc_client_unary(c, CHECK_PATH, &req.base,
                       &grpc__health__v1__health_check_response__descriptor, 5000, &resp, &st))
    return -st.code;
  int status = ((Grpc__Health__V1__HealthCheckResponse *)resp)->status;
  protobuf_c_message_free_unpacked(resp, NULL);
  return status;
}

static void test_check(void **state) {
  struct fixture f = {0};
  fx_start(&f, NULL);
  struct rpc_client *c = fx_client(&f, NULL);
  assert_int_equal(check(c, ""), SERVING);
  assert_int_equal(check(c, "stoker.test.Test"), SERVING);
  assert_int_equal(check(c, "no.such.Service"), -RPC_NOT_FOUND);
  fx_set_serving(&f, "stoker.test.Test", false);
  assert_int_equal(check(c, "stoker.test.Test"), NOT_SERVING);
  assert_int_equal(check(c, ""), SERVING);
  fx_set_serving(&f, "", false);
  assert_int_equal(check(c, ""), NOT_SERVING);
  fx_set_serving(&f, "stoker.test.Test", true);
  assert_int_equal(check(c, "stoker.test.Test"), SERVING);
  rpc_client_free(c);
  fx_stop(&f, 1000);
}

struct unhealthy_args {
  enum rpc_unhealthy why;
  bool holds;
};

static void set_unhealthy_on_loop(struct fixture *f, void *arg) {
  struct unhealthy_args *a = arg;
  rpc_server_set_unhealthy(f->srv, a->why, a->holds);
}

static void set_unhealthy(struct fixture *f, enum rpc_unhealthy why, bool holds) {
  struct unhealthy_args a = {why, holds};
  fx_on_loop(f, set_unhealthy_on_loop, &a);
}

/* Two reasons to be unhealthy (descriptors, stuck workers): the daemon
 * serves again only once neither holds; clearing one does not clear the
 * other's verdict. */
static void test_unhealthy_reasons(void **state) {
  struct fixture f = {0};
  fx_start(&f, NULL);
  struct rpc_client *c = fx_client(&f, NULL);
  set_unhealthy(&f, RPC_UNHEALTHY_DESCRIPTORS, true);
  assert_int_equal(check(c, ""), NOT_SERVING);
  assert_int_equal(check(c, "stoker.test.Test"), NOT_SERVING);
  set_unhealthy(&f, RPC_UNHEALTHY_WORKERS_STUCK, true);
  set_unhealthy(&f, RPC_UNHEALTHY_DESCRIPTORS, false);
  assert_int_equal(check(c, ""), NOT_SERVING);
  assert_int_equal(check(c, "stoker.test.Test"), NOT_SERVING);
  set_unhealthy(&f, RPC_UNHEALTHY_WORKERS_STUCK, false);
  assert_int_equal(check(c, ""), SERVING);
  assert_int_equal(check(c, "stoker.test.Test"), SERVING);
  rpc_client_free(c);
  fx_stop(&f, 1000);
}

struct watch_rx {
  int n;
  int statuses[16];
  int done;
  struct rpc_status st;
};

static void watch_msg(void *arg, ProtobufCMessage *msg) {
  struct watch_rx *rx = arg;
  if (rx->n < 16) rx->statuses[rx->n] = ((Grpc__Health__V1__HealthCheckResponse *)msg)->status;
  __atomic_add_fetch(&rx->n, 1, __ATOMIC_SEQ_CST);
  protobuf_c_message_free_unpacked(msg, NULL);
}

static void watch_done(void *arg, const struct rpc_status *st) {
  struct watch_rx *rx = arg;
  rx->st = *st;
  __atomic_store_n(&rx->done, 1, __ATOMIC_SEQ_CST);
}

static struct rpc_client_call *watch(struct rpc_client *c, const char *service,
                                     struct watch_rx *rx) {
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  req.service = (char *)service;
  struct rpc_client_call *call = NULL;
  assert_int_equal(rpc_client_stream_async(c, WATCH_PATH, &req.base,
                                           &grpc__health__v1__health_check_response__descriptor, 0,
                                           watch_msg, watch_done, rx, &call),
                   0);
  return call;
}

static void test_watch_reports_changes(void **state) {
  struct fixture f = {0};
  fx_start(&f, NULL);
  struct rpc_client *c = fx_client(&f, NULL);
  struct watch_rx rx = {0};
  struct rpc_client_call *call = watch(c, "stoker.test.Test", &rx);
  assert_int_equal(fx_wait_int(&rx.n, 1, 5000), 1);
  assert_int_equal(rx.statuses[0], SERVING);
  fx_set_serving(&f, "stoker.test.Test", false);
  assert_int_equal(fx_wait_int(&rx.n, 2, 5000), 2);
  assert_int_equal(rx.statuses[1], NOT_SERVING);
  fx_set_serving(&f, "stoker.test.Test", true);
  assert_int_equal(fx_wait_int(&rx.n, 3, 5000), 3);
  assert_int_equal(rx.statuses[2], SERVING);
  assert_int_equal(rx.done, 0);
  rpc_client_call_cancel(call);
  assert_int_equal(fx_wait_int(&rx.done, 1, 5000), 1);
  assert_int_equal(rx.st.code, RPC_CANCELLED);
  rpc_client_free(c);
  fx_stop(&f, 1000);
}

static void test_watch_ends_at_shutdown(void **state) {
  struct fixture f = {0};
  fx_start(&f, NULL);
  struct rpc_client *c = fx_client(&f, NULL);
  struct watch_rx rx = {0};
  watch(c, "", &rx);
  assert_int_equal(fx_wait_int(&rx.n, 1, 5000), 1);
  assert_int_equal(rx.statuses[0], SERVING);
  uint64_t t0 = uv_hrtime();
  fx_stop(&f, 5000); /* Must not need the grace period to end the watch. */
  assert_true(uv_hrtime() - t0 < 2000 * 1000000ull);
  assert_int_equal(fx_wait_int(&rx.done, 1, 5000), 1);
  assert_int_equal(rx.n, 2);
  assert_int_equal(rx.statuses[1], NOT_SERVING);
  assert_int_equal(rx.st.code, RPC_OK);
  rpc_client_free(c);
}

struct cancel_args {
  struct rpc_client_call *call;
  bool serving;
  unsigned delay_us;
};

/* On the loop (so nothing else runs there meanwhile): the client cancels,
 * and after a varying delay a status change starts a send that races the
 * cancellation through the transport; the loop stays busy until both the
 * send's completion and the cancellation are queued, in either order. */
static void cancel_and_change(struct fixture *f, void *arg) {
  struct cancel_args *a = arg;
  rpc_client_call_cancel(a->call);
  if (a->delay_us) usleep(a->delay_us);
  rpc_server_set_serving(f->srv, "stoker.test.Test", a->serving);
  uv_sleep(10);
}

/* A Watch cancelled while its send is outstanding is freed whichever
 * completes first (the sanitized build once found the watcher leaked when
 * the cancellation came first and the send then succeeded). The order is
 * up to gRPC's completion threads, so this varies the timing over many
 * watches and LeakSanitizer (in the sanitized run) checks none is left. */
static void test_watch_cancelled_during_send(void **state) {
  struct fixture f = {0};
  fx_start(&f, NULL);
  struct rpc_client *c = fx_client(&f, NULL);
  for (int i = 0; i < 100; i++) {
    struct watch_rx rx = {0};
    struct cancel_args a = {watch(c, "stoker.test.Test", &rx), i % 2 == 1,
                            (unsigned)(i % 10) * 100};
    assert_int_equal(fx_wait_int(&rx.n, 1, 5000), 1);
    fx_on_loop(&f, cancel_and_change, &a);
    assert_int_equal(fx_wait_int(&rx.done, 1, 5000), 1);
  }
  rpc_client_free(c);
  fx_stop(&f, 1000);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_watch_cancelled_during_send),
      cmocka_unit_test(test_check),
      cmocka_unit_test(test_unhealthy_reasons),
      cmocka_unit_test(test_watch_reports_changes),
      cmocka_unit_test(test_watch_ends_at_shutdown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
