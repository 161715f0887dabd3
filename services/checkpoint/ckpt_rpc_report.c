/*
 * The coordinator reporter (ckpt_rpc_report.h): a FIFO of commits guarded
 * by a mutex, drained by one thread that calls ReportCheckpoint with the
 * blocking rpc.h client. Transient failures (UNAVAILABLE, DEADLINE_EXCEEDED,
 * RESOURCE_EXHAUSTED, INTERNAL, UNKNOWN) are retried with exponential
 * backoff from 100 ms to 5 s; ReportCheckpoint is idempotent, so a retry of
 * a report that did land changes nothing. The first failure of a report
 * and every tenth retry are logged; outcomes and failed tries are counted.
 * A reload (SIGHUP) builds a new client on the loop and leaves it in
 * `next`; the thread takes it before its next try (a retry waiting in
 * backoff is woken) and frees the one it replaces, so a client is only
 * ever used and freed by the thread.
 */
#include "ckpt_rpc_report.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "metrics.h"
#include "rpc.h"
#include "stk_error.h"
#include "stoker/v1/coordinator.pb-c.h"

struct item {
  struct item *next;
  char *job, *uri;
  int64_t step;
};

struct ckpt_report {
  struct rpc_client *client; /* The thread's own. */
  struct rpc_client *next;   /* Guarded by mu: left by ckpt_report_reload for the thread. */
  struct metric_counter *reported, *refused, *dropped, *failures; /* NULL: not counted. */
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct item *head, *tail;
  bool stopping;
  struct timespec stop_by; /* CLOCK_REALTIME: give up retrying then. */
};

static struct rpc_client_opts client_opts(const struct ckpt_report_opts *opts) {
  return (struct rpc_client_opts){.target = opts->target,
                                  .token = opts->token,
                                  .tls_ca_file = opts->tls_ca_file,
                                  .tls_cert_file = opts->tls_cert_file,
                                  .tls_key_file = opts->tls_key_file};
}

static void item_free(struct item *it) {
  free(it->job);
  free(it->uri);
  free(it);
}

static bool transient(int code) {
  return code == RPC_UNAVAILABLE || code == RPC_DEADLINE_EXCEEDED ||
         code == RPC_RESOURCE_EXHAUSTED || code == RPC_INTERNAL || code == RPC_UNKNOWN;
}

static bool past(const struct timespec *t) {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  return now.tv_sec > t->tv_sec || (now.tv_sec == t->tv_sec && now.tv_nsec >= t->tv_nsec);
}

/* Waits delay_ms unless stopping with its deadline passed (false then)
 * or a reload left a new client (retry with it now). */
static bool backoff(struct ckpt_report *r, int64_t delay_ms) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += delay_ms / 1000;
  until.tv_nsec += (delay_ms % 1000) * 1000000;
  if (until.tv_nsec >= 1000000000) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000;
  }
  pthread_mutex_lock(&r->mu);
  while (!(r->stopping && past(&r->stop_by)) && !past(&until) && !r->next)
    pthread_cond_timedwait(&r->cv, &r->mu, r->stopping ? &r->stop_by : &until);
  bool go_on = !(r->stopping && past(&r->stop_by));
  pthread_mutex_unlock(&r->mu);
  return go_on;
}

static void count(struct metric_counter *c) {
  if (c) metric_counter_add(c, 1);
}

/* The reporter thread: switches to the client a reload left, if any. */
static void take_next_client(struct ckpt_report *r) {
  pthread_mutex_lock(&r->mu);
  struct rpc_client *next = r->next;
  r->next = NULL;
  pthread_mutex_unlock(&r->mu);
  if (!next) return;
  rpc_client_free(r->client);
  r->client = next;
}

static void send_one(struct ckpt_report *r, const struct item *it) {
  Stoker__V1__ReportCheckpointRequest req = STOKER__V1__REPORT_CHECKPOINT_REQUEST__INIT;
  req.job = it->job;
  req.step = it->step;
  req.uri = it->uri;
  int64_t tries = 0;
  for (int64_t delay_ms = 100;; delay_ms = delay_ms * 2 > 5000 ? 5000 : delay_ms * 2) {
    struct rpc_status st = {0};
    ProtobufCMessage *resp = NULL;
    take_next_client(r);
    int rc = rpc_client_unary(r->client,
                              RPC_METHOD_PATH(stoker__v1__coordinator, report_checkpoint, &req),
                              &req.base, &stoker__v1__empty__descriptor, 10000, &resp, &st);
    if (rc == 0) {
      protobuf_c_message_free_unpacked(resp, NULL);
      log_info("coordinator.reported", "job=%s step=%lld", it->job, (long long)it->step);
      count(r->reported);
      return;
    }
    count(r->failures);
    if (!transient(st.code)) {
      log_warn("coordinator.report_refused", "job=%s step=%lld: %s: %s", it->job,
               (long long)it->step, rpc_code_name(st.code), st.message);
      count(r->refused);
      return;
    }
    if (tries++ % 10 == 0)
      log_warn("coordinator.report_failed", "job=%s step=%lld try=%lld: %s: %s (retrying)", it->job,
               (long long)it->step, (long long)tries, rpc_code_name(st.code), st.message);
    if (!backoff(r, delay_ms)) {
      log_warn("coordinator.report_dropped", "job=%s step=%lld: %s", it->job, (long long)it->step,
               st.message);
      count(r->dropped);
      return;
    }
  }
}

static void *run(void *arg) {
  struct ckpt_report *r = arg;
  pthread_mutex_lock(&r->mu);
  for (;;) {
    while (!r->head && !r->stopping) pthread_cond_wait(&r->cv, &r->mu);
    struct item *it = r->head;
    if (!it) break;
    r->head = it->next;
    if (!r->head) r->tail = NULL;
    pthread_mutex_unlock(&r->mu);
    send_one(r, it);
    item_free(it);
    pthread_mutex_lock(&r->mu);
  }
  pthread_mutex_unlock(&r->mu);
  return NULL;
}

int ckpt_report_new(const struct ckpt_report_opts *opts, struct ckpt_report **ret_report) {
  struct ckpt_report *r = calloc(1, sizeof(*r));
  if (!r) return STK_ENOMEM;
  struct rpc_client_opts o = client_opts(opts);
  if (opts->metrics) {
    const char *name = "stoker_checkpoint_coordinator_reports_total";
    const char *help = "Commit reports to the coordinator, by outcome.";
    r->reported = metrics_counter(opts->metrics, name, help, "result=\"reported\"");
    r->refused = metrics_counter(opts->metrics, name, help, "result=\"refused\"");
    r->dropped = metrics_counter(opts->metrics, name, help, "result=\"dropped\"");
    r->failures =
        metrics_counter(opts->metrics, "stoker_checkpoint_coordinator_report_failures_total",
                        "Failed tries of commit reports (each retry counts).", NULL);
  }
  int rc = rpc_client_new(&o, &r->client);
  if (rc) {
    free(r);
    return rc;
  }
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  if (pthread_create(&r->thread, NULL, run, r) != 0) {
    rpc_client_free(r->client);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
    return STK_ENOMEM;
  }
  *ret_report = r;
  return 0;
}

int ckpt_report_reload(struct ckpt_report *r, const struct ckpt_report_opts *opts) {
  struct rpc_client_opts o = client_opts(opts);
  struct rpc_client *fresh = NULL;
  int rc = rpc_client_new(&o, &fresh);
  if (rc) return rc; /* The client in use stays. */
  pthread_mutex_lock(&r->mu);
  struct rpc_client *untaken = r->next;
  r->next = fresh;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
  rpc_client_free(untaken);
  return 0;
}

void ckpt_report_commit(struct ckpt_report *r, const char *job, int64_t step, const char *uri) {
  struct item *it = calloc(1, sizeof(*it));
  if (it) {
    it->job = strdup(job);
    it->uri = strdup(uri);
    it->step = step;
  }
  if (!it || !it->job || !it->uri) {
    if (it) item_free(it);
    log_warn("coordinator.report_dropped", "job=%s step=%lld: out of memory", job, (long long)step);
    return;
  }
  pthread_mutex_lock(&r->mu);
  if (r->tail)
    r->tail->next = it;
  else
    r->head = it;
  r->tail = it;
  pthread_cond_signal(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

void ckpt_report_free(struct ckpt_report *r, int64_t timeout_ms) {
  if (!r) return;
  pthread_mutex_lock(&r->mu);
  r->stopping = true;
  clock_gettime(CLOCK_REALTIME, &r->stop_by);
  r->stop_by.tv_sec += timeout_ms / 1000;
  r->stop_by.tv_nsec += (timeout_ms % 1000) * 1000000;
  if (r->stop_by.tv_nsec >= 1000000000) {
    r->stop_by.tv_sec++;
    r->stop_by.tv_nsec -= 1000000000;
  }
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
  pthread_join(r->thread, NULL);
  rpc_client_free(r->client);
  rpc_client_free(r->next);
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->cv);
  free(r);
}
