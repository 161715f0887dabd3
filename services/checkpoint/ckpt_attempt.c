/*
 * ckpt_attempt: the checkpoint attempt, its whole lifecycle in one place:
 * the attempt table, the state machine, the release of an attempt's
 * staging (buffers, shm segments, budget waiters), its abort and cleanup,
 * the timeouts that abort attempts nobody finishes, and the collection of
 * orphaned attempt directories in storage.
 *
 *                 Begin (A/ journaled)
 *                        |
 *                        v
 *   +--------------->  OPEN  ---- every rank sent "last", every object ----+
 *   |                    |        done and journaled (ckpt_upload.c)       |
 *   |                    |                                                 v
 *   |  ckpt__attempt_abort():  |                                            COMMITTING
 *   |  a bad write, the  |                                           (commit job,
 *   |  Abort call, the   |                                           ckpt_commit.c)
 *   |  attempt timeout,  |                                             |       |
 *   |  an abandoned      v                                  failed     |       | ok
 *   |  attempt, a failed upload/journal job  ABORTING  <---------------+       |
 *   |                    |  (writers failed, unsent staging freed at once;     |
 *   |                    |   waits for its jobs, then the cleanup job:         |
 *   |                    |   manifest key, uploads, objects, A/O/P/R records)  |
 *   |                    v                                                     v
 *   |                DONE (result = reason)                        DONE (result 0)
 *   |                    \______ answer Commit and Abort; pruned after 10 min _/
 *   |
 *   +-- recovery at open adds DONE entries directly (ckpt__attempt_recovered).
 *
 * A detached commit (ckpt_detach.c) changes no state: it marks an OPEN
 * attempt decided (a->detached), which the Abort call and the service cap
 * then leave alone; recovery names it in the reason of an abort.
 *
 * Rules. Only this file changes a->state. Entering ABORTING or DONE frees
 * what the attempt holds of the staging budget and wakes the writers that
 * wait for it. An open attempt is aborted when not every rank sent "last"
 * within attempt_timeout_ms, or when it is abandoned: some rank has not
 * sent "last", no stream is attached and nothing came for
 * attempt_idle_timeout_ms. Who may begin one is ckpt_admit.c's rule (per
 * job first, then the service's cap), above this file. Staging, upload,
 * commit, recovery and the calls use this file; it calls none of them (only the leaves: the event
 * queue ckpt_events.c, the pools, the journal, the shm directory, storage
 * and the storage sweeps of ckpt_gc.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_journal.h"
#include "ckpt_service_int.h"
#include "stk_error.h"

#define DONE_KEPT_MS     600000 /* DONE attempts answer Commit/Abort this long. */
#define SEGMENT_SWEEP_MS 10000

/* ---- Table ---- */

struct attempt *ckpt__attempt_find(struct ckpt_service *s, const char *id) {
  for (struct attempt *a = s->attempts; a; a = a->next)
    if (strcmp(a->id, id) == 0) return a;
  return NULL;
}

uint32_t ckpt__attempt_count_live(const struct ckpt_service *s) {
  uint32_t n = 0;
  for (const struct attempt *a = s->attempts; a; a = a->next)
    if (a->state != ATT_DONE) n++;
  return n;
}

struct attempt *ckpt__attempt_new(struct ckpt_service *s, const char *id, const char *job,
                                  int64_t step, uint32_t world, int64_t created_at_ms) {
  struct attempt *a = calloc(1, sizeof(*a));
  if (!a) return NULL;
  a->ranks = calloc(world, sizeof(*a->ranks));
  a->job = strdup(job);
  if (!a->ranks || !a->job) {
    free(a->ranks);
    free(a->job);
    free(a);
    return NULL;
  }
  a->svc = s;
  snprintf(a->id, sizeof(a->id), "%s", id);
  a->step = step;
  a->world = world;
  a->created_at_ms = created_at_ms;
  a->deadline_ms = uv_now(s->loop) + s->o.attempt_timeout_ms;
  a->active_ms = uv_now(s->loop);
  a->state = ATT_OPEN;
  a->next = s->attempts;
  s->attempts = a;
  return a;
}

void ckpt__attempt_recovered(struct ckpt_service *s, const Stoker__V1__JournalAttempt *rec,
                             int result, int64_t committed_at_ms, const char *manifest_uri) {
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
    char msg[300];
    if (rec->detached_at_ms)
      snprintf(msg, sizeof msg,
               "aborted by recovery: a detached commit was accepted at %lld (Unix ms), but the "
               "service stopped before every staged byte was uploaded",
               (long long)rec->detached_at_ms);
    else
      snprintf(msg, sizeof msg,
               "aborted by recovery: the attempt was incomplete when the service stopped");
    a->result_msg = strdup(msg);
    if (a->result_msg) ckpt__svc_queue_abort_hook(s, a->job, a->step, a->id, a->result_msg);
  } else {
    a->committed_at_ms = committed_at_ms;
    a->manifest_uri = manifest_uri ? strdup(manifest_uri) : NULL;
    ckpt__svc_queue_hook(s, a->job, a->step, a->manifest_uri);
  }
  a->next = s->attempts;
  s->attempts = a;
}

void ckpt__attempt_touch(struct attempt *a) {
  a->active_ms = uv_now(a->svc->loop);
}

/* ---- Budget release ---- */

void ckpt__attempt_budget_wake(struct ckpt_service *s) {
  for (struct ckpt_writer *w = s->wait_head; w; w = w->next_wait)
    ckpt__svc_post_event(s, w, CKPT_WRITE_RESUME, 0, "");
}

void ckpt__attempt_free_part(struct ckpt_service *s, struct part *p) {
  s->staged -= p->cap;
  p->obj->att->staged_bytes -= p->cap;
  if (!p->borrowed) free(p->buf);
  free(p);
}

void ckpt__attempt_release_segment(struct ckpt_service *s, struct obj *o) {
  if (!o->seg) return;
  char msg[320] = "";
  if (ckpt_shm_seg_broken(o->seg))
    snprintf(msg, sizeof msg,
             "attempt %s rank %u: shm segment %s shrank after it was handed over (its writer "
             "truncated or reused it); what was read from it is lost",
             o->att->id, o->rank, o->seg->name);
  s->staged -= o->size; /* What was fed of it, as ckpt__staging_feed_shm counted. */
  o->att->staged_bytes -= o->size;
  ckpt_shm_release(s->shm, o->seg);
  o->seg = NULL;
  ckpt__attempt_budget_wake(s);
  if (msg[0]) ckpt__attempt_abort(o->att, STK_EINVAL, msg);
}

void ckpt__attempt_wait_remove(struct ckpt_service *s, struct ckpt_writer *w) {
  if (!w->waiting) return;
  struct ckpt_writer **pp = &s->wait_head, *prev = NULL;
  while (*pp && *pp != w) {
    prev = *pp;
    pp = &(*pp)->next_wait;
  }
  if (*pp) *pp = w->next_wait;
  if (s->wait_tail == w) s->wait_tail = prev;
  w->waiting = false;
  w->next_wait = NULL;
}

void ckpt__attempt_wait_add(struct ckpt_service *s, struct ckpt_writer *w) {
  if (w->waiting) return;
  w->waiting = true;
  w->next_wait = NULL;
  if (s->wait_tail)
    s->wait_tail->next_wait = w;
  else
    s->wait_head = w;
  s->wait_tail = w;
}

/* Frees the parts of o that no upload job holds. */
static void drop_unsent(struct ckpt_service *s, struct obj *o) {
  if (o->cur) {
    ckpt__attempt_free_part(s, o->cur);
    o->cur = NULL;
  }
  while (o->waiting) {
    struct part *p = o->waiting;
    o->waiting = p->next;
    s->parts_outstanding--;
    ckpt__attempt_free_part(s, p);
  }
}

/* Frees what an ending attempt holds of the budget; once DONE with no jobs
 * left, its objects too. */
static void free_staging(struct attempt *a) {
  struct ckpt_service *s = a->svc;
  for (uint32_t r = 0; r < a->world; r++) {
    struct rank_state *rs = &a->ranks[r];
    if (rs->writer) {
      ckpt__attempt_wait_remove(s, rs->writer);
      if (a->state == ATT_DONE) {
        rs->writer->att = NULL;
        rs->writer = NULL;
      }
    }
    for (struct obj *o = rs->objs; o; o = o->next) drop_unsent(s, o);
    if (a->state != ATT_DONE || a->jobs > 0) continue;
    while (rs->objs) {
      struct obj *o = rs->objs;
      rs->objs = o->next;
      for (size_t i = 0; i < o->n_chunks; i++) free(o->chunks[i].tensor);
      ckpt__attempt_release_segment(s, o);
      free(o->chunks);
      free(o->upload_id);
      free(o);
    }
    rs->objs_tail = rs->cur = NULL;
  }
  ckpt__attempt_budget_wake(s); /* Writers of other attempts may fit now. */
}

static void drop_segments(struct attempt *a) {
  for (uint32_t r = 0; r < a->world; r++)
    for (struct obj *o = a->ranks[r].objs; o; o = o->next) {
      drop_unsent(a->svc, o);
      ckpt__attempt_release_segment(a->svc, o);
    }
}

static bool attempt_live(void *arg, const char *attempt) {
  struct attempt *a = ckpt__attempt_find(arg, attempt);
  return a && a->state != ATT_DONE;
}

void ckpt__attempt_sweep_segments(struct ckpt_service *s) {
  if (s->shm) ckpt_shm_sweep(s->shm, attempt_live, s);
}

/* ---- State machine ---- */

static void answer_waits(struct attempt *a) {
  struct commit_wait *w = a->waits;
  a->waits = NULL;
  static Stoker__V1__Empty empty = STOKER__V1__EMPTY__INIT;
  Stoker__V1__CheckpointRef ref = STOKER__V1__CHECKPOINT_REF__INIT;
  ref.step = a->step;
  ref.uri = a->manifest_uri;
  ref.committed_at_ms = a->committed_at_ms;
  ref.generation = a->generation;
  const char *msg = a->result_msg ? a->result_msg : stk_strerror(a->result);
  while (w) {
    struct commit_wait *n = w->next;
    if (w->abort && a->result != 0)
      w->done(w->arg, 0, "", &empty.base);
    else if (w->abort)
      w->done(w->arg, STK_ESTATE, "the attempt committed before the abort; delete the step", NULL);
    else if (a->result == 0)
      w->done(w->arg, 0, "", &ref.base);
    else
      w->done(w->arg, a->result, msg, NULL);
    free(w);
    w = n;
  }
}

static void set_done(struct attempt *a, int result, const char *msg) {
  struct ckpt_service *s = a->svc;
  a->state = ATT_DONE;
  a->result = result;
  if (result != 0 && !a->result_msg) a->result_msg = strdup(msg ? msg : stk_strerror(result));
  a->done_at_ms = uv_now(s->loop);
  if (result == 0)
    s->stats.commits++;
  else
    s->stats.aborts++;
  free_staging(a);
  ckpt__attempt_sweep_segments(s); /* Segments a rank wrote but never sent. */
  answer_waits(a);
  if (result != 0 && s->o.abort_hook)
    s->o.abort_hook(s->o.abort_hook_arg, a->job, a->step, a->id,
                    a->result_msg ? a->result_msg : stk_strerror(result));
}

bool ckpt__attempt_commit_start(struct attempt *a) {
  if (a->state != ATT_OPEN) return false;
  a->state = ATT_COMMITTING;
  return true;
}

void ckpt__attempt_committed(struct attempt *a, int64_t committed_at_ms, const char *manifest_uri) {
  struct ckpt_service *s = a->svc;
  a->committed_at_ms = committed_at_ms;
  a->manifest_uri = manifest_uri ? strdup(manifest_uri) : NULL;
  set_done(a, 0, NULL);
  if (s->o.commit_hook) s->o.commit_hook(s->o.commit_hook_arg, a->job, a->step, a->manifest_uri);
}

struct cleanup_job {
  struct ckpt_task t;
  struct attempt *a;
  char job[CKPT_JOB_MAX_BYTES + 1];
  bool collect; /* Also collect the job's orphaned attempt directories. */
};

static void cleanup_work(struct ckpt_task *t) {
  struct cleanup_job *j = (struct cleanup_job *)t;
  ckpt__attempt_cleanup_run(j->a->svc, j->a->id);
  if (j->collect) ckpt__attempt_collect_run(j->a->svc, j->job);
}

static void cleanup_after(struct ckpt_task *t) {
  struct cleanup_job *j = (struct cleanup_job *)t;
  struct attempt *a = j->a;
  a->jobs--;
  set_done(a, a->result, a->result_msg);
  free(j);
}

void ckpt__attempt_check_abort(struct attempt *a) {
  if (a->state != ATT_ABORTING || a->jobs > 0 || a->cleanup_started) return;
  struct cleanup_job *j = calloc(1, sizeof(*j));
  if (!j) return;
  a->cleanup_started = true;
  j->t.work = cleanup_work;
  j->t.after = cleanup_after;
  j->a = a;
  j->collect = a->collect;
  snprintf(j->job, sizeof(j->job), "%s", a->job);
  a->jobs++;
  ckpt_pool_submit(a->svc->work, &j->t);
}

void ckpt__attempt_abort(struct attempt *a, int err, const char *msg) {
  if (a->state == ATT_DONE || a->state == ATT_ABORTING) return;
  struct ckpt_service *s = a->svc;
  a->state = ATT_ABORTING;
  a->result = err;
  free(a->result_msg);
  a->result_msg = strdup(msg && msg[0] ? msg : stk_strerror(err));
  free_staging(a); /* Unsent buffers; writers waiting on the budget. */
  for (uint32_t r = 0; r < a->world; r++) {
    struct ckpt_writer *w = a->ranks[r].writer;
    if (!w) continue;
    a->ranks[r].writer = NULL;
    w->att = NULL;
    ckpt__svc_post_event(s, w, CKPT_WRITE_FAILED, err, a->result_msg);
  }
  ckpt__attempt_check_abort(a);
}

/* ---- The Abort call ---- */

void ckpt_abort(struct ckpt_service *s, const Stoker__V1__AbortCheckpointRequest *req,
                ckpt_done_fn done, void *arg) {
  if (s->closing) FAIL_LATER(s, done, arg, STK_EUNAVAIL, "closing");
  struct attempt *a = req->attempt && req->attempt[0] ? ckpt__attempt_find(s, req->attempt) : NULL;
  if (!a) FAIL_LATER(s, done, arg, STK_ENOENT, "unknown attempt (none open on this service)");
  if (a->state == ATT_COMMITTING)
    FAIL_LATER(s, done, arg, STK_ESTATE, "the attempt is committing; it can no longer be aborted");
  if (a->detached && a->state == ATT_OPEN)
    FAIL_LATER(s, done, arg, STK_ESTATE,
               "a detached commit of the attempt was accepted; it can no longer be aborted");
  if (a->state == ATT_DONE && a->result == 0)
    FAIL_LATER(s, done, arg, STK_ESTATE, "the attempt committed; delete the step instead");
  if (a->state == ATT_DONE) {
    static Stoker__V1__Empty empty = STOKER__V1__EMPTY__INIT;
    ckpt__svc_reply_later(s, &empty.base, done, arg);
    return;
  }
  struct commit_wait *w = calloc(1, sizeof(*w));
  if (!w) FAIL_LATER(s, done, arg, STK_ENOMEM, "");
  w->done = done;
  w->arg = arg;
  w->abort = true;
  w->next = a->waits;
  a->waits = w;
  char msg[200];
  snprintf(msg, sizeof(msg), "attempt %s: aborted by request%s%.100s", a->id,
           req->reason && req->reason[0] ? ": " : "", req->reason ? req->reason : "");
  a->collect = true;
  ckpt__attempt_abort(a, STK_EABORTED, msg);
}

/* ---- Timeouts and pruning (from the sweep timer) ---- */

static void free_attempt(struct attempt *a) {
  struct commit_wait *w = a->waits;
  while (w) {
    struct commit_wait *n = w->next;
    w->done(w->arg, STK_EUNAVAIL, "the checkpoint service is closing", NULL);
    free(w);
    w = n;
  }
  free_staging(a);
  if (a->ranks) drop_segments(a);
  free(a->ranks);
  free(a->job);
  free(a->result_msg);
  free(a->manifest_uri);
  free(a);
}

/* Some rank has not sent "last", none is attached, nothing came lately. */
static bool abandoned(const struct attempt *a, uint64_t now) {
  if (now < a->active_ms + a->svc->o.attempt_idle_timeout_ms) return false;
  bool unfinished = false;
  for (uint32_t r = 0; r < a->world; r++) {
    if (a->ranks[r].writer) return false;
    unfinished = unfinished || !a->ranks[r].last_fed;
  }
  return unfinished;
}

static void check_open(struct attempt *a, uint64_t now) {
  struct ckpt_service *s = a->svc;
  char msg[200];
  if (now >= a->deadline_ms) {
    bool all = true;
    for (uint32_t r = 0; r < a->world; r++) all = all && a->ranks[r].last_fed;
    if (!all) {
      snprintf(msg, sizeof(msg), "attempt %s: not every rank finished within %u ms", a->id,
               s->o.attempt_timeout_ms);
      ckpt__attempt_abort(a, STK_ETIMEDOUT, msg);
      return;
    }
  }
  if (abandoned(a, now)) {
    snprintf(msg, sizeof(msg),
             "attempt %s: abandoned (no stream and no data for %u ms with ranks unfinished)", a->id,
             s->o.attempt_idle_timeout_ms);
    s->stats.abandoned++;
    a->collect = true;
    ckpt__attempt_abort(a, STK_ETIMEDOUT, msg);
  }
}

void ckpt__attempt_sweep(struct ckpt_service *s) {
  uint64_t now = uv_now(s->loop);
  if (now >= s->shm_swept_ms + SEGMENT_SWEEP_MS) {
    s->shm_swept_ms = now;
    ckpt__attempt_sweep_segments(s);
  }
  for (struct attempt **pp = &s->attempts; *pp;) {
    struct attempt *a = *pp;
    if (a->state == ATT_OPEN) check_open(a, now);
    if (a->state == ATT_DONE && now > a->done_at_ms + DONE_KEPT_MS) {
      *pp = a->next;
      free_attempt(a);
      continue;
    }
    pp = &a->next;
  }
}

void ckpt__attempt_free_all(struct ckpt_service *s) {
  while (s->attempts) {
    struct attempt *a = s->attempts;
    s->attempts = a->next;
    if (a->jobs == 0) a->state = ATT_DONE; /* Closing: an open attempt's objects go too. */
    free_attempt(a);
  }
}

/* ---- Cleanup (blocking, worker threads and recovery) ---- */

/* Aborts the open uploads and deletes the objects the journal knows. */
static void abort_objects(struct ckpt_service *s, const Stoker__V1__JournalAttempt *rec) {
  struct ckpt_jkey k;
  ckpt_jkey_attempt_prefix(&k, 'O', rec->attempt);
  struct kv_iter *it;
  if (kv_iter_prefix(s->kv, NULL, k.b, k.len, &it) != 0) return;
  for (; kv_iter_valid(it); kv_iter_next(it)) {
    size_t len;
    const void *v = kv_iter_value(it, &len);
    Stoker__V1__JournalObject *o = (Stoker__V1__JournalObject *)ckpt_journal_unpack(
        &stoker__v1__journal_object__descriptor, v, len);
    if (!o) continue;
    char name[CKPT_OBJECT_MAX_BYTES + 1], *key = NULL;
    ckpt_object_name(o->rank, o->index, name);
    if (ckpt_key_object(s->prefix, rec->job, rec->step, rec->attempt, name, &key) == 0) {
      if (o->upload_id && o->upload_id[0] && !o->done) storage_mpu_abort(s->st, key, o->upload_id);
      storage_delete(s->st, key);
    }
    free(key);
    stoker__v1__journal_object__free_unpacked(o, NULL);
  }
  kv_iter_free(it);
}

int ckpt__attempt_cleanup_run(struct ckpt_service *s, const char *attempt) {
  Stoker__V1__JournalAttempt *rec;
  struct ckpt_jkey k;
  ckpt_jkey_attempt(&k, attempt);
  int err = ckpt_journal_get(s->kv, &k, &stoker__v1__journal_attempt__descriptor,
                             (ProtobufCMessage **)&rec);
  if (err) return err == STK_ENOENT ? 0 : err;
  char *key = NULL;
  /* The manifest first: whatever happens next, the attempt never exists. */
  err = ckpt_key_manifest(s->prefix, rec->job, rec->step, rec->attempt, &key);
  if (!err) err = storage_delete(s->st, key);
  free(key);
  if (!err) {
    abort_objects(s, rec);
    if (ckpt_key_attempt_dir(s->prefix, rec->job, rec->step, rec->attempt, &key) == 0) {
      ckpt_abort_uploads_under(s, key); /* Uploads and objects the journal never */
      ckpt_delete_dir(s, key);          /* heard of (best effort). */
    }
    free(key);
    struct kv_batch *b = kv_batch_new();
    if (!b) err = STK_ENOMEM;
    if (b) {
      ckpt_journal_drop_attempt(b, attempt);
      err = kv_write(s->kv, b, true);
    }
    kv_batch_free(b);
  }
  stoker__v1__journal_attempt__free_unpacked(rec, NULL);
  return err;
}

/* ---- Collection of orphaned attempt directories (blocking) ---- */

/* "step-N/attempt-ID/rest" after the job directory: the attempt directory
 * (job dir + first two segments) and whether rest is the manifest. */
static bool split_key(const char *rel, size_t *ret_dir_len, const char **ret_attempt,
                      size_t *ret_attempt_len, bool *ret_manifest) {
  const char *s1 = strchr(rel, '/');
  if (!s1 || strncmp(s1 + 1, "attempt-", 8) != 0) return false;
  const char *s2 = strchr(s1 + 1, '/');
  if (!s2) return false;
  *ret_attempt = s1 + 9;
  *ret_attempt_len = (size_t)(s2 - (s1 + 9));
  *ret_dir_len = (size_t)(s2 + 1 - rel);
  *ret_manifest = strcmp(s2 + 1, "manifest.pb") == 0;
  return true;
}

/* Whether a manifest is listed under the attempt directory dir (of len). */
static bool has_manifest(const struct ckpt_keylist *l, size_t skip, const char *dir, size_t len) {
  for (size_t i = 0; i < l->n; i++) {
    const char *k = l->keys[i] + skip;
    if (strncmp(k, dir, len) == 0 && strcmp(k + len, "manifest.pb") == 0) return true;
  }
  return false;
}

/* Whether the attempt of "step-N/attempt-ID/..." (the attempt id att_len
 * bytes at att) is claimed by the journal: open, committed or being
 * deleted. A/ alone would miss an attempt that committed between the
 * listing and the read (its A/ record gone, its manifest not listed). */
static bool claimed(struct ckpt_service *s, const char *job, const char *rel, const char *att,
                    size_t att_len) {
  char step_seg[18], id[CKPT_ATTEMPT_MAX_BYTES + 1];
  int64_t step;
  if (att_len > CKPT_ATTEMPT_MAX_BYTES || att - rel != 26) return true; /* not ours: keep */
  memcpy(step_seg, rel, 17);
  step_seg[17] = '\0';
  memcpy(id, att, att_len);
  id[att_len] = '\0';
  if (ckpt_key_parse_step(step_seg, &step) != 0) return true;
  return ckpt_gc_attempt_claimed(s, job, step, id);
}

int ckpt__attempt_collect_run(struct ckpt_service *s, const char *job) {
  char *jobdir;
  int err = ckpt_key_job_dir(s->prefix, job, &jobdir);
  if (err) return err;
  struct ckpt_keylist l = {0};
  err = ckpt_keylist_list(s, jobdir, &l);
  size_t skip = strlen(jobdir);
  for (size_t i = 0; !err && i < l.n; i++) {
    const char *rel = l.keys[i] + skip, *att;
    size_t dir_len, att_len;
    bool manifest;
    if (strncmp(l.keys[i], jobdir, skip) != 0 ||
        !split_key(rel, &dir_len, &att, &att_len, &manifest))
      continue;
    if (manifest || has_manifest(&l, skip, rel, dir_len) || claimed(s, job, rel, att, att_len))
      continue;
    err = storage_delete(s->st, l.keys[i]);
  }
  ckpt_keylist_free(&l);
  free(jobdir);
  return err;
}
