/*
 * coord_internal: the coordinator's in-memory model, shared by its files,
 * and their functions in ladder order (see "The ladder" below). One struct
 * coord owns jobs (hash by name); a job owns its members (hash by id plus a
 * list ordered by lease deadline), its open round's parked joins, barriers,
 * KV entries and an event ring. Every answer goes through a struct
 * coord_wait queued in seq order and released once durable.
 */
#ifndef STK_COORD_INTERNAL_H
#define STK_COORD_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "coord.h"
#include "coord_base.h"
#include "kv.h"
#include "utf8.h"

/* ---- Model -------------------------------------------------------------- */

struct member {
  struct hnode hn;   /* job->members or job->prev */
  struct list lease; /* job->leases, by deadline */
  struct list dirty; /* c->dirty_members */
  struct job *job;
  char *id, *address, *host, *message;
  uint32_t rank;
  int64_t deadline;   /* Loop time (ms) when the lease ends. */
  int64_t last_hb_ms; /* Unix ms. */
  uint64_t step;
  /* HeartbeatRequest.stop_step: the step it and its peers agreed to stop
   * at (0: none). In memory only: the rank sends it in every heartbeat. */
  int64_t stop_step;
  double tps, loss;
  Stoker__V1__RankHealth health;
  /* told_stop: a STOP that ends its seat (a forced pause's; a pause's STOP
   * with a checkpoint step leaves the seat until the member leaves). */
  bool told_ckpt, told_stop;
  bool finished;            /* Left with finished: holds no lease, answers STOP. */
  uint64_t asked_threshold; /* checkpoint_every_steps threshold already asked. */
};

struct kv_entry {
  struct hnode hn;
  char *key;
  uint8_t *value;
  size_t len;
  bool present;
  struct list waiters; /* Parked KvGets. */
};

struct barrier {
  struct hnode hn;
  char *name;
  struct htab arrived; /* member id -> coord_wait */
  struct list waits;
  uint32_t n;
};

struct event_slot {
  uint8_t *buf; /* Packed Stoker__V1__JobEvent. */
  size_t len;
  uint64_t dseq; /* Change seq: deliverable once durable_seq >= dseq. */
};

/* The event ring of a deleted job, kept for its watchers that had not
 * received every event yet; freed with the last of them. */
struct event_tomb {
  int refs;
  struct event_slot *slots; /* [max_events_per_job] */
  uint64_t first, last;
  uint8_t *final; /* The DELETED event, seq last + 1. */
  size_t final_len;
  uint64_t final_dseq;
};

struct job {
  struct hnode hn;
  struct coord *c;
  char *name;
  Stoker__V1__JobSpec *spec; /* Unpacked, owned; defaults applied. */
  Stoker__V1__JobState state;
  uint64_t generation;
  uint32_t world, target;
  uint64_t
      target_seq; /* The SCALED event's seq of the ScaleJob that set target (Job.target_seq). */
  int64_t ckpt_step, ckpt_at_ms;
  uint64_t ckpt_gen;
  char *ckpt_uri;
  int64_t created_ms, updated_ms;
  char *reason;
  /* Current generation. */
  struct htab members;
  struct member **by_rank; /* [world]; NULL where a member left. */
  uint32_t n_members;
  uint32_t n_finished; /* Members that left finished: the job is finishing. */
  struct list leases;
  struct htab prev; /* Last generation that ran, while none runs: rank order. */
  /* Open round. */
  struct list joiners; /* Parked joins by arrival. */
  struct htab joiners_by_id;
  uint32_t n_joiners;
  uint64_t
      kv_bytes; /* What its KV entries hold (coord_sync.c's charge), in c->stats.kv_bytes too. */
  uint64_t arrivals;
  int64_t last_call_at; /* Loop ms; 0: not armed. */
  /* The change seq of the last round close while its members have not been
   * told their seats: their leases start once it is durable (the Joins are
   * answered then), not at the close. 0: the leases run. */
  uint64_t leases_dseq;
  /* Synchronisation (current generation). */
  struct htab barriers, kv;
  /* Events: slots[seq % cap] for seq in [first_event_seq, last_event_seq]. */
  struct event_slot *events;
  uint64_t first_event_seq, last_event_seq;
  /* Operator actions (persisted in the JobRecord but for the deadlines,
   * which a restart re-arms). */
  bool scale_pending, pause_force, pause_ckpt_seen;
  int64_t scale_step, pause_step, scale_deadline, pause_deadline;
  /* A preemption (coord_ops.c): its reason while the job pauses, is paused
   * or resumes by itself (NULL: none); the checkpoint its members staged
   * before leaving, which the next round waits for until await_deadline. */
  char *preempted;
  int64_t awaited_step, await_deadline;
  /* coord_now() of the preemption notice that made a running job PAUSING
   * (0: none): PAUSED, once every member left, measures the time to stage
   * (coord_opts.preempt_staged). In memory only. */
  int64_t preempt_notice_ms;
  /* A submitted job (spec->submission): the queue controller's last report
   * (coord_queue.c), owned; NULL until the first. Kept in the JobRecord's
   * Job. */
  Stoker__V1__QueueStatus *queue;
  /* The world of the last round that closed (coord_rendezvous.c): the next
   * close logs SHRUNK or GROWN against it. In the JobRecord. */
  uint32_t last_world;
  /* Members of the previous generation left without a seat when the last
   * round closed full at an operator's target (a scale-down): their Join
   * and heartbeat are told they are not needed. In memory only; replaced
   * at every close. */
  char **surplus;
  uint32_t n_surplus;
  /* A submitted job's shrink in place (ScaleJobRequest.in_place,
   * coord_ops.c): shrink_from, the world when ScaleJob armed it (0: none),
   * kept until the round it opens closes; removed, the ids of the members
   * that reported terminating or left with a checkpoint step meanwhile, at
   * most shrink_from - target of them: those whose pods are deleted, not a
   * preemption notice, no seat in the round (at its close they join the
   * surplus). In the JobRecord. */
  uint32_t shrink_from;
  char **removed;
  uint32_t n_removed;
  bool dirty;
  struct list dirty_link;
};

enum wait_kind { WAIT_PLAIN, WAIT_JOIN, WAIT_BARRIER, WAIT_KVGET, WAIT_WATCH };

struct coord_wait {
  struct list link; /* Parked list, c->watchers, or c->ready. */
  struct hnode hn;  /* joiners_by_id or barrier->arrived. */
  enum wait_kind kind;
  bool parked, queued;
  struct coord *c;
  struct job *job;
  coord_done_fn done;
  void *arg;
  /* Set by whoever parks w (rendezvous, sync): takes w out of the job's
   * structures once it is answered or cancelled (its link is already off
   * the parked list). NULL when the link is all there is. */
  void (*unpark)(struct coord_wait *w);
  /* Set by whoever gives w data of its kind (the union below): frees it
   * with w. */
  void (*dispose)(struct coord_wait *w);
  /* The answer. */
  uint64_t seq;
  int err;
  char *errmsg;
  const ProtobufCMessageDescriptor *desc;
  uint8_t *resp;
  size_t resp_len;
  union {
    struct {
      char *member_id, *address, *host;
      uint64_t arrival;
      int64_t deadline;
    } join;
    struct {
      struct barrier *group;
      char *member_id;
    } barrier;
    struct {
      struct kv_entry *entry;
    } kvget;
    struct {
      coord_event_fn on_event;
      uint64_t next_seq;
      bool ready, caught_up, in_cb, cancel;
      struct event_tomb *tomb; /* Set (and job NULL) once the job is deleted. */
    } watch;
  } u;
};

struct coord {
  uv_loop_t *loop;
  struct kv *kv;
  struct coord_opts opts;
  struct htab jobs;
  /* Group commit (coord_store.c). */
  struct kv_batch *batch, *writing;
  bool batch_sync, batch_any, inflight, writing_sync;
  uint64_t change_seq, writing_seq, durable_seq;
  int write_err, broken;
  uv_work_t work;
  struct list dirty_jobs, dirty_members;
  int64_t next_stats_flush;
  /* Completions. */
  struct list ready;
  struct list watchers;
  struct list watch_todo; /* Watchers not yet pumped in the current pass. */
  uv_timer_t tick;
  uv_idle_t idle;
  uv_idle_cb pass; /* coord.c's idle pass, which coord_kick starts. */
  struct coord_stats stats;
  bool closing, finalizing;
  int handles_open;
  coord_close_fn close_done;
  void *close_arg;
};

/* ---- The ladder ------------------------------------------------------------
 * The declarations below go up the ladder: each file calls functions of
 * coord_base.h and of the files declared before its own, never after, so no
 * two files call each other (the coordinator suite's coord-ladder test
 * checks this on the objects). A new function goes in the lowest file
 * whose callees it needs; a call that would climb becomes a callback set
 * from above, as a wait's unpark and dispose are. */

/* ---- coord_validate.c: names, keys and job specs (calls nothing) --------- */
bool coord_valid_job_name(const char *s);
bool coord_valid_member_id(const char *s);
bool coord_valid_key(const char *s); /* KV keys and barrier names. */
/* Checks spec (its submission too) and fills defaults into *spec; msg gets
 * the reason, naming the field. */
int coord_spec_check(Stoker__V1__JobSpec *spec, char *msg, size_t msg_len);
/* A queue controller's report (ReportQueueRequest.status) for a job of at
 * most max_ranks; msg gets the reason, naming the field. */
int coord_queue_status_check(const Stoker__V1__QueueStatus *st, uint32_t max_ranks, char *msg,
                             size_t msg_len);

/* ---- coord_wait.c: completions ------------------------------------------ */
struct coord_wait *coord_wait_new(struct coord *c, enum wait_kind kind, coord_done_fn done,
                                  void *arg);
/* Queues the answer (resp may be NULL for errors); released once durable. */
void coord_answer(struct coord_wait *w, const ProtobufCMessage *resp);
void coord_fail(struct coord_wait *w, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void coord_release(struct coord *c);
/* Looks up a job or fails w with STK_EINVAL / STK_ENOENT / STK_EUNAVAIL. */
struct job *coord_job_or_fail(struct coord *c, const char *name, struct coord_wait *w);

/* ---- coord_job.c: the job and its members as records and messages ------- */
uint32_t coord_job_cap(const struct job *j);
/* STOPPED or FINISHED: terminal, no round opens again. */
bool coord_job_ended(const struct job *j);
int64_t coord_job_lease_ms(const struct job *j);
/* How long a scale or pause waits for a checkpoint, and a resumed round
 * for the one its members staged: scale_timeout_beats intervals. */
int64_t coord_job_ckpt_wait_ms(const struct job *j);
/* The highest step a member of the generation reported. */
int64_t coord_job_members_step(const struct job *j);
void coord_answer_job(struct coord_wait *w, struct job *j);
/* A Job message pointing into the model; valid until the model changes. */
struct job_view {
  Stoker__V1__Job job;
  Stoker__V1__CheckpointRef ck;
  Stoker__V1__Member *mem;
  Stoker__V1__Member **ptrs;
  char *token; /* job.next_members_page_token when set (malloc'd). */
};
/* with_members: the first page of members (coord_member_page). */
void coord_job_view_init(struct job_view *v, struct job *j, bool with_members);
void coord_job_view_free(struct job_view *v);
/* One page of the current generation's members, by rank from rank `from`
 * on: at most `size` (0: opts.members_per_page, or no count bound) within
 * PAGE_MAX_BYTES, never none while one is left. */
struct member_page {
  Stoker__V1__Member *mem;
  Stoker__V1__Member **ptrs;
  size_t n;
  char *token; /* The next page's token; NULL on the last page. */
};
void coord_member_page(struct job *j, uint32_t from, uint32_t size, struct member_page *ret_page);
void coord_member_page_free(struct member_page *p);
/* The rank a ListMembers token resumes from: STK_EINVAL (not a token, with
 * a detail), STK_EABORTED (another generation or world size), STK_ENOMEM. */
int coord_member_token_decode(const struct job *j, const char *token, uint32_t *ret_from);
/* Packs the JobRecord (no members, no waiting; pending operator actions)
 * into a malloc'd buffer. */
uint8_t *coord_job_record_pack(struct job *j, size_t *ret_len);
void coord_member_fill(const struct member *m, Stoker__V1__Member *out);
/* One allocation holding the member and its id, address and host; the
 * message changes only through coord_member_set_message. */
struct member *coord_member_new(const char *id, const char *address, const char *host);
void coord_member_set_message(struct member *m, const char *message);
void coord_member_free(struct member *m);

/* ---- coord_store.c: the RocksDB layout and group commit ----------------- */
void coord_store_put(struct coord *c, const void *k, size_t kl, const void *v, size_t vl);
void coord_store_del(struct coord *c, const void *k, size_t kl);
void coord_store_del_prefix(struct coord *c, const char *prefix, size_t len);
/* Unsynced changes: written with the next batch, synced only if that batch
 * is (they survive kill -9 of the coordinator, not the loss of the host). */
void coord_store_put_lazy(struct coord *c, const void *k, size_t kl, const void *v, size_t vl);
void coord_store_del_lazy(struct coord *c, const void *k, size_t kl);
void coord_store_job(struct job *j); /* Marks the job record dirty. */
void coord_store_job_lazy(struct job *j);
void coord_job_touch(struct job *j, const char *reason); /* updated_at + dirty. */
void coord_store_member(struct job *j, struct member *m);
void coord_store_member_lazy(struct member *m);
/* Keys: "k/<job>/<gen>/" prefix into buf (>= 300 bytes); returns length. */
size_t coord_key_kv_prefix(char *buf, const char *job, uint64_t gen);
void coord_store_maybe_commit(struct coord *c);
bool coord_store_idle(const struct coord *c);

/* ---- coord_events.c: event rings and watchers -------------------------- */
void coord_event(struct job *j, Stoker__V1__JobEventType type, const char *member_id, int64_t step,
                 const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* The same for an event that needs no fsync of its own (a parked Join's,
 * whose reply waits for the round's synced close): stored unsynced
 * (coord_store_put_lazy), delivered to watchers once written. */
void coord_event_lazy(struct job *j, Stoker__V1__JobEventType type, const char *member_id,
                      int64_t step, const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* coord_event whose world_size is world instead of the job's (ADMITTED:
 * the ranks an admission covers). */
void coord_event_sized(struct job *j, Stoker__V1__JobEventType type, uint32_t world, int64_t step,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Loads one stored event (at open). */
void coord_event_restore(struct job *j, uint64_t seq, const uint8_t *buf, size_t len);
void coord_events_free(struct job *j);
void coord_watch_pump_all(struct coord *c);
void coord_watch_job_deleted(struct job *j);
void coord_watch_end(struct coord_wait *w, int err, const char *msg);

/* ---- coord_sync.c: barriers and the generation-scoped KV --------------- */
void coord_sync_end_generation(struct job *j, int err, const char *msg);
/* A KV entry of the current generation read back at open (charged to the
 * job like a KvSet, never refused). */
void coord_kv_restore(struct job *j, const char *key, size_t key_len, const uint8_t *value,
                      size_t len);
/* A member finished, or left a finishing job or one shrinking in place:
 * answers the barriers every member still seated and unfinished reached. */
void coord_sync_members_gone(struct job *j);

/* ---- coord_rendezvous.c: Join and the round ---------------------------- */
void coord_round_open(struct job *j, const char *reason);
void coord_round_check(struct job *j); /* Close when full; arm last call. */
void coord_round_close(struct job *j);
/* Fails every parked call of a job (joins too when with_joins). */
void coord_fail_parked(struct job *j, bool with_joins, int err, const char *msg);
/* Ends the current generation's membership: its members become the rank
 * order of the next round (their records stay). No-op while none runs. */
void coord_members_clear(struct job *j);
void coord_member_remove(struct job *j, struct member *m);
/* Whether id was left out by the last close at the cap (see job.surplus)
 * and has no seat now: such a member is not needed. */
bool coord_surplus_has(const struct job *j, const char *id);
void coord_surplus_clear(struct job *j);
/* A shrink in place (job.shrink_from, job.removed): whether id is one of
 * the members it removes; coord_shrink_remove marks id as one while the
 * shrink is armed and fewer than shrink_from - target are (id a member of
 * the shrinking generation), and says whether it is one now. */
bool coord_shrink_removes(const struct job *j, const char *id);
bool coord_shrink_remove(struct job *j, const char *id);
void coord_shrink_clear(struct job *j);
/* Whether the open round waits for the checkpoint the last generation's
 * members staged before leaving (job.awaited_step, until await_deadline). */
bool coord_round_held(const struct job *j);
/* Whether a member of the last generation may still come back to the open
 * round: it has not joined it, and its lease (as of its last heartbeat of
 * that generation) has not run out. The round's last call waits for it,
 * within the cap: a rank slower to rejoin than the others (one that heard
 * the resize late, one still staging) is not left out, which would make
 * its later Join open another round and restore the same checkpoint, the
 * steps trained in between trained twice. */
bool coord_round_awaits_prev(const struct job *j, int64_t now);
/* A preempted, paused job whose ranks are back (a Join) resumes: WAITING. */
void coord_readmit_maybe(struct job *j);
/* A submitted job's grow: scales at a step boundary (coord_scale_arm) once
 * world plus parked spares reach the target. */
void coord_scale_grow_maybe(struct job *j);
/* ScaleJob's wait for a checkpoint newer than the last, the members told
 * CHECKPOINT_NOW again (coord_members_reset_told); ReportCheckpoint or the
 * deadline opens the scale's round (coord_ops.c). */
void coord_scale_arm(struct job *j);
void coord_members_reset_told(struct job *j);

/* ---- coord_ops.c: operator actions ------------------------------------- */
void coord_pause_maybe_done(struct job *j);
/* A preemption notice (see coord_preempt_job): 0, or STK_ESTATE for an
 * ended job. A second notice changes nothing. */
int coord_preempt(struct job *j, const char *reason);
/* A member left a pausing (or paused) job after staging the checkpoint of
 * step: the next round waits for it, and the pause's checkpoint is one of
 * at least that step (coord_stop_floor). */
void coord_pause_await(struct job *j, int64_t step);
/* A member said it and its peers stop at stop_step (HeartbeatRequest.
 * stop_step, or a Leave's checkpoint_step): a checkpoint below it is not
 * the pause's, nor a pending resize's. */
void coord_stop_floor(struct job *j, int64_t stop_step);
/* A pending resize's round opens on its checkpoint once every member still
 * seated said its stop step (a member removed by a shrink in place is not
 * waited for). */
void coord_scale_open_maybe(struct job *j);
void coord_ops_sweep(struct job *j, int64_t now);
/* After a restart: fresh deadlines for a pending scale or pause. */
void coord_ops_rearm(struct job *j);

/* ---- coord_lease.c: heartbeats, leaves, the sweep ---------------------- */
void coord_lease_sweep(struct coord *c);

/* ---- coord_catalog.c: a job's life ------------------------------------- */
struct job *coord_job_new(struct coord *c, Stoker__V1__JobSpec *spec);
void coord_job_free(struct job *j);

/* ---- coord_load.c: the model rebuilt at open --------------------------- */
int coord_store_load(struct coord *c);

#endif
