/*
 * The gRPC adapter of the coordinator: one thin handler per method. The
 * core answers through a coord_done_fn; here that becomes exactly one
 * rpc_reply or rpc_fail. Parked operations (Join, Barrier, KvGet with
 * wait, WatchJob) are tracked in a list so that a caller that cancels or
 * runs out of deadline is removed from the core at once, and so that a
 * draining daemon can answer them all UNAVAILABLE without waiting.
 */
#include "coord_rpc.h"

#include "stk_error.h"

#include <stdlib.h>

struct coord_rpc {
  struct coord *coord;
  struct parked *parked; /* Doubly linked list of open parked calls. */
  bool draining;
};

/* One parked call or watch: its call, its handle in the core (NULL once the
 * core answered), and for watches whether a send is outstanding. */
struct parked {
  struct coord_rpc *adapter;
  struct rpc_call *call;
  struct coord_wait *wait;
  struct parked *prev, *next;
  bool sending; /* A watch event send is outstanding. */
  bool ended;   /* The core answered; freed when no send refers to it. */
};

static struct parked *parked_new(struct coord_rpc *a, struct rpc_call *call) {
  struct parked *p = calloc(1, sizeof(*p));
  if (!p) return NULL;
  p->adapter = a;
  p->call = call;
  p->next = a->parked;
  if (a->parked) a->parked->prev = p;
  a->parked = p;
  rpc_call_set_data(call, p);
  return p;
}

/* Unlinks p; frees it unless a watch send still refers to it. */
static void parked_end(struct parked *p) {
  struct coord_rpc *a = p->adapter;
  if (p->prev)
    p->prev->next = p->next;
  else
    a->parked = p->next;
  if (p->next) p->next->prev = p->prev;
  p->prev = p->next = NULL;
  p->wait = NULL;
  p->ended = true;
  rpc_call_set_data(p->call, NULL);
  if (!p->sending) free(p);
}

/* The status for a core error; cancelled by a drain becomes UNAVAILABLE so
 * that clients retry after the restart. */
static void fail(struct rpc_call *call, bool draining, int err, const char *errmsg) {
  if (draining && err == STK_ECANCELED)
    rpc_fail(call, RPC_UNAVAILABLE, "coordinator is shutting down; retry");
  else
    rpc_fail_err(call, err, "%s", errmsg && *errmsg ? errmsg : stk_strerror(err));
}

static void answer(void *arg, int err, const char *errmsg, const ProtobufCMessage *resp) {
  struct rpc_call *call = arg;
  if (err)
    fail(call, false, err, errmsg);
  else
    rpc_reply(call, resp);
}

static void answer_parked(void *arg, int err, const char *errmsg, const ProtobufCMessage *resp) {
  struct rpc_call *call = arg;
  struct parked *p = rpc_call_data(call);
  bool draining = p && p->adapter->draining;
  if (p) parked_end(p);
  if (err)
    fail(call, draining, err, errmsg);
  else
    rpc_reply(call, resp);
}

static void cancel_parked(struct rpc_call *call, void *arg) {
  struct parked *p = rpc_call_data(call);
  if (p && p->wait) coord_cancel(p->adapter->coord, p->wait); /* Answers synchronously. */
}

/* ---------------------------------------------------------- unary calls */

#define UNARY_HANDLER(method, fn, type)                                                            \
  static void handle_##method(struct rpc_call *call, const ProtobufCMessage *req, void *svc) {     \
    struct coord_rpc *a = svc;                                                                     \
    fn(a->coord, (const type *)req, answer, call);                                                 \
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
UNARY_HANDLER(kv_add, coord_kv_add, Stoker__V1__KvAddRequest)
UNARY_HANDLER(kv_compare_set, coord_kv_compare_set, Stoker__V1__KvCompareSetRequest)
UNARY_HANDLER(kv_delete, coord_kv_delete, Stoker__V1__KvDeleteRequest)
UNARY_HANDLER(kv_count, coord_kv_count, Stoker__V1__KvCountRequest)
UNARY_HANDLER(report_checkpoint, coord_report_checkpoint, Stoker__V1__ReportCheckpointRequest)

/* The core never completes synchronously, so the wait is still open here. */
#define PARKED_HANDLER(method, fn, type)                                                           \
  static void handle_##method(struct rpc_call *call, const ProtobufCMessage *req, void *svc) {     \
    struct parked *p = parked_new(svc, call);                                                      \
    if (!p) {                                                                                      \
      rpc_fail_err(call, STK_ENOMEM, "out of memory");                                             \
      return;                                                                                      \
    }                                                                                              \
    p->wait = fn(p->adapter->coord, (const type *)req, answer_parked, call);                       \
    rpc_on_cancel(call, cancel_parked, NULL);                                                      \
  }

PARKED_HANDLER(join, coord_join, Stoker__V1__JoinRequest)
PARKED_HANDLER(barrier, coord_barrier, Stoker__V1__BarrierRequest)
PARKED_HANDLER(kv_get, coord_kv_get, Stoker__V1__KvGetRequest)

/* ------------------------------------------------------------ WatchJob */

/* One event at a time: the core holds delivery until the send completes;
 * the parked record outlives the core's watch until then. */
static void event_sent(struct rpc_call *call, int err, void *arg) {
  struct parked *p = arg;
  p->sending = false;
  if (p->ended) {
    free(p); /* The watch ended while this send was in flight. */
    return;
  }
  if (!err && p->wait) coord_watch_resume(p->adapter->coord, p->wait);
}

static bool send_event(void *arg, const Stoker__V1__JobEvent *ev) {
  struct rpc_call *call = arg;
  struct parked *p = rpc_call_data(call);
  if (!p || rpc_send(call, &ev->base, event_sent, p) != 0) return false; /* Cancel ends it. */
  p->sending = true;
  return false;
}

static void watch_done(void *arg, int err, const char *errmsg, const ProtobufCMessage *resp) {
  struct rpc_call *call = arg;
  struct parked *p = rpc_call_data(call);
  bool draining = p && p->adapter->draining;
  if (p) parked_end(p);
  if (draining && err == STK_ECANCELED)
    rpc_finish(call, RPC_UNAVAILABLE, "coordinator is shutting down; resume the watch");
  else if (err)
    rpc_finish(call, stk_error_to_grpc(err), "%s", errmsg && *errmsg ? errmsg : stk_strerror(err));
  else
    rpc_finish(call, RPC_OK, "%s", "");
}

static void handle_watch_job(struct rpc_call *call, const ProtobufCMessage *req, void *svc) {
  struct parked *p = parked_new(svc, call);
  if (!p) {
    rpc_fail_err(call, STK_ENOMEM, "out of memory");
    return;
  }
  p->wait = coord_watch_job(p->adapter->coord, (const Stoker__V1__WatchJobRequest *)req, send_event,
                            watch_done, call);
  rpc_on_cancel(call, cancel_parked, NULL);
}

/* ------------------------------------------------------------- table */

static const struct rpc_method_def coordinator_methods[] = {
    {"CreateJob", RPC_UNARY, handle_create_job, false},
    {"GetJob", RPC_UNARY, handle_get_job, false},
    {"ListJobs", RPC_UNARY, handle_list_jobs, false},
    {"WatchJob", RPC_SERVER_STREAM, handle_watch_job, true},
    {"PauseJob", RPC_UNARY, handle_pause_job, false},
    {"ResumeJob", RPC_UNARY, handle_resume_job, false},
    {"StopJob", RPC_UNARY, handle_stop_job, false},
    {"DeleteJob", RPC_UNARY, handle_delete_job, false},
    {"ScaleJob", RPC_UNARY, handle_scale_job, false},
    {"Join", RPC_UNARY, handle_join, true},
    {"Heartbeat", RPC_UNARY, handle_heartbeat, false},
    {"Leave", RPC_UNARY, handle_leave, false},
    {"Barrier", RPC_UNARY, handle_barrier, true},
    {"KvSet", RPC_UNARY, handle_kv_set, false},
    {"KvGet", RPC_UNARY, handle_kv_get, true},
    {"KvAdd", RPC_UNARY, handle_kv_add, false},
    {"KvCompareSet", RPC_UNARY, handle_kv_compare_set, false},
    {"KvDelete", RPC_UNARY, handle_kv_delete, false},
    {"KvCount", RPC_UNARY, handle_kv_count, false},
    {"ReportCheckpoint", RPC_UNARY, handle_report_checkpoint, false},
};

int coord_rpc_register(struct rpc_server *s, struct coord *c, struct coord_rpc **ret_adapter) {
  struct coord_rpc *a = calloc(1, sizeof(*a));
  if (!a) return STK_ENOMEM;
  a->coord = c;
  int rc = rpc_server_add_service(s, &stoker__v1__coordinator__descriptor, coordinator_methods,
                                  sizeof(coordinator_methods) / sizeof(coordinator_methods[0]), a);
  if (rc) {
    free(a);
    return rc;
  }
  *ret_adapter = a;
  return 0;
}

void coord_rpc_drain(struct coord_rpc *a) {
  a->draining = true;
  for (struct parked *p = a->parked, *next; p; p = next) {
    next = p->next;
    if (p->wait) coord_cancel(a->coord, p->wait); /* Ends p synchronously. */
  }
}

void coord_rpc_free(struct coord_rpc *a) {
  free(a);
}
