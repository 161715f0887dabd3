/*
 * stokerctl --json: jobs and events as JSON objects for tooling, one per
 * line. Field names follow the proto (snake_case), enums are their short
 * names ("RUNNING"), times stay Unix milliseconds.
 */
#include <stdlib.h>

#include "cli_format.h"

static void add_str(cJSON *o, const char *key, const char *s) {
  cJSON_AddStringToObject(o, key, s ? s : "");
}

static cJSON *spec_json(const Stoker__V1__JobSpec *s) {
  cJSON *o = cJSON_CreateObject();
  add_str(o, "name", s->name);
  cJSON_AddNumberToObject(o, "min_ranks", s->min_ranks);
  cJSON_AddNumberToObject(o, "max_ranks", s->max_ranks);
  cJSON_AddNumberToObject(o, "heartbeat_interval_ms", s->heartbeat_interval_ms);
  cJSON_AddNumberToObject(o, "heartbeat_misses", s->heartbeat_misses);
  cJSON_AddNumberToObject(o, "last_call_ms", s->last_call_ms);
  cJSON_AddNumberToObject(o, "join_timeout_ms", s->join_timeout_ms);
  cJSON *labels = cJSON_AddObjectToObject(o, "labels");
  for (size_t i = 0; i < s->n_labels; i++) add_str(labels, s->labels[i]->key, s->labels[i]->value);
  add_str(o, "dataset", s->dataset ? s->dataset->uri : NULL);
  add_str(o, "checkpoint_storage", s->checkpoint_storage ? s->checkpoint_storage->uri : NULL);
  cJSON_AddNumberToObject(o, "checkpoint_every_steps", (double)s->checkpoint_every_steps);
  if (!s->submission) {
    cJSON_AddNullToObject(o, "submission");
  } else {
    cJSON *sub = cJSON_AddObjectToObject(o, "submission");
    add_str(sub, "queue", s->submission->queue);
    add_str(sub, "priority", s->submission->priority);
    add_str(sub, "template", s->submission->template_);
    cJSON *args = cJSON_AddArrayToObject(sub, "args");
    for (size_t i = 0; i < s->submission->n_args; i++)
      cJSON_AddItemToArray(args, cJSON_CreateString(s->submission->args[i]));
  }
  return o;
}

static cJSON *queue_json(const Stoker__V1__QueueStatus *q) {
  char buf[32];
  cJSON *o = cJSON_CreateObject();
  add_str(o, "state", fmt_queue_state(q->state, buf, sizeof(buf)));
  add_str(o, "workload", q->workload);
  add_str(o, "cluster_queue", q->cluster_queue);
  cJSON_AddNumberToObject(o, "position", q->position);
  cJSON_AddNumberToObject(o, "admitted_ranks", q->admitted_ranks);
  add_str(o, "message", q->message);
  cJSON_AddNumberToObject(o, "updated_ms", (double)q->updated_ms);
  return o;
}

static cJSON *member_json(const Stoker__V1__Member *m) {
  char buf[32];
  cJSON *o = cJSON_CreateObject();
  add_str(o, "member_id", m->member_id);
  cJSON_AddNumberToObject(o, "rank", m->rank);
  add_str(o, "address", m->address);
  add_str(o, "host", m->host);
  cJSON_AddNumberToObject(o, "last_heartbeat_ms", (double)m->last_heartbeat_ms);
  cJSON_AddNumberToObject(o, "step", (double)m->step);
  cJSON_AddNumberToObject(o, "tokens_per_s", m->tokens_per_s);
  cJSON_AddNumberToObject(o, "loss", m->loss);
  add_str(o, "health", fmt_health(m->health, buf, sizeof(buf)));
  add_str(o, "message", m->message);
  return o;
}

static cJSON *checkpoint_json(const Stoker__V1__CheckpointRef *c) {
  if (!c) return cJSON_CreateNull();
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "step", (double)c->step);
  add_str(o, "uri", c->uri);
  cJSON_AddNumberToObject(o, "committed_at_ms", (double)c->committed_at_ms);
  cJSON_AddNumberToObject(o, "generation", (double)c->generation);
  return o;
}

cJSON *fmt_job_json(const Stoker__V1__Job *j) {
  char buf[32];
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  add_str(o, "name", j->spec ? j->spec->name : NULL);
  add_str(o, "state", fmt_job_state(j->state, buf, sizeof(buf)));
  add_str(o, "reason", j->reason);
  cJSON_AddNumberToObject(o, "generation", (double)j->generation);
  cJSON_AddNumberToObject(o, "world_size", j->world_size);
  cJSON_AddNumberToObject(o, "target_ranks", j->target_ranks);
  cJSON_AddNumberToObject(o, "waiting", j->waiting);
  cJSON_AddItemToObject(o, "spec", j->spec ? spec_json(j->spec) : cJSON_CreateNull());
  cJSON *members = cJSON_AddArrayToObject(o, "members");
  for (size_t i = 0; i < j->n_members; i++)
    cJSON_AddItemToArray(members, member_json(j->members[i]));
  cJSON_AddItemToObject(o, "latest_checkpoint", checkpoint_json(j->latest_checkpoint));
  cJSON_AddNumberToObject(o, "created_at_ms", (double)j->created_at_ms);
  cJSON_AddNumberToObject(o, "updated_at_ms", (double)j->updated_at_ms);
  cJSON_AddNumberToObject(o, "last_event_seq", (double)j->last_event_seq);
  cJSON_AddItemToObject(o, "queue", j->queue ? queue_json(j->queue) : cJSON_CreateNull());
  return o;
}

cJSON *fmt_event_json(const Stoker__V1__JobEvent *ev) {
  char buf[48];
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  cJSON_AddNumberToObject(o, "seq", (double)ev->seq);
  cJSON_AddNumberToObject(o, "time_ms", (double)ev->time_ms);
  add_str(o, "job", ev->job);
  add_str(o, "type", fmt_event_type(ev->type, buf, sizeof(buf)));
  cJSON_AddNumberToObject(o, "generation", (double)ev->generation);
  add_str(o, "member_id", ev->member_id);
  cJSON_AddNumberToObject(o, "world_size", ev->world_size);
  cJSON_AddNumberToObject(o, "step", (double)ev->step);
  add_str(o, "message", ev->message);
  return o;
}

void fmt_print_json(const cJSON *obj, FILE *out) {
  char *s = cJSON_PrintUnformatted(obj);
  if (!s) return;
  fprintf(out, "%s\n", s);
  cJSON_free(s);
}
