/*
 * libstoker-client: the C API a trainer (and stokerctl) uses to talk to the
 * Stoker coordinator.
 *
 * A client owns one channel to one address. A trainer rank joins a job with
 * stk_join(); from then on a background heartbeat thread (one per
 * membership) reports the latest figures given to stk_report() and learns
 * what the coordinator wants (restart, checkpoint now, stop). Barriers and
 * the key-value store work within the member's generation. Operator calls
 * (jobs, scale, watch, health) live here too and return protobuf-c messages
 * the caller frees with protobuf_c_message_free_unpacked().
 *
 * Every blocking call is a thin shell over the asynchronous one (an async
 * call plus a condition variable). Fallible functions return 0 or a negative
 * STK_E* code (stk_error.h); the server's status of the last failure on the
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

#include "grpc/health/v1/health.pb-c.h"
#include "stk_error.h"
#include "stoker/v1/coordinator.pb-c.h"

struct stk_client;
struct stk_watch;
struct stk_async;

struct stk_client_opts {
  const char *address;       /* Coordinator "HOST:PORT"; required. */
  const char *tls_ca_file;   /* PEM; set: TLS, verifying the server. */
  const char *tls_cert_file; /* PEM client certificate (mutual TLS). */
  const char *tls_key_file;
  const char *token;          /* Bearer token; NULL: none. */
  const char *token_file;     /* Read the token from here (whitespace trimmed). */
  int64_t default_timeout_ms; /* For calls given timeout 0; 0: 30000. */
};

/* Errors: STK_EINVAL (no address, unreadable token file), what the rpc
 * layer returns. No connection is made before the first call. */
int stk_client_new(const struct stk_client_opts *opts, struct stk_client **ret_client);

/* Ends the membership (without Leave), stops the heartbeat thread, cancels
 * calls still open and waits for their callbacks. Accepts NULL. */
void stk_client_free(struct stk_client *c);

/* The server's status message and gRPC code (enum rpc_code) of the last
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

/* The figures the next heartbeat carries. Any thread, never blocks. */
void stk_report(struct stk_client *c, uint64_t step, double tokens_per_s, double loss,
                Stoker__V1__RankHealth health);

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

/* ------------------------------------------------------- operator calls */

/* Each *ret_job / *ret_resp is freed by the caller with
 * protobuf_c_message_free_unpacked(&x->base, NULL). timeout_ms 0: default. */
int stk_job_create(struct stk_client *c, const Stoker__V1__JobSpec *spec, int64_t timeout_ms,
                   Stoker__V1__Job **ret_job);
int stk_job_get(struct stk_client *c, const char *job, int64_t timeout_ms,
                Stoker__V1__Job **ret_job);
/* Jobs whose labels include every (keys[i], values[i]). */
int stk_job_list(struct stk_client *c, const char *const *keys, const char *const *values,
                 size_t n_labels, int64_t timeout_ms, Stoker__V1__ListJobsResponse **ret_resp);

enum stk_job_verb {
  STK_JOB_PAUSE,
  STK_JOB_RESUME,
  STK_JOB_STOP,
};
int stk_job_action(struct stk_client *c, enum stk_job_verb verb, const char *job, bool force,
                   int64_t timeout_ms, Stoker__V1__Job **ret_job);
int stk_job_delete(struct stk_client *c, const char *job, bool force, int64_t timeout_ms);
int stk_job_scale(struct stk_client *c, const char *job, uint32_t ranks, bool skip_checkpoint,
                  int64_t timeout_ms, Stoker__V1__Job **ret_job);

/* Streams job's events with seq > after_seq, then live ones. on_event runs
 * on the client's thread with a borrowed event. The stream ends when the job
 * is deleted (status 0), on an error, or on stk_watch_cancel(). */
typedef void (*stk_event_fn)(void *arg, const Stoker__V1__JobEvent *ev);
int stk_job_watch(struct stk_client *c, const char *job, uint64_t after_seq, stk_event_fn on_event,
                  void *arg, struct stk_watch **ret_watch);
/* Waits up to timeout_ms (< 0: forever) for the stream to end. Returns
 * STK_ETIMEDOUT while it is still open, else its final status (0, or the
 * mapped error; the message is in stk_client_last_error()). Cancelled
 * streams end with STK_ECANCELED. */
int stk_watch_wait(struct stk_watch *w, int64_t timeout_ms);
void stk_watch_cancel(struct stk_watch *w);
/* Cancels, waits for the end, frees. Accepts NULL. */
void stk_watch_free(struct stk_watch *w);

/* grpc.health.v1.Health/Check of service ("" = the whole server);
 * *ret_status is a Grpc__Health__V1__HealthCheckResponse__ServingStatus. */
int stk_health_check(struct stk_client *c, const char *service, int64_t timeout_ms,
                     int *ret_status);

#endif
