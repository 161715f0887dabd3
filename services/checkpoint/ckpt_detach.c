/*
 * ckpt_detach: the detached commit (CommitCheckpointRequest.detach, issue
 * 23). A rank evicted from its node must exit once its shards are staged,
 * not once they are uploaded; the service commits them after it is gone.
 * Commits already happen by themselves once every byte is durable
 * (ckpt_upload.c), so what a detached Commit adds is an earlier answer and a
 * promise: the commit is decided.
 *
 * Decided means: every rank of the attempt sent "last" (every byte is
 * staged here and was validated), the staged chunks pass the commit's own
 * manifest check (coverage, bounds, overlaps: the manifest is built from
 * the chunks in memory, with placeholder CRCs), and the decision is
 * journaled on the attempt's A/ record (detached_at_ms, a synced write; no
 * record of its own). The answer is the attempt's reference without a uri.
 * From then on no call or rule aborts the attempt (Abort answers
 * FAILED_PRECONDITION, the service cap never takes it, and an attempt
 * whose ranks all sent "last" is never idle or late); only a failure does:
 * storage refusing an upload or the manifest, or the process dying before
 * every staged byte is uploaded (recovery then aborts it, naming the
 * detached commit in the reason; one whose bytes were all uploaded is
 * committed by recovery as any other).
 *
 * The decision job counts as one of the attempt's jobs, so the commit job
 * (which drops the A/ record) never runs beside its rewrite of that record.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_crc.h"
#include "ckpt_journal.h"
#include "ckpt_manifest.h"
#include "ckpt_service_int.h"
#include "stk_error.h"

struct detach_job {
  struct ckpt_task t;
  struct attempt *a;
  struct ckpt_manifest *m; /* The staged chunks, checked on the worker. */
  int64_t at_ms;
  int err;
  char msg[320];
};

static bool wanted(const struct attempt *a);
static void answer_decided(struct attempt *a);
static int staged_manifest(struct attempt *a, struct ckpt_manifest **ret);
static void detach_work(struct ckpt_task *t);
static void detach_after(struct ckpt_task *t);

void ckpt__detach_wait(struct attempt *a, ckpt_done_fn done, void *arg) {
  struct commit_wait *w = calloc(1, sizeof(*w));
  if (!w) FAIL_LATER(a->svc, done, arg, STK_ENOMEM, "");
  w->done = done;
  w->arg = arg;
  w->detach = true;
  w->next = a->waits;
  a->waits = w;
  ckpt__detach_progress(a);
}

void ckpt__detach_progress(struct attempt *a) {
  if (a->state == ATT_ABORTING || a->state == ATT_DONE || !wanted(a)) return;
  if (a->detached || a->state == ATT_COMMITTING) { /* Every byte durable: decided too. */
    answer_decided(a);
    return;
  }
  if (a->detach_started) return;
  for (uint32_t r = 0; r < a->world; r++)
    if (!a->ranks[r].last_fed) return;
  struct detach_job *j = calloc(1, sizeof(*j));
  if (!j) {
    ckpt__attempt_abort(a, STK_ENOMEM, "out of memory");
    return;
  }
  stk_clear_detail();
  int err = staged_manifest(a, &j->m);
  if (err) {
    char msg[320];
    snprintf(msg, sizeof msg, "attempt %s: detached commit refused: %s", a->id,
             stk_detail()[0] ? stk_detail() : stk_strerror(err));
    free(j);
    ckpt__attempt_abort(a, err, msg);
    return;
  }
  j->t.work = detach_work;
  j->t.after = detach_after;
  j->a = a;
  j->at_ms = ckpt__svc_now_ms();
  a->detach_started = true;
  a->jobs++;
  ckpt_pool_submit(a->svc->work, &j->t);
}

/* ---- Helpers ---- */

static bool wanted(const struct attempt *a) {
  for (const struct commit_wait *w = a->waits; w; w = w->next)
    if (w->detach) return true;
  return false;
}

/* Answers every detached Commit of a with its reference (no uri while not
 * committed), from a later loop callback. */
static void answer_decided(struct attempt *a) {
  struct commit_wait **pp = &a->waits;
  while (*pp) {
    struct commit_wait *w = *pp;
    if (!w->detach) {
      pp = &w->next;
      continue;
    }
    *pp = w->next;
    ckpt__svc_ref_later(a->svc, a, w->done, w->arg);
    free(w);
  }
}

/* The manifest the staged chunks make (placeholder CRCs): the same check
 * the commit runs on the journaled objects then passes or fails alike. */
static int staged_manifest(struct attempt *a, struct ckpt_manifest **ret) {
  struct ckpt_manifest *m;
  int err = ckpt_manifest_new(a->job, a->step, a->world, a->id, &m);
  if (err) return err;
  uint32_t *crcs = NULL;
  for (uint32_t r = 0; !err && r < a->world; r++) {
    for (const struct obj *o = a->ranks[r].objs; !err && o; o = o->next) {
      char name[CKPT_OBJECT_MAX_BYTES + 1];
      ckpt_object_name(o->rank, o->index, name);
      size_t n = (size_t)ckpt_crc_block_count(o->size);
      free(crcs);
      crcs = calloc(n ? n : 1, sizeof(*crcs));
      uint32_t idx = 0;
      err = crcs ? ckpt_manifest_add_object(m, name, o->size, crcs, n, &idx) : STK_ENOMEM;
      for (size_t i = 0; !err && i < o->n_chunks; i++) {
        const struct chunk_rec *c = &o->chunks[i];
        err = ckpt_manifest_add_chunk(m, c->tensor, c->dtype, &c->shape, &c->box, idx, c->offset);
      }
    }
  }
  free(crcs);
  if (err) {
    ckpt_manifest_free(m);
    return err;
  }
  *ret = m;
  return 0;
}

/* Worker: the whole manifest check, then the decision on the A/ record. */
static void detach_work(struct ckpt_task *t) {
  struct detach_job *j = (struct detach_job *)t;
  stk_clear_detail();
  int err = ckpt_manifest_check(j->m);
  if (err) {
    j->err = err;
    snprintf(j->msg, sizeof j->msg, "attempt %s: detached commit refused: %s", j->a->id,
             stk_detail()[0] ? stk_detail() : stk_strerror(err));
    return;
  }
  struct ckpt_service *s = j->a->svc;
  struct ckpt_jkey k;
  ckpt_jkey_attempt(&k, j->a->id);
  Stoker__V1__JournalAttempt *rec;
  err = ckpt_journal_get(s->kv, &k, &stoker__v1__journal_attempt__descriptor,
                         (ProtobufCMessage **)&rec);
  if (!err) {
    rec->detached_at_ms = j->at_ms;
    err = ckpt_journal_put(s->kv, &k, &rec->base, true);
    stoker__v1__journal_attempt__free_unpacked(rec, NULL);
  }
  if (err) {
    j->err = err;
    snprintf(j->msg, sizeof j->msg, "attempt %s: detached commit: journal: %s", j->a->id,
             stk_detail()[0] ? stk_detail() : stk_strerror(err));
    return;
  }
  ckpt__svc_probe(s, "detached");
}

static void detach_after(struct ckpt_task *t) {
  struct detach_job *j = (struct detach_job *)t;
  struct attempt *a = j->a;
  a->jobs--;
  ckpt_manifest_free(j->m);
  if (j->err) {
    ckpt__attempt_abort(a, j->err, j->msg);
  } else if (a->state == ATT_OPEN) {
    a->detached = true;
    a->detached_at_ms = j->at_ms;
    answer_decided(a);
  }
  free(j);
  ckpt__upload_progress(a); /* The commit waits for no job of a's any more. */
}
