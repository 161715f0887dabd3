/*
 * Validation of everything a client names: job names, member ids, KV keys,
 * barrier names, labels, job specs (with a submission's queue, priority,
 * template and args), the queue controller's reports, and UTF-8 of the
 * free text the coordinator shows back (utf8_valid_str, services/common). Bad input gets
 * STK_EINVAL and a one-line reason naming the field before any state is
 * touched.
 */
#include "coord_internal.h"

#include <stdio.h>
#include <string.h>

#include "stk_error.h"

static bool in_set(char ch, const char *extra) {
  return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
         (extra && ch && strchr(extra, ch) != NULL);
}

static bool is_alpha_upper(char ch) {
  return ch >= 'A' && ch <= 'Z';
}

/* Every char in [a-z0-9] or extra (or A-Z when upper); length lo..hi. */
static bool match(const char *s, size_t lo, size_t hi, bool upper, const char *extra) {
  if (!s) return false;
  size_t n = strlen(s);
  if (n < lo || n > hi) return false;
  for (size_t i = 0; i < n; i++)
    if (!in_set(s[i], extra) && !(upper && is_alpha_upper(s[i]))) return false;
  return true;
}

bool coord_valid_job_name(const char *s) {
  return match(s, 1, 63, false, "._-") && in_set(s[0], NULL);
}

bool coord_valid_member_id(const char *s) {
  return match(s, 1, 128, true, "._:@-");
}

bool coord_valid_key(const char *s) {
  return match(s, 1, 256, true, "._:/-");
}

static int bad(char *msg, size_t len, const char *what) {
  snprintf(msg, len, "%s", what);
  return STK_EINVAL;
}

static int check_labels(const Stoker__V1__JobSpec *s, char *msg, size_t len) {
  if (s->n_labels > 64) return bad(msg, len, "more than 64 labels");
  for (size_t i = 0; i < s->n_labels; i++) {
    const Stoker__V1__JobSpec__LabelsEntry *e = s->labels[i];
    /* The key is echoed only once it is known to be plain ASCII. */
    if (!match(e->key, 1, 63, true, "._/-"))
      return bad(msg, len, "labels: a key must match [A-Za-z0-9._/-]{1,63}");
    if (!e->value || strlen(e->value) > 256 || !utf8_valid_str(e->value)) {
      snprintf(msg, len, "labels[\"%s\"] value %s", e->key,
               e->value && utf8_valid_str(e->value) ? "over 256 bytes" : "not valid UTF-8");
      return STK_EINVAL;
    }
  }
  return 0;
}

static int check_refs(const Stoker__V1__JobSpec *s, char *msg, size_t len) {
  if (s->dataset && s->dataset->uri && strlen(s->dataset->uri) > 1024)
    return bad(msg, len, "dataset uri over 1024 bytes");
  if (s->dataset && s->dataset->uri && !utf8_valid_str(s->dataset->uri))
    return bad(msg, len, "dataset uri not valid UTF-8");
  if (s->checkpoint_storage && s->checkpoint_storage->uri &&
      strlen(s->checkpoint_storage->uri) > 1024)
    return bad(msg, len, "checkpoint_storage uri over 1024 bytes");
  if (s->checkpoint_storage && s->checkpoint_storage->uri &&
      !utf8_valid_str(s->checkpoint_storage->uri))
    return bad(msg, len, "checkpoint_storage uri not valid UTF-8");
  return 0;
}

/* A cluster object's name (queue, priority class, template):
 * [a-z0-9][a-z0-9.-]{0,62}, or "" where the field may be left to a default. */
static bool cluster_name(const char *s, bool may_be_empty) {
  if (!s || !*s) return may_be_empty;
  return match(s, 1, 63, false, ".-") && in_set(s[0], NULL);
}

static int check_submission(const Stoker__V1__Submission *sub, char *msg, size_t len) {
  if (!sub) return 0;
  if (!cluster_name(sub->queue, true))
    return bad(msg, len, "submission.queue must be empty or match [a-z0-9][a-z0-9.-]{0,62}");
  if (!cluster_name(sub->priority, true))
    return bad(msg, len, "submission.priority must be empty or match [a-z0-9][a-z0-9.-]{0,62}");
  if (!cluster_name(sub->template_, false))
    return bad(msg, len, "submission.template must match [a-z0-9][a-z0-9.-]{0,62}");
  if (sub->n_args > 64) return bad(msg, len, "submission.args: more than 64 arguments");
  for (size_t i = 0; i < sub->n_args; i++)
    if (!sub->args[i] || strlen(sub->args[i]) > 1024 || !utf8_valid_str(sub->args[i])) {
      snprintf(msg, len, "submission.args[%zu] %s", i,
               sub->args[i] && utf8_valid_str(sub->args[i]) ? "over 1024 bytes"
                                                            : "not valid UTF-8");
      return STK_EINVAL;
    }
  return 0;
}

int coord_spec_check(Stoker__V1__JobSpec *s, char *msg, size_t len) {
  if (!s) return bad(msg, len, "spec missing");
  if (!coord_valid_job_name(s->name))
    return bad(msg, len, "job name must match [a-z0-9][a-z0-9._-]{0,62}");
  if (s->min_ranks < 1 || s->min_ranks > s->max_ranks || s->max_ranks > 100000)
    return bad(msg, len, "need 1 <= min_ranks <= max_ranks <= 100000");
  if (!s->heartbeat_interval_ms) s->heartbeat_interval_ms = 5000;
  if (!s->heartbeat_misses) s->heartbeat_misses = 3;
  if (!s->last_call_ms) s->last_call_ms = 30000;
  if (!s->join_timeout_ms) s->join_timeout_ms = 600000;
  if (s->heartbeat_interval_ms < 10 || s->heartbeat_interval_ms > 3600000)
    return bad(msg, len, "heartbeat_interval_ms must be 10..3600000");
  if (s->heartbeat_misses > 100) return bad(msg, len, "heartbeat_misses must be 1..100");
  if (s->last_call_ms > 3600000) return bad(msg, len, "last_call_ms must be 0..3600000");
  int err = check_labels(s, msg, len);
  if (!err) err = check_refs(s, msg, len);
  return err ? err : check_submission(s->submission, msg, len);
}

/* A Kubernetes object's name as the controller reports it (a Workload, a
 * ClusterQueue): a DNS subdomain, at most 253 bytes, or "". */
static bool object_name(const char *s) {
  return !s || !*s || match(s, 1, 253, false, ".-");
}

int coord_queue_status_check(const Stoker__V1__QueueStatus *st, uint32_t max_ranks, char *msg,
                             size_t len) {
  if (!st) return bad(msg, len, "status missing");
  if (st->state < STOKER__V1__QUEUE_STATE__QUEUE_STATE_QUEUED ||
      st->state > STOKER__V1__QUEUE_STATE__QUEUE_STATE_REJECTED)
    return bad(msg, len, "status.state must be QUEUED, ADMITTED, EVICTED, FINISHED or REJECTED");
  if (!object_name(st->workload))
    return bad(msg, len, "status.workload must match [a-z0-9.-]{0,253}");
  if (!object_name(st->cluster_queue))
    return bad(msg, len, "status.cluster_queue must match [a-z0-9.-]{0,253}");
  if (st->position < -1) return bad(msg, len, "status.position must be -1 (unknown) or more");
  if (st->admitted_ranks > max_ranks) {
    snprintf(msg, len, "status.admitted_ranks %u over the job's max_ranks %u", st->admitted_ranks,
             max_ranks);
    return STK_EINVAL;
  }
  if (st->message && strlen(st->message) > 1024)
    return bad(msg, len, "status.message over 1024 bytes");
  if (st->message && !utf8_valid_str(st->message))
    return bad(msg, len, "status.message not valid UTF-8");
  if (st->updated_ms < 0) return bad(msg, len, "status.updated_ms must not be negative");
  return 0;
}
