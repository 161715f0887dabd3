/*
 * ckpt_pool: worker threads with a locked FIFO of tasks in and a locked list
 * of finished tasks out, drained by a uv_async on the loop (sends coalesce,
 * so each wake-up drains the whole list). A parked task is in no list
 * until ckpt_pool_resume puts it in the FIFO of resumed tasks, which
 * workers take before new ones; new ones start only while fewer than
 * max_out tasks are out (running or parked).
 */
#include "ckpt_pool.h"

#include <stdbool.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include "stk_error.h"

/* Set by ckpt_pool_park during a task's work; read by its worker after. */
static _Thread_local bool parked;

struct ckpt_pool {
  uv_loop_t *loop;
  uv_async_t async;
  uv_mutex_t mu;
  uv_cond_t cv;
  struct ckpt_task *head, *tail;   /* Queued, not started. */
  struct ckpt_task *rhead, *rtail; /* Resumed: started, to run again (before new ones). */
  unsigned out, max_out;           /* Tasks started and not finished (running or parked). */
  struct ckpt_task *done;          /* Finished, after not run (LIFO, reversed when drained). */
  bool stopping;
  unsigned n_threads;
  int nice; /* Added to each worker's nice value. */
  uv_thread_t *threads;
  size_t pending; /* Loop thread only. */
  void (*closed)(void *arg);
  void *closed_arg;
};

static struct ckpt_task *take(struct ckpt_pool *p);

static void worker(void *arg) {
  struct ckpt_pool *p = arg;
  if (p->nice) setpriority(PRIO_PROCESS, (id_t)gettid(), getpriority(PRIO_PROCESS, 0) + p->nice);
  for (;;) {
    uv_mutex_lock(&p->mu);
    struct ckpt_task *t;
    while (!(t = take(p)) && !p->stopping) uv_cond_wait(&p->cv, &p->mu);
    uv_mutex_unlock(&p->mu);
    if (!t) return;
    parked = false;
    t->work(t);
    if (parked) continue; /* t belongs to its asynchronous call now. */
    uv_mutex_lock(&p->mu);
    p->out--;
    uv_cond_signal(&p->cv); /* A slot for a queued task. */
    t->next = p->done;
    p->done = t;
    uv_mutex_unlock(&p->mu);
    uv_async_send(&p->async);
  }
}

/* The next task to run: a resumed one, else a queued one if a slot is
 * free; NULL if none. Under the lock. */
static struct ckpt_task *take(struct ckpt_pool *p) {
  struct ckpt_task *t = p->rhead;
  if (t) {
    p->rhead = t->next;
    if (!p->rhead) p->rtail = NULL;
    return t;
  }
  t = p->head;
  if (!t || p->out >= p->max_out) return NULL;
  p->head = t->next;
  if (!p->head) p->tail = NULL;
  p->out++;
  return t;
}

/* Runs the afters of every finished task, oldest first. */
static void drain(struct ckpt_pool *p) {
  for (;;) {
    uv_mutex_lock(&p->mu);
    struct ckpt_task *list = p->done, *rev = NULL;
    p->done = NULL;
    uv_mutex_unlock(&p->mu);
    if (!list) return;
    while (list) {
      struct ckpt_task *n = list->next;
      list->next = rev;
      rev = list;
      list = n;
    }
    while (rev) {
      struct ckpt_task *n = rev->next;
      p->pending--;
      rev->after(rev);
      rev = n;
    }
  }
}

static void on_async(uv_async_t *a) {
  drain(a->data);
}

int ckpt_pool_new(uv_loop_t *loop, unsigned threads, int nice, struct ckpt_pool **ret_pool) {
  if (threads == 0) return STK_EINVAL;
  struct ckpt_pool *p = calloc(1, sizeof(*p));
  if (!p) return STK_ENOMEM;
  p->threads = calloc(threads, sizeof(*p->threads));
  if (!p->threads || uv_mutex_init(&p->mu) != 0) {
    free(p->threads);
    free(p);
    return STK_ENOMEM;
  }
  uv_cond_init(&p->cv);
  p->loop = loop;
  p->nice = nice;
  p->max_out = threads;
  if (uv_async_init(loop, &p->async, on_async) != 0) {
    uv_cond_destroy(&p->cv);
    uv_mutex_destroy(&p->mu);
    free(p->threads);
    free(p);
    return STK_EIO;
  }
  p->async.data = p;
  for (; p->n_threads < threads; p->n_threads++)
    if (uv_thread_create(&p->threads[p->n_threads], worker, p) != 0) break;
  if (p->n_threads == 0) {
    ckpt_pool_free(p, NULL, NULL);
    return STK_EIO;
  }
  *ret_pool = p;
  return 0;
}

void ckpt_pool_set_limit(struct ckpt_pool *p, unsigned max_out) {
  uv_mutex_lock(&p->mu);
  p->max_out = max_out ? max_out : 1;
  uv_mutex_unlock(&p->mu);
}

void ckpt_pool_submit(struct ckpt_pool *p, struct ckpt_task *t) {
  t->next = NULL;
  p->pending++;
  uv_mutex_lock(&p->mu);
  if (p->tail)
    p->tail->next = t;
  else
    p->head = t;
  p->tail = t;
  uv_cond_signal(&p->cv);
  uv_mutex_unlock(&p->mu);
}

void ckpt_pool_park(void) {
  parked = true;
}

void ckpt_pool_resume(struct ckpt_pool *p, struct ckpt_task *t) {
  t->next = NULL;
  uv_mutex_lock(&p->mu);
  if (p->rtail)
    p->rtail->next = t;
  else
    p->rhead = t;
  p->rtail = t;
  uv_cond_signal(&p->cv);
  uv_mutex_unlock(&p->mu);
}

size_t ckpt_pool_pending(const struct ckpt_pool *p) {
  return p->pending;
}

static void on_closed(uv_handle_t *h) {
  struct ckpt_pool *p = h->data;
  void (*closed)(void *) = p->closed;
  void *arg = p->closed_arg;
  uv_cond_destroy(&p->cv);
  uv_mutex_destroy(&p->mu);
  free(p->threads);
  free(p);
  if (closed) closed(arg);
}

void ckpt_pool_free(struct ckpt_pool *p, void (*done)(void *arg), void *arg) {
  if (!p) {
    if (done) done(arg);
    return;
  }
  /* Tasks submitted by afters while draining are run too: keep going until
   * nothing is pending. Workers are alive until stopping is set. */
  while (p->pending > 0) {
    uv_mutex_lock(&p->mu);
    bool idle = p->done == NULL;
    uv_mutex_unlock(&p->mu);
    if (idle) uv_sleep(1);
    drain(p);
  }
  uv_mutex_lock(&p->mu);
  p->stopping = true;
  uv_cond_broadcast(&p->cv);
  uv_mutex_unlock(&p->mu);
  for (unsigned i = 0; i < p->n_threads; i++) uv_thread_join(&p->threads[i]);
  p->closed = done;
  p->closed_arg = arg;
  uv_close((uv_handle_t *)&p->async, on_closed);
}
