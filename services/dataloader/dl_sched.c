/*
 * dl_sched.c: see dl_sched.h. A tenant's entry lives while it has tasks
 * queued or running, and so does each of its jobs'; they are few, so they
 * are lists searched by name.
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

/* A ring of named entries with work, served round-robin after a cursor:
 * the tenants of the scheduler, and the jobs of each tenant. */
struct sched_ring {
  struct sched_entry *first;
  struct sched_entry *cursor; /* The entry served last: the next turn starts after it. */
};

struct sched_entry {
  char *name;
  uint32_t running;
  struct sched_entry *next;
};

struct sched_tenant {
  struct sched_entry e; /* First: a ring entry is its tenant. */
  struct sched_ring jobs;
};

struct sched_job {
  struct sched_entry e; /* First: a ring entry is its job. */
  struct sched_tenant *tenant;
  struct sched_task *head, *tail; /* Waiting, in submission order. */
};

struct dl_sched {
  uv_loop_t *loop;
  uint32_t workers;
  uint32_t running;
  uint64_t waiting;
  struct sched_ring tenants;
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
  while (s->tenants.first) {
    struct sched_tenant *t = (struct sched_tenant *)s->tenants.first;
    s->tenants.first = t->e.next;
    while (t->jobs.first) {
      struct sched_job *j = (struct sched_job *)t->jobs.first;
      t->jobs.first = j->e.next;
      while (j->head) {
        struct sched_task *k = j->head;
        j->head = k->next;
        free(k);
      }
      free(j->e.name);
      free(j);
    }
    free(t->e.name);
    free(t);
  }
  free(s->live);
  free(s);
}

/* ---- Rings ---- */

static struct sched_entry *ring_find(const struct sched_ring *r, const char *name) {
  for (struct sched_entry *e = r->first; e; e = e->next)
    if (!strcmp(e->name, name)) return e;
  return NULL;
}

/* A new entry of size bytes (its struct, entry first) named name. */
static struct sched_entry *ring_add(struct sched_ring *r, const char *name, size_t size) {
  struct sched_entry *e = calloc(1, size);
  if (!e || !(e->name = strdup(name))) {
    free(e);
    return NULL;
  }
  e->next = r->first;
  r->first = e;
  return e;
}

static void ring_remove(struct sched_ring *r, struct sched_entry *e) {
  struct sched_entry **p = &r->first;
  while (*p != e) p = &(*p)->next;
  *p = e->next;
  if (r->cursor == e) r->cursor = NULL;
  free(e->name);
  free(e);
}

static uint32_t ring_count(const struct sched_ring *r) {
  uint32_t n = 0;
  for (const struct sched_entry *e = r->first; e; e = e->next) n++;
  return n;
}

static uint32_t share_of(uint32_t workers, uint32_t n) {
  return n ? (workers + n - 1) / n : workers;
}

/* ---- Entries ---- */

static struct sched_job *job_get(struct dl_sched *s, const char *tenant, const char *name) {
  struct sched_tenant *t = (struct sched_tenant *)ring_find(&s->tenants, tenant);
  if (!t && !(t = (struct sched_tenant *)ring_add(&s->tenants, tenant, sizeof(*t)))) return NULL;
  struct sched_job *j = (struct sched_job *)ring_find(&t->jobs, name);
  if (!j && (j = (struct sched_job *)ring_add(&t->jobs, name, sizeof(*j)))) j->tenant = t;
  if (!j && !t->jobs.first) ring_remove(&s->tenants, &t->e);
  return j;
}

static void job_drop_if_idle(struct dl_sched *s, struct sched_job *j) {
  if (j->e.running || j->head) return;
  struct sched_tenant *t = j->tenant;
  ring_remove(&t->jobs, &j->e);
  if (!t->jobs.first) ring_remove(&s->tenants, &t->e);
}

/* The tenant's next job in round-robin order with a waiting task and
 * fewer than its share of the tenant's workers running; NULL when none. */
static struct sched_job *next_job(struct sched_tenant *t, uint32_t tenant_share) {
  uint32_t share = share_of(tenant_share, ring_count(&t->jobs));
  struct sched_entry *start =
      t->jobs.cursor && t->jobs.cursor->next ? t->jobs.cursor->next : t->jobs.first;
  struct sched_entry *e = start;
  do {
    struct sched_job *j = (struct sched_job *)e;
    if (j->head && j->e.running < share) return j;
    e = e->next ? e->next : t->jobs.first;
  } while (e != start);
  return NULL;
}

/* The next job to run: from the next tenant in round-robin order below its
 * share that has a job below its own; NULL when none. */
static struct sched_job *next(struct dl_sched *s) {
  if (!s->tenants.first) return NULL;
  uint32_t share = share_of(s->workers, ring_count(&s->tenants));
  struct sched_entry *start =
      s->tenants.cursor && s->tenants.cursor->next ? s->tenants.cursor->next : s->tenants.first;
  struct sched_entry *e = start;
  do {
    struct sched_tenant *t = (struct sched_tenant *)e;
    struct sched_job *j = t->e.running < share ? next_job(t, share) : NULL;
    if (j) return j;
    e = e->next ? e->next : s->tenants.first;
  } while (e != start);
  return NULL;
}

/* ---- Running ---- */

static void task_work(uv_work_t *w) {
  struct sched_task *t = w->data;
  atomic_store(&t->started_ms, now_ms());
  t->work(t->outer);
}

static void dispatch(struct dl_sched *s);

static void account(struct dl_sched *s, struct sched_job *j, int delta) {
  s->running += (uint32_t)delta;
  j->e.running += (uint32_t)delta;
  j->tenant->e.running += (uint32_t)delta;
}

static void task_done(uv_work_t *w, int status) {
  struct sched_task *t = w->data;
  struct dl_sched *s = t->sched;
  s->live[t->slot] = NULL;
  account(s, t->job, -1);
  job_drop_if_idle(s, t->job);
  uv_work_t *outer = t->outer;
  uv_after_work_cb done = t->done;
  free(t);
  dispatch(s); /* Before done: a task done submits for the same job goes to the back. */
  done(outer, status);
}

static void dispatch(struct dl_sched *s) {
  struct sched_job *j;
  while (s->running < s->workers && (j = next(s))) {
    struct sched_task *t = j->head;
    j->head = t->next;
    if (!j->head) j->tail = NULL;
    s->waiting--;
    uint32_t slot = 0;
    while (s->live[slot]) slot++;
    t->slot = slot;
    s->live[slot] = t;
    account(s, j, 1);
    j->tenant->jobs.cursor = &j->e;
    s->tenants.cursor = &j->tenant->e;
    int rc = uv_queue_work(s->loop, &t->inner, task_work, task_done);
    if (rc) { /* Not expected of libuv's pool; answered as the task's failure. */
      s->live[slot] = NULL;
      account(s, j, -1);
      job_drop_if_idle(s, j);
      t->done(t->outer, rc);
      free(t);
    }
  }
}

int dl_sched_submit(struct dl_sched *s, const char *tenant, const char *job, uv_work_t *req,
                    uv_work_cb work, uv_after_work_cb done) {
  struct sched_task *t = calloc(1, sizeof(*t));
  struct sched_job *j = t ? job_get(s, tenant ? tenant : "", job ? job : "") : NULL;
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
