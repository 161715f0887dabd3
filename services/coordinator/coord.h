/*
 * coord: the coordinator's job state machine as a library ("embedded mode").
 * The gRPC daemon is a thin adapter over this header: each Coordinator RPC
 * maps to exactly one coord_* call below, taking the unpacked request and
 * answering through a completion callback. Tests and trainers can run the
 * same engine in-process. The semantics are those of
 * proto/stoker/v1/coordinator.proto; this header adds the C contract.
 *
 * Threading: a struct coord lives on ONE libuv loop (given to coord_open).
 * Every call below must be made on that loop's thread, and every callback
 * runs on it. Blocking RocksDB writes run on the libuv threadpool.
 *
 * Completion: every operation takes a coord_done_fn that is called exactly
 * once, never synchronously from inside the call that started it (always
 * from a later loop callback), except coord_cancel() which completes the
 * cancelled operation synchronously. `resp` is the reply message (the type
 * named at each call), valid only during the callback; on failure err is a
 * negative STK_E* code, errmsg a one-line reason and resp NULL. Map err to a
 * gRPC status with stk_error_to_grpc().
 *
 * Durability: a completion is released only after every change made before
 * it was produced has been written to RocksDB with a synced write (group
 * commit: concurrent changes share one fsync). Heartbeat statistics are the
 * exception: they are persisted lazily (a few seconds late at most).
 *
 * Errors common to all calls: STK_EINVAL (bad name, key, bounds; nothing is
 * changed), STK_ENOENT (unknown job), STK_EUNAVAIL (the coordinator is
 * closing), STK_EIO (the store failed a write; the coordinator then refuses
 * further work with STK_EUNAVAIL).
 */
#ifndef STK_COORD_H
#define STK_COORD_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "stoker/v1/coordinator.pb-c.h"

struct coord;
/* A parked operation (Join, Barrier, KvGet with wait, WatchJob). The handle
 * is valid from the call that returns it until its done callback begins. */
struct coord_wait;

typedef void (*coord_done_fn)(void *arg, int err, const char *errmsg, const ProtobufCMessage *resp);

/* Called for each event of a watch, in seq order. Return true to receive
 * the next one at once, false to hold delivery until coord_watch_resume()
 * (flow control: a gRPC stream has one send outstanding). */
typedef bool (*coord_event_fn)(void *arg, const Stoker__V1__JobEvent *ev);

typedef void (*coord_close_fn)(void *arg);

struct coord_opts {
  const char *dir;              /* RocksDB directory; created if missing. Required. */
  uint32_t tick_ms;             /* Sweep timer period (leases, last call, timeouts); 20. */
  uint32_t max_events_per_job;  /* Events kept per job (older deleted); 10000. */
  uint32_t watch_queue_max;     /* Live events a watcher may fall behind; 1024. */
  uint32_t stats_flush_ms;      /* Lazy persistence period of heartbeat stats; 2000. */
  uint32_t scale_timeout_beats; /* Heartbeat intervals a scale/pause waits for a checkpoint; 10. */
  uint64_t kv_bytes_per_job;    /* Key-value bytes one job's generation may hold; 64 MiB. */
  uint64_t kv_bytes;            /* Key-value bytes all jobs together may hold; 1 GiB. */
  uint64_t write_buffer_bytes;  /* RocksDB memtable size; 0: RocksDB's 64 MiB. */
  /* Called on the loop when a preempted job's members are all gone after a
   * preemption notice (each left once its checkpoint was staged): seconds
   * from the notice to then, what a pod's terminationGracePeriodSeconds
   * must cover (the daemon's stoker_preempt_stage_seconds). May be NULL. */
  void (*preempt_staged)(void *arg, const char *job, double seconds);
  void *preempt_staged_arg;
};

/* JobEventType values counted apart (coord_stats.events_by_type). */
#define COORD_EVENT_TYPES 32

struct coord_stats {
  uint64_t jobs;          /* Jobs known now. */
  uint64_t members;       /* Members of current generations, all jobs. */
  uint64_t parked;        /* Parked Joins, Barriers and KvGets now. */
  uint64_t watchers;      /* Open watches now. */
  uint64_t synced_writes; /* RocksDB batches written with sync=true. */
  uint64_t writes;        /* All RocksDB batches written. */
  uint64_t heartbeats;    /* Heartbeats handled. */
  uint64_t joins;         /* Joins handled. */
  uint64_t events;        /* Events recorded. */
  /* Events recorded by JobEventType (index: the enum's value). */
  uint64_t events_by_type[COORD_EVENT_TYPES];
  uint64_t kv_bytes; /* Key-value bytes held now, all jobs (keys, values, overhead). */
};

/* Opens the store in opts->dir, loads every job, member, KV entry and
 * event, records a COORDINATOR_RESTARTED event per job, gives every member
 * a grace lease (heartbeat timeout + one interval) and reopens the round of
 * jobs that were WAITING. Errors: STK_EINVAL, STK_EIO, STK_EBUSY (the
 * directory is locked by another process), STK_ECORRUPT. */
int coord_open(uv_loop_t *loop, const struct coord_opts *opts, struct coord **ret_coord);

/* Stops timers, fails parked calls and watches with STK_EUNAVAIL, releases
 * answered calls once their changes are durable, flushes everything with a
 * synced write, closes its handles and the store, frees c, then calls
 * done(arg) on the loop. Calls made after coord_close answer STK_EUNAVAIL. */
void coord_close(struct coord *c, coord_close_fn done, void *arg);

/* Completes a parked operation now, synchronously, with STK_ECANCELED and
 * frees it (call it when the client went away). For a watch this is the end
 * of the stream. No effect on job state. */
void coord_cancel(struct coord *c, struct coord_wait *w);

void coord_get_stats(const struct coord *c, struct coord_stats *ret_stats);

/* A job's figures for per-job metrics (coord_figures.c). */
struct coord_job_figures {
  const char *name;        /* Valid until the next call into the coord. */
  uint64_t generation;     /* Current generation. */
  uint32_t world_size;     /* Members of the current generation. */
  uint64_t step;           /* Highest step a member reported. */
  double tokens_per_s;     /* Sum over the members' last reports. */
  int64_t checkpoint_step; /* Latest committed checkpoint; 0: none. */
  uint32_t joiners;        /* Joins parked in the open round. */
  uint64_t kv_bytes;       /* What its key-value entries hold (--kv-bytes-per-job). */
};
/* Fills out[0..max) with the figures of the first jobs by name; returns how
 * many jobs there are (may exceed max). */
size_t coord_job_figures(const struct coord *c, struct coord_job_figures *out, size_t max);

/* ---- Jobs (operators and tooling) ------------------------------------ */

/* resp: Stoker__V1__Job. Validates and defaults the spec; STK_EEXIST when
 * the name is taken. The new job is WAITING in generation 1. */
void coord_create_job(struct coord *c, const Stoker__V1__CreateJobRequest *req, coord_done_fn done,
                      void *arg);
/* resp: Stoker__V1__Job (members by rank, with their last stats). */
void coord_get_job(struct coord *c, const Stoker__V1__GetJobRequest *req, coord_done_fn done,
                   void *arg);
/* resp: Stoker__V1__ListJobsResponse, jobs by name, filtered by labels. */
void coord_list_jobs(struct coord *c, const Stoker__V1__ListJobsRequest *req, coord_done_fn done,
                     void *arg);
/* resp: Stoker__V1__Job. PAUSING (members told CHECKPOINT_NOW, then STOP
 * once a checkpoint is reported; STOP at once with force), PAUSED when no
 * member is left to tell. Already PAUSING/PAUSED: no change. STOPPED:
 * STK_ESTATE. */
void coord_pause_job(struct coord *c, const Stoker__V1__JobActionRequest *req, coord_done_fn done,
                     void *arg);
/* resp: Stoker__V1__Job. PAUSING or PAUSED -> WAITING with a new round.
 * WAITING/RUNNING: no change. STOPPED: STK_ESTATE. */
void coord_resume_job(struct coord *c, const Stoker__V1__JobActionRequest *req, coord_done_fn done,
                      void *arg);
/* resp: Stoker__V1__Job. -> STOPPED (terminal): heartbeats answer STOP,
 * parked Joins, Barriers and KvGets fail STK_ESTATE. */
void coord_stop_job(struct coord *c, const Stoker__V1__JobActionRequest *req, coord_done_fn done,
                    void *arg);
/* resp: Stoker__V1__Empty. Only STOPPED or PAUSED jobs unless force
 * (else STK_ESTATE). Removes every key of the job; parked calls fail
 * STK_ENOENT; watches get their remaining events, a DELETED event and end
 * with err 0. */
void coord_delete_job(struct coord *c, const Stoker__V1__JobActionRequest *req, coord_done_fn done,
                      void *arg);
/* resp: Stoker__V1__Job. Sets target_ranks (min <= ranks <= max, else
 * STK_EINVAL). A RUNNING job whose world differs: members are told
 * CHECKPOINT_NOW and a new round opens when a newer checkpoint is reported
 * or after scale_timeout_beats intervals; with skip_checkpoint at once. */
void coord_scale_job(struct coord *c, const Stoker__V1__ScaleJobRequest *req, coord_done_fn done,
                     void *arg);

/* resp: Stoker__V1__Job. A preemption notice (PreemptJobRequest in the
 * proto): RUNNING -> PAUSING (checkpoint, then stop), WAITING -> PAUSED,
 * with a PREEMPTED event; the job resumes when ranks Join again. Already
 * PAUSING or PAUSED: no change. STOPPED or FINISHED: STK_ESTATE. Reason
 * over 1024 bytes: STK_EINVAL. */
void coord_preempt_job(struct coord *c, const Stoker__V1__PreemptJobRequest *req,
                       coord_done_fn done, void *arg);

/* resp: Stoker__V1__Job. The queue controller's report on a submitted job
 * (ReportQueueRequest): recorded as Job.queue (synced before the answer);
 * a change of state logs QUEUED (the queue and position in the message)
 * or ADMITTED (world_size: the admitted ranks) once, and while the job
 * waits or is paused its reason says where it is. A job without
 * spec.submission: STK_ESTATE. A bad status: STK_EINVAL naming the field,
 * no change. */
void coord_report_queue(struct coord *c, const Stoker__V1__ReportQueueRequest *req,
                        coord_done_fn done, void *arg);

/* Streams stored events with seq > after_seq, then live events, through
 * on_event (only events already durable are delivered). When the job is
 * deleted, the watcher still gets every event it had not received, then
 * DELETED, then done(arg, 0, ...). STK_EBUSY when the
 * watcher fell more than watch_queue_max events behind (resume with
 * after_seq = last seq seen); STK_ECANCELED on coord_cancel; STK_EUNAVAIL on
 * close; STK_ENOENT for an unknown job. resp is always NULL. */
struct coord_wait *coord_watch_job(struct coord *c, const Stoker__V1__WatchJobRequest *req,
                                   coord_event_fn on_event, coord_done_fn done, void *arg);
/* Resumes delivery to a watcher whose on_event returned false. */
void coord_watch_resume(struct coord *c, struct coord_wait *w);

/* ---- Membership ---------------------------------------------------------- */

/* resp: Stoker__V1__JoinResponse. Parks until a round including this
 * member closes. Errors: STK_ESTATE (job STOPPED), STK_ETIMEDOUT (parked
 * longer than join_timeout_ms), STK_EABORTED (the same member joined again:
 * the older call is superseded), STK_ENOENT (job deleted). */
struct coord_wait *coord_join(struct coord *c, const Stoker__V1__JoinRequest *req,
                              coord_done_fn done, void *arg);
/* resp: Stoker__V1__HeartbeatResponse. STK_ESTALE when generation is newer
 * than the job's; a member of an older generation gets RESTART. With
 * req->terminating, a preemption notice as coord_preempt_job (first one
 * wins). While the job pauses, CHECKPOINT_NOW and STOP carry pausing. */
void coord_heartbeat(struct coord *c, const Stoker__V1__HeartbeatRequest *req, coord_done_fn done,
                     void *arg);
/* resp: Stoker__V1__Empty. Leaving a RUNNING job opens a new round, unless
 * the job is finishing. With req->finished the member's work is done: it
 * keeps its seat without a lease (the generation, its KV and barriers go on
 * for the others; its heartbeat answers STOP), Joins fail STK_ESTATE while
 * the job is finishing, a member lost or leaving meanwhile opens no round,
 * and once every member left of the generation has finished the job is
 * FINISHED (terminal, a FINISHED event). Unknown member or older
 * generation: no change, success. req->checkpoint_step (a pausing job's
 * last checkpoint, staged) is recorded while the job pauses or is paused,
 * from any generation: the next round waits for its commit. */
void coord_leave(struct coord *c, const Stoker__V1__LeaveRequest *req, coord_done_fn done,
                 void *arg);

/* ---- Synchronisation within a generation --------------------------------- */

/* resp: Stoker__V1__BarrierResponse. Parks until every member of the
 * generation reached the same name. STK_ESTALE: not a member of the current
 * generation; STK_EABORTED: the generation ended, or the member arrived
 * again (the older call is answered so). */
struct coord_wait *coord_barrier(struct coord *c, const Stoker__V1__BarrierRequest *req,
                                 coord_done_fn done, void *arg);
/* resp: Stoker__V1__Empty. STK_ESTALE unless generation is the current one. */
void coord_kv_set(struct coord *c, const Stoker__V1__KvSetRequest *req, coord_done_fn done,
                  void *arg);
/* Largest KV value (KvSet, KvCompareSet). */
#define COORD_KV_VALUE_MAX 65536

/* resp: Stoker__V1__KvAddResponse. The key's value is a decimal int64
 * (absent: 0) plus delta; STK_EINVAL when it holds something else,
 * STK_ERANGE on overflow. Wakes parked gets of the key. */
void coord_kv_add(struct coord *c, const Stoker__V1__KvAddRequest *req, coord_done_fn done,
                  void *arg);
/* resp: Stoker__V1__KvGetResponse (the value afterwards). Sets desired when
 * the key holds expected, or is absent and expected is empty (the
 * semantics of torch.distributed.Store.compare_set). */
void coord_kv_compare_set(struct coord *c, const Stoker__V1__KvCompareSetRequest *req,
                          coord_done_fn done, void *arg);
/* resp: Stoker__V1__KvDeleteResponse. Parked gets keep waiting. */
void coord_kv_delete(struct coord *c, const Stoker__V1__KvDeleteRequest *req, coord_done_fn done,
                     void *arg);
/* resp: Stoker__V1__KvCountResponse: keys set in the current generation. */
void coord_kv_count(struct coord *c, const Stoker__V1__KvCountRequest *req, coord_done_fn done,
                    void *arg);
/* resp: Stoker__V1__KvGetResponse. STK_ENOENT when absent and !wait; with
 * wait parks until set (STK_EABORTED when the generation ends first). */
struct coord_wait *coord_kv_get(struct coord *c, const Stoker__V1__KvGetRequest *req,
                                coord_done_fn done, void *arg);

/* resp: Stoker__V1__Empty. Records the checkpoint if its step is newer;
 * may advance a pending scale or pause. generation 0: from outside the
 * generation; otherwise it must be the current one (STK_ESTALE). */
void coord_report_checkpoint(struct coord *c, const Stoker__V1__ReportCheckpointRequest *req,
                             coord_done_fn done, void *arg);

#endif
