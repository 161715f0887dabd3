/*
 * The scripted coordinator of fake_coord.h: just enough of each method for
 * the client's behaviour to show (retries, actions, parking, abort, not
 * found, a finite event stream). Handlers run on the fake's loop thread.
 */
#include "fake_coord.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

static struct fake_coord *fake_of(void *data) {
  return data;
}

static void handle_join(struct rpc_call *c, const ProtobufCMessage *m, void *data) {
  struct fake_coord *f = fake_of(data);
  pthread_mutex_lock(&f->mu);
  f->joins++;
  bool fail = f->join_unavailable > 0;
  if (fail) f->join_unavailable--;
  pthread_mutex_unlock(&f->mu);
  if (fail) {
    rpc_fail(c, RPC_UNAVAILABLE, "coordinator restarting");
    return;
  }
  Stoker__V1__CheckpointRef ck = STOKER__V1__CHECKPOINT_REF__INIT;
  ck.step = 100;
  ck.uri = "file:///ckpt/100";
  Stoker__V1__JoinResponse r = STOKER__V1__JOIN_RESPONSE__INIT;
  r.generation = FAKE_GENERATION;
  r.rank = 1;
  r.world_size = 2;
  r.heartbeat_interval_ms = FAKE_INTERVAL_MS;
  r.heartbeat_timeout_ms = 3 * FAKE_INTERVAL_MS;
  r.latest_checkpoint = &ck;
  rpc_reply(c, &r.base);
}

static void handle_heartbeat(struct rpc_call *c, const ProtobufCMessage *m, void *data) {
  struct fake_coord *f = fake_of(data);
  const Stoker__V1__HeartbeatRequest *req = (const Stoker__V1__HeartbeatRequest *)m;
  Stoker__V1__HeartbeatResponse r = STOKER__V1__HEARTBEAT_RESPONSE__INIT;
  pthread_mutex_lock(&f->mu);
  f->heartbeats++;
  f->hb_step = req->step;
  f->hb_loss = req->loss;
  f->hb_terminating += req->terminating;
  r.action = f->next_action;
  r.pausing = f->next_pausing;
  pthread_mutex_unlock(&f->mu);
  r.generation = FAKE_GENERATION + (r.action == 1);
  r.reason = r.action ? "scripted" : "";
  rpc_reply(c, &r.base);
}

static void handle_leave(struct rpc_call *c, const ProtobufCMessage *m, void *data) {
  struct fake_coord *f = fake_of(data);
  pthread_mutex_lock(&f->mu);
  f->leaves++;
  f->leaves_finished += ((const Stoker__V1__LeaveRequest *)m)->finished;
  f->leave_checkpoint_step = ((const Stoker__V1__LeaveRequest *)m)->checkpoint_step;
  pthread_mutex_unlock(&f->mu);
  Stoker__V1__Empty e = STOKER__V1__EMPTY__INIT;
  rpc_reply(c, &e.base);
}

static void handle_barrier(struct rpc_call *c, const ProtobufCMessage *m, void *data) {
  const Stoker__V1__BarrierRequest *req = (const Stoker__V1__BarrierRequest *)m;
  if (req->generation != FAKE_GENERATION) {
    rpc_fail(c, RPC_FAILED_PRECONDITION, "stale generation %llu",
             (unsigned long long)req->generation);
  } else if (strcmp(req->name, "abort") == 0) {
    rpc_fail(c, RPC_ABORTED, "generation ended");
  } else {
    Stoker__V1__BarrierResponse r = STOKER__V1__BARRIER_RESPONSE__INIT;
    r.arrived = 2;
    rpc_reply(c, &r.base);
  }
}

static void reply_value(struct rpc_call *c, struct fake_coord *f) {
  Stoker__V1__KvGetResponse r = STOKER__V1__KV_GET_RESPONSE__INIT;
  r.value.data = f->kv_value;
  r.value.len = f->kv_len;
  rpc_reply(c, &r.base);
}

static void kv_cancelled(struct rpc_call *c, void *arg) {
  struct fake_coord *f = arg;
  pthread_mutex_lock(&f->mu);
  for (int i = 0; i < FAKE_MAX_PARKED; i++) {
    if (f->parked[i] == c) f->parked[i] = NULL;
  }
  pthread_mutex_unlock(&f->mu);
  free(rpc_call_data(c));
  rpc_fail(c, RPC_CANCELLED, "cancelled");
}

static void handle_kv_get(struct rpc_call *c, const ProtobufCMessage *m, void *data) {
  struct fake_coord *f = fake_of(data);
  const Stoker__V1__KvGetRequest *req = (const Stoker__V1__KvGetRequest *)m;
  pthread_mutex_lock(&f->mu);
  if (f->kv_key[0] && strcmp(f->kv_key, req->key) == 0) {
    reply_value(c, f);
  } else if (!req->wait) {
    rpc_fail(c, RPC_NOT_FOUND, "no key \"%s\"", req->key);
  } else {
    for (int i = 0; i < FAKE_MAX_PARKED; i++) {
      if (!f->parked[i]) {
        f->parked[i] = c;
        rpc_call_set_data(c, strdup(req->key));
        rpc_on_cancel(c, kv_cancelled, f);
        break;
      }
    }
  }
  pthread_mutex_unlock(&f->mu);
}

static void handle_kv_set(struct rpc_call *c, const ProtobufCMessage *m, void *data) {
  struct fake_coord *f = fake_of(data);
  const Stoker__V1__KvSetRequest *req = (const Stoker__V1__KvSetRequest *)m;
  pthread_mutex_lock(&f->mu);
  snprintf(f->kv_key, sizeof(f->kv_key), "%s", req->key);
  f->kv_len = req->value.len < sizeof(f->kv_value) ? req->value.len : sizeof(f->kv_value);
  memcpy(f->kv_value, req->value.data, f->kv_len);
  for (int i = 0; i < FAKE_MAX_PARKED; i++) {
    char *key = f->parked[i] ? rpc_call_data(f->parked[i]) : NULL;
    if (key && strcmp(key, f->kv_key) == 0) {
      free(key);
      reply_value(f->parked[i], f);
      f->parked[i] = NULL;
    }
  }
  pthread_mutex_unlock(&f->mu);
  Stoker__V1__Empty e = STOKER__V1__EMPTY__INIT;
  rpc_reply(c, &e.base);
}

static void handle_report_checkpoint(struct rpc_call *c, const ProtobufCMessage *m, void *data) {
  struct fake_coord *f = fake_of(data);
  const Stoker__V1__ReportCheckpointRequest *req = (const Stoker__V1__ReportCheckpointRequest *)m;
  pthread_mutex_lock(&f->mu);
  f->ckpt_step = req->step;
  snprintf(f->ckpt_uri, sizeof(f->ckpt_uri), "%s", req->uri);
  pthread_mutex_unlock(&f->mu);
  Stoker__V1__Empty e = STOKER__V1__EMPTY__INIT;
  rpc_reply(c, &e.base);
}

static void handle_get_job(struct rpc_call *c, const ProtobufCMessage *m, void *data) {
  const Stoker__V1__GetJobRequest *req = (const Stoker__V1__GetJobRequest *)m;
  if (strcmp(req->job, "x") != 0) {
    rpc_fail(c, RPC_NOT_FOUND, "no job named \"%s\"", req->job);
    return;
  }
  Stoker__V1__JobSpec spec = STOKER__V1__JOB_SPEC__INIT;
  spec.name = "x";
  spec.min_ranks = 1;
  spec.max_ranks = 2;
  Stoker__V1__Job job = STOKER__V1__JOB__INIT;
  job.spec = &spec;
  job.state = STOKER__V1__JOB_STATE__JOB_STATE_RUNNING;
  job.generation = FAKE_GENERATION;
  rpc_reply(c, &job.base);
}

/* WatchJob: events seq after_seq+1 .. 3, then the stream ends (deleted). */
struct watch_state {
  uint64_t next;
};

static void watch_sent(struct rpc_call *c, int err, void *arg) {
  struct watch_state *w = arg;
  if (err || w->next > 3) {
    rpc_finish(c, err ? RPC_CANCELLED : RPC_OK, NULL);
    free(w);
    return;
  }
  Stoker__V1__JobEvent ev = STOKER__V1__JOB_EVENT__INIT;
  ev.seq = w->next++;
  ev.job = "x";
  ev.type = ev.seq == 3 ? STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_DELETED
                        : STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_MEMBER_JOINED;
  if (rpc_send(c, &ev.base, watch_sent, w) < 0) {
    rpc_finish(c, RPC_INTERNAL, "send failed");
    free(w);
  }
}

static void handle_watch(struct rpc_call *c, const ProtobufCMessage *m, void *data) {
  struct watch_state *w = calloc(1, sizeof(*w));
  w->next = ((const Stoker__V1__WatchJobRequest *)m)->after_seq + 1;
  watch_sent(c, 0, w);
}

#define SVC Stoker__V1__Coordinator_Service

/* What the client tests call; the rest answer UNIMPLEMENTED. */
static const struct rpc_method_def defs[] = {
    RPC_UNARY_ROW(SVC, join, handle_join),
    RPC_UNARY_ROW(SVC, heartbeat, handle_heartbeat),
    RPC_UNARY_ROW(SVC, leave, handle_leave),
    RPC_UNARY_ROW(SVC, barrier, handle_barrier),
    RPC_UNARY_ROW(SVC, kv_get, handle_kv_get),
    RPC_UNARY_ROW(SVC, kv_set, handle_kv_set),
    RPC_UNARY_ROW(SVC, report_checkpoint, handle_report_checkpoint),
    RPC_UNARY_ROW(SVC, get_job, handle_get_job),
    RPC_SERVER_STREAM_ROW(SVC, watch_job, handle_watch),
    RPC_UNSERVED_ROW(SVC, create_job),
    RPC_UNSERVED_ROW(SVC, list_jobs),
    RPC_UNSERVED_ROW(SVC, pause_job),
    RPC_UNSERVED_ROW(SVC, resume_job),
    RPC_UNSERVED_ROW(SVC, stop_job),
    RPC_UNSERVED_ROW(SVC, delete_job),
    RPC_UNSERVED_ROW(SVC, scale_job),
    RPC_UNSERVED_ROW(SVC, kv_add),
    RPC_UNSERVED_ROW(SVC, kv_compare_set),
    RPC_UNSERVED_ROW(SVC, kv_delete),
    RPC_UNSERVED_ROW(SVC, kv_count),
    RPC_UNSERVED_ROW(SVC, preempt_job),
    RPC_UNSERVED_ROW(SVC, report_queue),
    RPC_UNSERVED_ROW(SVC, list_members),
};

void fake_start(struct fake_coord *f) {
  fake_start_auth(f, NULL);
}

void fake_start_auth(struct fake_coord *f, const char *token_file) {
  memset(f, 0, sizeof(*f));
  pthread_mutex_init(&f->mu, NULL);
  fake_server_init(&f->server, f);
  struct rpc_server_opts o = {.token_file = token_file};
  fake_server_start(&f->server, &o, &stoker__v1__coordinator__descriptor, defs,
                    sizeof(defs) / sizeof(defs[0]), f);
}

void fake_stop(struct fake_coord *f) {
  fake_server_stop(&f->server);
  pthread_mutex_destroy(&f->mu);
}

int fake_get(struct fake_coord *f, const int *field) {
  pthread_mutex_lock(&f->mu);
  int v = *field;
  pthread_mutex_unlock(&f->mu);
  return v;
}

void fake_set(struct fake_coord *f, int *field, int value) {
  pthread_mutex_lock(&f->mu);
  *field = value;
  pthread_mutex_unlock(&f->mu);
}

int fake_wait(struct fake_coord *f, const int *field, int want, int ms) {
  int v = fake_get(f, field);
  for (int waited = 0; v < want && waited < ms; waited += 5) {
    usleep(5000);
    v = fake_get(f, field);
  }
  return v;
}
