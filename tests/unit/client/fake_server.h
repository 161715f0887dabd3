/*
 * fake_server: what the fake services of these tests share — an rpc server
 * on 127.0.0.1 (port 0) whose libuv loop runs on a thread of the test
 * process, started and stopped with assertions. A fake embeds one, may add
 * its own handles to the loop between init and start, and closes them in
 * after_shutdown, which runs on the loop once the server is freed.
 */
#ifndef STK_TEST_FAKE_SERVER_H
#define STK_TEST_FAKE_SERVER_H

#include <stddef.h>
#include <uv.h>

#include "rpc.h"

struct fake_server {
  uv_loop_t loop;
  uv_thread_t thread;
  uv_async_t stop;
  struct rpc_server *srv;
  char addr[128]; /* Bound HOST:PORT, once started. */
  /* NULL, or closes the fake's own handles and then calls done(s). */
  void (*after_shutdown)(struct fake_server *s, void (*done)(struct fake_server *s));
  void *owner; /* For after_shutdown. */
};

/* Zeroes s and opens its loop; the fake may now add handles to s->loop. */
void fake_server_init(struct fake_server *s, void *owner);
/* Serves desc's methods (defs, arg as each handler's data) on the loop
 * thread. opts->listen is ignored (127.0.0.1:0); opts may be NULL. */
void fake_server_start(struct fake_server *s, const struct rpc_server_opts *opts,
                       const ProtobufCServiceDescriptor *desc, const struct rpc_method_def *defs,
                       size_t n_defs, void *arg);
/* Shuts the server down (calls in flight are cancelled), joins the loop
 * thread and closes the loop. */
void fake_server_stop(struct fake_server *s);

#endif
