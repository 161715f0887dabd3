/*
 * Operator and tooling calls on jobs (what stokerctl uses): create, get,
 * list, pause/resume/stop, delete, scale and watch (stoker_admin.h, not
 * installed). Each is one unary call through client_call(), except
 * WatchJob, a server stream whose end a caller can wait for, and get and
 * list, which follow a job's member pages (ListMembers) so that every Job
 * they answer holds all its members.
 */
#include "client_internal.h"
#include "stoker_admin.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int stk_job_create(struct stk_client *c, const Stoker__V1__JobSpec *spec, int64_t timeout_ms,
                   Stoker__V1__Job **ret_job) {
  if (!spec) return client_fail(STK_EINVAL, "create job");
  Stoker__V1__CreateJobRequest req = STOKER__V1__CREATE_JOB_REQUEST__INIT;
  req.spec = (Stoker__V1__JobSpec *)spec;
  return COORD_CALL(c, create_job, &req, timeout_ms, ret_job);
}

/* Times a job is read again when its generation changed while its member
 * pages were followed (each change is a rendezvous round). */
#define MEMBER_READS 5

static int complete_members(struct stk_client *c, Stoker__V1__Job *job, int64_t timeout_ms);

int stk_job_get(struct stk_client *c, const char *job, int64_t timeout_ms,
                Stoker__V1__Job **ret_job) {
  if (!job) return client_fail(STK_EINVAL, "get job");
  Stoker__V1__GetJobRequest req = STOKER__V1__GET_JOB_REQUEST__INIT;
  req.job = (char *)job;
  for (int reads = 1;; reads++) {
    Stoker__V1__Job *got = NULL;
    int err = COORD_CALL(c, get_job, &req, timeout_ms, &got);
    if (err) return err;
    err = complete_members(c, got, timeout_ms);
    if (!err) {
      *ret_job = got;
      return 0;
    }
    protobuf_c_message_free_unpacked(&got->base, NULL);
    if (err != STK_EABORTED || reads == MEMBER_READS) return err;
  }
}

/* Follows a Job's member pages (ListMembers from its
 * next_members_page_token) and moves every member into job, so that it
 * holds its whole generation and no token. STK_EABORTED when the job's
 * generation changed meanwhile (members of two generations never mix). */
static int complete_members(struct stk_client *c, Stoker__V1__Job *job, int64_t timeout_ms) {
  if (!job->next_members_page_token || !*job->next_members_page_token) return 0;
  Stoker__V1__ListMembersRequest req = STOKER__V1__LIST_MEMBERS_REQUEST__INIT;
  req.job = job->spec ? job->spec->name : "";
  req.page_token = job->next_members_page_token;
  Stoker__V1__ListMembersResponse *rest = NULL;
  int err = CLIENT_LIST_ALL(stoker__v1__coordinator, c, list_members, &req, timeout_ms, &rest);
  if (err) return err;
  if (rest->generation != job->generation) {
    protobuf_c_message_free_unpacked(&rest->base, NULL);
    return client_fail(STK_EABORTED, "list members: the generation changed");
  }
  if (rest->n_members) {
    Stoker__V1__Member **m =
        realloc(job->members, (job->n_members + rest->n_members) * sizeof(*job->members));
    if (!m) {
      protobuf_c_message_free_unpacked(&rest->base, NULL);
      return client_fail(STK_ENOMEM, "list members");
    }
    memcpy(m + job->n_members, rest->members, rest->n_members * sizeof(*m));
    job->members = m;
    job->n_members += rest->n_members;
    rest->n_members = 0; /* the members belong to job now */
  }
  protobuf_c_message_free_unpacked(&rest->base, NULL);
  free(job->next_members_page_token);
  job->next_members_page_token = (char *)protobuf_c_empty_string;
  return 0;
}

int stk_job_list(struct stk_client *c, const char *const *keys, const char *const *values,
                 size_t n_labels, int64_t timeout_ms, Stoker__V1__ListJobsResponse **ret_resp) {
  Stoker__V1__ListJobsRequest req = STOKER__V1__LIST_JOBS_REQUEST__INIT;
  Stoker__V1__ListJobsRequest__LabelSelectorEntry *entries = NULL, **ptrs = NULL;
  if (n_labels) {
    entries = calloc(n_labels, sizeof(*entries));
    ptrs = calloc(n_labels, sizeof(*ptrs));
    if (!entries || !ptrs) {
      free(entries);
      free(ptrs);
      return client_fail(STK_ENOMEM, "list jobs");
    }
  }
  for (size_t i = 0; i < n_labels; i++) {
    stoker__v1__list_jobs_request__label_selector_entry__init(&entries[i]);
    entries[i].key = (char *)keys[i];
    entries[i].value = (char *)values[i];
    ptrs[i] = &entries[i];
  }
  req.n_label_selector = n_labels;
  req.label_selector = ptrs;
  Stoker__V1__ListJobsResponse *resp = NULL;
  int err = CLIENT_LIST_ALL(stoker__v1__coordinator, c, list_jobs, &req, timeout_ms, &resp);
  free(entries);
  free(ptrs);
  for (size_t i = 0; !err && i < resp->n_jobs; i++) {
    Stoker__V1__Job *job = resp->jobs[i], *again = NULL;
    err = complete_members(c, job, timeout_ms);
    if (err != STK_EABORTED) continue;
    /* A new generation since the listing: this job read again whole. */
    err = stk_job_get(c, job->spec ? job->spec->name : "", timeout_ms, &again);
    if (err) break;
    protobuf_c_message_free_unpacked(&job->base, NULL);
    resp->jobs[i] = again;
  }
  if (err) {
    if (resp) protobuf_c_message_free_unpacked(&resp->base, NULL);
    return err;
  }
  *ret_resp = resp;
  return 0;
}

int stk_job_action(struct stk_client *c, enum stk_job_verb verb, const char *job, bool force,
                   int64_t timeout_ms, Stoker__V1__Job **ret_job) {
  if (!job || (unsigned)verb > STK_JOB_STOP) return client_fail(STK_EINVAL, "job action");
  Stoker__V1__JobActionRequest req = STOKER__V1__JOB_ACTION_REQUEST__INIT;
  req.job = (char *)job;
  req.force = force;
  if (verb == STK_JOB_PAUSE) return COORD_CALL(c, pause_job, &req, timeout_ms, ret_job);
  if (verb == STK_JOB_RESUME) return COORD_CALL(c, resume_job, &req, timeout_ms, ret_job);
  return COORD_CALL(c, stop_job, &req, timeout_ms, ret_job);
}

int stk_job_delete(struct stk_client *c, const char *job, bool force, int64_t timeout_ms) {
  if (!job) return client_fail(STK_EINVAL, "delete job");
  Stoker__V1__JobActionRequest req = STOKER__V1__JOB_ACTION_REQUEST__INIT;
  req.job = (char *)job;
  req.force = force;
  return COORD_CALL(c, delete_job, &req, timeout_ms, (Stoker__V1__Empty **)NULL);
}

static int scale_job(struct stk_client *c, const char *job, uint32_t ranks, bool skip_checkpoint,
                     bool in_place, int64_t timeout_ms, Stoker__V1__Job **ret_job);

int stk_job_scale(struct stk_client *c, const char *job, uint32_t ranks, bool skip_checkpoint,
                  int64_t timeout_ms, Stoker__V1__Job **ret_job) {
  return scale_job(c, job, ranks, skip_checkpoint, false, timeout_ms, ret_job);
}

int stk_job_scale_in_place(struct stk_client *c, const char *job, uint32_t ranks,
                           int64_t timeout_ms, Stoker__V1__Job **ret_job) {
  return scale_job(c, job, ranks, false, true, timeout_ms, ret_job);
}

static int scale_job(struct stk_client *c, const char *job, uint32_t ranks, bool skip_checkpoint,
                     bool in_place, int64_t timeout_ms, Stoker__V1__Job **ret_job) {
  if (!job) return client_fail(STK_EINVAL, "scale job");
  Stoker__V1__ScaleJobRequest req = STOKER__V1__SCALE_JOB_REQUEST__INIT;
  req.job = (char *)job;
  req.ranks = ranks;
  req.skip_checkpoint = skip_checkpoint;
  req.in_place = in_place;
  return COORD_CALL(c, scale_job, &req, timeout_ms, ret_job);
}

int stk_job_preempt(struct stk_client *c, const char *job, const char *reason, int64_t timeout_ms,
                    Stoker__V1__Job **ret_job) {
  if (!job) return client_fail(STK_EINVAL, "preempt job");
  Stoker__V1__PreemptJobRequest req = STOKER__V1__PREEMPT_JOB_REQUEST__INIT;
  req.job = (char *)job;
  req.reason = (char *)(reason ? reason : "");
  return COORD_CALL(c, preempt_job, &req, timeout_ms, ret_job);
}

/* ------------------------------------------------------------------ watch */

struct stk_watch {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  int cancelling; /* Threads inside rpc_client_call_cancel. */
  struct rpc_client_call *call;
  struct rpc_status st;
  stk_event_fn on_event;
  void *arg;
};

static void watch_msg(void *arg, ProtobufCMessage *msg) {
  struct stk_watch *w = arg;
  w->on_event(w->arg, (const Stoker__V1__JobEvent *)msg);
  protobuf_c_message_free_unpacked(msg, NULL);
}

static void watch_done(void *arg, const struct rpc_status *st) {
  struct stk_watch *w = arg;
  pthread_mutex_lock(&w->mu);
  while (w->cancelling > 0) pthread_cond_wait(&w->cv, &w->mu);
  w->st = *st;
  w->done = true;
  w->call = NULL;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

int stk_job_watch(struct stk_client *c, const char *job, uint64_t after_seq, stk_event_fn on_event,
                  void *arg, struct stk_watch **ret_watch) {
  if (!job || !on_event) return client_fail(STK_EINVAL, "watch job");
  struct stk_watch *w = calloc(1, sizeof(*w));
  if (!w) return client_fail(STK_ENOMEM, "watch job");
  pthread_mutex_init(&w->mu, NULL);
  client_cond_init(&w->cv);
  w->on_event = on_event;
  w->arg = arg;
  Stoker__V1__WatchJobRequest req = STOKER__V1__WATCH_JOB_REQUEST__INIT;
  req.job = (char *)job;
  req.after_seq = after_seq;
  struct rpc_client_call *call = NULL;
  pthread_mutex_lock(&w->mu);
  int err = rpc_client_stream_async(client_rpc(c), COORD_METHOD(watch_job, &req), &req.base,
                                    &stoker__v1__job_event__descriptor, 0, watch_msg, watch_done, w,
                                    &call);
  if (err == 0 && !w->done) w->call = call;
  pthread_mutex_unlock(&w->mu);
  if (err < 0) {
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
    return client_fail(err, "watch job");
  }
  *ret_watch = w;
  return 0;
}

int stk_watch_wait(struct stk_watch *w, int64_t timeout_ms) {
  struct timespec ts;
  if (timeout_ms >= 0) client_deadline_after(&ts, timeout_ms);
  pthread_mutex_lock(&w->mu);
  while (!w->done) {
    if (timeout_ms < 0) {
      pthread_cond_wait(&w->cv, &w->mu);
    } else if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT) {
      break;
    }
  }
  bool done = w->done;
  struct rpc_status st = w->st;
  pthread_mutex_unlock(&w->mu);
  if (!done) return STK_ETIMEDOUT;
  if (st.code == RPC_OK) return 0;
  client_set_error(st.code, "%s", st.message);
  return stk_error_from_grpc(st.code);
}

void stk_watch_cancel(struct stk_watch *w) {
  pthread_mutex_lock(&w->mu);
  if (!w->done && w->call) {
    struct rpc_client_call *call = w->call;
    w->cancelling++;
    pthread_mutex_unlock(&w->mu);
    rpc_client_call_cancel(call);
    pthread_mutex_lock(&w->mu);
    w->cancelling--;
    pthread_cond_broadcast(&w->cv);
  }
  pthread_mutex_unlock(&w->mu);
}

void stk_watch_free(struct stk_watch *w) {
  if (!w) return;
  stk_watch_cancel(w);
  stk_watch_wait(w, -1);
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
  free(w);
}

/* ------------------------------------------------------------------ usage */

int stk_usage_get(struct stk_client *c, int64_t timeout_ms, Stoker__V1__UsageReport **ret_report) {
  Stoker__V1__GetUsageRequest req = STOKER__V1__GET_USAGE_REQUEST__INIT;
  return CLIENT_CALL(stoker__v1__usage, c, get_usage, &req, timeout_ms, ret_report);
}
