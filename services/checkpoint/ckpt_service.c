/*
 * ckpt_service: lifecycle of the service (open, recovery, close), the
 * attempt table and its state machine (open -> committing -> done, or
 * aborting -> done), deferred writer events, the sweep timer that aborts
 * attempts whose ranks never finish (and removes shm segments nobody
 * will send), and Begin/Commit.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt_journal.h"
#include "ckpt_manifest.h"
#include "ckpt_service_int.h"
#include "stk_error.h"

#define MIB ((uint64_t)1 << 20)

/* Upload workers are background work: at this nice value the loop, the
 * gRPC threads answering ranks and the ranks themselves (the trainer's
 * threads on the same host) run first when the cores are short, e.g. the
 * moment held segment PUTs start while the last ranks still wait for
 * "staged". A worker still gets its share whenever the cores are busy
 * with anything else, and all of an idle machine. */
#define UPLOAD_NICE 10

int64_t svc_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void svc_probe(struct ckpt_service *s, const char *point) {
  if (s->o.probe) s->o.probe(s->o.probe_arg, point);
}

struct attempt *svc_find_attempt(struct ckpt_service *s, const char *id) {
  for (struct attempt *a = s->attempts; a; a = a->next)
    if (strcmp(a->id, id) == 0) return a;
  return NULL;
}

/* ---- Deferred events and recovered commit hooks ---- */

void svc_post_event(struct ckpt_service *s, struct ckpt_writer *w, enum ckpt_write_event ev,
                    int err, const char *msg) {
  struct wevent *e = calloc(1, sizeof(*e));
  if (!e) return;
  e->w = w;
  e->ev = ev;
  e->err = err;
  e->msg = msg ? strdup(msg) : NULL;
  if (s->events_tail)
    s->events_tail->next = e;
  else
    s->events = e;
  s->events_tail = e;
  uv_async_send(&s->events_async);
}

static void free_hooks(struct hook_call *h) {
  while (h) {
    struct hook_call *n = h->next;
    free(h->job);
    free(h->uri);
    free(h);
    h = n;
  }
}

static void fire_hooks(struct ckpt_service *s) {
  struct hook_call *list = s->pending_hooks;
  s->pending_hooks = NULL;
  for (struct hook_call *h = list; h; h = h->next)
    if (s->o.commit_hook && h->job && h->uri)
      s->o.commit_hook(s->o.commit_hook_arg, h->job, h->step, h->uri);
  free_hooks(list);
}

static void on_events(uv_async_t *h) {
  struct ckpt_service *s = h->data;
  fire_hooks(s);
  while (s->events) {
    struct wevent *e = s->events;
    s->events = e->next;
    if (!s->events) s->events_tail = NULL;
    e->w->on_event(e->w->arg, e->ev, e->err, e->msg ? e->msg : "");
    free(e->msg);
    free(e);
  }
}

/* Drops the events of a writer being closed. */
void svc_forget_writer(struct ckpt_service *s, struct ckpt_writer *w) {
  struct wevent **pp = &s->events, *last = NULL;
  while (*pp) {
    struct wevent *e = *pp;
    if (e->w == w) {
      *pp = e->next;
      free(e->msg);
      free(e);
    } else {
      last = e;
      pp = &e->next;
    }
  }
  s->events_tail = last;
}

/* ---- The attempt state machine ---- */

static void answer_waits(struct attempt *a) {
  struct commit_wait *w = a->waits;
  a->waits = NULL;
  Stoker__V1__CheckpointRef ref = STOKER__V1__CHECKPOINT_REF__INIT;
  ref.step = a->step;
  ref.uri = a->manifest_uri;
  ref.committed_at_ms = a->committed_at_ms;
  while (w) {
    struct commit_wait *n = w->next;
    if (a->result == 0)
      w->done(w->arg, 0, "", &ref.base);
    else
      w->done(w->arg, a->result, a->result_msg ? a->result_msg : stk_strerror(a->result), NULL);
    free(w);
    w = n;
  }
}

void svc_attempt_done(struct attempt *a, int result, const char *msg) {
  struct ckpt_service *s = a->svc;
  a->state = ATT_DONE;
  a->result = result;
  if (result != 0 && !a->result_msg) a->result_msg = strdup(msg ? msg : stk_strerror(result));
  a->done_at_ms = uv_now(s->loop);
  if (result == 0)
    s->stats.commits++;
  else
    s->stats.aborts++;
  staging_free_attempt(a);
  staging_sweep_segments(s); /* Segments a rank wrote but never sent. */
  answer_waits(a);
}

struct cleanup_job {
  struct ckpt_task t;
  struct attempt *a;
  int err;
};

static void cleanup_work(struct ckpt_task *t) {
  struct cleanup_job *j = (struct cleanup_job *)t;
  j->err = ckpt_abort_run(j->a->svc, j->a->id);
}

static void cleanup_after(struct ckpt_task *t) {
  struct cleanup_job *j = (struct cleanup_job *)t;
  struct attempt *a = j->a;
  a->jobs--;
  svc_attempt_done(a, a->result, a->result_msg);
  free(j);
}

/* Called whenever an aborting attempt may have no jobs left. */
void svc_check_abort(struct attempt *a) {
  if (a->state != ATT_ABORTING || a->jobs > 0 || a->cleanup_started) return;
  struct cleanup_job *j = calloc(1, sizeof(*j));
  if (!j) return;
  a->cleanup_started = true;
  j->t.work = cleanup_work;
  j->t.after = cleanup_after;
  j->a = a;
  a->jobs++;
  ckpt_pool_submit(a->svc->work, &j->t);
}

void svc_abort(struct attempt *a, int err, const char *msg) {
  if (a->state == ATT_DONE || a->state == ATT_ABORTING) return;
  struct ckpt_service *s = a->svc;
  a->state = ATT_ABORTING;
  a->result = err;
  free(a->result_msg);
  a->result_msg = strdup(msg && msg[0] ? msg : stk_strerror(err));
  staging_free_attempt(a); /* Unsent buffers; writers waiting on the budget. */
  for (uint32_t r = 0; r < a->world; r++) {
    struct ckpt_writer *w = a->ranks[r].writer;
    if (!w) continue;
    a->ranks[r].writer = NULL;
    w->att = NULL;
    svc_post_event(s, w, CKPT_WRITE_FAILED, err, a->result_msg);
  }
  svc_check_abort(a);
}

void svc_attempt_recovered(struct ckpt_service *s, const Stoker__V1__JournalAttempt *rec,
                           int result, const struct commit_result *cr) {
  struct attempt *a = calloc(1, sizeof(*a));
  if (!a || !(a->job = strdup(rec->job))) {
    free(a);
    return;
  }
  a->svc = s;
  snprintf(a->id, sizeof(a->id), "%s", rec->attempt);
  a->step = rec->step;
  a->state = ATT_DONE;
  a->done_at_ms = uv_now(s->loop);
  a->result = result;
  if (result) {
    a->result_msg =
        strdup("aborted by recovery: the attempt was incomplete when the service stopped");
  } else {
    a->committed_at_ms = cr->committed_at_ms;
    a->manifest_uri = ckpt_manifest_uri(s, cr->manifest_key);
    struct hook_call *h = calloc(1, sizeof(*h));
    if (h) {
      h->job = strdup(a->job);
      h->step = a->step;
      h->uri = a->manifest_uri ? strdup(a->manifest_uri) : NULL;
      h->next = s->pending_hooks;
      s->pending_hooks = h;
    }
  }
  a->next = s->attempts;
  s->attempts = a;
}

/* ---- Sweep: attempt timeouts, pruning, close ---- */

static void free_attempt(struct attempt *a) {
  struct commit_wait *w = a->waits;
  while (w) {
    struct commit_wait *n = w->next;
    w->done(w->arg, STK_EUNAVAIL, "the checkpoint service is closing", NULL);
    free(w);
    w = n;
  }
  staging_free_attempt(a);
  if (a->ranks) staging_drop_segments(a);
  free(a->ranks);
  free(a->job);
  free(a->result_msg);
  free(a->manifest_uri);
  free(a);
}

static void sweep(struct ckpt_service *s) {
  uint64_t now = uv_now(s->loop);
  if (now >= s->shm_swept_ms + 10000) {
    s->shm_swept_ms = now;
    staging_sweep_segments(s);
  }
  for (struct attempt **pp = &s->attempts; *pp;) {
    struct attempt *a = *pp;
    if (a->state == ATT_OPEN && now >= a->deadline_ms) {
      bool all = true;
      for (uint32_t r = 0; r < a->world; r++) all = all && a->ranks[r].last_fed;
      if (!all) {
        char msg[160];
        snprintf(msg, sizeof(msg), "attempt %s: not every rank finished within %u ms", a->id,
                 s->o.attempt_timeout_ms);
        svc_abort(a, STK_ETIMEDOUT, msg);
      }
    }
    if (a->state == ATT_DONE && now > a->done_at_ms + 600000) {
      *pp = a->next;
      free_attempt(a);
      continue;
    }
    pp = &a->next;
  }
  ckpt_orphans_tick(s);
}

static void closed_one(struct ckpt_service *s) {
  if (--s->handles_open > 0) return;
  while (s->attempts) {
    struct attempt *a = s->attempts;
    s->attempts = a->next;
    free_attempt(a);
  }
  while (s->events) {
    struct wevent *e = s->events;
    s->events = e->next;
    free(e->msg);
    free(e);
  }
  free_hooks(s->pending_hooks);
  ckpt_shm_close(s->shm);
  kv_close(s->kv);
  if (s->own_storage) storage_free(s->st);
  void (*done)(void *) = s->close_done;
  void *arg = s->close_arg;
  free(s->url);
  free(s->prefix);
  free(s);
  if (done) done(arg);
}

static void on_handle_closed(uv_handle_t *h) {
  closed_one(h->data);
}
static void pool_freed(void *arg) {
  closed_one(arg);
}

void svc_maybe_closed(struct ckpt_service *s) {
  if (!s->closing || s->finishing) return;
  if (ckpt_pool_pending(s->up) > 0 || ckpt_pool_pending(s->work) > 0 ||
      ckpt_pool_pending(s->read) > 0)
    return;
  s->finishing = true;
  uv_timer_stop(&s->sweep);
  s->handles_open = 6;
  uv_close((uv_handle_t *)&s->sweep, on_handle_closed);
  uv_close((uv_handle_t *)&s->hold_timer, on_handle_closed);
  uv_close((uv_handle_t *)&s->events_async, on_handle_closed);
  ckpt_pool_free(s->up, pool_freed, s);
  ckpt_pool_free(s->work, pool_freed, s);
  ckpt_pool_free(s->read, pool_freed, s);
}

static void on_sweep(uv_timer_t *t) {
  struct ckpt_service *s = t->data;
  if (s->closing)
    svc_maybe_closed(s);
  else
    sweep(s);
}

/* ---- Open and close ---- */

static int opts_resolve(const struct ckpt_service_opts *in, struct ckpt_service_opts *o) {
  *o = *in;
  if (!o->db_dir || (!o->storage_url && !o->storage)) {
    stk_set_detail("db_dir and storage_url are required");
    return STK_EINVAL;
  }
  if (!o->key_prefix) o->key_prefix = "";
  if (!o->staging_budget_bytes) o->staging_budget_bytes = (uint64_t)1 << 30;
  if (!o->upload_concurrency) o->upload_concurrency = 8;
  if (!o->part_bytes) o->part_bytes = 16 * MIB;
  if (!o->max_parts || o->max_parts > STORAGE_PART_MAX) o->max_parts = STORAGE_PART_MAX;
  if (!o->attempt_timeout_ms) o->attempt_timeout_ms = 600000;
  if (!o->read_piece_bytes) o->read_piece_bytes = 4 * MIB;
  if (!o->read_concurrency) o->read_concurrency = 8;
  if (o->part_bytes < 5 * MIB || o->part_bytes % MIB != 0 || o->part_bytes > ((uint64_t)5 << 30)) {
    stk_set_detail("part size must be a multiple of 1 MiB between 5 MiB and 5 GiB");
    return STK_EINVAL;
  }
  if (o->upload_concurrency > 256 || o->read_concurrency > 256) {
    stk_set_detail("upload or read concurrency above 256");
    return STK_EINVAL;
  }
  if (o->shm_pool_bytes > o->staging_budget_bytes) o->shm_pool_bytes = o->staging_budget_bytes;
  return ckpt_name_check_prefix(o->key_prefix);
}

static int open_parts(uv_loop_t *loop, struct ckpt_service *s) {
  struct kv_opts ko = {.create_if_missing = true};
  int err = kv_open(s->o.db_dir, &ko, &s->kv);
  if (err) return err;
  if (s->o.storage) {
    s->st = s->o.storage;
  } else {
    err = storage_open_with(s->o.storage_url, s->o.s3, &s->st);
    if (err) return err;
    s->own_storage = true;
  }
  err = ckpt_pool_new(loop, s->o.upload_concurrency, UPLOAD_NICE, &s->up);
  if (!err) err = ckpt_pool_new(loop, 2, 0, &s->work);
  if (!err) err = ckpt_pool_new(loop, s->o.read_concurrency, 0, &s->read);
  if (!err && s->o.shm_dir && s->o.shm_dir[0]) {
    uint64_t max = (uint64_t)s->o.max_parts * s->o.part_bytes;
    if (max > s->o.staging_budget_bytes) max = s->o.staging_budget_bytes;
    err = ckpt_shm_open(s->o.shm_dir, max, s->o.shm_pool_bytes, &s->shm);
  }
  return err;
}

static void open_fail(struct ckpt_service *s) {
  ckpt_shm_close(s->shm);
  ckpt_pool_free(s->up, NULL, NULL);
  ckpt_pool_free(s->work, NULL, NULL);
  ckpt_pool_free(s->read, NULL, NULL);
  if (s->own_storage) storage_free(s->st);
  kv_close(s->kv);
  free(s->url);
  free(s->prefix);
  free(s);
}

int ckpt_service_open(uv_loop_t *loop, const struct ckpt_service_opts *opts,
                      struct ckpt_service **ret_service) {
  struct ckpt_service *s = calloc(1, sizeof(*s));
  if (!s) return STK_ENOMEM;
  int err = opts_resolve(opts, &s->o);
  if (err) {
    free(s);
    return err;
  }
  s->loop = loop;
  s->url = strdup(s->o.storage_url ? s->o.storage_url : "");
  s->prefix = strdup(s->o.key_prefix);
  s->o.storage_url = s->url;
  s->o.key_prefix = s->prefix;
  err = (!s->url || !s->prefix) ? STK_ENOMEM : open_parts(loop, s);
  s->o.s3 = NULL; /* Read by the open only (the store copied it). */
  if (!err) err = ckpt_recover(s);
  if (err) {
    open_fail(s);
    return err;
  }
  ckpt_orphans_open(s);
  uv_timer_init(loop, &s->sweep);
  s->sweep.data = s;
  uv_timer_init(loop, &s->hold_timer);
  s->hold_timer.data = s;
  uv_async_init(loop, &s->events_async, on_events);
  s->events_async.data = s;
  uint64_t period = s->o.attempt_timeout_ms / 4;
  period = period < 20 ? 20 : (period > 1000 ? 1000 : period);
  uv_timer_start(&s->sweep, on_sweep, period, period);
  if (s->pending_hooks) uv_async_send(&s->events_async);
  *ret_service = s;
  return 0;
}

void ckpt_service_close(struct ckpt_service *s, void (*done)(void *arg), void *arg) {
  s->closing = true;
  s->close_done = done;
  s->close_arg = arg;
  /* Writers waiting for memory will not get it. */
  while (s->wait_head) {
    struct ckpt_writer *w = s->wait_head;
    s->wait_head = w->next_wait;
    w->waiting = false;
    svc_post_event(s, w, CKPT_WRITE_FAILED, STK_EUNAVAIL, "the checkpoint service is closing");
  }
  s->wait_tail = NULL;
  uv_timer_start(&s->sweep, on_sweep, 0, 5);
}

void ckpt_service_get_stats(const struct ckpt_service *s, struct ckpt_service_stats *ret_stats) {
  *ret_stats = s->stats;
  ret_stats->staged_bytes = s->staged;
}

void ckpt_staging_info(const struct ckpt_service *s, Stoker__V1__StagingInfo *ret) {
  stoker__v1__staging_info__init(ret);
  if (!s->shm || s->closing) return;
  ret->shm_dir = (char *)ckpt_shm_dir(s->shm);
  ret->shm_token = (char *)ckpt_shm_token(s->shm);
  ret->shm_max_bytes = ckpt_shm_max_bytes(s->shm);
}

/* Fails a call that takes a ckpt_done_fn from a later loop callback. */
struct late_fail {
  uv_timer_t t;
  struct attempt *a; /* Answer with its reference instead (err 0). */
  ckpt_done_fn done;
  void *arg;
  int err;
  char msg[256];
};

static void late_fail_closed(uv_handle_t *h) {
  free(h->data);
}

static void late_fail_fire(uv_timer_t *t) {
  struct late_fail *f = t->data;
  if (f->a) {
    Stoker__V1__CheckpointRef ref = STOKER__V1__CHECKPOINT_REF__INIT;
    ref.step = f->a->step;
    ref.uri = f->a->manifest_uri;
    ref.committed_at_ms = f->a->committed_at_ms;
    f->done(f->arg, 0, "", &ref.base);
  } else {
    f->done(f->arg, f->err, f->msg, NULL);
  }
  uv_close((uv_handle_t *)t, late_fail_closed);
}

static void later(struct ckpt_service *s, struct attempt *a, ckpt_done_fn done, void *arg, int err,
                  const char *msg) {
  struct late_fail *f = calloc(1, sizeof(*f));
  if (!f) return;
  f->a = a;
  f->done = done;
  f->arg = arg;
  f->err = err;
  snprintf(f->msg, sizeof(f->msg), "%s", msg && msg[0] ? msg : stk_strerror(err));
  uv_timer_init(s->loop, &f->t);
  f->t.data = f;
  uv_timer_start(&f->t, late_fail_fire, 0, 0);
}

void svc_fail_later(struct ckpt_service *s, ckpt_done_fn done, void *arg, int err,
                    const char *msg) {
  later(s, NULL, done, arg, err, msg);
}

static void svc_ref_later(struct ckpt_service *s, struct attempt *a, ckpt_done_fn done, void *arg) {
  later(s, a, done, arg, 0, "");
}

/* ---- Begin ---- */

struct begin_job {
  struct ckpt_task t;
  struct ckpt_service *s;
  Stoker__V1__JournalAttempt rec;
  char job[CKPT_JOB_MAX_BYTES + 1];
  char id[CKPT_ATTEMPT_MAX_BYTES + 1];
  ckpt_done_fn done;
  void *arg;
  int err;
  char msg[256];
};

static void begin_work(struct ckpt_task *t) {
  struct begin_job *j = (struct begin_job *)t;
  struct ckpt_jkey k;
  ckpt_jkey_step(&k, 'C', j->job, j->rec.step);
  void *v;
  size_t len;
  j->err = kv_get(j->s->kv, NULL, k.b, k.len, &v, &len);
  if (j->err == 0) {
    free(v);
    j->err = STK_EEXIST;
    snprintf(j->msg, sizeof(j->msg), "step %lld of job %s is already committed",
             (long long)j->rec.step, j->job);
    return;
  }
  if (j->err == STK_ENOENT) j->err = ckpt_attempt_generate(j->id);
  if (j->err) return;
  j->rec.attempt = j->id;
  ckpt_jkey_attempt(&k, j->id);
  j->err = ckpt_journal_put(j->s->kv, &k, &j->rec.base, true);
  if (j->err) snprintf(j->msg, sizeof(j->msg), "journal: %s", stk_detail());
}

static struct attempt *attempt_new(struct ckpt_service *s, const struct begin_job *j) {
  struct attempt *a = calloc(1, sizeof(*a));
  if (!a) return NULL;
  a->ranks = calloc(j->rec.world, sizeof(*a->ranks));
  a->job = strdup(j->job);
  if (!a->ranks || !a->job) {
    free(a->ranks);
    free(a->job);
    free(a);
    return NULL;
  }
  a->svc = s;
  snprintf(a->id, sizeof(a->id), "%s", j->id);
  a->step = j->rec.step;
  a->world = j->rec.world;
  a->created_at_ms = j->rec.created_at_ms;
  a->deadline_ms = uv_now(s->loop) + s->o.attempt_timeout_ms;
  a->state = ATT_OPEN;
  a->next = s->attempts;
  s->attempts = a;
  return a;
}

static void begin_after(struct ckpt_task *t) {
  struct begin_job *j = (struct begin_job *)t;
  struct ckpt_service *s = j->s;
  if (j->err == 0 && !attempt_new(s, j)) j->err = STK_ENOMEM;
  if (j->err) {
    j->done(j->arg, j->err, j->msg[0] ? j->msg : stk_strerror(j->err), NULL);
  } else {
    Stoker__V1__BeginResponse resp = STOKER__V1__BEGIN_RESPONSE__INIT;
    resp.attempt = j->id;
    j->done(j->arg, 0, "", &resp.base);
  }
  free(j);
}

void ckpt_begin(struct ckpt_service *s, const Stoker__V1__BeginRequest *req, ckpt_done_fn done,
                void *arg) {
  if (s->closing) FAIL_LATER(s, done, arg, STK_EUNAVAIL, "closing");
  int err = ckpt_name_check_job(req->job);
  if (!err) err = ckpt_name_check_step(req->step);
  if (!err && (req->world == 0 || req->world > CKPT_MANIFEST_MAX_WORLD)) {
    stk_set_detail("world %u outside 1..%u", req->world, CKPT_MANIFEST_MAX_WORLD);
    err = STK_EINVAL;
  }
  if (err) FAIL_LATER(s, done, arg, err, stk_detail());
  struct begin_job *j = calloc(1, sizeof(*j));
  if (!j) FAIL_LATER(s, done, arg, STK_ENOMEM, "");
  j->t.work = begin_work;
  j->t.after = begin_after;
  j->s = s;
  j->done = done;
  j->arg = arg;
  snprintf(j->job, sizeof(j->job), "%s", req->job);
  stoker__v1__journal_attempt__init(&j->rec);
  j->rec.job = j->job;
  j->rec.step = req->step;
  j->rec.world = req->world;
  j->rec.created_at_ms = svc_now_ms();
  ckpt_pool_submit(s->work, &j->t);
}

/* ---- Commit (waiting for the outcome) ---- */

void ckpt_commit(struct ckpt_service *s, const Stoker__V1__CommitCheckpointRequest *req,
                 ckpt_done_fn done, void *arg) {
  if (s->closing) FAIL_LATER(s, done, arg, STK_EUNAVAIL, "closing");
  struct attempt *a = req->attempt ? svc_find_attempt(s, req->attempt) : NULL;
  if (!a) FAIL_LATER(s, done, arg, STK_ENOENT, "unknown attempt");
  struct commit_wait *w = calloc(1, sizeof(*w));
  if (!w) FAIL_LATER(s, done, arg, STK_ENOMEM, "");
  w->done = done;
  w->arg = arg;
  w->next = a->waits;
  a->waits = w;
  if (a->state == ATT_DONE) {
    /* Answer from a loop callback: park on a zero timer via the events path. */
    a->waits = w->next;
    if (a->result)
      svc_fail_later(s, done, arg, a->result, a->result_msg);
    else
      svc_ref_later(s, a, done, arg);
    free(w);
  }
}
