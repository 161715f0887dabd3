/*
 * coord_queue: a submitted job's place in its cluster's queue
 * (ReportQueue). The queue controller, which turns JobSpec.submission into
 * a workload of its cluster, reports what the cluster says of it: queued
 * at a position, admitted for some ranks, evicted, finished, rejected. The
 * last report is the job's Job.queue, kept in its JobRecord (synced before
 * the reply, so a restart keeps it); a change of state logs QUEUED,
 * ADMITTED or REJECTED once, so users follow the queue in the job's event
 * log without Kubernetes credentials. Eviction itself is a PreemptJob
 * (coord_ops.c).
 * A concern beside the operator actions: calls the events, the store, the
 * job's records and the validation below it.
 */
#include "coord_internal.h"

#include <stdio.h>
#include <stdlib.h>

#include "stk_error.h"

#define Q(x) STOKER__V1__QUEUE_STATE__QUEUE_STATE_##x
#define S(x) STOKER__V1__JOB_STATE__JOB_STATE_##x
#define E(x) STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_##x

static Stoker__V1__QueueStatus *status_copy(const Stoker__V1__QueueStatus *in);
static void log_change(struct job *j, const Stoker__V1__QueueStatus *st);

void coord_report_queue(struct coord *c, const Stoker__V1__ReportQueueRequest *req,
                        coord_done_fn done, void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_PLAIN, done, arg);
  if (c->closing || c->broken) return coord_fail(w, STK_EUNAVAIL, "coordinator unavailable");
  struct job *j = coord_job_or_fail(c, req->job, w);
  if (!j) return;
  if (!j->spec->submission)
    return coord_fail(w, STK_ESTATE, "job %s was not submitted to a queue (no spec.submission)",
                      j->name);
  char msg[160];
  int err = coord_queue_status_check(req->status, j->spec->max_ranks, msg, sizeof(msg));
  if (err) return coord_fail(w, err, "%s", msg);
  bool changed = !j->queue || j->queue->state != req->status->state;
  Stoker__V1__QueueStatus *st = status_copy(req->status);
  if (!st->updated_ms) st->updated_ms = coord_wall_ms();
  if (j->queue) protobuf_c_message_free_unpacked(&j->queue->base, NULL);
  j->queue = st;
  if (changed)
    log_change(j, st); /* The event stores the job with it. */
  else
    coord_store_job(j);
  coord_answer_job(w, j);
}

static Stoker__V1__QueueStatus *status_copy(const Stoker__V1__QueueStatus *in) {
  size_t n = stoker__v1__queue_status__get_packed_size(in);
  uint8_t *buf = coord_xmalloc(n ? n : 1);
  stoker__v1__queue_status__pack(in, buf);
  Stoker__V1__QueueStatus *out = stoker__v1__queue_status__unpack(NULL, n, buf);
  free(buf);
  if (!out) abort(); /* Only out of memory: it was just packed. */
  return out;
}

/* The queue a submitted job waits in, as the user named it. */
static const char *queue_name(const struct job *j) {
  const char *q = j->spec->submission->queue;
  return q && *q ? q : "the default queue";
}

/* QUEUED, ADMITTED and REJECTED are events; a job not yet running also
 * says why in its reason. The other states are in Job.queue only: an
 * eviction is the controller's PreemptJob (PREEMPTED), the end is the
 * ranks'. */
static void log_change(struct job *j, const Stoker__V1__QueueStatus *st) {
  char why[1400];
  const char *cq = st->cluster_queue && *st->cluster_queue ? st->cluster_queue : NULL;
  bool idle = j->state == S(WAITING) || j->state == S(PAUSED);
  switch (st->state) {
  case Q(QUEUED):
    if (st->position >= 0)
      snprintf(why, sizeof(why), "queued in %s at position %d", queue_name(j), st->position);
    else
      snprintf(why, sizeof(why), "queued in %s", queue_name(j));
    coord_event(j, E(QUEUED), NULL, 0, "%s", why);
    break;
  case Q(ADMITTED):
    snprintf(why, sizeof(why), "admitted %u rank%s%s%s", st->admitted_ranks,
             st->admitted_ranks == 1 ? "" : "s", cq ? " by " : "", cq ? cq : "");
    coord_event_sized(j, E(ADMITTED), st->admitted_ranks, 0, "%s", why);
    break;
  case Q(REJECTED):
    snprintf(why, sizeof(why), "rejected by the queue controller: %s",
             st->message && *st->message ? st->message : "(no reason given)");
    coord_event(j, E(REJECTED), NULL, 0, "%s", why);
    break;
  case Q(EVICTED):
    snprintf(why, sizeof(why), "evicted from %s; queued again next", queue_name(j));
    break;
  default:
    snprintf(why, sizeof(why), "its workload ended");
    break;
  }
  coord_job_touch(j, idle ? why : NULL);
}
