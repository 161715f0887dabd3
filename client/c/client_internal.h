/*
 * What the parts of libstoker-client share and callers never see: the
 * client struct, the membership it carries, and the waiter that turns an
 * asynchronous rpc call into a blocking one (the easy-over-multi shell).
 */
#ifndef STK_CLIENT_INTERNAL_H
#define STK_CLIENT_INTERNAL_H

#include <pthread.h>
#include <time.h>

#include "grpc/health/v1/health.pb-c.h"
#include "rpc.h"
#include "stk_error.h"
#include "stoker/v1/coordinator.pb-c.h"
#include "stoker_client.h"

/* A call's method path, checked by the compiler against the generated code
 * (RPC_METHOD_PATH in rpc.h): COORD_METHOD(create_job, &req), where req is
 * the request sent; a method the service lacks or a request of another
 * type does not compile. */
#define COORD_METHOD(field, req) RPC_METHOD_PATH(stoker__v1__coordinator, field, req)

/* A unary call of a service's method with everything the descriptor knows
 * taken from it: path and response descriptor (RPC_METHOD_PATH,
 * RPC_METHOD_REPLY), request and response types checked by the compiler.
 * ret: Resp ** (a typed NULL when the answer is dropped). COORD_CALL,
 * DL_CALL (loader_internal.h), CKPT_CALL (ckpt_internal.h) name the
 * service. */
#define CLIENT_CALL(prefix, c, field, req, timeout_ms, ret)                                        \
  client_call((c), RPC_METHOD_PATH(prefix, field, req), &(req)->base,                              \
              RPC_METHOD_REPLY(prefix, field, req, ret), (timeout_ms), (ProtobufCMessage **)(ret))
/* The same through client_call_idempotent: for a call whose repeat changes
 * nothing. */
#define CLIENT_CALL_IDEMPOTENT(prefix, c, field, req, timeout_ms, ret)                             \
  client_call_idempotent((c), RPC_METHOD_PATH(prefix, field, req), &(req)->base,                   \
                         RPC_METHOD_REPLY(prefix, field, req, ret), (timeout_ms),                  \
                         (ProtobufCMessage **)(ret))
/* The same for a paged listing (client_list_all): req's page_token is set
 * page by page. */
#define CLIENT_LIST_ALL(prefix, c, field, req, timeout_ms, ret)                                    \
  client_list_all((c), RPC_METHOD_PATH(prefix, field, req), &(req)->base, &(req)->page_token,      \
                  RPC_METHOD_REPLY(prefix, field, req, ret), (timeout_ms),                         \
                  (ProtobufCMessage **)(ret))
#define COORD_CALL(c, field, req, timeout_ms, ret)                                                 \
  CLIENT_CALL(stoker__v1__coordinator, c, field, req, timeout_ms, ret)

/* The member this client joined as, guarded by stk_client.mu. */
struct membership {
  bool joined;
  char job[128];
  char member_id[160];
  uint64_t generation;
  uint32_t interval_ms;
  /* Figures for the next heartbeat (stk_report). */
  uint64_t step;
  double tokens_per_s;
  double loss;
  enum stk_rank_health health;
  enum stk_action pending; /* Most severe action not yet polled. */
  bool terminating;        /* stk_notify_terminating: sent with every heartbeat. */
  bool beat_now;           /* Wakes the heartbeat thread for a beat at once. */
  bool pausing;            /* HeartbeatResponse.pausing of the last action. */
  bool resizing;           /* HeartbeatResponse.resizing of the last action. */
  int64_t stop_step;       /* stk_report_stop: sent with every heartbeat. */
  int64_t stop_ckpt_step;  /* HeartbeatResponse.checkpoint_step of the last STOP. */
  stk_action_fn on_action;
  void *on_action_arg;
  /* Heartbeat thread: started by join, stopped by leave/free/rejoin. */
  bool hb_started; /* hb_thread must be joined. */
  bool hb_stop;
  pthread_t hb_thread;
  pthread_cond_t hb_cv;
  struct waiter *hb_waiter; /* The heartbeat in flight, for cancel. */
};

/* A job of the client's engine (client_engine.c): a state machine that the
 * engine advances one bounded step at a time. Embedded in its owner. */
struct client_job;
enum client_step {
  CLIENT_STEP_MORE, /* Step again (after the other jobs' turns). */
  CLIENT_STEP_WAIT, /* Parked until client_engine_wake (what it waits on ended). */
  CLIENT_STEP_DONE, /* Finished: done runs. */
};
struct client_job_ops {
  /* Advances the job one step without waiting on the network (it returns
   * CLIENT_STEP_WAIT instead). Never run twice at once. */
  enum client_step (*step)(struct client_job *j);
  /* Asks the job to end soon (the client is closing): what it waits on is
   * cancelled (its wake follows) and its next step ends it. Any thread,
   * also while a step runs; called under the engine's lock, so it must not
   * block or call the engine. */
  void (*cancel)(struct client_job *j);
  /* Once, after the last step, on the engine's thread; the job is the
   * owner's again (it may free it here). */
  void (*done)(struct client_job *j);
};
struct client_job {
  const struct client_job_ops *ops;
  /* The engine's, under its lock: */
  struct client_job *next; /* In the queue or the parked list. */
  int where;               /* enum job_where (client_engine.c). */
  bool woken;              /* A wake came while the step ran. */
};

/* The client's engine: its jobs in flight and the thread that steps them
 * (started at the first job). */
struct client_engine {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct client_job *head, *tail; /* Waiting for their next step. */
  struct client_job *parked;      /* Waiting for a wake. */
  struct client_job *running;     /* Being stepped (outside mu); NULL: none. */
  bool started;                   /* thread runs and must be joined. */
  bool closing;                   /* client_engine_close: no new jobs. */
  pthread_t thread;
};

struct stk_client {
  struct rpc_client *rpc;
  struct client_engine engine; /* The saves in flight (client_engine.c). */
  int64_t default_timeout_ms;
  /* What the channel was made with (owned copies), for extra channels:
   * a batch stream blocks its own completion thread for flow control. */
  struct rpc_client_opts ro;
  char *token_file;         /* stk_client_opts.token_file (owned); NULL: none. */
  pthread_mutex_t token_mu; /* Guards ro.token and token_read_ms (client_token.c). */
  int64_t token_read_ms;    /* When the token file was last read (client_now_ms). */
  pthread_mutex_t mu;
  struct membership m;
  uint64_t ckpt_generation; /* stk_ckpt_set_generation (atomic loads and stores). */
  /* Clients of other addresses with this one's options (client_peer, under
   * mu): the checkpoint replicas owning attempts. Freed with the client. */
  struct stk_client *peers, *next_peer;
};

/* One asynchronous unary call waited on by one thread, or polled by a
 * machine's steps (waiter_ended) that notify wakes. */
struct waiter {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  bool cancelled; /* waiter_cancel came: a start after it ends at once. */
  int cancelling; /* Threads inside rpc_client_call_cancel. */
  int notifying;  /* notify runs (outside mu); waiter_close waits for it. */
  struct rpc_client_call *call;
  struct rpc_status st;
  ProtobufCMessage *resp; /* Owned by the waiter until taken. */
  /* Optional, set before the start: runs on the rpc client's thread once
   * the call ended (done set), outside mu, so it may take its owner's
   * locks (a job's wake) while a cancel holds them. */
  void (*notify)(void *arg);
  void *notify_arg;
};

/* The files below stack as a ladder (README.md), bottom first here: each
 * calls only the files declared before it. */

/* ---- client_base.c: last error, clocks, timeouts (calls no file here) ---- */

/* Sets this thread's last error. */
void client_set_error(int grpc_code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Records a local failure (err's gRPC code, stk_strerror text) and
 * returns err. */
int client_fail(int err, const char *what);
/* Monotonic clock in milliseconds. */
int64_t client_now_ms(void);
/* timeout_ms, or the client's default when <= 0. */
int64_t client_timeout(const struct stk_client *c, int64_t timeout_ms);
/* Every condition variable of the client waits on CLOCK_MONOTONIC (a wall
 * clock step never shortens or stretches a wait): initialise each with
 * client_cond_init and compute timed-wait deadlines with
 * client_deadline_after, an absolute CLOCK_MONOTONIC time ms from now. */
void client_cond_init(pthread_cond_t *cv);
void client_deadline_after(struct timespec *ts, int64_t ms);
/* Sleeps ms milliseconds (the whole of them, signals or not). */
void client_sleep_ms(int64_t ms);

/* ---- client_token.c: following the token file ---- */

/* How often a call's start may re-read the token file; a variable so that
 * tests can shorten it (the library does not export it). */
#define CLIENT_TOKEN_RELOAD_MS 30000
extern int64_t client_token_reload_ms;
/* Re-reads the token file when one was given and, unless now, when the
 * last read is client_token_reload_ms old; a changed token goes to the
 * channel. Returns 1 when the token changed, 0 when not (or no file or
 * not due), or the reader's error (the token in use stays). */
int client_token_refresh(struct stk_client *c, bool now);
/* The client's channel for a call about to start, after a due refresh. */
struct rpc_client *client_rpc(struct stk_client *c);
/* Opens another channel to the client's server with the same options and
 * the current token (the CA and certificate files are read again).
 * Errors: as rpc_client_new. */
int client_new_channel(struct stk_client *c, struct rpc_client **ret_rpc);

/* ---- client_engine.c: the jobs that outlive their call (calls client_base.c) ---- */

void client_engine_init(struct client_engine *e);
/* Hands j (ops set) to the engine, which steps it until done and then
 * calls its done. STK_ECANCELED when the engine is closing, STK_ENOMEM when
 * its thread cannot start; then j is the caller's again and done never
 * runs. Any thread but the engine's own may submit; a job's done may too. */
int client_engine_submit(struct client_engine *e, struct client_job *j);
/* Puts a parked job back in the queue (what it waited on ended); a wake
 * while its step runs makes a WAIT step again at once. Any thread (the rpc
 * completion thread) until the job is done. */
void client_engine_wake(struct client_engine *e, struct client_job *j);
/* Cancels every job in flight, steps them to their end (their done callbacks
 * run, on the engine's thread), joins the thread and destroys e. Not from
 * a job's callback (the thread would join itself). */
void client_engine_close(struct client_engine *e);

/* ---- client_call.c: the waiter and the blocking call ---- */

void waiter_init(struct waiter *w);
/* Frees a response not taken; destroys the sync objects. Call once the
 * call is done (waits for a notify still running). */
void waiter_close(struct waiter *w);
/* Starts the call; on failure the waiter is already done with the error
 * (notify does not run then). After a waiter_cancel the call ends at once
 * with CANCELLED. */
int waiter_start(struct waiter *w, struct stk_client *c, const char *method,
                 const ProtobufCMessage *req, const ProtobufCMessageDescriptor *resp_desc,
                 int64_t timeout_ms);
/* Waits for the end; returns 0 or the mapped error, recording the status
 * as this thread's last error. */
int waiter_wait(struct waiter *w);
/* Asks the call to stop if still open, or not to start. Any thread; it
 * does not wait for notify. */
void waiter_cancel(struct waiter *w);
/* True once the call ended (w->st and w->resp are then the caller's to
 * read). Never waits. */
bool waiter_ended(struct waiter *w);
/* Waits for the end without setting the last error (a machine's cleanup). */
void waiter_join(struct waiter *w);
/* Blocking unary call: *ret_resp owned by the caller on success. */
int client_call(struct stk_client *c, const char *method, const ProtobufCMessage *req,
                const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                ProtobufCMessage **ret_resp);
/* Whether an idempotent call that failed with err is tried again: the
 * server was UNAVAILABLE (restarting, or moved to a new address under its
 * name), or it CANCELLED the call as it shut down (a call still in flight
 * when a draining server's grace ran out; seen as a held-out GetBatch lost
 * to a dataloader part's rolling update). The blocking calls this serves
 * are never cancelled by their own caller. */
static inline bool client_retryable(int err) {
  return err == STK_EUNAVAIL || err == STK_ECANCELED;
}
/* client_call, tried again while it fails client_retryable (the server
 * restarting or moving to a new address under its name), with backoff from
 * CLIENT_RETRY_FIRST_MS doubling to CLIENT_RETRY_MAX_MS, until timeout_ms
 * (the client's default when <= 0) has passed since the first try. Only for
 * calls whose repeat changes nothing. */
#define CLIENT_RETRY_FIRST_MS 50
#define CLIENT_RETRY_MAX_MS   1000
int client_call_idempotent(struct stk_client *c, const char *method, const ProtobufCMessage *req,
                           const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                           ProtobufCMessage **ret_resp);

/* ---- client_pages.c: paged listings (calls client_call.c) ---- */

/* A paged listing followed to its last page: calls method with req again
 * and again, *req_token (req's page_token field) set to each page's
 * next_page_token, and answers one response of resp_desc holding every
 * page's entries (its repeated message field), in order, with an empty
 * next_page_token. timeout_ms bounds each page's call. On failure nothing
 * is answered; *req_token is restored either way. */
int client_list_all(struct stk_client *c, const char *method, ProtobufCMessage *req,
                    char **req_token, const ProtobufCMessageDescriptor *resp_desc,
                    int64_t timeout_ms, ProtobufCMessage **ret_resp);

/* ---- membership.c: join, heartbeats, actions (under client.c) ---- */

/* Stops and joins the heartbeat thread, if any. Call without c->mu. */
void membership_stop_heartbeat(struct stk_client *c);
void membership_init(struct membership *m);
void membership_close(struct membership *m);

/* ---- client.c: the client's life (top of this ladder) ---- */

/* stk_client_new; round_robin spreads calls over every address the target
 * resolves to (the checkpoint replicas behind one name). */
int client_new(const struct stk_client_opts *opts, bool round_robin,
               struct stk_client **ret_client);
/* The client of address with c's TLS files, token (file) and default
 * timeout, made at the first ask and kept in c until c is freed (the
 * checkpoint replica owning an attempt). Any thread. */
int client_peer(struct stk_client *c, const char *address, struct stk_client **ret_peer);

#endif
