/*
 * The call shapes and the server's answers to bad calls, against a real
 * server on loopback: unary, server and client streams, a reply made later
 * from a timer, unknown methods, malformed and oversized requests, and the
 * per-method metrics.
 */
#include "rpc_fixture.h"
#include "rpc_internal.h"

#include "metrics.h"
#include "stk_error.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* cmocka needs the headers above. */
#include <cmocka.h>

static void test_unary_round_trip(void **state) {
  struct fixture f = {0};
  fx_start(&f, NULL);
  struct rpc_client *c = fx_client(&f, NULL);
  Stoker__Test__Num req = STOKER__TEST__NUM__INIT;
  req.value = 42;
  req.text = "hello";
  ProtobufCMessage *resp = NULL;
  struct rpc_status st;
  assert_int_equal(rpc_client_unary(c, TEST_PATH("Echo"), &req.base, &stoker__test__num__descriptor,
                                    5000, &resp, &st),
                   0);
  assert_int_equal(st.code, RPC_OK);
  Stoker__Test__Num *r = (Stoker__Test__Num *)resp;
  assert_int_equal(r->value, 42);
  assert_string_equal(r->text, "hello");
  protobuf_c_message_free_unpacked(resp, NULL);
  for (int i = 0; i < 100; i++) {
    int64_t v = -1;
    assert_int_equal(fx_echo(c, i, &v, NULL), 0);
    assert_int_equal(v, i);
  }
  rpc_client_free(c);
  fx_stop(&f, 1000);
}

/* Receives a server stream on the client thread. */
struct stream_rx {
  pthread_mutex_t mu;
  int64_t next; /* The value expected next. */
  int out_of_order;
  int done;
  struct rpc_status st;
};

static void rx_msg(void *arg, ProtobufCMessage *msg) {
  struct stream_rx *rx = arg;
  if (((Stoker__Test__Num *)msg)->value != rx->next) rx->out_of_order++;
  rx->next++;
  protobuf_c_message_free_unpacked(msg, NULL);
}

static void rx_done(void *arg, const struct rpc_status *st) {
  struct stream_rx *rx = arg;
  rx->st = *st;
  __atomic_store_n(&rx->done, 1, __ATOMIC_SEQ_CST);
}

static void test_server_stream_in_order(void **state) {
  struct fixture f = {0};
  fx_start(&f, NULL);
  struct rpc_client *c = fx_client(&f, NULL);
  struct stream_rx rx = {.next = 0};
  Stoker__Test__Num req = STOKER__TEST__NUM__INIT;
  req.value = 5000;
  assert_int_equal(rpc_client_stream_async(c, TEST_PATH("Count"), &req.base,
                                           &stoker__test__num__descriptor, 20000, rx_msg, rx_done,
                                           &rx, NULL),
                   0);
  assert_int_equal(fx_wait_int(&rx.done, 1, 20000), 1);
  assert_int_equal(rx.st.code, RPC_OK);
  assert_int_equal(rx.next, 5000);
  assert_int_equal(rx.out_of_order, 0);
  /* Flow control: a second send while one is outstanding was refused. */
  assert_int_equal(f.svc.busy_seen, 1);
  rpc_client_free(c);
  fx_stop(&f, 1000);
}

/* A receiver that takes the first message and then holds its callback
 * thread until released, so the client reads nothing more. */
struct held_rx {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool release;
  int got, done;
};

static void held_msg(void *arg, ProtobufCMessage *msg) {
  struct held_rx *h = arg;
  protobuf_c_message_free_unpacked(msg, NULL);
  pthread_mutex_lock(&h->mu);
  h->got++;
  while (!h->release) pthread_cond_wait(&h->cv, &h->mu);
  pthread_mutex_unlock(&h->mu);
}

static void held_done(void *arg, const struct rpc_status *st) {
  struct held_rx *h = arg;
  (void)st;
  __atomic_store_n(&h->done, 1, __ATOMIC_SEQ_CST);
}

/* The client's stream window lets a server send 8 MiB ahead of its reads
 * (a trainer's prefetched token batches); gRPC's own sizing held about 4. */
static void test_client_window_holds_megabytes(void **state) {
  enum { MSG_BYTES = 1 << 20, MSGS = 16 };
  struct fixture f = {0};
  fx_start(&f, NULL);
  struct rpc_client *c = fx_client(&f, NULL);
  struct held_rx h = {.release = false};
  pthread_mutex_init(&h.mu, NULL);
  pthread_cond_init(&h.cv, NULL);
  uint8_t *blob = calloc(1, MSG_BYTES);
  Stoker__Test__Num req = STOKER__TEST__NUM__INIT;
  req.value = MSGS;
  req.blob.data = blob;
  req.blob.len = MSG_BYTES;
  assert_int_equal(rpc_client_stream_async(c, TEST_PATH("Count"), &req.base,
                                           &stoker__test__num__descriptor, 20000, held_msg,
                                           held_done, &h, NULL),
                   0);
  /* Wait until the server's sends stop completing: the window is full. */
  int sent = -1, now;
  for (int i = 0; i < 200 && (now = __atomic_load_n(&f.svc.sends_done, __ATOMIC_SEQ_CST)) != sent;
       i++) {
    sent = now;
    usleep(100 * 1000);
  }
  print_message("sends completed while the client held its first message: %d\n", sent);
  assert_true(sent >= 5);       /* About 8 MiB of 1 MiB messages went ahead ... */
  assert_true(sent < MSGS - 1); /* ... and no more: flow control still holds. */
  pthread_mutex_lock(&h.mu);
  h.release = true;
  pthread_cond_broadcast(&h.cv);
  pthread_mutex_unlock(&h.mu);
  assert_int_equal(fx_wait_int(&h.done, 1, 20000), 1);
  free(blob);
  rpc_client_free(c);
  fx_stop(&f, 1000);
  pthread_mutex_destroy(&h.mu);
  pthread_cond_destroy(&h.cv);
}

static void test_client_stream_sum(void **state) {
  struct fixture f = {0};
  fx_start(&f, NULL);
  struct rpc_client *c = fx_client(&f, NULL);
  struct rpc_client_cstream *s = NULL;
  assert_int_equal(
      rpc_client_cstream_open(c, TEST_PATH("Sum"), &stoker__test__num__descriptor, 20000, &s), 0);
  int64_t want = 0;
  for (int i = 1; i <= 2000; i++) {
    Stoker__Test__Num m = STOKER__TEST__NUM__INIT;
    m.value = i;
    want += i;
    assert_int_equal(rpc_client_cstream_write(s, &m.base), 0);
  }
  ProtobufCMessage *resp = NULL;
  struct rpc_status st;
  assert_int_equal(rpc_client_cstream_finish(s, &resp, &st), 0);
  assert_int_equal(((Stoker__Test__Num *)resp)->value, want);
  protobuf_c_message_free_unpacked(resp, NULL);
  rpc_client_free(c);
  fx_stop(&f, 1000);
}

/* What a state machine uses: notify after each batch, write_ready,
 * close_send and ended never block; the stream's moves wake the writer. */
struct moved {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int n; /* Notifies so far. */
};

static void on_moved(void *arg) {
  struct moved *m = arg;
  pthread_mutex_lock(&m->mu);
  m->n++;
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
}

/* Sleeps until a notify after seen; returns the count. */
static int wait_moved(struct moved *m, int seen) {
  pthread_mutex_lock(&m->mu);
  while (m->n == seen) pthread_cond_wait(&m->cv, &m->mu);
  int n = m->n;
  pthread_mutex_unlock(&m->mu);
  return n;
}

static void test_client_stream_driven(void **state) {
  struct fixture f = {0};
  fx_start(&f, NULL);
  struct rpc_client *c = fx_client(&f, NULL);
  struct moved mv = {.n = 0};
  pthread_mutex_init(&mv.mu, NULL);
  pthread_cond_init(&mv.cv, NULL);
  struct rpc_client_cstream *s = NULL;
  assert_int_equal(
      rpc_client_cstream_open(c, TEST_PATH("Sum"), &stoker__test__num__descriptor, 20000, &s), 0);
  rpc_client_cstream_set_notify(s, on_moved, &mv);
  int64_t want = 0;
  int seen = 0;
  for (int i = 1; i <= 500; i++) {
    while (!rpc_client_cstream_write_ready(s)) seen = wait_moved(&mv, seen);
    Stoker__Test__Num m = STOKER__TEST__NUM__INIT;
    m.value = i;
    want += i;
    assert_int_equal(rpc_client_cstream_write(s, &m.base), 0);
  }
  while (!rpc_client_cstream_write_ready(s)) seen = wait_moved(&mv, seen);
  rpc_client_cstream_close_send(s);
  while (!rpc_client_cstream_ended(s)) seen = wait_moved(&mv, seen);
  ProtobufCMessage *resp = NULL;
  assert_int_equal(rpc_client_cstream_end(s, &resp, NULL), 0);
  assert_int_equal(((Stoker__Test__Num *)resp)->value, want);
  protobuf_c_message_free_unpacked(resp, NULL);
  rpc_client_cstream_free(s);
  assert_true(mv.n >= 500); /* At least one per message taken. */
  /* A cancel from another thread ends the call: end answers CANCELLED. */
  assert_int_equal(
      rpc_client_cstream_open(c, TEST_PATH("Sum"), &stoker__test__num__descriptor, 20000, &s), 0);
  Stoker__Test__Num m = STOKER__TEST__NUM__INIT;
  assert_int_equal(rpc_client_cstream_write(s, &m.base), 0);
  rpc_client_cstream_cancel(s);
  struct rpc_status st;
  assert_int_equal(rpc_client_cstream_end(s, NULL, &st), STK_ECANCELED);
  assert_int_equal(st.code, RPC_CANCELLED);
  rpc_client_cstream_free(s);
  pthread_mutex_destroy(&mv.mu);
  pthread_cond_destroy(&mv.cv);
  rpc_client_free(c);
  fx_stop(&f, 1000);
}

static void test_reply_later(void **state) {
  struct fixture f = {0};
  fx_start(&f, NULL);
  struct rpc_client *c = fx_client(&f, NULL);
  Stoker__Test__Num req = STOKER__TEST__NUM__INIT;
  req.value = 150; /* ms until the timer replies. */
  ProtobufCMessage *resp = NULL;
  uint64_t t0 = uv_hrtime();
  assert_int_equal(rpc_client_unary(c, TEST_PATH("Later"), &req.base,
                                    &stoker__test__num__descriptor, 5000, &resp, NULL),
                   0);
  assert_true(uv_hrtime() - t0 >= 140 * 1000000ull);
  assert_int_equal(((Stoker__Test__Num *)resp)->value, 1000);
  assert_string_equal(((Stoker__Test__Num *)resp)->text, "later");
  protobuf_c_message_free_unpacked(resp, NULL);
  rpc_client_free(c);
  fx_stop(&f, 1000);
}

static void test_unknown_method(void **state) {
  struct fixture f = {0};
  fx_start(&f, NULL);
  struct rpc_client *c = fx_client(&f, NULL);
  Stoker__Test__Num req = STOKER__TEST__NUM__INIT;
  struct rpc_status st;
  const char *paths[] = {TEST_PATH("Nope"), "/other.Svc/Method"};
  for (int i = 0; i < 2; i++) {
    int err =
        rpc_client_unary(c, paths[i], &req.base, &stoker__test__num__descriptor, 3000, NULL, &st);
    assert_int_equal(err, STK_ENOTSUP);
    assert_int_equal(st.code, RPC_UNIMPLEMENTED);
    char want[128];
    snprintf(want, sizeof(want), "unknown method %s", paths[i]);
    assert_string_equal(st.message, want);
  }
  assert_int_equal(fx_echo(c, 7, NULL, NULL), 0); /* The server is still fine. */
  rpc_client_free(c);
  fx_stop(&f, 1000);
}

static void test_malformed_request(void **state) {
  struct fixture f = {0};
  fx_start(&f, NULL);
  struct rpc_client *c = fx_client(&f, NULL);
  /* Field 2 (string) claims 16 bytes but only 3 follow. */
  static const uint8_t bad[] = {0x12, 0x10, 'a', 'b', 'c'};
  struct rpc_status st;
  int err = rpc_client_unary_raw(c, TEST_PATH("Echo"), bad, sizeof(bad),
                                 &stoker__test__num__descriptor, 3000, NULL, &st);
  assert_int_equal(err, STK_EINVAL);
  assert_int_equal(st.code, RPC_INVALID_ARGUMENT);
  assert_string_equal(st.message, "malformed request for /stoker.test.Test/Echo");
  rpc_client_free(c);
  fx_stop(&f, 1000);
}

static void test_oversized_request(void **state) {
  struct fixture f = {0};
  struct rpc_server_opts o = {.max_recv_bytes = 64 * 1024};
  fx_start(&f, &o);
  struct rpc_client *c = fx_client(&f, NULL);
  size_t n = 128 * 1024;
  uint8_t *blob = calloc(1, n);
  Stoker__Test__Num req = STOKER__TEST__NUM__INIT;
  req.blob.data = blob;
  req.blob.len = n;
  struct rpc_status st;
  int err = rpc_client_unary(c, TEST_PATH("Echo"), &req.base, &stoker__test__num__descriptor, 5000,
                             NULL, &st);
  assert_int_equal(st.code, RPC_RESOURCE_EXHAUSTED);
  assert_int_equal(err, STK_EBUSY);
  req.blob.len = 1024; /* Under the limit: fine. */
  ProtobufCMessage *resp = NULL;
  assert_int_equal(rpc_client_unary(c, TEST_PATH("Echo"), &req.base, &stoker__test__num__descriptor,
                                    5000, &resp, &st),
                   0);
  assert_int_equal(((Stoker__Test__Num *)resp)->blob.len, 1024);
  protobuf_c_message_free_unpacked(resp, NULL);
  free(blob);
  rpc_client_free(c);
  fx_stop(&f, 1000);
}

/* Polls the rendered metrics for want; the call is counted when freed,
 * just after the client has its answer. */
static bool metrics_show(struct metrics *m, const char *want) {
  for (int i = 0; i < 2000; i++) {
    char *text = metrics_render(m, NULL);
    bool found = text && strstr(text, want);
    free(text);
    if (found) return true;
    usleep(1000);
  }
  return false;
}

static void test_metrics(void **state) {
  struct fixture f = {0};
  f.metrics = metrics_new();
  fx_start(&f, NULL);
  struct rpc_client *c = fx_client(&f, NULL);
  for (int i = 0; i < 3; i++) assert_int_equal(fx_echo(c, i, NULL, NULL), 0);
  static const uint8_t bad[] = {0x12, 0x10};
  rpc_client_unary_raw(c, TEST_PATH("Echo"), bad, sizeof(bad), &stoker__test__num__descriptor, 3000,
                       NULL, NULL);
#define ECHO_LABELS "grpc_type=\"unary\",grpc_service=\"stoker.test.Test\",grpc_method=\"Echo\""
  assert_true(metrics_show(f.metrics, "grpc_server_started_total{" ECHO_LABELS "} 4"));
  assert_true(
      metrics_show(f.metrics, "grpc_server_handled_total{" ECHO_LABELS ",grpc_code=\"OK\"} 3"));
  assert_true(metrics_show(f.metrics, "grpc_server_handled_total{" ECHO_LABELS
                                      ",grpc_code=\"INVALID_ARGUMENT\"} 1"));
  assert_true(metrics_show(f.metrics, "grpc_server_handling_seconds_count{" ECHO_LABELS "} 4"));
  assert_true(metrics_show(f.metrics,
                           "grpc_server_handling_seconds_bucket{" ECHO_LABELS ",le=\"+Inf\"} 4"));
  assert_true(metrics_show(f.metrics, "grpc_server_in_flight{" ECHO_LABELS "} 0"));
#undef ECHO_LABELS
  rpc_client_free(c);
  fx_stop(&f, 1000);
  metrics_free(f.metrics);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unary_round_trip),
      cmocka_unit_test(test_server_stream_in_order),
      cmocka_unit_test(test_client_stream_sum),
      cmocka_unit_test(test_client_stream_driven),
      cmocka_unit_test(test_reply_later),
      cmocka_unit_test(test_unknown_method),
      cmocka_unit_test(test_malformed_request),
      cmocka_unit_test(test_oversized_request),
      cmocka_unit_test(test_metrics),
      cmocka_unit_test(test_client_window_holds_megabytes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
