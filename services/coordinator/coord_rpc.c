/*
 * The gRPC adapter of the coordinator: one thin handler per method. The
 * core answers through a coord_done_fn; here that becomes exactly one
 * rpc_reply or rpc_fail. Parked operations (Join, Barrier, KvGet with
 * wait, WatchJob) keep their coord_wait in the call's data so that a caller
 * that cancels or runs out of deadline is removed from the core at once.
 */
#include "coord_rpc.h"

#include "stk_error.h"

#include <stdlib.h>

/* Every handler gets the coordinator as svc_data. */
#define COORD(svc) ((struct coord *)(svc))

static void answer(void *arg, int err, const char *errmsg, const ProtobufCMessage *resp) {
  struct rpc_call *call = arg;
  rpc_call_set_data(call, NULL);
  if (err)
    rpc_fail_err(call, err, "%s", errmsg && *errmsg ? errmsg : stk_strerror(err));
  else
    rpc_reply(call, resp);
}

/* --------------------------------------------------------- parked calls */

struct parked {
  struct coord *coord;
  struct coord_wait *wait;
};

static void cancel_parked(struct rpc_call *call, void *arg) {
  struct coord *c = arg;
  struct coord_wait *w = rpc_call_data(call);
  if (w) coord_cancel(c, w); /* Runs answer() synchronously. */
}

/* Ties a parked operation to its call. The core never completes
 * synchronously, so w is still valid here. */
static void park(struct rpc_call *call, struct coord *c, struct coord_wait *w) {
  if (!w) return;
  rpc_call_set_data(call, w);
  rpc_on_cancel(call, cancel_parked, c);
}

/* ---------------------------------------------------------- unary calls */

#define UNARY_HANDLER(method, fn, type)                                                            \
  static void handle_##method(struct rpc_call *call, const ProtobufCMessage *req, void *svc) {     \
    fn(COORD(svc), (const type *)req, answer, call);                                               \
  }

UNARY_HANDLER(create_job, coord_create_job, Stoker__V1__CreateJobRequest)
UNARY_HANDLER(get_job, coord_get_job, Stoker__V1__GetJobRequest)
UNARY_HANDLER(list_jobs, coord_list_jobs, Stoker__V1__ListJobsRequest)
UNARY_HANDLER(pause_job, coord_pause_job, Stoker__V1__JobActionRequest)
UNARY_HANDLER(resume_job, coord_resume_job, Stoker__V1__JobActionRequest)
UNARY_HANDLER(stop_job, coord_stop_job, Stoker__V1__JobActionRequest)
UNARY_HANDLER(delete_job, coord_delete_job, Stoker__V1__JobActionRequest)
UNARY_HANDLER(scale_job, coord_scale_job, Stoker__V1__ScaleJobRequest)
UNARY_HANDLER(heartbeat, coord_heartbeat, Stoker__V1__HeartbeatRequest)
UNARY_HANDLER(leave, coord_leave, Stoker__V1__LeaveRequest)
UNARY_HANDLER(kv_set, coord_kv_set, Stoker__V1__KvSetRequest)
UNARY_HANDLER(report_checkpoint, coord_report_checkpoint, Stoker__V1__ReportCheckpointRequest)

#define PARKED_HANDLER(method, fn, type)                                                           \
  static void handle_##method(struct rpc_call *call, const ProtobufCMessage *req, void *svc) {     \
    park(call, COORD(svc), fn(COORD(svc), (const type *)req, answer, call));                       \
  }

PARKED_HANDLER(join, coord_join, Stoker__V1__JoinRequest)
PARKED_HANDLER(barrier, coord_barrier, Stoker__V1__BarrierRequest)
PARKED_HANDLER(kv_get, coord_kv_get, Stoker__V1__KvGetRequest)

/* ------------------------------------------------------------ WatchJob */

/* One watch: the core holds delivery while a send is outstanding (gRPC
 * allows one), and the context outlives the core's watch until that send
 * completes. */
struct watch_ctx {
  struct coord *coord;
  struct coord_wait *wait; /* NULL once the core's watch ended. */
  bool sending;
};

static void event_sent(struct rpc_call *call, int err, void *arg) {
  struct watch_ctx *w = arg;
  w->sending = false;
  if (!w->wait) {
    free(w);
    return;
  }
  if (!err) coord_watch_resume(w->coord, w->wait);
}

static bool send_event(void *arg, const Stoker__V1__JobEvent *ev) {
  struct rpc_call *call = arg;
  struct watch_ctx *w = rpc_call_data(call);
  if (rpc_send(call, &ev->base, event_sent, w) != 0) return false; /* Cancel path ends it. */
  w->sending = true;
  return false;
}

static void cancel_watch(struct rpc_call *call, void *arg) {
  struct watch_ctx *w = rpc_call_data(call);
  if (w && w->wait) coord_cancel(w->coord, w->wait); /* Runs watch_done. */
}

static void watch_done(void *arg, int err, const char *errmsg, const ProtobufCMessage *resp) {
  struct rpc_call *call = arg;
  struct watch_ctx *w = rpc_call_data(call);
  rpc_call_set_data(call, NULL);
  if (w) {
    w->wait = NULL;
    if (!w->sending) free(w);
  }
  if (err)
    rpc_finish(call, stk_error_to_grpc(err), "%s", errmsg && *errmsg ? errmsg : stk_strerror(err));
  else
    rpc_finish(call, RPC_OK, "%s", "");
}

static void handle_watch_job(struct rpc_call *call, const ProtobufCMessage *req, void *svc) {
  struct watch_ctx *w = calloc(1, sizeof(*w));
  if (!w) {
    rpc_fail_err(call, STK_ENOMEM, "out of memory");
    return;
  }
  w->coord = COORD(svc);
  rpc_call_set_data(call, w);
  w->wait = coord_watch_job(w->coord, (const Stoker__V1__WatchJobRequest *)req, send_event,
                            watch_done, call);
  rpc_on_cancel(call, cancel_watch, NULL);
}

/* ------------------------------------------------------------- table */

static const struct rpc_method_def coordinator_methods[] = {
    {"CreateJob", RPC_UNARY, handle_create_job},
    {"GetJob", RPC_UNARY, handle_get_job},
    {"ListJobs", RPC_UNARY, handle_list_jobs},
    {"WatchJob", RPC_SERVER_STREAM, handle_watch_job},
    {"PauseJob", RPC_UNARY, handle_pause_job},
    {"ResumeJob", RPC_UNARY, handle_resume_job},
    {"StopJob", RPC_UNARY, handle_stop_job},
    {"DeleteJob", RPC_UNARY, handle_delete_job},
    {"ScaleJob", RPC_UNARY, handle_scale_job},
    {"Join", RPC_UNARY, handle_join},
    {"Heartbeat", RPC_UNARY, handle_heartbeat},
    {"Leave", RPC_UNARY, handle_leave},
    {"Barrier", RPC_UNARY, handle_barrier},
    {"KvSet", RPC_UNARY, handle_kv_set},
    {"KvGet", RPC_UNARY, handle_kv_get},
    {"ReportCheckpoint", RPC_UNARY, handle_report_checkpoint},
};

int coord_rpc_register(struct rpc_server *s, struct coord *c) {
  return rpc_server_add_service(s, &stoker__v1__coordinator__descriptor, coordinator_methods,
                                sizeof(coordinator_methods) / sizeof(coordinator_methods[0]), c);
}
