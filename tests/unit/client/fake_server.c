/*
 * fake_server: the loop thread and rpc server every fake service of the
 * client tests runs on (see fake_server.h).
 */
#include "fake_server.h"

#include <setjmp.h>
#include <stdarg.h>
#include <string.h>

#include <cmocka.h>

static void run_loop(void *arg) {
  struct fake_server *s = arg;
  uv_run(&s->loop, UV_RUN_DEFAULT);
}

static void close_stop(struct fake_server *s) {
  uv_close((uv_handle_t *)&s->stop, NULL);
}

static void on_shutdown_done(void *arg) {
  struct fake_server *s = arg;
  rpc_server_free(s->srv);
  s->srv = NULL;
  if (s->after_shutdown)
    s->after_shutdown(s, close_stop);
  else
    close_stop(s);
}

static void on_stop(uv_async_t *a) {
  struct fake_server *s = a->data;
  rpc_server_shutdown(s->srv, 100, on_shutdown_done, s);
}

void fake_server_init(struct fake_server *s, void *owner) {
  memset(s, 0, sizeof(*s));
  s->owner = owner;
  assert_int_equal(uv_loop_init(&s->loop), 0);
  assert_int_equal(uv_async_init(&s->loop, &s->stop, on_stop), 0);
  s->stop.data = s;
}

void fake_server_start(struct fake_server *s, const struct rpc_server_opts *opts,
                       const ProtobufCServiceDescriptor *desc, const struct rpc_method_def *defs,
                       size_t n_defs, void *arg) {
  struct rpc_server_opts o = opts ? *opts : (struct rpc_server_opts){0};
  o.listen = "127.0.0.1:0";
  assert_int_equal(rpc_server_new(&s->loop, &o, &s->srv), 0);
  assert_int_equal(rpc_server_add_service(s->srv, desc, defs, n_defs, arg), 0);
  assert_int_equal(rpc_server_start(s->srv, s->addr, sizeof(s->addr)), 0);
  assert_int_equal(uv_thread_create(&s->thread, run_loop, s), 0);
}

void fake_server_stop(struct fake_server *s) {
  uv_async_send(&s->stop);
  assert_int_equal(uv_thread_join(&s->thread), 0);
  assert_null(s->srv);
  assert_int_equal(uv_loop_close(&s->loop), 0);
}
