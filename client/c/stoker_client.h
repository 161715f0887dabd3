/*
 * libstoker-client: the C API a trainer (and stokerctl) uses to talk to the
 * Stoker services. This header: the client itself and the coordinator's
 * calls (stoker_loader.h and stoker_ckpt.h add the other two services).
 * Outside the tree: #include <stoker_client.h>, built with
 * `pkg-config --cflags --libs stoker-client`.
 *
 * A client owns one channel to one address. A trainer rank joins a job with
 * stk_join(); from then on a background heartbeat thread (one per
 * membership) reports the latest figures given to stk_report() and learns
 * what the coordinator wants (restart, checkpoint now, stop). Barriers and
 * the key-value store work within the member's generation. This header is
 * installed (include/stoker/) and names only stk_ types: operator calls
 * that take or return protobuf-c messages (jobs, scale, watch) are in the
 * in-tree header stoker_admin.h, which the installed library does not
 * export.
 *
 * Every blocking call is a thin shell over the asynchronous one (an async
 * call plus a condition variable). Fallible functions return 0 or a negative
 * STK_E* code (stoker_error.h); the server's status of the last failure on the
 * calling thread is kept by stk_client_last_error().
 *
 * Threads: a client may be used from several threads at once. Callbacks run
 * on the client's internal threads and must not block for long. Action
 * callbacks (heartbeat thread) must not call stk_join(), stk_leave() or
 * stk_client_free(); completion callbacks (the rpc thread) must not call
 * any blocking function of the same client: that thread is the one that
 * would wake them. Hand such work to another thread (or poll).
 */
#ifndef STOKER_CLIENT_H
#define STOKER_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "stoker_error.h"

struct stk_client;

struct stk_client_opts {
  const char *address;       /* The service's "HOST:PORT"; required. */
  const char *tls_ca_file;   /* PEM; set: TLS, verifying the server. */
  const char *tls_cert_file; /* PEM client certificate (mutual TLS). */
  const char *tls_key_file;
  const char *token; /* Bearer token; NULL: none. */
  /* Read the token from here, and again when a call is refused
   * UNAUTHENTICATED (the call is then sent once more if the token changed)
   * or at most every 30 s when a call starts; a file that does not read
   * keeps the token in use. Trailing whitespace is dropped; the rest must
   * be one word of printable ASCII, the file at most 4096 bytes. */
  const char *token_file;
  int64_t default_timeout_ms; /* For calls given timeout 0; 0: 30000. */
};

/* Errors: STK_EINVAL (no address, unreadable token file), what the rpc
 * layer returns. No connection is made before the first call. */
int stk_client_new(const struct stk_client_opts *opts, struct stk_client **ret_client);

/* Ends the membership (without Leave), stops the heartbeat thread, cancels
 * calls still open and waits for their callbacks. Accepts NULL. */
void stk_client_free(struct stk_client *c);

/* The server's status message and gRPC status code of the last
 * call that failed on this thread; "" and 0 before any failure. Local
 * failures (bad arguments) set code 3 (INVALID_ARGUMENT) or 9. */
const char *stk_client_last_error(int *ret_grpc_code);

/* ------------------------------------------------------------ membership */

struct stk_membership {
  uint64_t generation;
  uint32_t rank;
  uint32_t world_size;
  uint32_t heartbeat_interval_ms;
  uint32_t heartbeat_timeout_ms;
  int64_t checkpoint_step; /* Latest committed checkpoint; 0: none. */
  char checkpoint_uri[1024];
};

/* What the coordinator asked for in a heartbeat reply. */
enum stk_action {
  STK_ACTION_NONE = 0,           /* Carry on. */
  STK_ACTION_RESTART = 1,        /* Abort collectives, rejoin, restore. */
  STK_ACTION_CHECKPOINT_NOW = 2, /* Write a checkpoint, then go on. */
  STK_ACTION_STOP = 3,           /* Exit cleanly. */
};

/* Runs on the heartbeat thread for every action other than NONE. */
typedef void (*stk_action_fn)(void *arg, enum stk_action action, uint64_t generation,
                              const char *reason);

/* Optional; set before stk_join(). */
void stk_on_action(struct stk_client *c, stk_action_fn fn, void *arg);

/* Joins job as member_id (unique per process), parking until the
 * rendezvous round closes, and starts the heartbeat thread. UNAVAILABLE
 * (coordinator restarting) is retried with backoff until timeout_ms (0:
 * the client's default). Joining again (after RESTART) replaces the old
 * membership. Errors: STK_ETIMEDOUT, STK_EABORTED (round aborted), any
 * mapped server status. */
int stk_join(struct stk_client *c, const char *job, const char *member_id, const char *address,
             const char *host, int64_t timeout_ms, struct stk_membership *ret_membership);

/* Stops heartbeats and tells the coordinator the member leaves cleanly.
 * Errors: STK_ESTATE (not joined), mapped server status. */
int stk_leave(struct stk_client *c);
/* The same for a member whose work is done (it trained every step): the
 * others go on in the same generation instead of a new round, and the job
 * ends FINISHED once every member finished. Errors as stk_leave. */
int stk_leave_finished(struct stk_client *c);

/* Leaves a pausing job (stk_job_pausing) after staging the shards of its
 * last checkpoint, at step (> 0): the checkpoint service commits it after
 * the member is gone, and the job's next round waits for that commit so
 * every rank restores it. Errors as stk_leave; STK_EINVAL for step <= 0. */
int stk_leave_checkpointed(struct stk_client *c, int64_t step);

/* The rank is about to be terminated (it got SIGTERM: its pod is being
 * evicted). The heartbeat thread beats at once, and every later heartbeat
 * of this client (after a rejoin too) says so: the coordinator takes it as
 * a preemption notice for the whole job and answers CHECKPOINT_NOW with
 * stk_job_pausing() true to every rank. Any thread; never blocks (not
 * async-signal-safe: call it from the training loop, not the handler). */
void stk_notify_terminating(struct stk_client *c);

/* Whether the job is pausing or paused (an operator's pause or a
 * preemption), as the last heartbeat reply with an action said. With
 * CHECKPOINT_NOW: the checkpoint is the generation's last; stage it, leave
 * with stk_leave_checkpointed() and exit. With STOP: exit as a process that
 * will be started again (stoker-train exits 75, EX_TEMPFAIL), not as one
 * whose work is done. False after a join until a reply says otherwise. */
bool stk_job_pausing(struct stk_client *c);

/* This rank and its peers agreed to stop at step (> 0; their stop vote):
 * the heartbeat thread beats at once, and every later heartbeat of this
 * membership says so (HeartbeatRequest.stop_step). While the job pauses the
 * coordinator then takes no checkpoint below step as the pause's and tells
 * no member STOP below it. Any thread; never blocks. */
void stk_report_stop(struct stk_client *c, int64_t step);

/* With a STOP while the job pauses (stk_job_pausing): the step of the
 * checkpoint the pause took (HeartbeatResponse.checkpoint_step), or 0 (a
 * forced pause, or no STOP). When it is > 0 the member keeps its seat and
 * its heartbeats go on, because the STOP may have crossed steps this rank
 * finished after its heartbeat: a rank past that step checkpoints, then
 * stops (agreeing on the step with its peers, stk_report_stop), and leaves
 * with stk_leave_checkpointed(); a rank at or below it stops at once.
 * When it is 0 the heartbeats end with the STOP, as for any other. */
int64_t stk_stop_checkpoint_step(struct stk_client *c);

/* Whether the last heartbeat reply with an action was a resize's
 * CHECKPOINT_NOW (ScaleJob): a new round opens once that checkpoint is
 * reported, so the rank may train no step past it and wait for RESTART
 * (no step is trained twice). False after a join until a reply says so. */
bool stk_job_resizing(struct stk_client *c);

/* How a rank says it is doing in its heartbeats (the proto's RankHealth
 * numbers). */
enum stk_rank_health {
  STK_RANK_HEALTH_UNSPECIFIED = 0,
  STK_RANK_HEALTH_OK = 1,
  STK_RANK_HEALTH_DEGRADED = 2, /* Slow or retrying, still training. */
  STK_RANK_HEALTH_FAILING = 3,  /* About to give up. */
};

/* The figures the next heartbeat carries. Any thread, never blocks. */
void stk_report(struct stk_client *c, uint64_t step, double tokens_per_s, double loss,
                enum stk_rank_health health);

/* Returns and clears the pending action. When several arrive before a
 * poll, the most severe wins: STOP over RESTART over CHECKPOINT_NOW. */
enum stk_action stk_poll_action(struct stk_client *c);

/* The generation of the current membership; 0 when not joined. */
uint64_t stk_generation(struct stk_client *c);

/* ----------------------------------------------- synchronisation (ranks) */

/* Completion of an asynchronous call: err 0 or STK_E*; msg is the server's
 * status message ("" on success). For kv_get, value/len hold the value
 * (borrowed: valid during the callback). */
typedef void (*stk_done_fn)(void *arg, int err, const char *msg);
typedef void (*stk_kv_done_fn)(void *arg, int err, const char *msg, const uint8_t *value,
                               size_t len);

/* Waits until every member of the generation reached barrier name.
 * STK_EABORTED: the generation ended (restart). STK_ESTATE: not joined or
 * stale generation. */
int stk_barrier(struct stk_client *c, const char *name, int64_t timeout_ms);
/* If it fails, done never runs; otherwise done runs exactly once on the
 * client's thread. */
int stk_barrier_async(struct stk_client *c, const char *name, int64_t timeout_ms, stk_done_fn done,
                      void *arg);

int stk_kv_set(struct stk_client *c, const char *key, const void *value, size_t len,
               int64_t timeout_ms);
/* *ret_value is malloc'ed (NUL-terminated beyond *ret_len) and the caller
 * frees it. wait: park until the key is set; otherwise STK_ENOENT. */
int stk_kv_get(struct stk_client *c, const char *key, bool wait, int64_t timeout_ms,
               uint8_t **ret_value, size_t *ret_len);
int stk_kv_get_async(struct stk_client *c, const char *key, bool wait, int64_t timeout_ms,
                     stk_kv_done_fn done, void *arg);

/* Records a committed checkpoint for the job joined (generation attached)
 * or, when not joined, for job (generation 0). */
int stk_report_checkpoint(struct stk_client *c, const char *job, int64_t step, const char *uri);

/* ---------------------------------------------------------------- health */

/* The serving status of grpc.health.v1 (same numbers). */
enum stk_serving_status {
  STK_SERVING_UNKNOWN = 0,
  STK_SERVING = 1,
  STK_NOT_SERVING = 2,
  STK_SERVICE_UNKNOWN = 3, /* Only Watch answers it; Check fails NOT_FOUND. */
};

/* grpc.health.v1.Health/Check of service ("" = the whole server);
 * *ret_status is an enum stk_serving_status. */
int stk_health_check(struct stk_client *c, const char *service, int64_t timeout_ms,
                     int *ret_status);

#endif
