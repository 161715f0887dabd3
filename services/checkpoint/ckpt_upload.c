/*
 * ckpt_upload: moving staged parts to storage and journaling each step, so
 * that a restarted service can resume or abort what was in flight.
 *
 * Per object: the first full part opens a multipart upload (its id is
 * journaled before any part is sent); each part is CRC'd per 1 MiB block,
 * uploaded and journaled with its ETag and CRCs; sealing journals the
 * object's chunks and part count; when every part is in, the upload is
 * completed and the object marked done. An object sealed before its first
 * part filled is sent with one PUT instead (so is a shm segment of a few
 * parts, its PUT held while ranks of the attempt still copy into
 * segments). Per rank: once "last" arrived and every object's seal is
 * journaled, the rank is journaled finished. Per attempt: once every rank
 * is finished and every object done, the commit job runs (ckpt_commit.c).
 * A part staged in shared memory is uploaded from the segment's mapping;
 * the segment is released once its object is done.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_crc.h"
#include "ckpt_journal.h"
#include "ckpt_service_int.h"
#include "stk_error.h"

enum job_kind { J_BEGIN, J_PART, J_PUT, J_SEAL, J_COMPLETE, J_FINISH, J_COMMIT };

struct up_job {
  struct ckpt_task t;
  enum job_kind kind;
  struct attempt *a;
  struct obj *o;
  struct part *p;
  uint32_t rank;
  bool sealed; /* Snapshot of the object at submission (the loop owns it). */
  uint64_t size;
  uint32_t parts;
  char *upload_id; /* J_BEGIN result. */
  struct commit_result commit;
  int err;
  char msg[320];
};

static void job_fail(struct up_job *j, int err, const char *what) {
  j->err = err;
  snprintf(j->msg, sizeof(j->msg), "%s: %s", what,
           stk_detail()[0] ? stk_detail() : stk_strerror(err));
}

static int obj_key(const struct obj *o, char **ret_key) {
  char name[CKPT_OBJECT_MAX_BYTES + 1];
  ckpt_object_name(o->rank, o->index, name);
  const struct attempt *a = o->att;
  return ckpt_key_object(a->svc->prefix, a->job, a->step, a->id, name, ret_key);
}

/* Block CRCs of a buffer that starts on a block boundary. */
static int block_crcs(const uint8_t *buf, size_t len, uint32_t **ret, size_t *ret_n) {
  struct ckpt_crc_stream cs;
  ckpt_crc_stream_init(&cs);
  int err = ckpt_crc_stream_feed(&cs, buf, len);
  if (!err) err = ckpt_crc_stream_finish(&cs, ret, ret_n);
  ckpt_crc_stream_close(&cs);
  return err;
}

/* The object's journal record as of now (chunks borrowed from o). */
static int put_object_record(struct up_job *j, bool done, const uint32_t *crcs, size_t n_crcs) {
  const struct obj *o = j->o;
  Stoker__V1__JournalObject rec = STOKER__V1__JOURNAL_OBJECT__INIT;
  rec.rank = o->rank;
  rec.index = o->index;
  rec.upload_id = j->upload_id ? j->upload_id : "";
  rec.sealed = j->sealed;
  rec.size = j->size;
  rec.parts = j->parts;
  rec.done = done;
  rec.n_block_crc32c = n_crcs;
  rec.block_crc32c = (uint32_t *)crcs;
  size_t n = j->sealed ? o->n_chunks : 0;
  Stoker__V1__ChunkEntry *ce = calloc(n ? n : 1, sizeof(*ce));
  Stoker__V1__ChunkEntry **cp = calloc(n ? n : 1, sizeof(*cp));
  Stoker__V1__Box *bx = calloc(n ? n : 1, sizeof(*bx));
  int err = STK_ENOMEM;
  if (ce && cp && bx) {
    for (size_t i = 0; i < n; i++) {
      const struct chunk_rec *c = &o->chunks[i];
      stoker__v1__chunk_entry__init(&ce[i]);
      stoker__v1__box__init(&bx[i]);
      bx[i].n_offsets = bx[i].n_sizes = c->box.ndim;
      bx[i].offsets = (uint64_t *)c->box.offsets;
      bx[i].sizes = (uint64_t *)c->box.sizes;
      ce[i].tensor = c->tensor;
      ce[i].dtype = (Stoker__V1__DType)c->dtype;
      ce[i].n_global_shape = c->shape.ndim;
      ce[i].global_shape = (uint64_t *)c->shape.dims;
      ce[i].box = &bx[i];
      ce[i].object_offset = c->offset;
      ce[i].length = c->length;
      cp[i] = &ce[i];
    }
    rec.n_chunks = n;
    rec.chunks = cp;
    struct ckpt_jkey k;
    ckpt_jkey_object(&k, o->att->id, o->rank, o->index);
    err = ckpt_journal_put(o->att->svc->kv, &k, &rec.base, true);
  }
  free(ce);
  free(cp);
  free(bx);
  return err;
}

/* ---- Work (worker threads) ---- */

static void do_begin(struct up_job *j, const char *key) {
  int err = storage_mpu_begin(j->a->svc->st, key, &j->upload_id);
  if (err) return job_fail(j, err, "begin multipart upload");
  err = put_object_record(j, false, NULL, 0);
  if (err) job_fail(j, err, "journal upload id");
}

static void do_part(struct up_job *j, const char *key) {
  struct part *p = j->p;
  uint32_t *crcs = NULL;
  size_t n = 0;
  char *etag = NULL;
  int err = block_crcs(p->buf, p->len, &crcs, &n);
  if (!err)
    err = storage_mpu_part(j->a->svc->st, key, j->upload_id, (int)p->number, p->buf, p->len, &etag);
  if (err) {
    free(crcs);
    return job_fail(j, err, "upload part");
  }
  Stoker__V1__JournalPart rec = STOKER__V1__JOURNAL_PART__INIT;
  rec.number = p->number;
  rec.etag = etag;
  rec.size = p->len;
  rec.n_block_crc32c = n;
  rec.block_crc32c = crcs;
  struct ckpt_jkey k;
  ckpt_jkey_part(&k, j->a->id, j->o->rank, j->o->index, p->number);
  err = ckpt_journal_put(j->a->svc->kv, &k, &rec.base, true);
  free(crcs);
  free(etag);
  if (err) return job_fail(j, err, "journal part");
  svc_probe(j->a->svc, "part_journaled");
}

static void do_put(struct up_job *j, const char *key) {
  struct part *p = j->p;
  uint32_t *crcs = NULL;
  size_t n = 0;
  int err = p ? block_crcs(p->buf, p->len, &crcs, &n) : 0;
  if (!err)
    err = storage_put(j->a->svc->st, key, p ? p->buf : (const uint8_t *)"", p ? p->len : 0, 0);
  if (!err) err = put_object_record(j, true, crcs, n);
  free(crcs);
  if (err) job_fail(j, err, "put object");
}

static void do_complete(struct up_job *j, const char *key) {
  Stoker__V1__JournalPart **jp = NULL;
  int err = ckpt_journal_parts(j->a->svc->kv, j->a->id, j->o->rank, j->o->index, j->parts, &jp);
  if (err) return job_fail(j, err, "read journaled parts");
  struct storage_part *sp = calloc(j->parts, sizeof(*sp));
  if (!sp) err = STK_ENOMEM;
  for (uint32_t i = 0; !err && i < j->parts; i++)
    sp[i] = (struct storage_part){(int)jp[i]->number, jp[i]->etag};
  if (!err) err = storage_mpu_complete(j->a->svc->st, key, j->upload_id, sp, j->parts, 0);
  free(sp);
  ckpt_journal_parts_free(jp, j->parts);
  if (!err) err = put_object_record(j, true, NULL, 0);
  if (err) job_fail(j, err, "complete multipart upload");
}

static void do_finish(struct up_job *j) {
  Stoker__V1__JournalRank rec = STOKER__V1__JOURNAL_RANK__INIT;
  rec.rank = j->rank;
  rec.objects = j->parts; /* Object count of the rank. */
  struct ckpt_jkey k;
  ckpt_jkey_rank(&k, j->a->id, j->rank);
  int err = ckpt_journal_put(j->a->svc->kv, &k, &rec.base, true);
  if (err) return job_fail(j, err, "journal rank");
  svc_probe(j->a->svc, "rank_finished");
}

static void do_commit(struct up_job *j) {
  int err = ckpt_commit_run(j->a->svc, j->a->id, &j->commit);
  if (err) {
    j->err = err;
    snprintf(j->msg, sizeof(j->msg), "commit of attempt %s: %s", j->a->id, stk_detail());
    return;
  }
  ckpt_retention_run(j->a->svc, j->a->job); /* Best effort; failures leave extra checkpoints. */
}

static void job_work(struct ckpt_task *t) {
  struct up_job *j = (struct up_job *)t;
  char *key = NULL;
  if (j->o) {
    int err = obj_key(j->o, &key);
    if (err) return job_fail(j, err, "object key");
  }
  switch (j->kind) {
  case J_BEGIN:
    do_begin(j, key);
    break;
  case J_PART:
    do_part(j, key);
    break;
  case J_PUT:
    do_put(j, key);
    break;
  case J_SEAL:
    if (put_object_record(j, false, NULL, 0)) job_fail(j, STK_EIO, "journal seal");
    break;
  case J_COMPLETE:
    do_complete(j, key);
    break;
  case J_FINISH:
    do_finish(j);
    break;
  case J_COMMIT:
    do_commit(j);
    break;
  }
  free(key);
}

/* ---- Loop side ---- */

static void job_after(struct ckpt_task *t);

static struct up_job *job_new(enum job_kind kind, struct attempt *a, struct obj *o,
                              struct part *p) {
  struct up_job *j = calloc(1, sizeof(*j));
  if (!j) return NULL;
  j->t.work = job_work;
  j->t.after = job_after;
  j->kind = kind;
  j->a = a;
  j->o = o;
  j->p = p;
  if (o) {
    j->rank = o->rank;
    j->sealed = o->sealed;
    j->size = o->size;
    j->parts = o->parts_sent;
    j->upload_id = o->upload_id;
  }
  return j;
}

static void job_go(struct up_job *j) {
  struct attempt *a = j->a;
  enum job_kind kind = j->kind;
  a->jobs++;
  bool upload = kind == J_BEGIN || kind == J_PART || kind == J_PUT || kind == J_COMPLETE;
  ckpt_pool_submit(upload ? a->svc->up : a->svc->work, &j->t);
}

static void submit(enum job_kind kind, struct attempt *a, struct obj *o, struct part *p) {
  struct up_job *j = job_new(kind, a, o, p);
  if (!j) {
    if (p) staging_free_part(a->svc, p);
    svc_abort(a, STK_ENOMEM, "out of memory");
    return;
  }
  job_go(j);
}

void upload_part_ready(struct obj *o, struct part *p) {
  struct attempt *a = o->att;
  a->svc->parts_outstanding++;
  if (!o->begin_started) {
    o->begin_started = true;
    submit(J_BEGIN, a, o, NULL);
  }
  if (o->upload_id) {
    submit(J_PART, a, o, p);
    return;
  }
  p->next = NULL;
  struct part **pp = &o->waiting;
  while (*pp) pp = &(*pp)->next;
  *pp = p;
}

/* A rank not heard from yet (no stream, no data) of an attempt staging
 * through shm is held for at most this long after the first held PUT: it is
 * most likely copying into its first segment (whose message comes once the
 * segment is full), but a straggler must not hold the others' uploads. */
#define HOLD_UNHEARD_MS 200

static void on_hold_timer(uv_timer_t *t) {
  struct ckpt_service *s = t->data;
  for (struct attempt *a = s->attempts; a; a = a->next)
    if (a->state == ATT_OPEN) upload_release_held(a, false);
}

/* True while a rank of a is copying into shm segments: its bytes are
 * staged in memory-bandwidth time (milliseconds per 100 MiB), and uploads
 * started now would take cores and memory bandwidth from those copies,
 * which the ranks wait on. Ranks not heard from count for HOLD_UNHEARD_MS
 * (the timer then releases what they held). */
static bool shm_staging(struct attempt *a) {
  bool unheard = false;
  for (uint32_t r = 0; r < a->world; r++) {
    const struct rank_state *rs = &a->ranks[r];
    if (rs->shm && !rs->last_fed) return true;
    if (!rs->last_fed && !rs->writer && !rs->objs) unheard = true;
  }
  if (!unheard || !a->held_any) return false;
  uint64_t now = uv_now(a->svc->loop), end = a->held_at_ms + HOLD_UNHEARD_MS;
  if (now >= end) return false;
  uv_timer_start(&a->svc->hold_timer, on_hold_timer, end - now, 0);
  return true;
}

static void put_start(struct obj *o) {
  struct attempt *a = o->att;
  struct part *p = o->cur;
  o->cur = NULL;
  o->put_held = false;
  o->seal_started = true;
  if (!p) o->parts_sent = 0;
  a->svc->parts_outstanding++;
  submit(J_PUT, a, o, p);
}

void upload_release_held(struct attempt *a, bool force) {
  if (!force && shm_staging(a)) return;
  for (uint32_t r = 0; r < a->world; r++)
    for (struct obj *o = a->ranks[r].objs; o; o = o->next)
      if (o->put_held) put_start(o);
}

void upload_seal(struct obj *o) {
  struct attempt *a = o->att;
  struct rank_state *rs = &a->ranks[o->rank];
  o->sealed = true;
  if (rs->cur == o) rs->cur = NULL;
  if (!o->begin_started && o->seg && !a->held_any) {
    a->held_any = true; /* From now, ranks not heard from hold for a while. */
    a->held_at_ms = uv_now(a->svc->loop);
  }
  if (!o->begin_started && o->seg && shm_staging(a) && !a->svc->wait_head) {
    o->put_held = true; /* Its part stays in o->cur (freed with it on abort). */
    return;
  }
  struct part *p = o->cur;
  o->cur = NULL;
  if (!o->begin_started) {
    o->cur = p;
    put_start(o);
  } else if (p) {
    upload_part_ready(o, p);
  }
  upload_progress(a);
}

static void part_done(struct ckpt_service *s, struct up_job *j) {
  if (j->p) staging_free_part(s, j->p);
  s->parts_outstanding--;
  staging_wake(s);
}

static void after_ok(struct up_job *j) {
  struct ckpt_service *s = j->a->svc;
  struct obj *o = j->o;
  switch (j->kind) {
  case J_BEGIN:
    o->upload_id = j->upload_id;
    j->upload_id = NULL;
    while (o->waiting && j->a->state == ATT_OPEN) {
      struct part *p = o->waiting;
      o->waiting = p->next;
      submit(J_PART, j->a, o, p);
    }
    break;
  case J_PART:
    o->parts_done++;
    s->stats.parts_uploaded++;
    break;
  case J_PUT:
    o->seal_journaled = o->done = true;
    s->stats.objects_uploaded++;
    staging_release_segment(s, o);
    break;
  case J_SEAL:
    o->seal_journaled = true;
    break;
  case J_COMPLETE:
    o->done = true;
    s->stats.objects_uploaded++;
    staging_release_segment(s, o);
    break;
  case J_FINISH:
    j->a->ranks[j->rank].finished = true;
    break;
  case J_COMMIT:
    break;
  }
}

static void commit_after(struct up_job *j) {
  struct attempt *a = j->a;
  struct ckpt_service *s = a->svc;
  if (j->err) {
    a->state = ATT_OPEN; /* So that the abort path runs. */
    svc_abort(a, j->err, j->msg);
    return;
  }
  a->committed_at_ms = j->commit.committed_at_ms;
  a->manifest_uri = ckpt_manifest_uri(s, j->commit.manifest_key);
  svc_attempt_done(a, 0, NULL);
  if (s->o.commit_hook) s->o.commit_hook(s->o.commit_hook_arg, a->job, a->step, a->manifest_uri);
}

static void job_after(struct ckpt_task *t) {
  struct up_job *j = (struct up_job *)t;
  struct attempt *a = j->a;
  a->jobs--;
  if (j->kind == J_PART || j->kind == J_PUT) part_done(a->svc, j);
  if (j->kind == J_COMMIT) {
    commit_after(j);
  } else if (j->err) {
    svc_abort(a, j->err, j->msg);
  } else if (a->state == ATT_OPEN) {
    after_ok(j);
  } else if (j->kind == J_BEGIN) {
    j->o->upload_id = j->upload_id; /* Aborting: the journal has it for the cleanup. */
    j->upload_id = NULL;
  }
  if (j->kind == J_BEGIN) free(j->upload_id);
  free(j);
  upload_progress(a);
}

/* Starts what an object is ready for; true if it is done. */
static bool obj_step(struct obj *o) {
  struct attempt *a = o->att;
  if (o->sealed && o->upload_id && !o->seal_started) {
    o->seal_started = true;
    submit(J_SEAL, a, o, NULL);
  }
  if (o->sealed && o->seal_journaled && o->upload_id && !o->complete_started &&
      o->parts_done == o->parts_sent && !o->waiting) {
    o->complete_started = true;
    submit(J_COMPLETE, a, o, NULL);
  }
  return o->done;
}

/* Starts what a rank is ready for; true if finished and durable. */
static bool rank_step(struct attempt *a, uint32_t r) {
  struct rank_state *rs = &a->ranks[r];
  bool all_sealed = true, all_done = true;
  for (struct obj *o = rs->objs; o; o = o->next) {
    all_done = obj_step(o) && all_done;
    all_sealed = all_sealed && o->seal_journaled;
  }
  if (rs->last_fed && all_sealed && !rs->finish_started) {
    rs->finish_started = true;
    struct up_job *j = job_new(J_FINISH, a, NULL, NULL);
    if (!j) {
      svc_abort(a, STK_ENOMEM, "out of memory");
      return false;
    }
    j->rank = r;
    j->parts = rs->n_objects;
    job_go(j);
  }
  bool durable = rs->finished && all_done;
  if (durable && !rs->durable_sent) {
    rs->durable_sent = true;
    if (rs->writer) svc_post_event(a->svc, rs->writer, CKPT_WRITE_DURABLE, 0, "");
  }
  return durable;
}

void upload_progress(struct attempt *a) {
  if (a->state == ATT_ABORTING) {
    svc_check_abort(a);
    return;
  }
  if (a->state != ATT_OPEN) return;
  bool all = true;
  for (uint32_t r = 0; r < a->world && a->state == ATT_OPEN; r++) all = rank_step(a, r) && all;
  if (all && a->state == ATT_OPEN && a->jobs == 0) {
    a->state = ATT_COMMITTING;
    submit(J_COMMIT, a, NULL, NULL);
  }
}
