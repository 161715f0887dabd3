/*
 * ckpt_service: lifecycle of the service (open, recovery, close), the
 * sweep timer (it drives the attempt timeouts of ckpt_attempt.c, the
 * orphan-upload GC of ckpt_orphans.c and the orphaned-attempt sweep of
 * ckpt_orphan_attempts.c) and the Begin and Commit calls. The
 * attempt itself (table, state machine, abort, cleanup) is ckpt_attempt.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_crc.h"
#include "ckpt_fetch.h"
#include "ckpt_journal.h"
#include "ckpt_manifest.h"
#include "ckpt_mcache.h"
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

/* Manifests held for restores (ckpt_mcache.c): a restore's ranks read
 * within seconds of each other; a large model's manifest is a few MiB. */
#define MCACHE_BYTES  (64 * MIB)
#define MCACHE_TTL_MS 60000

static int manifest_make(const uint8_t *buf, size_t len, void **ret_value, size_t *ret_bytes);
static void manifest_drop(void *value);

static void on_events(uv_async_t *h) {
  ckpt__svc_deliver_events(h->data);
}

/* ---- Sweep: attempt timeouts, pruning, close ---- */

static void sweep(struct ckpt_service *s) {
  ckpt__attempt_sweep(s);
  ckpt_read_retry(s);
  ckpt_orphans_tick(s);
  ckpt_orphan_attempts_tick(s);
}

static void closed_one(struct ckpt_service *s) {
  if (--s->handles_open > 0) return;
  ckpt__attempt_free_all(s);
  ckpt_gc_orphan_dirs_free(s);
  ckpt__svc_drop_events(s);
  ckpt__svc_free_hooks(s->pending_hooks);
  ckpt_shm_close(s->shm);
  ckpt_mcache_free(s->mcache);
  ckpt_fetches_free(s->fetches);
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

static void svc_maybe_closed(struct ckpt_service *s) {
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
  if (!o->attempt_idle_timeout_ms) o->attempt_idle_timeout_ms = 120000;
  if (!o->max_open_attempts) o->max_open_attempts = 16;
  if (!o->max_open_attempts_per_job) o->max_open_attempts_per_job = 4;
  if (o->max_open_attempts_per_job > o->max_open_attempts)
    o->max_open_attempts_per_job = o->max_open_attempts;
  if (!o->read_piece_bytes) o->read_piece_bytes = 4 * MIB;
  if (!o->read_concurrency) o->read_concurrency = 8;
  if (!o->read_batch_bytes) o->read_batch_bytes = 64 * MIB;
  if (!o->read_budget_bytes) o->read_budget_bytes = 1024 * MIB;
  if (!o->read_budget_per_job_bytes) o->read_budget_per_job_bytes = 256 * MIB;
  if (!o->read_loop_plan_chunks) o->read_loop_plan_chunks = 4096;
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

static unsigned pool_threads(const struct ckpt_service *s, unsigned concurrency);

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
  err = ckpt_pool_new(loop, pool_threads(s, s->o.upload_concurrency), UPLOAD_NICE, &s->up);
  if (!err) err = ckpt_pool_new(loop, 2, 0, &s->work);
  if (!err) err = ckpt_pool_new(loop, pool_threads(s, s->o.read_concurrency), 0, &s->read);
  if (!err) {
    ckpt_pool_set_limit(s->up, s->o.upload_concurrency);
    ckpt_pool_set_limit(s->read, s->o.read_concurrency);
  }
  if (!err)
    err = ckpt_mcache_new(MCACHE_BYTES, MCACHE_TTL_MS, manifest_make, manifest_drop, &s->mcache);
  if (!err) err = ckpt_fetches_new(CKPT_CRC_BLOCK_BYTES, &s->fetches);
  if (!err && s->o.shm_dir && s->o.shm_dir[0]) {
    uint64_t max = (uint64_t)s->o.max_parts * s->o.part_bytes;
    if (max > s->o.staging_budget_bytes) max = s->o.staging_budget_bytes;
    err = ckpt_shm_open(s->o.shm_dir, max, s->o.shm_pool_bytes, &s->shm);
  }
  return err;
}

/* Threads for a pool of `concurrency` storage requests in flight: one per
 * request where the store does the I/O in the submitting thread
 * (file://); else only the CRCs and copies run there (the S3 engine has
 * the requests), and the cores bound them. */
static unsigned pool_threads(const struct ckpt_service *s, unsigned concurrency) {
  if (storage_caps(s->st)->completes_inline) return concurrency;
  unsigned cores = uv_available_parallelism();
  if (cores < 2) cores = 2;
  return concurrency < cores ? concurrency : cores;
}

static void open_fail(struct ckpt_service *s) {
  ckpt_shm_close(s->shm);
  ckpt_pool_free(s->up, NULL, NULL);
  ckpt_pool_free(s->work, NULL, NULL);
  ckpt_pool_free(s->read, NULL, NULL);
  ckpt_mcache_free(s->mcache);
  ckpt_fetches_free(s->fetches);
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
  uint64_t period = s->o.attempt_timeout_ms < s->o.attempt_idle_timeout_ms
                        ? s->o.attempt_timeout_ms / 4
                        : s->o.attempt_idle_timeout_ms / 4;
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
    ckpt__svc_post_event(s, w, CKPT_WRITE_FAILED, STK_EUNAVAIL,
                         "the checkpoint service is closing");
  }
  s->wait_tail = NULL;
  uv_timer_start(&s->sweep, on_sweep, 0, 5);
}

void ckpt_service_get_stats(const struct ckpt_service *s, struct ckpt_service_stats *ret_stats) {
  *ret_stats = s->stats;
  ret_stats->staged_bytes = s->staged;
  ret_stats->read_reserved_bytes = s->read_reserved;
  struct ckpt_fetch_counts fc;
  ckpt_fetches_get_counts(s->fetches, &fc);
  ret_stats->read_gets = fc.gets;
  ret_stats->read_gets_shared = fc.shared;
  ret_stats->read_fetched_bytes = fc.held_bytes;
}

const char *ckpt_service_attempt_job(const struct ckpt_service *s, const char *attempt) {
  for (const struct attempt *a = s->attempts; a; a = a->next)
    if (strcmp(a->id, attempt) == 0) return a->job;
  return NULL;
}

size_t ckpt_service_attempt_staging(const struct ckpt_service *s, struct ckpt_attempt_staging *ret,
                                    size_t cap) {
  size_t n = 0;
  for (const struct attempt *a = s->attempts; a; a = a->next, n++)
    if (n < cap)
      ret[n] = (struct ckpt_attempt_staging){
          .job = a->job, .staged_bytes = a->staged_bytes, .open = a->state != ATT_DONE};
  return n;
}

void ckpt_staging_info(const struct ckpt_service *s, Stoker__V1__StagingInfo *ret) {
  stoker__v1__staging_info__init(ret);
  if (!s->shm || s->closing) return;
  ret->shm_dir = (char *)ckpt_shm_dir(s->shm);
  ret->shm_token = (char *)ckpt_shm_token(s->shm);
  ret->shm_max_bytes = ckpt_shm_max_bytes(s->shm);
  ret->shm_read_max_bytes = ckpt_shm_read_max_bytes(s->shm);
}

/* ---- Begin ---- */

struct begin_job {
  struct ckpt_task t;
  struct begin_pending pending; /* In s->begins until the attempt is in the table. */
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
  /* Another replica may have committed the step (one LIST of its directory). */
  if (j->err == STK_ENOENT && j->s->o.shared_storage) {
    j->err = ckpt_import_step(j->s, j->job, j->rec.step);
    if (j->err == 0) j->err = kv_get(j->s->kv, NULL, k.b, k.len, &v, &len);
  }
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

static void begin_after(struct ckpt_task *t) {
  struct begin_job *j = (struct begin_job *)t;
  struct ckpt_service *s = j->s;
  struct begin_pending **p = &s->begins;
  while (*p != &j->pending) p = &(*p)->next;
  *p = j->pending.next;
  struct attempt *a = j->err == 0 ? ckpt__attempt_new(s, j->id, j->job, j->rec.step, j->rec.world,
                                                      j->rec.created_at_ms)
                                  : NULL;
  if (a) a->generation = j->rec.generation;
  if (j->err == 0 && !a) j->err = STK_ENOMEM;
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
  if (!err) err = ckpt_admit(s, req->job, req->step);
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
  j->rec.generation = req->generation;
  j->rec.created_at_ms = ckpt__svc_now_ms();
  j->pending.job = j->job;
  j->pending.next = s->begins;
  s->begins = &j->pending;
  ckpt_pool_submit(s->work, &j->t);
}

/* ---- Commit (waiting for the outcome) ---- */

void ckpt_commit(struct ckpt_service *s, const Stoker__V1__CommitCheckpointRequest *req,
                 ckpt_done_fn done, void *arg) {
  if (s->closing) FAIL_LATER(s, done, arg, STK_EUNAVAIL, "closing");
  struct attempt *a = req->attempt ? ckpt__attempt_find(s, req->attempt) : NULL;
  if (!a) FAIL_LATER(s, done, arg, STK_ENOENT, "unknown attempt");
  if (req->detach && a->state != ATT_DONE) {
    ckpt__detach_wait(a, done, arg); /* Answered once decided (ckpt_detach.c). */
    return;
  }
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
      ckpt__svc_fail_later(s, done, arg, a->result, a->result_msg);
    else
      ckpt__svc_ref_later(s, a, done, arg);
    free(w);
  }
}

/* What the manifest cache holds for a manifest's bytes: the manifest
 * parsed, checked and indexed by tensor (ckpt_mcache_make_fn). */
static int manifest_make(const uint8_t *buf, size_t len, void **ret_value, size_t *ret_bytes) {
  struct ckpt_manifest *m;
  int err = ckpt_manifest_parse(buf, len, &m);
  if (!err && (err = ckpt_manifest_index(m)) != 0) ckpt_manifest_free(m);
  if (err) return err;
  /* Roughly what it takes: its bytes (held too), the arrays and the names. */
  size_t bytes = 2 * len + m->n_objects * sizeof(*m->objects) +
                 m->n_chunks * (sizeof(*m->chunks) + sizeof(*m->by_tensor));
  for (size_t i = 0; i < m->n_objects; i++) bytes += m->objects[i].n_blocks * 4;
  *ret_value = m;
  *ret_bytes = bytes;
  return 0;
}

static void manifest_drop(void *value) {
  ckpt_manifest_free(value);
}
