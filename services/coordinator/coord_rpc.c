/*
 * The gRPC adapter of the coordinator: one thin handler per method. The
 * core answers through a coord_done_fn; here that becomes exactly one
 * rpc_reply or rpc_fail. Parked operations (Join, Barrier, KvGet with
 * wait, WatchJob) are tracked in a list so that a caller that cancels or
 * runs out of deadline is removed from the core at once, and so that a
 * draining daemon can answer them all UNAVAILABLE without waiting. The
 * tokens are the server's, so CreateJob checks a submission's queue and
 * priority against the caller's token grants here, before the core.
 */
#include "coord_rpc.h"

#include "stk_error.h"

#include <stdlib.h>
#include <string.h>

struct coord_rpc {
  struct coord *coord;
  struct parked *parked; /* Doubly linked list of open parked calls. */
  uint64_t n_parked;     /* Calls on that list. */
  uint64_t parked_peak;  /* The most at once since coord_rpc_parked_span. */
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
  if (++a->n_parked > a->parked_peak) a->parked_peak = a->n_parked;
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
  a->n_parked--;
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

static bool submission_allowed(struct rpc_call *call, const Stoker__V1__Submission *sub,
                               const char **ret_queue, char *first, size_t first_len);

/* A submission is checked against the token's grants (rpc.h, the README's
 * "Tenants' queues and priorities") before the core sees it, so a refused
 * one creates nothing and logs no event. */
RPC_HANDLER(handle_create_job, struct coord_rpc, Stoker__V1__CreateJobRequest) {
  const Stoker__V1__Submission *sub = req->spec ? req->spec->submission : NULL;
  char first[64];
  const char *queue;
  if (!sub) {
    coord_create_job(svc->coord, req, answer, call);
    return;
  }
  if (!submission_allowed(call, sub, &queue, first, sizeof(first))) return;
  /* Shallow copies naming the queue it goes to; the core copies the spec. */
  Stoker__V1__Submission s = *sub;
  Stoker__V1__JobSpec spec = *req->spec;
  Stoker__V1__CreateJobRequest r = *req;
  s.queue = (char *)queue;
  spec.submission = &s;
  r.spec = &spec;
  coord_create_job(svc->coord, &r, answer, call);
}

/* Whether the call's token may submit sub: a queue its queues= holds (no
 * queue named: the list's first, or the controller's default for "*"), a
 * priority its priorities= holds or none (the default). A line without
 * the key: a team's token only the default, an operator's (or no token)
 * anything. Else fails the call PERMISSION_DENIED naming the field.
 * *ret_queue is sub's queue or the list's first, copied to first. */
static bool submission_allowed(struct rpc_call *call, const Stoker__V1__Submission *sub,
                               const char **ret_queue, char *first, size_t first_len) {
  static const char where[] = "on its line of the coordinator's token file";
  bool team = rpc_call_scope(call) != NULL;
  const char *queues = rpc_call_grant(call, RPC_GRANT_QUEUES);
  const char *prios = rpc_call_grant(call, RPC_GRANT_PRIORITIES);
  const char *q = sub->queue ? sub->queue : "", *p = sub->priority ? sub->priority : "";
  if (!*q && queues && strcmp(queues, "*") != 0) {
    size_t n = strcspn(queues, ",");
    if (n == 0 || n >= first_len) {
      rpc_fail(call, RPC_PERMISSION_DENIED,
               "submission.queue: this token may submit to no queue (queues= is empty %s)", where);
      return false;
    }
    memcpy(first, queues, n);
    first[n] = '\0';
    q = first;
  }
  *ret_queue = q;
  if (*q && !(queues ? rpc_grant_holds(queues, q) : !team)) {
    if (queues)
      rpc_fail(call, RPC_PERMISSION_DENIED,
               "submission.queue %.63s: this token may submit only to the queues %.300s "
               "(queues= %s)",
               q, queues, where);
    else
      rpc_fail(call, RPC_PERMISSION_DENIED,
               "submission.queue %.63s: this token may submit only to the controller's default "
               "queue (leave the queue empty): no queues= %s",
               q, where);
    return false;
  }
  if (*p && !(prios ? rpc_grant_holds(prios, p) : !team)) {
    if (prios)
      rpc_fail(call, RPC_PERMISSION_DENIED,
               "submission.priority %.63s: this token may ask only for the priorities %.300s "
               "(priorities= %s) or the default (leave the priority empty)",
               p, prios, where);
    else
      rpc_fail(call, RPC_PERMISSION_DENIED,
               "submission.priority %.63s: this token may ask only for the default priority "
               "(leave the priority empty): no priorities= %s",
               p, where);
    return false;
  }
  return true;
}

RPC_HANDLER(handle_get_job, struct coord_rpc, Stoker__V1__GetJobRequest) {
  coord_get_job(svc->coord, req, answer, call);
}

/* The jobs the caller's token covers (rpc.h). */
static void answer_listing(void *arg, int err, const char *errmsg, const ProtobufCMessage *resp) {
  struct rpc_call *call = arg;
  if (err)
    fail(call, false, err, errmsg);
  else
    rpc_reply_listing(call, resp);
}

RPC_HANDLER(handle_list_jobs, struct coord_rpc, Stoker__V1__ListJobsRequest) {
  coord_list_jobs(svc->coord, req, answer_listing, call);
}

RPC_HANDLER(handle_pause_job, struct coord_rpc, Stoker__V1__JobActionRequest) {
  coord_pause_job(svc->coord, req, answer, call);
}

RPC_HANDLER(handle_resume_job, struct coord_rpc, Stoker__V1__JobActionRequest) {
  coord_resume_job(svc->coord, req, answer, call);
}

RPC_HANDLER(handle_stop_job, struct coord_rpc, Stoker__V1__JobActionRequest) {
  coord_stop_job(svc->coord, req, answer, call);
}

RPC_HANDLER(handle_delete_job, struct coord_rpc, Stoker__V1__JobActionRequest) {
  coord_delete_job(svc->coord, req, answer, call);
}

RPC_HANDLER(handle_scale_job, struct coord_rpc, Stoker__V1__ScaleJobRequest) {
  coord_scale_job(svc->coord, req, answer, call);
}

RPC_HANDLER(handle_preempt_job, struct coord_rpc, Stoker__V1__PreemptJobRequest) {
  coord_preempt_job(svc->coord, req, answer, call);
}

RPC_HANDLER(handle_report_queue, struct coord_rpc, Stoker__V1__ReportQueueRequest) {
  coord_report_queue(svc->coord, req, answer, call);
}

RPC_HANDLER(handle_heartbeat, struct coord_rpc, Stoker__V1__HeartbeatRequest) {
  coord_heartbeat(svc->coord, req, answer, call);
}

RPC_HANDLER(handle_leave, struct coord_rpc, Stoker__V1__LeaveRequest) {
  coord_leave(svc->coord, req, answer, call);
}

RPC_HANDLER(handle_kv_set, struct coord_rpc, Stoker__V1__KvSetRequest) {
  coord_kv_set(svc->coord, req, answer, call);
}

RPC_HANDLER(handle_kv_add, struct coord_rpc, Stoker__V1__KvAddRequest) {
  coord_kv_add(svc->coord, req, answer, call);
}

RPC_HANDLER(handle_kv_compare_set, struct coord_rpc, Stoker__V1__KvCompareSetRequest) {
  coord_kv_compare_set(svc->coord, req, answer, call);
}

RPC_HANDLER(handle_kv_delete, struct coord_rpc, Stoker__V1__KvDeleteRequest) {
  coord_kv_delete(svc->coord, req, answer, call);
}

RPC_HANDLER(handle_kv_count, struct coord_rpc, Stoker__V1__KvCountRequest) {
  coord_kv_count(svc->coord, req, answer, call);
}

RPC_HANDLER(handle_report_checkpoint, struct coord_rpc, Stoker__V1__ReportCheckpointRequest) {
  coord_report_checkpoint(svc->coord, req, answer, call);
}

/* ---------------------------------------------------------- parked calls */

/* A parked call's record, or NULL when out of memory (the call is answered). The
 * core never completes a parked call synchronously, so its wait is still open
 * when the handler stores it. */
static struct parked *park(struct rpc_call *call, struct coord_rpc *a) {
  struct parked *p = parked_new(a, call);
  if (!p) rpc_fail_err(call, STK_ENOMEM, "out of memory");
  return p;
}

RPC_HANDLER(handle_join, struct coord_rpc, Stoker__V1__JoinRequest) {
  struct parked *p = park(call, svc);
  if (!p) return;
  p->wait = coord_join(svc->coord, req, answer_parked, call);
  rpc_on_cancel(call, cancel_parked, NULL);
}

RPC_HANDLER(handle_barrier, struct coord_rpc, Stoker__V1__BarrierRequest) {
  struct parked *p = park(call, svc);
  if (!p) return;
  p->wait = coord_barrier(svc->coord, req, answer_parked, call);
  rpc_on_cancel(call, cancel_parked, NULL);
}

RPC_HANDLER(handle_kv_get, struct coord_rpc, Stoker__V1__KvGetRequest) {
  struct parked *p = park(call, svc);
  if (!p) return;
  p->wait = coord_kv_get(svc->coord, req, answer_parked, call);
  rpc_on_cancel(call, cancel_parked, NULL);
}

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

RPC_HANDLER(handle_watch_job, struct coord_rpc, Stoker__V1__WatchJobRequest) {
  struct parked *p = park(call, svc);
  if (!p) return;
  p->wait = coord_watch_job(svc->coord, req, send_event, watch_done, call);
  rpc_on_cancel(call, cancel_parked, NULL);
}

/* ------------------------------------------------------------- table */

#define SVC Stoker__V1__Coordinator_Service

/* Join, Barrier and KvGet are unary on the wire, parked in the core. */
static const struct rpc_method_def coordinator_methods[] = {
    RPC_UNARY_ROW(SVC, create_job, handle_create_job),
    RPC_UNARY_ROW(SVC, get_job, handle_get_job),
    RPC_UNARY_SCOPED_ROW(SVC, list_jobs, handle_list_jobs),
    RPC_SERVER_STREAM_PARKED_ROW(SVC, watch_job, handle_watch_job),
    RPC_UNARY_ROW(SVC, pause_job, handle_pause_job),
    RPC_UNARY_ROW(SVC, resume_job, handle_resume_job),
    RPC_UNARY_ROW(SVC, stop_job, handle_stop_job),
    RPC_UNARY_ROW(SVC, delete_job, handle_delete_job),
    RPC_UNARY_ROW(SVC, scale_job, handle_scale_job),
    RPC_UNARY_PARKED_ROW(SVC, join, handle_join),
    RPC_UNARY_ROW(SVC, heartbeat, handle_heartbeat),
    RPC_UNARY_ROW(SVC, leave, handle_leave),
    RPC_UNARY_PARKED_ROW(SVC, barrier, handle_barrier),
    RPC_UNARY_ROW(SVC, kv_set, handle_kv_set),
    RPC_UNARY_PARKED_ROW(SVC, kv_get, handle_kv_get),
    RPC_UNARY_ROW(SVC, kv_add, handle_kv_add),
    RPC_UNARY_ROW(SVC, kv_compare_set, handle_kv_compare_set),
    RPC_UNARY_ROW(SVC, kv_delete, handle_kv_delete),
    RPC_UNARY_ROW(SVC, kv_count, handle_kv_count),
    RPC_UNARY_ROW(SVC, report_checkpoint, handle_report_checkpoint),
    RPC_UNARY_ROW(SVC, preempt_job, handle_preempt_job),
    RPC_UNARY_ROW(SVC, report_queue, handle_report_queue),
};

int coord_rpc_register(struct rpc_server *s, struct coord *c, struct coord_rpc **ret_adapter) {
  struct coord_rpc *a = calloc(1, sizeof(*a));
  if (!a) return STK_ENOMEM;
  a->coord = c;
  int rc = rpc_server_add_service(s, &stoker__v1__coordinator__descriptor, coordinator_methods,
                                  RPC_N_ROWS(coordinator_methods), a);
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

void coord_rpc_parked_span(struct coord_rpc *a, uint64_t *ret_now, uint64_t *ret_peak) {
  *ret_now = a->n_parked;
  *ret_peak = a->parked_peak;
  a->parked_peak = a->n_parked;
}

void coord_rpc_free(struct coord_rpc *a) {
  free(a);
}
