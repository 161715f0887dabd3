/*
 * dl_sched.c: see dl_sched.h. A job's entry lives while it has tasks
 * queued or running; jobs are few, so they are a list searched by name.
 */
#include "dl_sched.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stk_error.h"

struct sched_job;

struct sched_task {
  uv_work_t inner; /* What the pool runs; inner.data is this task. */
  uv_work_t *outer;
  uv_work_cb work;
  uv_after_work_cb done;
  struct dl_sched *sched;
  struct sched_job *job;
  _Atomic uint64_t started_ms; /* Set by the worker; 0 until it starts. */
  uint32_t slot;               /* In sched->live while handed to the pool. */
  struct sched_task *next;
};

struct sched_job {
  char *name;
  uint32_t running;
  struct sched_task *head, *tail; /* Waiting, in submission order. */
  struct sched_job *next;
};

struct dl_sched {
  uv_loop_t *loop;
  uint32_t workers;
  uint32_t running;
  uint64_t waiting;
  struct sched_job *jobs;   /* Jobs with work. */
  struct sched_job *cursor; /* The job served last: the next turn starts after it. */
  struct sched_task **live; /* Tasks handed to the pool, `workers` slots. */
};

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int dl_sched_new(uv_loop_t *loop, uint32_t workers, struct dl_sched **ret_sched) {
  struct dl_sched *s = calloc(1, sizeof(*s));
  if (!s) return STK_ENOMEM;
  s->loop = loop;
  s->workers = workers ? workers : 1;
  s->live = calloc(s->workers, sizeof(*s->live));
  if (!s->live) {
    free(s);
    return STK_ENOMEM;
  }
  *ret_sched = s;
  return 0;
}

void dl_sched_free(struct dl_sched *s) {
  if (!s) return;
  while (s->jobs) {
    struct sched_job *j = s->jobs;
    s->jobs = j->next;
    while (j->head) {
      struct sched_task *t = j->head;
      j->head = t->next;
      free(t);
    }
    free(j->name);
    free(j);
  }
  free(s->live);
  free(s);
}

static struct sched_job *job_get(struct dl_sched *s, const char *name) {
  for (struct sched_job *j = s->jobs; j; j = j->next)
    if (!strcmp(j->name, name)) return j;
  struct sched_job *j = calloc(1, sizeof(*j));
  if (!j || !(j->name = strdup(name))) {
    free(j);
    return NULL;
  }
  j->next = s->jobs;
  s->jobs = j;
  return j;
}

static void job_drop_if_idle(struct dl_sched *s, struct sched_job *j) {
  if (j->running || j->head) return;
  struct sched_job **p = &s->jobs;
  while (*p != j) p = &(*p)->next;
  *p = j->next;
  if (s->cursor == j) s->cursor = NULL;
  free(j->name);
  free(j);
}

static void task_work(uv_work_t *w) {
  struct sched_task *t = w->data;
  atomic_store(&t->started_ms, now_ms());
  t->work(t->outer);
}

static void dispatch(struct dl_sched *s);

static void task_done(uv_work_t *w, int status) {
  struct sched_task *t = w->data;
  struct dl_sched *s = t->sched;
  s->live[t->slot] = NULL;
  s->running--;
  t->job->running--;
  job_drop_if_idle(s, t->job);
  uv_work_t *outer = t->outer;
  uv_after_work_cb done = t->done;
  free(t);
  dispatch(s); /* Before done: a task done submits for the same job goes to the back. */
  done(outer, status);
}

static uint32_t jobs_with_work(const struct dl_sched *s) {
  uint32_t n = 0;
  for (const struct sched_job *j = s->jobs; j; j = j->next) n++;
  return n;
}

/* The next job in round-robin order (after the cursor) with a waiting task
 * and fewer than share running; NULL when none. */
static struct sched_job *next_job(struct dl_sched *s, uint32_t share) {
  struct sched_job *start = s->cursor && s->cursor->next ? s->cursor->next : s->jobs;
  struct sched_job *j = start;
  do {
    if (!j) j = s->jobs;
    if (!j) return NULL;
    if (j->head && j->running < share) return j;
    j = j->next ? j->next : s->jobs;
  } while (j != start);
  return NULL;
}

static void dispatch(struct dl_sched *s) {
  while (s->running < s->workers) {
    uint32_t active = jobs_with_work(s);
    uint32_t share = active ? (s->workers + active - 1) / active : s->workers;
    struct sched_job *j = next_job(s, share);
    if (!j) return;
    struct sched_task *t = j->head;
    j->head = t->next;
    if (!j->head) j->tail = NULL;
    s->waiting--;
    uint32_t slot = 0;
    while (s->live[slot]) slot++;
    t->slot = slot;
    s->live[slot] = t;
    s->running++;
    j->running++;
    s->cursor = j;
    int rc = uv_queue_work(s->loop, &t->inner, task_work, task_done);
    if (rc) { /* Not expected of libuv's pool; answered as the task's failure. */
      s->live[slot] = NULL;
      s->running--;
      j->running--;
      job_drop_if_idle(s, j);
      t->done(t->outer, rc);
      free(t);
    }
  }
}

int dl_sched_submit(struct dl_sched *s, const char *job, uv_work_t *req, uv_work_cb work,
                    uv_after_work_cb done) {
  struct sched_task *t = calloc(1, sizeof(*t));
  struct sched_job *j = t ? job_get(s, job ? job : "") : NULL;
  if (!j) {
    free(t);
    return STK_ENOMEM;
  }
  req->loop = s->loop;
  t->inner.data = t;
  t->outer = req;
  t->work = work;
  t->done = done;
  t->sched = s;
  t->job = j;
  if (j->tail)
    j->tail->next = t;
  else
    j->head = t;
  j->tail = t;
  s->waiting++;
  dispatch(s);
  return 0;
}

uint64_t dl_sched_waiting(const struct dl_sched *s) {
  return s->waiting;
}

bool dl_sched_stuck(const struct dl_sched *s, uint64_t stuck_ms) {
  if (s->waiting == 0 || s->running < s->workers) return false;
  uint64_t now = now_ms();
  for (uint32_t i = 0; i < s->workers; i++) {
    uint64_t started = s->live[i] ? atomic_load(&s->live[i]->started_ms) : 0;
    if (started == 0 || now - started < stuck_ms) return false;
  }
  return true;
}
