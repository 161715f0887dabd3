/*
 * Blocking S3 calls over the asynchronous client (see s3_sync.h): a
 * locked list of calls handed to the loop thread with uv_async_send
 * (sends coalesce, so the whole list is drained each time), each call
 * waiting on its own condition variable.
 */
#include "s3_sync.h"

#include "stk_error.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct call {
  const struct s3_op *op; /* NULL: a stats request. */
  struct s3_result *res;
  struct s3_stats *stats;
  struct s3_sync *sync;
  bool done;
  pthread_cond_t cond;
  struct call *next;
};

struct s3_sync {
  uv_loop_t loop;
  uv_async_t wake;
  uv_thread_t thread;
  struct s3_client *client;
  pthread_mutex_t mu;
  struct call *pending;
  bool stopping;
};

static void complete(struct s3_sync *s, struct call *call) {
  pthread_mutex_lock(&s->mu);
  call->done = true;
  pthread_cond_signal(&call->cond);
  pthread_mutex_unlock(&s->mu);
}

static void on_done(void *arg, struct s3_result *res) {
  struct call *call = arg;
  *call->res = *res;
  memset(res, 0, sizeof(*res));
  complete(call->sync, call);
}

static void start(struct s3_sync *s, struct call *call) {
  if (!call->op) {
    s3_client_stats(s->client, call->stats);
    complete(s, call);
    return;
  }
  call->sync = s;
  int err = s3_client_submit(s->client, call->op, on_done, call);
  if (err) {
    memset(call->res, 0, sizeof(*call->res));
    call->res->err = err;
    complete(s, call);
  }
}

static void on_wake(uv_async_t *a) {
  struct s3_sync *s = a->data;
  pthread_mutex_lock(&s->mu);
  struct call *list = s->pending;
  s->pending = NULL;
  bool stopping = s->stopping;
  pthread_mutex_unlock(&s->mu);
  /* The list is LIFO; reverse it so calls start in arrival order. */
  struct call *fifo = NULL;
  while (list) {
    struct call *next = list->next;
    list->next = fifo;
    fifo = list;
    list = next;
  }
  for (struct call *call = fifo, *next; call; call = next) {
    next = call->next;
    start(s, call);
  }
  if (stopping) {
    s3_client_free(s->client);
    s->client = NULL;
    uv_close((uv_handle_t *)&s->wake, NULL);
  }
}

static void run(void *arg) {
  struct s3_sync *s = arg;
  uv_run(&s->loop, UV_RUN_DEFAULT);
}

int s3_sync_new(const struct s3_config *cfg, struct s3_sync **ret) {
  struct s3_sync *s = calloc(1, sizeof(*s));
  if (!s) return STK_ENOMEM;
  int err = uv_loop_init(&s->loop) ? STK_ENOMEM : 0;
  if (err) {
    free(s);
    return err;
  }
  err = s3_client_new(&s->loop, cfg, &s->client);
  if (err) {
    uv_loop_close(&s->loop);
    free(s);
    return err;
  }
  pthread_mutex_init(&s->mu, NULL);
  uv_async_init(&s->loop, &s->wake, on_wake);
  s->wake.data = s;
  if (uv_thread_create(&s->thread, run, s) != 0) {
    s->stopping = true;
    on_wake(&s->wake);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    uv_loop_close(&s->loop);
    pthread_mutex_destroy(&s->mu);
    free(s);
    return STK_ENOMEM;
  }
  *ret = s;
  return 0;
}

void s3_sync_free(struct s3_sync *s) {
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  s->stopping = true;
  pthread_mutex_unlock(&s->mu);
  uv_async_send(&s->wake);
  uv_thread_join(&s->thread);
  uv_loop_close(&s->loop);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

static void post_and_wait(struct s3_sync *s, struct call *call) {
  pthread_cond_init(&call->cond, NULL);
  pthread_mutex_lock(&s->mu);
  call->next = s->pending;
  s->pending = call;
  pthread_mutex_unlock(&s->mu);
  uv_async_send(&s->wake);
  pthread_mutex_lock(&s->mu);
  while (!call->done) pthread_cond_wait(&call->cond, &s->mu);
  pthread_mutex_unlock(&s->mu);
  pthread_cond_destroy(&call->cond);
}

int s3_sync_do(struct s3_sync *s, const struct s3_op *op, struct s3_result *ret) {
  struct call call = {.op = op, .res = ret};
  memset(ret, 0, sizeof(*ret));
  post_and_wait(s, &call);
  return ret->err;
}
