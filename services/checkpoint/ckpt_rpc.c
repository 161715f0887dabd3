/*
 * The checkpoint adapter's unary methods: Begin, Commit, Abort, List,
 * GetManifest, Delete, Verify, and GetStagingInfo (answered at once), and the method table. Each
 * becomes one core call whose completion answers the call on the loop. The core may take long
 * (Commit waits until every rank's bytes are durable), so each call keeps a small record: a
 * cancelled or drained call is answered at once and the record only waits for the core's completion
 * to be freed. Write and Read live in ckpt_rpc_write.c and ckpt_rpc_read.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt_rpc_internal.h"
#include "stk_error.h"

struct ckpt_rpc_unary {
  struct ckpt_rpc *a;
  struct rpc_call *call; /* NULL once answered early (cancel, drain). */
  struct ckpt_rpc_unary *prev, *next;
  bool is_commit;
  double start_s;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void unlink_unary(struct ckpt_rpc_unary *u) {
  if (u->prev)
    u->prev->next = u->next;
  else
    u->a->unary = u->next;
  if (u->next) u->next->prev = u->prev;
}

/* Verify answers OK with its findings listed in problems (STK_ECORRUPT
 * comes with the response): the report is the point of the call. */
static void core_done(void *arg, int err, const char *errmsg, const ProtobufCMessage *resp) {
  struct ckpt_rpc_unary *u = arg;
  if (u->call) {
    if (err == 0 || (err == STK_ECORRUPT && resp))
      rpc_reply(u->call, resp);
    else
      rpc_fail_err(u->call, err, "%s", errmsg && errmsg[0] ? errmsg : stk_strerror(err));
    if (err == 0 && u->is_commit && u->a->commit_seconds)
      metric_histogram_observe(u->a->commit_seconds, now_s() - u->start_s);
  }
  unlink_unary(u);
  free(u);
}

static void on_cancel(struct rpc_call *call, void *arg) {
  struct ckpt_rpc_unary *u = arg;
  if (!u->call) return;
  u->call = NULL;
  rpc_fail(call, RPC_CANCELLED, "cancelled");
}

/* The record of a unary call about to go to the core, or NULL when the call
 * was answered already (draining, out of memory). */
static struct ckpt_rpc_unary *start(struct rpc_call *call, struct ckpt_rpc *a, bool is_commit) {
  if (a->draining) {
    rpc_fail(call, RPC_UNAVAILABLE, "checkpoint service is shutting down; retry");
    return NULL;
  }
  struct ckpt_rpc_unary *u = calloc(1, sizeof(*u));
  if (!u) {
    rpc_fail(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
  }
  *u = (struct ckpt_rpc_unary){.a = a, .call = call, .next = a->unary, .is_commit = is_commit};
  u->start_s = now_s();
  if (a->unary) a->unary->prev = u;
  a->unary = u;
  rpc_on_cancel(call, on_cancel, u);
  return u;
}

/* ------------------------------------------------------------- handlers */

/* Begin's answer names this replica as the owner when it is one of
 * several. */
static void begin_done(void *arg, int err, const char *errmsg, const ProtobufCMessage *resp) {
  struct ckpt_rpc_unary *u = arg;
  Stoker__V1__BeginResponse r;
  if (err == 0 && resp && u->a->owner) {
    r = *(const Stoker__V1__BeginResponse *)resp;
    r.owner = u->a->owner;
    resp = &r.base;
  }
  core_done(arg, err, errmsg, resp);
}

RPC_HANDLER(handle_begin, struct ckpt_rpc, Stoker__V1__BeginRequest) {
  if (svc->leaving) {
    rpc_fail(call, RPC_UNAVAILABLE, "checkpoint replica %s is draining; begin on another replica",
             svc->owner);
    return;
  }
  struct ckpt_rpc_unary *u = start(call, svc, false);
  if (u) ckpt_begin(svc->svc, req, begin_done, u);
}

/* A scoped caller may name only its own jobs' attempts (rpc.h); an
 * unknown attempt is the core's to answer. */
static bool attempt_in_scope(struct rpc_call *call, struct ckpt_rpc *a, const char *attempt) {
  const char *job = attempt ? ckpt_service_attempt_job(a->svc, attempt) : NULL;
  return !job || rpc_call_check_job(call, job);
}

RPC_HANDLER(handle_commit, struct ckpt_rpc, Stoker__V1__CommitCheckpointRequest) {
  if (!attempt_in_scope(call, svc, req->attempt)) return;
  struct ckpt_rpc_unary *u = start(call, svc, true);
  if (u) ckpt_commit(svc->svc, req, core_done, u);
}

RPC_HANDLER(handle_abort, struct ckpt_rpc, Stoker__V1__AbortCheckpointRequest) {
  if (!attempt_in_scope(call, svc, req->attempt)) return;
  struct ckpt_rpc_unary *u = start(call, svc, false);
  if (u) ckpt_abort(svc->svc, req, core_done, u);
}

RPC_HANDLER(handle_list, struct ckpt_rpc, Stoker__V1__ListCheckpointsRequest) {
  struct ckpt_rpc_unary *u = start(call, svc, false);
  if (u) ckpt_list(svc->svc, req, core_done, u);
}

RPC_HANDLER(handle_get_manifest, struct ckpt_rpc, Stoker__V1__GetManifestRequest) {
  struct ckpt_rpc_unary *u = start(call, svc, false);
  if (u) ckpt_get_manifest(svc->svc, req, core_done, u);
}

RPC_HANDLER(handle_delete, struct ckpt_rpc, Stoker__V1__DeleteCheckpointRequest) {
  struct ckpt_rpc_unary *u = start(call, svc, false);
  if (u) ckpt_delete(svc->svc, req, core_done, u);
}

RPC_HANDLER(handle_verify, struct ckpt_rpc, Stoker__V1__VerifyCheckpointRequest) {
  struct ckpt_rpc_unary *u = start(call, svc, false);
  if (u) ckpt_verify(svc->svc, req, core_done, u);
}

/* Answered at once, from the service's settings. */
RPC_HANDLER(handle_get_staging_info, struct ckpt_rpc, Stoker__V1__StagingInfoRequest) {
  (void)req;
  Stoker__V1__StagingInfo info;
  ckpt_staging_info(svc->svc, &info);
  if (svc->draining) info.shm_dir = info.shm_token = "";
  if (svc->owner) info.owner = svc->owner;
  rpc_reply(call, &info.base);
}

RPC_HANDLER(handle_write, struct ckpt_rpc, Stoker__V1__WriteChunk) {
  (void)req; /* NULL: a client stream's messages come through rpc_recv. */
  ckpt_rpc_write(call, svc);
}

RPC_HANDLER(handle_read, struct ckpt_rpc, Stoker__V1__ReadRequest) {
  ckpt_rpc_read(call, svc, req);
}

/* ---------------------------------------------------------------- table */

#define SVC Stoker__V1__Checkpoint_Service

static const struct rpc_method_def checkpoint_methods[] = {
    RPC_UNARY_ROW(SVC, begin, handle_begin),
    RPC_CLIENT_STREAM_SCOPED_ROW(SVC, write, handle_write),
    RPC_UNARY_SCOPED_ROW(SVC, commit, handle_commit),
    RPC_UNARY_SCOPED_ROW(SVC, abort, handle_abort),
    RPC_UNARY_ROW(SVC, list, handle_list),
    RPC_UNARY_ROW(SVC, get_manifest, handle_get_manifest),
    RPC_SERVER_STREAM_ROW(SVC, read, handle_read),
    RPC_UNARY_ROW(SVC, delete, handle_delete),
    RPC_UNARY_ROW(SVC, verify, handle_verify),
    RPC_UNARY_SCOPED_ROW(SVC, get_staging_info, handle_get_staging_info), /* No job: any token. */
};

static void register_metrics(struct ckpt_rpc *a, struct metrics *m) {
  if (!m) return;
  a->bytes_staged = metrics_counter(m, "stoker_checkpoint_bytes_staged_total",
                                    "Checkpoint bytes received and staged.", NULL);
  a->bytes_uploaded = metrics_counter(m, "stoker_checkpoint_bytes_uploaded_total",
                                      "Bytes of ranks whose data became durable in storage.", NULL);
  a->commit_seconds = metrics_histogram(m, "stoker_checkpoint_commit_seconds",
                                        "Latency of successful Commit calls.", NULL);
}

int ckpt_rpc_register(struct rpc_server *s, struct ckpt_service *svc,
                      const struct ckpt_rpc_opts *opts, struct ckpt_rpc **ret_adapter) {
  struct ckpt_rpc *a = calloc(1, sizeof(*a));
  if (!a) return STK_ENOMEM;
  a->svc = svc;
  register_metrics(a, opts ? opts->metrics : NULL);
  int rc = rpc_server_add_service(s, &stoker__v1__checkpoint__descriptor, checkpoint_methods,
                                  RPC_N_ROWS(checkpoint_methods), a);
  if (rc) {
    free(a);
    return rc;
  }
  *ret_adapter = a;
  return 0;
}

int ckpt_rpc_set_owner(struct ckpt_rpc *a, const char *owner) {
  char *o = strdup(owner);
  if (!o) return STK_ENOMEM;
  free(a->owner);
  a->owner = o;
  return 0;
}

bool ckpt_rpc_busy(void *adapter) {
  struct ckpt_rpc *a = adapter;
  if (!a->svc) return false;
  size_t n = ckpt_service_attempt_staging(a->svc, NULL, 0);
  struct ckpt_attempt_staging *at = n ? calloc(n, sizeof(*at)) : NULL;
  if (n && !at) return true; /* Out of memory: ask again at the next tick. */
  size_t got = n ? ckpt_service_attempt_staging(a->svc, at, n) : 0;
  bool open = got > n; /* More than were counted: some may be open. */
  for (size_t i = 0; i < n && i < got && !open; i++) open = at[i].open;
  free(at);
  return open;
}

void ckpt_rpc_drain(struct ckpt_rpc *a) {
  if (a->owner) {
    a->leaving = true;
    return;
  }
  a->draining = true;
  for (struct ckpt_rpc_unary *u = a->unary; u; u = u->next) {
    if (!u->call || !u->is_commit) continue;
    struct rpc_call *call = u->call;
    u->call = NULL;
    rpc_fail(call, RPC_UNAVAILABLE,
             "checkpoint service is shutting down; the attempt resumes after the restart");
  }
}

void ckpt_rpc_detach(struct ckpt_rpc *a) {
  if (a) ckpt_rpc_writers_detach(a);
}

void ckpt_rpc_free(struct ckpt_rpc *a) {
  if (!a) return;
  ckpt_rpc_detach(a);
  free(a->owner);
  free(a);
}
