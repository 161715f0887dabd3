/*
 * rpc_fixture: the test server (see rpc_fixture.h) and the test service's
 * handlers, one per call shape: Echo (unary), Count (server stream), Sum
 * (client stream), Later (replies after a uv timer), Park (never replies;
 * records its cancel callback); Later and Park are parked calls.
 */
#include "rpc_fixture.h"

#include "stk_error.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* cmocka needs the headers above. */
#include <cmocka.h>

/* ------------------------------------------------------------- handlers */

static void handle_echo(struct rpc_call *c, const ProtobufCMessage *req, void *data) {
  rpc_reply(c, req);
}

struct count_state {
  struct test_svc *svc;
  int64_t next, n;
  ProtobufCBinaryData blob; /* Carried by every message (the request's). */
};

static void count_sent(struct rpc_call *c, int err, void *arg);

static void count_send_next(struct rpc_call *c, struct count_state *st) {
  if (st->next >= st->n) {
    rpc_finish(c, RPC_OK, NULL);
    free(st);
    return;
  }
  Stoker__Test__Num m = STOKER__TEST__NUM__INIT;
  m.value = st->next++;
  m.blob = st->blob;
  int err = rpc_send(c, &m.base, count_sent, st);
  if (err) {
    rpc_finish(c, RPC_INTERNAL, "send: %s", stk_strerror(err));
    free(st);
    return;
  }
  if (rpc_send(c, &m.base, count_sent, st) == STK_EBUSY) st->svc->busy_seen = 1;
}

static void count_sent(struct rpc_call *c, int err, void *arg) {
  struct count_state *st = arg;
  if (err) {
    rpc_finish(c, RPC_CANCELLED, "gone");
    free(st);
    return;
  }
  __atomic_add_fetch(&st->svc->sends_done, 1, __ATOMIC_SEQ_CST);
  count_send_next(c, st);
}

static void handle_count(struct rpc_call *c, const ProtobufCMessage *req, void *data) {
  struct count_state *st = calloc(1, sizeof(*st));
  st->svc = data;
  st->n = ((const Stoker__Test__Num *)req)->value;
  st->blob = ((const Stoker__Test__Num *)req)->blob; /* The request outlives the call's sends. */
  count_send_next(c, st);
}

static void sum_got(struct rpc_call *c, ProtobufCMessage *msg, int err, void *arg) {
  int64_t *sum = arg;
  if (err) {
    rpc_fail_err(c, err, "recv failed");
    free(sum);
    return;
  }
  if (!msg) {
    Stoker__Test__Num m = STOKER__TEST__NUM__INIT;
    m.value = *sum;
    free(sum);
    rpc_reply(c, &m.base);
    return;
  }
  *sum += ((Stoker__Test__Num *)msg)->value;
  protobuf_c_message_free_unpacked(msg, NULL);
  rpc_recv(c, sum_got, sum);
}

static void handle_sum(struct rpc_call *c, const ProtobufCMessage *req, void *data) {
  int64_t *sum = calloc(1, sizeof(*sum));
  rpc_recv(c, sum_got, sum);
}

static void later_closed(uv_handle_t *h) {
  free(h);
}

static void later_fire(uv_timer_t *t) {
  struct rpc_call *c = t->data;
  Stoker__Test__Num m = STOKER__TEST__NUM__INIT;
  m.value = 1000;
  m.text = "later";
  rpc_reply(c, &m.base);
  uv_close((uv_handle_t *)t, later_closed);
}

static void handle_later(struct rpc_call *c, const ProtobufCMessage *req, void *data) {
  struct fixture *f = (struct fixture *)((char *)data - offsetof(struct fixture, svc));
  uv_timer_t *t = malloc(sizeof(*t));
  uv_timer_init(&f->loop, t);
  t->data = c;
  uv_timer_start(t, later_fire, (uint64_t)((const Stoker__Test__Num *)req)->value, 0);
}

static void park_cancelled(struct rpc_call *c, void *arg) {
  struct test_svc *svc = arg;
  __atomic_add_fetch(&svc->cancels, 1, __ATOMIC_SEQ_CST);
  rpc_fail(c, RPC_CANCELLED, "parked call cancelled");
}

static void handle_park(struct rpc_call *c, const ProtobufCMessage *req, void *data) {
  struct test_svc *svc = data;
  svc->park_left_ms = rpc_deadline_remaining_ms(c);
  rpc_on_cancel(c, park_cancelled, svc);
  __atomic_add_fetch(&svc->parked, 1, __ATOMIC_SEQ_CST);
}

#define SVC Stoker__Test__Test_Service

/* Later and Park wait, so they are parked rows: their batches complete on
 * the pump's parked-call queues (rpc_loop.c), the others on the loop's. */
static const struct rpc_method_def test_defs[] = {
    RPC_UNARY_ROW(SVC, echo, handle_echo),        RPC_SERVER_STREAM_ROW(SVC, count, handle_count),
    RPC_CLIENT_STREAM_ROW(SVC, sum, handle_sum),  RPC_UNARY_PARKED_ROW(SVC, later, handle_later),
    RPC_UNARY_PARKED_ROW(SVC, park, handle_park),
};

/* -------------------------------------------------------------- fixture */

static void on_cmd(uv_async_t *a) {
  struct fixture *f = a->data;
  pthread_mutex_lock(&f->mu);
  void (*fn)(struct fixture *, void *) = f->cmd_fn;
  void *arg = f->cmd_arg;
  f->cmd_fn = NULL;
  pthread_mutex_unlock(&f->mu);
  if (!fn) return;
  fn(f, arg);
  pthread_mutex_lock(&f->mu);
  f->cmd_done = true;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
}

void fx_on_loop(struct fixture *f, void (*fn)(struct fixture *f, void *arg), void *arg) {
  pthread_mutex_lock(&f->mu);
  f->cmd_fn = fn;
  f->cmd_arg = arg;
  f->cmd_done = false;
  uv_async_send(&f->cmd);
  while (!f->cmd_done) pthread_cond_wait(&f->cv, &f->mu);
  pthread_mutex_unlock(&f->mu);
}

static void run_loop(void *arg) {
  struct fixture *f = arg;
  uv_run(&f->loop, UV_RUN_DEFAULT);
}

void fx_start(struct fixture *f, const struct rpc_server_opts *opts) {
  struct rpc_server_opts o = {0};
  if (opts) o = *opts;
  o.listen = "127.0.0.1:0";
  if (!o.metrics) o.metrics = f->metrics;
  assert_int_equal(uv_loop_init(&f->loop), 0);
  pthread_mutex_init(&f->mu, NULL);
  pthread_cond_init(&f->cv, NULL);
  assert_int_equal(uv_async_init(&f->loop, &f->cmd, on_cmd), 0);
  f->cmd.data = f;
  assert_int_equal(rpc_server_new(&f->loop, &o, &f->srv), 0);
  assert_int_equal(rpc_server_add_service(f->srv, &stoker__test__test__descriptor, test_defs,
                                          RPC_N_ROWS(test_defs), &f->svc),
                   0);
  assert_int_equal(rpc_server_start(f->srv, f->addr, sizeof(f->addr)), 0);
  assert_non_null(strstr(f->addr, "127.0.0.1:"));
  assert_int_equal(uv_thread_create(&f->thread, run_loop, f), 0);
}

static void on_done(void *arg) {
  struct fixture *f = arg;
  f->done_fired = 1;
  rpc_server_free(f->srv); /* Allowed from done. */
  f->srv = NULL;
}

struct stop_args {
  int64_t grace_ms;
};

static void stop_on_loop(struct fixture *f, void *arg) {
  struct stop_args *a = arg;
  rpc_server_shutdown(f->srv, a->grace_ms, on_done, f);
  uv_close((uv_handle_t *)&f->cmd, NULL);
}

void fx_stop(struct fixture *f, int64_t grace_ms) {
  struct stop_args a = {grace_ms};
  fx_on_loop(f, stop_on_loop, &a);
  assert_int_equal(uv_thread_join(&f->thread), 0);
  assert_int_equal(f->done_fired, 1);
  assert_int_equal(uv_loop_close(&f->loop), 0);
  pthread_cond_destroy(&f->cv);
  pthread_mutex_destroy(&f->mu);
}

struct rpc_client *fx_client(struct fixture *f, const char *token) {
  struct rpc_client_opts o = {.target = f->addr, .token = token};
  struct rpc_client *c = NULL;
  assert_int_equal(rpc_client_new(&o, &c), 0);
  return c;
}

int fx_wait_int(const int *v, int want, int ms) {
  for (int i = 0; i < ms; i++) {
    int now = __atomic_load_n(v, __ATOMIC_SEQ_CST);
    if (now >= want) return now;
    usleep(1000);
  }
  return __atomic_load_n(v, __ATOMIC_SEQ_CST);
}

struct serving_args {
  const char *service;
  bool serving;
};

static void set_serving_on_loop(struct fixture *f, void *arg) {
  struct serving_args *a = arg;
  rpc_server_set_serving(f->srv, a->service, a->serving);
}

void fx_set_serving(struct fixture *f, const char *service, bool serving) {
  struct serving_args a = {service, serving};
  fx_on_loop(f, set_serving_on_loop, &a);
}

int fx_echo(struct rpc_client *c, int64_t value, int64_t *ret_value, struct rpc_status *ret_st) {
  Stoker__Test__Num req = STOKER__TEST__NUM__INIT;
  req.value = value;
  ProtobufCMessage *resp = NULL;
  int err = rpc_client_unary(c, TEST_PATH("Echo"), &req.base, &stoker__test__num__descriptor, 5000,
                             &resp, ret_st);
  if (!err) {
    if (ret_value) *ret_value = ((Stoker__Test__Num *)resp)->value;
    protobuf_c_message_free_unpacked(resp, NULL);
  }
  return err;
}
