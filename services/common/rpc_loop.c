/*
 * rpc_loop: the bridge between gRPC's completion queue and a daemon's libuv
 * loop. gRPC reports finished batches on threads that block in
 * grpc_completion_queue_next; the service state belongs to the loop thread.
 * So the CQ threads only push each completed tag onto a locked FIFO and
 * wake the loop with uv_async_send; the loop drains the whole FIFO on each
 * wakeup (wakeups coalesce) and runs the tags' callbacks in order.
 *
 * The FIFO links the tags themselves (struct rpc_tag has next/ok), so
 * posting never allocates and cannot fail.
 */
#include "rpc_internal.h"

#include "stk_error.h"

#include <pthread.h>
#include <stdlib.h>

struct rpc_pump {
  uv_loop_t *loop;
  grpc_completion_queue *cq;
  uv_async_t async;
  pthread_t *threads;
  unsigned n_threads;
  pthread_mutex_t mu;
  struct rpc_tag *head; /* FIFO of completed tags, under mu. */
  struct rpc_tag *tail;
  void (*closed)(void *arg);
  void *closed_arg;
};

void rpc_pump_post(struct rpc_pump *p, struct rpc_tag *tag, bool ok) {
  tag->ok = ok;
  tag->next = NULL;
  pthread_mutex_lock(&p->mu);
  if (p->tail)
    p->tail->next = tag;
  else
    p->head = tag;
  p->tail = tag;
  pthread_mutex_unlock(&p->mu);
  uv_async_send(&p->async);
}

static void *cq_thread(void *arg) {
  struct rpc_pump *p = arg;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(p->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) return NULL;
    if (ev.type == GRPC_OP_COMPLETE) rpc_pump_post(p, ev.tag, ev.success != 0);
  }
}

static void drain(struct rpc_pump *p) {
  pthread_mutex_lock(&p->mu);
  struct rpc_tag *t = p->head;
  p->head = p->tail = NULL;
  pthread_mutex_unlock(&p->mu);
  while (t) {
    struct rpc_tag *next = t->next; /* fn may free or re-arm t. */
    t->fn(t, t->ok);
    t = next;
  }
}

static void on_async(uv_async_t *a) {
  drain(a->data);
}

static void on_async_closed(uv_handle_t *h) {
  struct rpc_pump *p = h->data;
  void (*closed)(void *) = p->closed;
  void *arg = p->closed_arg;
  pthread_mutex_destroy(&p->mu);
  free(p->threads);
  free(p);
  if (closed) closed(arg);
}

int rpc_pump_start(uv_loop_t *loop, grpc_completion_queue *cq, unsigned n_threads,
                   struct rpc_pump **ret_pump) {
  struct rpc_pump *p = calloc(1, sizeof(*p));
  if (!p) return STK_ENOMEM;
  p->threads = calloc(n_threads, sizeof(*p->threads));
  if (!p->threads || uv_async_init(loop, &p->async, on_async) != 0) {
    free(p->threads);
    free(p);
    return STK_ENOMEM;
  }
  p->loop = loop;
  p->cq = cq;
  p->async.data = p;
  pthread_mutex_init(&p->mu, NULL);
  for (; p->n_threads < n_threads; p->n_threads++) {
    if (pthread_create(&p->threads[p->n_threads], NULL, cq_thread, p) != 0) break;
  }
  if (p->n_threads == 0) {
    stk_set_detail("rpc: cannot start completion-queue threads");
    uv_close((uv_handle_t *)&p->async, on_async_closed); /* Frees p; cq stays the caller's. */
    return STK_EINTERNAL;
  }
  *ret_pump = p;
  return 0;
}

void rpc_pump_stop(struct rpc_pump *p, void (*closed)(void *arg), void *arg) {
  grpc_completion_queue_shutdown(p->cq);
  for (unsigned i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
  drain(p); /* Nothing should be left; run whatever is, in order. */
  grpc_completion_queue_destroy(p->cq);
  p->cq = NULL;
  p->closed = closed;
  p->closed_arg = arg;
  uv_close((uv_handle_t *)&p->async, on_async_closed);
}
