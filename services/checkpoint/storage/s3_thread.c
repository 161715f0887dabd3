/*
 * The S3 client on its own loop thread (see s3_thread.h): a locked list of
 * submitted operations handed to the loop with uv_async_send (sends
 * coalesce, so the whole list is drained each time). The blocking wait is
 * a condition variable signalled from the operation's callback.
 */
#include "s3_thread.h"

#include "stk_error.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct call {
  struct s3_op op;
  s3_done_fn done;
  void *arg;
  struct call *next;
};

struct s3_thread {
  uv_loop_t loop;
  uv_async_t wake;
  uv_thread_t thread;
  struct s3_client *client;
  pthread_mutex_t mu;
  struct call *pending;
  bool stopping;
};

/* Starts one call on the loop thread; the client copies the op. */
static void start(struct s3_thread *s, struct call *call) {
  int err =
      s->client ? s3_client_submit(s->client, &call->op, call->done, call->arg) : STK_ECANCELED;
  if (err) {
    struct s3_result res = {.err = err};
    call->done(call->arg, &res);
    s3_result_clear(&res);
  }
  free(call);
}

static void on_wake(uv_async_t *a) {
  struct s3_thread *s = a->data;
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
  if (stopping && s->client) {
    s3_client_free(s->client);
    s->client = NULL;
    uv_close((uv_handle_t *)&s->wake, NULL);
  }
}

static void run(void *arg) {
  struct s3_thread *s = arg;
  uv_run(&s->loop, UV_RUN_DEFAULT);
}

int s3_thread_new(const struct s3_config *cfg, struct s3_thread **ret) {
  struct s3_thread *s = calloc(1, sizeof(*s));
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

void s3_thread_free(struct s3_thread *s) {
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

void s3_thread_submit(struct s3_thread *s, const struct s3_op *op, s3_done_fn done, void *arg) {
  struct call *call = malloc(sizeof(*call));
  if (!call) {
    struct s3_result res = {.err = STK_ENOMEM};
    done(arg, &res);
    return;
  }
  *call = (struct call){.op = *op, .done = done, .arg = arg};
  pthread_mutex_lock(&s->mu);
  call->next = s->pending;
  s->pending = call;
  pthread_mutex_unlock(&s->mu);
  uv_async_send(&s->wake);
}

/* ---- The blocking wait ---- */

struct waiter {
  pthread_mutex_t mu;
  pthread_cond_t cond;
  bool done;
  struct s3_result *res;
};

static void on_done(void *arg, struct s3_result *res) {
  struct waiter *w = arg;
  pthread_mutex_lock(&w->mu);
  *w->res = *res;
  memset(res, 0, sizeof(*res));
  w->done = true;
  pthread_cond_signal(&w->cond);
  pthread_mutex_unlock(&w->mu);
}

int s3_thread_do(struct s3_thread *s, const struct s3_op *op, struct s3_result *ret) {
  memset(ret, 0, sizeof(*ret));
  struct waiter w = {.res = ret};
  pthread_mutex_init(&w.mu, NULL);
  pthread_cond_init(&w.cond, NULL);
  s3_thread_submit(s, op, on_done, &w);
  pthread_mutex_lock(&w.mu);
  while (!w.done) pthread_cond_wait(&w.cond, &w.mu);
  pthread_mutex_unlock(&w.mu);
  pthread_cond_destroy(&w.cond);
  pthread_mutex_destroy(&w.mu);
  return ret->err;
}
