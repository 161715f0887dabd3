/*
 * `stokerctl job show`: one job for a person — its spec, where it stands,
 * a submitted job's place in its queue, its latest checkpoint, and a table of the members of the
 * current generation with their last reported figures.
 */
#include <inttypes.h>
#include <string.h>

#include "cli_format.h"

/* Adds a "Key:  value" row to the two-column summary. */
static void field(struct table *t, const char *key, const char *value) {
  const char *row[] = {key, value};
  table_add(t, row);
}

static void spec_fields(struct table *t, const Stoker__V1__JobSpec *s) {
  char buf[1024], a[32], b[32];
  snprintf(buf, sizeof(buf), "min %u, max %u", s->min_ranks, s->max_ranks);
  field(t, "Ranks:", buf);
  fmt_duration_ms(s->heartbeat_interval_ms, a, sizeof(a));
  snprintf(b, sizeof(b), "%u", s->heartbeat_misses);
  snprintf(buf, sizeof(buf), "every %s, dead after %s missed",
           s->heartbeat_interval_ms ? a : "default", s->heartbeat_misses ? b : "default");
  field(t, "Heartbeat:", buf);
  fmt_duration_ms(s->last_call_ms, a, sizeof(a));
  fmt_duration_ms(s->join_timeout_ms, b, sizeof(b));
  snprintf(buf, sizeof(buf), "last call %s, join timeout %s", s->last_call_ms ? a : "default",
           s->join_timeout_ms ? b : "default");
  field(t, "Rendezvous:", buf);
  size_t off = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < s->n_labels && off < sizeof(buf); i++) {
    off += (size_t)snprintf(buf + off, sizeof(buf) - off, "%s%s=%s", i ? ", " : "",
                            s->labels[i]->key, s->labels[i]->value);
  }
  field(t, "Labels:", buf);
  field(t, "Dataset:", s->dataset ? s->dataset->uri : NULL);
  snprintf(buf, sizeof(buf), "%s", s->checkpoint_storage ? s->checkpoint_storage->uri : "-");
  if (s->checkpoint_every_steps)
    snprintf(buf + strlen(buf), sizeof(buf) - strlen(buf), " (every %" PRIu64 " steps)",
             s->checkpoint_every_steps);
  field(t, "Checkpoints:", buf);
}

static void state_fields(struct table *t, const Stoker__V1__Job *j, int64_t now_ms) {
  char buf[1024], st[32], age[32];
  fmt_job_state(j->state, st, sizeof(st));
  snprintf(buf, sizeof(buf), "%s%s%s%s", st, j->reason && j->reason[0] ? " (" : "",
           j->reason ? j->reason : "", j->reason && j->reason[0] ? ")" : "");
  field(t, "State:", buf);
  snprintf(buf, sizeof(buf), "%" PRIu64, j->generation);
  field(t, "Generation:", buf);
  if (j->target_seq) /* Which ScaleJob set the target: its SCALED event. */
    snprintf(buf, sizeof(buf), "%u (target %u set by event %" PRIu64 ", waiting %u)", j->world_size,
             j->target_ranks, j->target_seq, j->waiting);
  else
    snprintf(buf, sizeof(buf), "%u (target %u, waiting %u)", j->world_size, j->target_ranks,
             j->waiting);
  field(t, "World:", buf);
  const Stoker__V1__CheckpointRef *ck = j->latest_checkpoint;
  if (ck && ck->step) {
    fmt_age(now_ms, ck->committed_at_ms, age, sizeof(age));
    snprintf(buf, sizeof(buf), "step %" PRId64 " at %s (generation %" PRIu64 ", %s ago)", ck->step,
             ck->uri ? ck->uri : "-", ck->generation, age);
    field(t, "Latest checkpoint:", buf);
  } else {
    field(t, "Latest checkpoint:", "none");
  }
  fmt_time_ms(j->created_at_ms, buf, sizeof(buf));
  field(t, "Created:", buf);
  snprintf(buf, sizeof(buf), "%" PRIu64, j->last_event_seq);
  field(t, "Last event:", buf);
}

/* A submitted job: where it was sent, and the queue controller's last word. */
static void queue_fields(struct table *t, const Stoker__V1__Job *j, int64_t now_ms) {
  const Stoker__V1__Submission *sub = j->spec ? j->spec->submission : NULL;
  if (!sub) return;
  char buf[1400], st[32], age[32];
  snprintf(buf, sizeof(buf), "queue %s, priority %s, template %s",
           sub->queue[0] ? sub->queue : "(default)", sub->priority[0] ? sub->priority : "(default)",
           sub->template_);
  field(t, "Submitted:", buf);
  size_t off = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < sub->n_args && off < sizeof(buf); i++)
    off += (size_t)snprintf(buf + off, sizeof(buf) - off, "%s%s", i ? " " : "", sub->args[i]);
  if (sub->n_args) field(t, "Trainer args:", buf);
  const Stoker__V1__QueueStatus *q = j->queue;
  if (!q) {
    field(t, "Queue:", "not yet seen by the queue controller");
    return;
  }
  fmt_queue_state(q->state, st, sizeof(st));
  off = (size_t)snprintf(buf, sizeof(buf), "%s", st);
  if (q->state == STOKER__V1__QUEUE_STATE__QUEUE_STATE_QUEUED && q->position >= 0)
    off += (size_t)snprintf(buf + off, sizeof(buf) - off, " at position %d", q->position);
  if (q->admitted_ranks)
    off += (size_t)snprintf(buf + off, sizeof(buf) - off, ", %u ranks admitted", q->admitted_ranks);
  if (q->cluster_queue[0] && off < sizeof(buf))
    off += (size_t)snprintf(buf + off, sizeof(buf) - off, ", cluster queue %s", q->cluster_queue);
  if (q->workload[0] && off < sizeof(buf))
    off += (size_t)snprintf(buf + off, sizeof(buf) - off, ", workload %s", q->workload);
  if (q->updated_ms && off < sizeof(buf)) {
    fmt_age(now_ms, q->updated_ms, age, sizeof(age));
    snprintf(buf + off, sizeof(buf) - off, " (%s ago)", age);
  }
  field(t, "Queue:", buf);
  if (q->message[0]) field(t, "Queue message:", q->message);
}

static void member_table(const Stoker__V1__Job *j, int64_t now_ms, FILE *out) {
  static const char *const headers[] = {"RANK",     "MEMBER", "HOST",   "STEP",
                                        "TOKENS/S", "LOSS",   "HEALTH", "LAST HEARTBEAT"};
  struct table *t = table_new(8, headers);
  if (!t) return;
  for (size_t i = 0; i < j->n_members; i++) {
    const Stoker__V1__Member *m = j->members[i];
    char rank[16], step[24], tps[32], loss[32], health[32], age[40];
    snprintf(rank, sizeof(rank), "%u", m->rank);
    snprintf(step, sizeof(step), "%" PRIu64, m->step);
    snprintf(tps, sizeof(tps), "%.0f", m->tokens_per_s);
    snprintf(loss, sizeof(loss), "%.4f", m->loss);
    fmt_health(m->health, health, sizeof(health));
    fmt_age(now_ms, m->last_heartbeat_ms, age, sizeof(age));
    if (m->last_heartbeat_ms > 0) strncat(age, " ago", sizeof(age) - strlen(age) - 1);
    const char *row[] = {rank, m->member_id, m->host, step, tps, loss, health, age};
    table_add(t, row);
  }
  table_print(t, out);
  table_free(t);
}

void fmt_job_show(const Stoker__V1__Job *job, int64_t now_ms, FILE *out) {
  struct table *t = table_new(2, NULL);
  if (!t) return;
  field(t, "Job:", job->spec ? job->spec->name : NULL);
  state_fields(t, job, now_ms);
  queue_fields(t, job, now_ms);
  if (job->spec) spec_fields(t, job->spec);
  table_print(t, out);
  table_free(t);
  fprintf(out, "\nMembers (%zu):\n", job->n_members);
  if (job->n_members) member_table(job, now_ms, out);
}
