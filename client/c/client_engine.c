/*
 * client_engine: the client's engine for work that outlives the call that
 * started it (a checkpoint save handed back at once: stk_ckpt_save_async,
 * background staging). Such work is a job, a state machine the engine
 * advances one bounded step at a time (curl's multi handle over its easy
 * handles): one thread per client, started at the first job, steps every
 * job in turn, so jobs in flight share it instead of a thread each. A step
 * never waits on the network: a job whose stream cannot take a message yet,
 * or whose reply is not in, parks (CLIENT_STEP_WAIT), and the completion
 * that ends the wait wakes it (client_engine_wake, from the rpc client's
 * completion thread). The client owns every job it runs: client_engine_close
 * (stk_client_free) cancels the jobs not done, steps them to their end (a
 * cancelled job's next step ends it), runs their done callbacks and joins
 * the thread, so no job touches the client after it is freed. A blocking
 * call steps its machine on the caller's thread instead (curl_easy_perform
 * driving its own handle) and never comes here.
 *
 * Jobs know nothing of each other; this file calls only client_base.c and
 * the jobs' own ops.
 */
#include "client_internal.h"

#include <string.h>

enum job_where {
  JOB_NOWHERE, /* Not the engine's (before submit, after done). */
  JOB_QUEUED,  /* In the queue for its next step. */
  JOB_RUNNING, /* Its step runs on the engine's thread. */
  JOB_PARKED,  /* In the parked list until a wake. */
};

static void *engine_main(void *arg);

void client_engine_init(struct client_engine *e) {
  memset(e, 0, sizeof(*e));
  pthread_mutex_init(&e->mu, NULL);
  client_cond_init(&e->cv);
}

/* Under e->mu. */
static void enqueue(struct client_engine *e, struct client_job *j) {
  j->next = NULL;
  j->where = JOB_QUEUED;
  if (e->tail)
    e->tail->next = j;
  else
    e->head = j;
  e->tail = j;
  pthread_cond_broadcast(&e->cv);
}

int client_engine_submit(struct client_engine *e, struct client_job *j) {
  pthread_mutex_lock(&e->mu);
  int err = e->closing ? STK_ECANCELED : 0;
  if (!err && !e->started) {
    if (pthread_create(&e->thread, NULL, engine_main, e) == 0)
      e->started = true;
    else
      err = STK_ENOMEM;
  }
  if (!err) {
    j->woken = false;
    enqueue(e, j);
  }
  pthread_mutex_unlock(&e->mu);
  return err;
}

void client_engine_wake(struct client_engine *e, struct client_job *j) {
  pthread_mutex_lock(&e->mu);
  if (j->where == JOB_PARKED) {
    struct client_job **p = &e->parked;
    while (*p != j) p = &(*p)->next;
    *p = j->next;
    enqueue(e, j);
  } else if (j->where == JOB_RUNNING) {
    j->woken = true;
  }
  pthread_mutex_unlock(&e->mu);
}

void client_engine_close(struct client_engine *e) {
  pthread_mutex_lock(&e->mu);
  e->closing = true;
  for (struct client_job *j = e->head; j; j = j->next) j->ops->cancel(j);
  for (struct client_job *j = e->parked; j; j = j->next) j->ops->cancel(j);
  if (e->running) e->running->ops->cancel(e->running); /* Not freed while running. */
  pthread_cond_broadcast(&e->cv);
  bool started = e->started;
  pthread_mutex_unlock(&e->mu);
  if (started) pthread_join(e->thread, NULL);
  pthread_cond_destroy(&e->cv);
  pthread_mutex_destroy(&e->mu);
}

/* Under e->mu: the next job to step, or NULL once the engine closes with
 * no job left (parked ones are woken by their cancel). */
static struct client_job *take(struct client_engine *e) {
  while (!e->head && !(e->closing && !e->parked)) pthread_cond_wait(&e->cv, &e->mu);
  struct client_job *j = e->head;
  if (!j) return NULL;
  e->head = j->next;
  if (!e->head) e->tail = NULL;
  j->where = JOB_RUNNING;
  j->woken = false;
  e->running = j;
  return j;
}

/* Under e->mu, after j's step: back in the queue, parked, or out (then it
 * hears so outside the lock: done may free it, which is why it is no longer
 * `running`, the pointer close cancels through). */
static void after_step(struct client_engine *e, struct client_job *j, enum client_step st) {
  e->running = NULL;
  if (st == CLIENT_STEP_MORE || (st == CLIENT_STEP_WAIT && j->woken)) {
    enqueue(e, j);
  } else if (st == CLIENT_STEP_WAIT) {
    j->where = JOB_PARKED;
    j->next = e->parked;
    e->parked = j;
  } else {
    j->where = JOB_NOWHERE;
    pthread_mutex_unlock(&e->mu);
    j->ops->done(j);
    pthread_mutex_lock(&e->mu);
  }
}

/* Steps the jobs in turn until the engine closes with none left. */
static void *engine_main(void *arg) {
  struct client_engine *e = arg;
  (void)pthread_setname_np(pthread_self(), "stk-engine"); /* For ps, gdb and tests. */
  pthread_mutex_lock(&e->mu);
  for (struct client_job *j; (j = take(e));) {
    pthread_mutex_unlock(&e->mu);
    enum client_step st = j->ops->step(j);
    pthread_mutex_lock(&e->mu);
    after_step(e, j, st);
  }
  pthread_mutex_unlock(&e->mu);
  return NULL;
}
