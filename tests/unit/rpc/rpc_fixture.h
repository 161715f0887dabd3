/*
 * rpc_fixture: a real rpc server on 127.0.0.1 (port 0) whose loop runs on a
 * thread of the test process, serving the stoker.test.Test service of
 * rpctest.proto, plus helpers for the tests' client side. fx_stop shuts the
 * server down gracefully and checks that the loop closes cleanly.
 */
#ifndef STK_RPC_FIXTURE_H
#define STK_RPC_FIXTURE_H

#include "rpc.h"
#include "rpctest.pb-c.h"

#include <pthread.h>
#include <stdbool.h>

#define TEST_PATH(m) "/stoker.test.Test/" m

/* What the test service's handlers saw (written on the loop thread). */
struct test_svc {
  int parked;           /* Park calls that arrived. */
  int cancels;          /* Cancel callbacks that ran. */
  int busy_seen;        /* Count saw STK_EBUSY for a second send. */
  int sends_done;       /* Count's sends that completed (read atomically). */
  int64_t park_left_ms; /* rpc_deadline_remaining_ms of the last Park. */
};

struct fixture {
  uv_loop_t loop;
  uv_thread_t thread;
  uv_async_t cmd;
  pthread_mutex_t mu; /* Serializes fx_on_loop callers; guards cmd_*. */
  pthread_cond_t cv;
  void (*cmd_fn)(struct fixture *f, void *arg);
  void *cmd_arg;
  bool cmd_done;
  struct rpc_server *srv;
  struct metrics *metrics; /* Set before fx_start to get metrics. */
  char addr[128];
  int done_fired;
  struct test_svc svc;
};

/* Starts the server with opts (NULL: defaults; listen is always set). */
void fx_start(struct fixture *f, const struct rpc_server_opts *opts);
/* Runs fn(f, arg) on the loop thread and waits for it. */
void fx_on_loop(struct fixture *f, void (*fn)(struct fixture *f, void *arg), void *arg);
/* Graceful shutdown; asserts done ran and uv_loop_close(loop) == 0. */
void fx_stop(struct fixture *f, int64_t grace_ms);
/* A plaintext client for the fixture's address, with an optional token. */
struct rpc_client *fx_client(struct fixture *f, const char *token);
/* Polls until *v >= want (read atomically) or ms pass; returns *v. */
int fx_wait_int(const int *v, int want, int ms);
/* Sets the health status of service on the loop thread. */
void fx_set_serving(struct fixture *f, const char *service, bool serving);

/* Unary Echo of value on c; returns the rpc_client_unary result. */
int fx_echo(struct rpc_client *c, int64_t value, int64_t *ret_value, struct rpc_status *ret_st);

#endif
