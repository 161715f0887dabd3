/*
 * Calls that end without a reply: the caller's deadline passes, the caller
 * cancels, or the server shuts down with the call parked. In each case the
 * server's cancel callback must run and the server must still stop cleanly.
 */
#include "rpc_fixture.h"

#include "stk_error.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

/* cmocka needs the headers above. */
#include <cmocka.h>

static void test_deadline_exceeded(void **state) {
  struct fixture f = {0};
  fx_start(&f, NULL);
  struct rpc_client *c = fx_client(&f, NULL);
  Stoker__Test__Num req = STOKER__TEST__NUM__INIT;
  struct rpc_status st;
  int err = rpc_client_unary(c, TEST_PATH("Park"), &req.base, &stoker__test__num__descriptor, 300,
                             NULL, &st);
  assert_int_equal(err, STK_ETIMEDOUT);
  assert_int_equal(st.code, RPC_DEADLINE_EXCEEDED);
  assert_int_equal(fx_wait_int(&f.svc.cancels, 1, 5000), 1);
  /* The handler saw the caller's deadline. */
  assert_true(f.svc.park_left_ms > 0 && f.svc.park_left_ms <= 300);
  rpc_client_free(c);
  fx_stop(&f, 1000);
}

struct async_result {
  int done;
  struct rpc_status st;
};

static void on_unary_done(void *arg, const struct rpc_status *st, ProtobufCMessage *resp) {
  struct async_result *r = arg;
  r->st = *st;
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  __atomic_store_n(&r->done, 1, __ATOMIC_SEQ_CST);
}

static void test_client_cancel(void **state) {
  struct fixture f = {0};
  fx_start(&f, NULL);
  struct rpc_client *c = fx_client(&f, NULL);
  Stoker__Test__Num req = STOKER__TEST__NUM__INIT;
  struct async_result r = {0};
  struct rpc_client_call *call = NULL;
  assert_int_equal(rpc_client_unary_async(c, TEST_PATH("Park"), &req.base,
                                          &stoker__test__num__descriptor, 0, on_unary_done, &r,
                                          &call),
                   0);
  assert_int_equal(fx_wait_int(&f.svc.parked, 1, 5000), 1);
  assert_int_equal(f.svc.park_left_ms, INT64_MAX); /* No deadline given. */
  assert_int_equal(r.done, 0);
  rpc_client_call_cancel(call);
  assert_int_equal(fx_wait_int(&r.done, 1, 5000), 1);
  assert_int_equal(r.st.code, RPC_CANCELLED);
  assert_int_equal(fx_wait_int(&f.svc.cancels, 1, 5000), 1);
  rpc_client_free(c);
  fx_stop(&f, 1000);
}

static void test_shutdown_with_parked_call(void **state) {
  struct fixture f = {0};
  fx_start(&f, NULL);
  struct rpc_client *c = fx_client(&f, NULL);
  Stoker__Test__Num req = STOKER__TEST__NUM__INIT;
  struct async_result r = {0};
  assert_int_equal(rpc_client_unary_async(c, TEST_PATH("Park"), &req.base,
                                          &stoker__test__num__descriptor, 0, on_unary_done, &r,
                                          NULL),
                   0);
  assert_int_equal(fx_wait_int(&f.svc.parked, 1, 5000), 1);
  /* fx_stop asserts that done ran and the loop closes with nothing left. */
  fx_stop(&f, 100);
  assert_int_equal(f.svc.cancels, 1);
  assert_int_equal(fx_wait_int(&r.done, 1, 5000), 1);
  assert_int_not_equal(r.st.code, RPC_OK);
  rpc_client_free(c);
}

/* More calls than the server has parked-call queues (rpc_loop.c), so every
 * queue holds some and each reports its cancellations to the loop. */
#define N_OPEN 80

static void test_client_free_cancels_open_calls(void **state) {
  struct fixture f = {0};
  fx_start(&f, NULL);
  struct rpc_client *c = fx_client(&f, NULL);
  Stoker__Test__Num req = STOKER__TEST__NUM__INIT;
  struct async_result r[N_OPEN] = {{0}};
  for (int i = 0; i < N_OPEN; i++)
    assert_int_equal(rpc_client_unary_async(c, TEST_PATH("Park"), &req.base,
                                            &stoker__test__num__descriptor, 0, on_unary_done, &r[i],
                                            NULL),
                     0);
  assert_int_equal(fx_wait_int(&f.svc.parked, N_OPEN, 5000), N_OPEN);
  rpc_client_free(c); /* Returns once every done has run. */
  for (int i = 0; i < N_OPEN; i++) {
    assert_int_equal(r[i].done, 1);
    assert_int_equal(r[i].st.code, RPC_CANCELLED);
  }
  assert_int_equal(fx_wait_int(&f.svc.cancels, N_OPEN, 5000), N_OPEN);
  fx_stop(&f, 1000);
}

static void test_shutdown_idle_server(void **state) {
  struct fixture f = {0};
  fx_start(&f, NULL);
  fx_stop(&f, 0);
  assert_int_equal(f.svc.cancels, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_deadline_exceeded),
      cmocka_unit_test(test_client_cancel),
      cmocka_unit_test(test_shutdown_with_parked_call),
      cmocka_unit_test(test_client_free_cancels_open_calls),
      cmocka_unit_test(test_shutdown_idle_server),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
