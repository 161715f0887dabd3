/*
 * ckpt_service_int: the service's private state, shared by its files
 * (ckpt_service.c: lifecycle, Begin and Commit; ckpt_attempt.c: the
 * attempt's table, state machine, budget release, abort, cleanup and
 * collection; ckpt_events.c: deferred events and answers; ckpt_staging.c:
 * writers and the memory budget, over ckpt_staging_shm.c (segments) and
 * ckpt_staging_obj.c (objects and parts); ckpt_upload.c: parts, objects and
 * ranks;
 * ckpt_commit.c, ckpt_recover.c, ckpt_gc.c: the blocking protocol steps;
 * ckpt_restore.c: reads and verify). Everything here is owned by the loop
 * thread except what the worker jobs carry.
 *
 * Call graph between these files (no cycles; the ckpt-ladder test checks):
 * ckpt_staging -> ckpt_staging_shm -> ckpt_staging_obj -> ckpt_upload;
 * ckpt_service, ckpt_calls, ckpt_staging(_shm), ckpt_upload, ckpt_recover
 * -> ckpt_attempt -> {ckpt_events, ckpt_gc, ckpt_pool, ckpt_journal,
 * ckpt_shm, storage}; ckpt_upload, ckpt_restore -> ckpt_store -> {ckpt_pool,
 * storage}; ckpt_shm_read -> ckpt_shm.
 */
#ifndef STK_CKPT_SERVICE_INT_H
#define STK_CKPT_SERVICE_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "ckpt_box.h"
#include "ckpt_mcache.h"
#include "ckpt_names.h"
#include "ckpt_pool.h"
#include "ckpt_service.h"
#include "ckpt_shm.h"
#include "kv.h"
#include "storage.h"

/* memcpy of n uint64s that accepts NULL when n is 0 (scalars have no dims). */
static inline void u64copy(uint64_t *dst, const uint64_t *src, size_t n) {
  if (n) memcpy(dst, src, n * sizeof(*dst));
}

/* The state diagram is in ckpt_attempt.c; only that file changes it. */
enum attempt_state {
  ATT_OPEN,       /* Ranks writing or uploads in flight. */
  ATT_COMMITTING, /* The commit job runs. */
  ATT_ABORTING,   /* Waiting for its jobs, then the cleanup job. */
  ATT_DONE,       /* Committed or aborted; kept for Commit and Abort answers. */
};

struct chunk_rec {
  char *tensor;
  int dtype;
  struct ckpt_shape shape;
  struct ckpt_box box;
  uint64_t offset; /* In the object. */
  uint64_t length;
};

/* One part buffer, staged then uploaded. */
struct part {
  struct obj *obj;
  uint32_t number; /* 1-based. */
  uint8_t *buf;
  size_t len, cap;
  bool borrowed;     /* buf points into the object's shm segment (cap 0). */
  struct part *next; /* Parts waiting for the upload id. */
};

struct obj {
  struct attempt *att;
  uint32_t rank, index;
  char *upload_id;      /* NULL until the multipart upload exists. */
  bool begin_started;   /* mpu_begin job submitted. */
  struct part *cur;     /* Being filled (NULL before the first byte). */
  struct part *waiting; /* Full parts waiting for upload_id (FIFO by number). */
  uint32_t parts_sent;  /* Parts numbered so far. */
  uint32_t parts_done;  /* Parts uploaded and journaled. */
  uint64_t size;        /* Bytes placed. */
  struct chunk_rec *chunks;
  size_t n_chunks, cap_chunks;
  bool sealed;       /* No more chunks. */
  bool seal_started; /* Seal record (or single PUT) job submitted. */
  bool seal_journaled;
  bool complete_started;
  bool done; /* Visible in storage and journaled. */
  /* Zero-copy staging: the object's bytes are its segment's bytes (object
   * offset x = segment offset x); held until the object is done. */
  struct ckpt_shm_seg *seg;
  bool put_held;    /* Sealed segment object whose PUT waits (ckpt__upload_seal). */
  struct obj *next; /* In the rank's list. */
};

struct rank_state {
  struct ckpt_writer *writer;
  bool last_fed;       /* "last" consumed. */
  bool shm;            /* Staged through a shm segment. */
  bool finish_started; /* JournalRank job submitted. */
  bool finished;       /* JournalRank written. */
  bool durable_sent;
  uint32_t n_objects;
  struct obj *objs, *objs_tail;
  struct obj *cur; /* Object being filled. */
};

struct hook_call {
  char *job;
  int64_t step;
  char *uri;
  char *attempt, *reason; /* Set: an abort (the abort hook); else a commit. */
  struct hook_call *next;
};

struct commit_wait {
  ckpt_done_fn done;
  void *arg;
  bool abort;  /* An Abort call: answered Empty once aborted. */
  bool detach; /* A detached Commit: answered once decided (ckpt_detach.c). */
  struct commit_wait *next;
};

struct attempt {
  struct ckpt_service *svc;
  char id[CKPT_ATTEMPT_MAX_BYTES + 1];
  char *job;
  int64_t step;
  uint32_t world;
  uint64_t generation; /* Of the writing ranks, from Begin (0: not known). */
  int64_t created_at_ms;
  uint64_t deadline_ms; /* uv_now */
  uint64_t active_ms;   /* uv_now of the last stream opened, closed or fed. */
  bool collect;         /* Its cleanup also collects the job's orphaned directories. */
  enum attempt_state state;
  int result; /* When DONE: 0 committed, else the abort reason. */
  char *result_msg;
  char *manifest_uri;
  int64_t committed_at_ms;
  struct rank_state *ranks; /* [world] */
  uint32_t jobs;            /* Worker jobs in flight that use this attempt. */
  bool cleanup_started;
  uint64_t done_at_ms; /* uv_now when DONE (pruned later). */
  uint64_t held_at_ms; /* uv_now when a segment's PUT was first held (held_any). */
  bool held_any;
  uint64_t staged_bytes; /* Its share of svc->staged (buffer capacity, segments). */
  /* A detached commit (ckpt_detach.c): decided once its record is journaled;
   * from then on it is never aborted by a call or a rule, only by a failure. */
  bool detach_started;    /* The decision job was submitted. */
  bool detached;          /* The decision is journaled (A/ detached_at_ms). */
  int64_t detached_at_ms; /* Unix ms of the decision. */
  struct commit_wait *waits;
  struct attempt *next;
};

/* A Begin between admission and its attempt in the table (journal write). */
struct begin_pending {
  const char *job;
  struct begin_pending *next;
};

struct ckpt_writer {
  struct ckpt_service *svc;
  struct attempt *att;
  uint32_t rank;
  ckpt_write_event_fn on_event;
  void *arg;
  uint64_t bytes;
  bool waiting; /* On the budget wait list. */
  bool staged_sent;
  struct ckpt_writer *next_wait;
};

/* A deferred writer event (delivered from a loop callback, never inside the
 * call that caused it). */
struct wevent {
  struct ckpt_writer *w;
  enum ckpt_write_event ev;
  int err;
  char *msg;
  struct wevent *next;
};

/* An attempt directory found orphaned ("PREFIX/JOB/step-N/attempt-ID/"),
 * and when first (wall clock), kept until it is removed or claimed. */
struct ckpt_orphan_dir {
  char *dir;
  int64_t first_ms;
};

struct ckpt_service {
  uv_loop_t *loop;
  struct ckpt_service_opts o;
  char *url, *prefix;
  struct kv *kv;
  struct storage *st;
  bool own_storage;
  struct ckpt_pool *up, *work, *read;
  struct ckpt_mcache *mcache;   /* Manifests recently loaded (ckpt_mcache.c). */
  struct ckpt_fetches *fetches; /* Object bytes reads share (ckpt_fetch.c). */
  uv_timer_t sweep;
  uv_timer_t hold_timer; /* Ends holds for ranks not heard from (ckpt__upload_release_held). */
  uv_async_t events_async;
  struct wevent *events, *events_tail;
  struct attempt *attempts;
  struct ckpt_reader *readers;  /* Reads not yet freed (ckpt_restore.c). */
  uint64_t read_reserved;       /* What their batches reserved of the read budgets. */
  bool read_freed;              /* A batch gave budget back since the last retry. */
  struct begin_pending *begins; /* Begin jobs in flight (they count as their job's attempts). */
  struct ckpt_writer *wait_head, *wait_tail;
  uint64_t staged;
  uint32_t parts_outstanding; /* Parts handed to upload, not yet done. */
  struct ckpt_service_stats stats;
  /* Orphaned-upload GC (ckpt_orphans.c). */
  uint64_t orphans_next_ms; /* uv_now of the next run. */
  bool orphans_running;
  bool orphans_off; /* The store cannot list uploads. */
  /* Orphaned attempt directories (ckpt_orphan_attempts.c). The list is read
   * and replaced only by the running sweep (one at a time, on the work pool)
   * and freed at close. */
  uint64_t orphan_attempts_next_ms; /* uv_now of the next run. */
  bool orphan_attempts_running;
  struct ckpt_orphan_dir *orphan_dirs;
  size_t n_orphan_dirs;
  bool closing;
  bool finishing;
  uint32_t handles_open;
  void (*close_done)(void *);
  void *close_arg;
  /* Commit hook calls found by recovery, fired from the loop after open. */
  struct hook_call *pending_hooks;
  struct ckpt_shm *shm;  /* NULL: shared-memory staging is off. */
  uint64_t shm_swept_ms; /* uv_now of the last periodic segment sweep. */
};

struct commit_result {
  int64_t committed_at_ms;
  char manifest_key[STORAGE_KEY_MAX + 1];
};

/* ---- ckpt_events.c (leaf) ---- */
/* ---- ckpt_store.c: a pool task waiting for a storage request ---- */

/* Embedded in the task; res holds the answer when work runs again. */
struct ckpt_store_call {
  struct ckpt_pool *pool;
  struct ckpt_task *t;
  struct storage_result res; /* Zeroed before first use; cleared by the next call. */
};

/* From t's work on pool: parks t and sends rq to st; when the store
 * answers, c->res holds the answer and t's work runs again on pool. The
 * caller returns from work at once without touching t or c. */
void ckpt__store(struct ckpt_store_call *c, struct ckpt_pool *pool, struct ckpt_task *t,
                 struct storage *st, const struct storage_req *rq);

int64_t ckpt__svc_now_ms(void);
void ckpt__svc_probe(struct ckpt_service *s, const char *point);
void ckpt__svc_post_event(struct ckpt_service *s, struct ckpt_writer *w, enum ckpt_write_event ev,
                          int err, const char *msg);
/* Drops the events of a writer being closed. */
void ckpt__svc_forget_writer(struct ckpt_service *s, struct ckpt_writer *w);
/* Fires queued commit and abort hooks, then delivers queued writer events. */
void ckpt__svc_deliver_events(struct ckpt_service *s);
void ckpt__svc_drop_events(struct ckpt_service *s);
void ckpt__svc_queue_hook(struct ckpt_service *s, const char *job, int64_t step, const char *uri);
void ckpt__svc_queue_abort_hook(struct ckpt_service *s, const char *job, int64_t step,
                                const char *attempt, const char *reason);
void ckpt__svc_free_hooks(struct hook_call *h);
/* Answer done(arg, ...) from a later loop callback: an error, a's
 * reference, or a static reply. */
void ckpt__svc_fail_later(struct ckpt_service *s, ckpt_done_fn done, void *arg, int err,
                          const char *msg);
void ckpt__svc_ref_later(struct ckpt_service *s, struct attempt *a, ckpt_done_fn done, void *arg);
void ckpt__svc_reply_later(struct ckpt_service *s, const ProtobufCMessage *resp, ckpt_done_fn done,
                           void *arg);
#define FAIL_LATER(...)                                                                            \
  do {                                                                                             \
    ckpt__svc_fail_later(__VA_ARGS__);                                                             \
    return;                                                                                        \
  } while (0)

/* ---- ckpt_attempt.c (loop thread unless marked blocking) ---- */
struct attempt *ckpt__attempt_find(struct ckpt_service *s, const char *id);
/* Attempts not DONE. */
uint32_t ckpt__attempt_count_live(const struct ckpt_service *s);
/* A new OPEN attempt in the table (NULL: out of memory). */
struct attempt *ckpt__attempt_new(struct ckpt_service *s, const char *id, const char *job,
                                  int64_t step, uint32_t world, int64_t created_at_ms);
/* Remembers an outcome found by recovery so that Commit(attempt) can answer
 * it; a commit also queues the commit hook. */
void ckpt__attempt_recovered(struct ckpt_service *s, const Stoker__V1__JournalAttempt *rec,
                             int result, int64_t committed_at_ms, const char *manifest_uri);
/* A stream of a was opened, closed or fed (for the abandoned-attempt rule). */
void ckpt__attempt_touch(struct attempt *a);
/* OPEN -> COMMITTING; false in any other state. */
bool ckpt__attempt_commit_start(struct attempt *a);
/* COMMITTING -> DONE(0); calls the commit hook. */
void ckpt__attempt_committed(struct attempt *a, int64_t committed_at_ms, const char *manifest_uri);
/* OPEN or COMMITTING -> ABORTING: fails a's writers, frees its unsent
 * staging, cleans up once its jobs are over. No-op when already ending. */
void ckpt__attempt_abort(struct attempt *a, int err, const char *msg);
/* Called whenever an aborting attempt may have no jobs left. */
void ckpt__attempt_check_abort(struct attempt *a);
/* Budget: a part's or a segment's memory goes back; waiters are resumed. */
void ckpt__attempt_free_part(struct ckpt_service *s, struct part *p);
void ckpt__attempt_release_segment(struct ckpt_service *s, struct obj *o);
void ckpt__attempt_budget_wake(struct ckpt_service *s);
void ckpt__attempt_wait_add(struct ckpt_service *s, struct ckpt_writer *w);
void ckpt__attempt_wait_remove(struct ckpt_service *s, struct ckpt_writer *w);
/* Removes segment files of attempts that are over or unknown. */
void ckpt__attempt_sweep_segments(struct ckpt_service *s);
/* From the sweep timer: timeouts, abandoned attempts, pruning, segments. */
void ckpt__attempt_sweep(struct ckpt_service *s);
/* At close, once every job is over. */
void ckpt__attempt_free_all(struct ckpt_service *s);
/* Blocking: deletes the manifest key, aborts uploads, deletes objects and
 * drops the attempt's records (recovery and the cleanup job). */
int ckpt__attempt_cleanup_run(struct ckpt_service *s, const char *attempt);
/* Blocking: deletes what no manifest and no A/ record claims under the
 * job's directory (attempts of a lost journal). */
int ckpt__attempt_collect_run(struct ckpt_service *s, const char *job);

/* ---- ckpt_admit.c (loop thread; above ckpt_attempt.c) ---- */
/* Whether job may begin an attempt for step: 0, or STK_EBUSY (detail names
 * the limit). May abort the job's own idle older attempts and, at the
 * service cap, the oldest open attempt of the job holding the most. */
int ckpt_admit(struct ckpt_service *s, const char *job, int64_t step);

/* ---- ckpt_staging_shm.c ---- */
/* Feeds a validated chunk whose bytes are in shm segment c->shm_name
 * (len bytes at c->shm_offset): 0, CKPT_WRITE_WAIT or a negative error. */
int ckpt__staging_feed_shm(struct ckpt_writer *w, const Stoker__V1__WriteChunk *c, uint64_t len);
/* ---- ckpt_staging_obj.c (below both feeds: calls neither) ---- */
struct obj *ckpt__staging_obj_new(struct attempt *a, uint32_t rank);
int ckpt__staging_add_chunk(struct obj *o, const Stoker__V1__WriteChunk *c, uint64_t len);
/* The object's part being filled; a new one (the next number) when none.
 * NULL when out of memory. */
struct part *ckpt__staging_open_part(struct obj *o);
/* p took n more bytes; once full it goes to the uploader. */
void ckpt__staging_part_took(struct ckpt_service *s, struct obj *o, struct part *p, size_t n);
void ckpt__staging_relieve(struct ckpt_service *s);

/* ---- ckpt_detach.c (above ckpt_upload.c) ---- */
/* A detached Commit of a (not DONE): answered once the commit is decided. */
void ckpt__detach_wait(struct attempt *a, ckpt_done_fn done, void *arg);
/* Decides a's detached commit when it is asked for and every rank sent
 * "last"; called after each rank's "last". */
void ckpt__detach_progress(struct attempt *a);

/* ---- ckpt_upload.c ---- */
void ckpt__upload_part_ready(struct obj *o, struct part *p);
void ckpt__upload_seal(struct obj *o);
void ckpt__upload_progress(struct attempt *a);
/* Starts every held segment PUT of a once no rank of it is copying into
 * segments any more, or at once when force (memory is needed). */
void ckpt__upload_release_held(struct attempt *a, bool force);

/* ---- ckpt_commit.c (blocking) ---- */
int ckpt_commit_run(struct ckpt_service *s, const char *attempt, struct commit_result *ret);
int ckpt_retention_run(struct ckpt_service *s, const char *job);
int ckpt_committed_steps(struct ckpt_service *s, const char *job, int64_t **ret, size_t *ret_n);
int ckpt_journal_parts(struct kv *kv, const char *attempt, uint32_t rank, uint32_t index,
                       uint32_t n_parts, Stoker__V1__JournalPart ***ret_parts);
void ckpt_journal_parts_free(Stoker__V1__JournalPart **parts, uint32_t n_parts);
char *ckpt_manifest_uri(const struct ckpt_service *s, const char *key);

/* ---- ckpt_gc.c (blocking) ---- */
int ckpt_delete_run(struct ckpt_service *s, const char *job, int64_t step);
int ckpt_delete_finish(struct ckpt_service *s, const char *job, int64_t step);
struct ckpt_keylist {
  char **keys;
  size_t n, cap;
};
/* Appends every key under prefix (storage_list). */
int ckpt_keylist_list(struct ckpt_service *s, const char *prefix, struct ckpt_keylist *l);
void ckpt_keylist_free(struct ckpt_keylist *l);
/* Whether attempt (len bytes, not NUL-terminated) has an A/ record. */
bool ckpt_gc_attempt_journaled(struct ckpt_service *s, const char *attempt, size_t len);
int ckpt_delete_dir(struct ckpt_service *s, const char *dir_key);
/* Aborts every multipart upload under dir_key (an aborted attempt's
 * directory), journaled or not: an upload created just before a crash and
 * never journaled is found this way. Best effort; 0 where the store cannot
 * list uploads (the orphan GC's grace period covers those). */
int ckpt_abort_uploads_under(struct ckpt_service *s, const char *dir_key);
/* Aborts the multipart uploads under the service's prefix that began at
 * least grace_ms before now_ms (wall clock) and whose key names an attempt
 * with no A/ record; keys the service does not write and uploads whose
 * begin time the store does not give are left alone. *ret_aborted counts
 * the uploads aborted, also on failure (the first error is returned;
 * STK_ENOTSUP when the store cannot list uploads). */
int ckpt_gc_orphan_uploads(struct ckpt_service *s, int64_t now_ms, uint64_t grace_ms,
                           uint64_t *ret_aborted);
/* Whether the journal claims the attempt: an A/ record (open, committing,
 * aborting), or the C/ or D/ record of (job, step) naming it (committed,
 * being deleted). Read after a listing, it sees every attempt claimed when
 * the listing ran. */
bool ckpt_gc_attempt_claimed(struct ckpt_service *s, const char *job, int64_t step,
                             const char *attempt);
struct ckpt_orphan_sweep {
  uint64_t attempts; /* Attempt directories removed. */
  uint64_t objects;  /* Objects deleted from them. */
  uint64_t waiting;  /* Orphaned directories still in their grace period. */
};
/* Lists the keys under the service's prefix and removes the attempt
 * directories that hold no manifest and that the journal does not claim
 * (ckpt_gc_attempt_claimed), once found so by runs grace_ms apart (now_ms,
 * wall clock): objects deleted, uploads under them aborted. Directories
 * found so for the first time are remembered in s->orphan_dirs. Keys the
 * service does not write are left alone. The first error is returned. */
int ckpt_gc_orphan_attempts(struct ckpt_service *s, int64_t now_ms, uint64_t grace_ms,
                            struct ckpt_orphan_sweep *ret);
void ckpt_gc_orphan_dirs_free(struct ckpt_service *s);

/* ---- ckpt_restore.c (loop thread) ---- */
/* Reads whose next batch waited for the read budgets try again. */
void ckpt_read_retry(struct ckpt_service *s);

/* ---- ckpt_calls.c (blocking) ---- */
struct ckpt_manifest;
/* The manifest of a committed checkpoint, held (*ret_hold, its bytes in
 * ret_hold->buf): parsed, checked and indexed by tensor, read-only and
 * shared with other callers until ckpt_release_manifest. STK_ENOENT when
 * not committed. The journal first, then s->mcache (loaded from storage
 * and parsed once for concurrent and repeated calls, ckpt_mcache.c). */
int ckpt_load_manifest(struct ckpt_service *s, const char *job, int64_t step,
                       const struct ckpt_manifest **ret_m, struct ckpt_mcache_hold *ret_hold);
void ckpt_release_manifest(struct ckpt_service *s, struct ckpt_mcache_hold *hold);
/* With shared storage: imports the manifest of (job, step) another replica
 * committed, when storage holds one and the journal has no C/ record of it
 * (0: imported or known; STK_ENOENT: storage holds none). */
int ckpt_import_step(struct ckpt_service *s, const char *job, int64_t step);

/* ---- ckpt_recover.c (blocking, at open) ---- */
int ckpt_recover(struct ckpt_service *s);

/* ---- ckpt_orphans.c (loop thread) ---- */
/* Runs orphan-upload GC once, blocking (at open, after recovery). */
void ckpt_orphans_open(struct ckpt_service *s);
/* From the sweep timer: starts a run on the work pool when one is due. */
void ckpt_orphans_tick(struct ckpt_service *s);

/* ---- ckpt_orphan_attempts.c (loop thread) ---- */
/* From the sweep timer: starts a sweep of orphaned attempt directories on
 * the work pool when one is due. */
void ckpt_orphan_attempts_tick(struct ckpt_service *s);

#endif
