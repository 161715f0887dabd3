/*
 * stokerctl's human-readable output: enum names, durations, ages, the job
 * list, one job in detail with its member table, and one line per event.
 */
#include "cli_format.h"

#include <inttypes.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

const char *fmt_enum_name(const ProtobufCEnumDescriptor *d, int value, char *buf, size_t len) {
  const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(d, value);
  if (!v) {
    snprintf(buf, len, "UNKNOWN(%d)", value);
    return buf;
  }
  snprintf(buf, len, "%s", v->name + fmt_enum_prefix_len(d));
  return buf;
}

size_t fmt_enum_prefix_len(const ProtobufCEnumDescriptor *d) {
  const ProtobufCEnumValue *zero = protobuf_c_enum_descriptor_get_value(d, 0);
  const char *u = zero ? strstr(zero->name, "_UNSPECIFIED") : NULL;
  if (u && strcmp(u, "_UNSPECIFIED") == 0) return (size_t)(u - zero->name) + 1;
  /* Else the longest prefix every name shares, up to an underscore. */
  size_t n = d->n_values ? strlen(d->values[0].name) : 0;
  for (unsigned i = 1; i < d->n_values; i++) {
    size_t k = 0;
    while (k < n && d->values[i].name[k] == d->values[0].name[k]) k++;
    n = k;
  }
  while (n > 0 && d->values[0].name[n - 1] != '_') n--;
  return n;
}

const char *fmt_job_state(int state, char *buf, size_t len) {
  return fmt_enum_name(&stoker__v1__job_state__descriptor, state, buf, len);
}

const char *fmt_queue_state(int state, char *buf, size_t len) {
  return fmt_enum_name(&stoker__v1__queue_state__descriptor, state, buf, len);
}

const char *fmt_event_type(int type, char *buf, size_t len) {
  return fmt_enum_name(&stoker__v1__job_event_type__descriptor, type, buf, len);
}

const char *fmt_health(int health, char *buf, size_t len) {
  return fmt_enum_name(&stoker__v1__rank_health__descriptor, health, buf, len);
}

void fmt_duration_ms(int64_t ms, char *buf, size_t len) {
  if (ms % 1000 != 0 || ms < 0) {
    snprintf(buf, len, "%" PRId64 "ms", ms);
    return;
  }
  int64_t s = ms / 1000, h = s / 3600, m = s / 60 % 60, sec = s % 60;
  size_t off = 0;
  buf[0] = '\0';
  if (h) off += (size_t)snprintf(buf + off, len - off, "%" PRId64 "h", h);
  if (m && off < len) off += (size_t)snprintf(buf + off, len - off, "%" PRId64 "m", m);
  if ((sec || s == 0) && off < len) snprintf(buf + off, len - off, "%" PRId64 "s", sec);
}

void fmt_age(int64_t now_ms, int64_t then_ms, char *buf, size_t len) {
  if (then_ms <= 0) {
    snprintf(buf, len, "-");
    return;
  }
  int64_t d = now_ms > then_ms ? now_ms - then_ms : 0;
  fmt_duration_ms(d / 1000 * 1000, buf, len);
}

void fmt_time_ms(int64_t ms, char *buf, size_t len) {
  if (ms <= 0) {
    snprintf(buf, len, "-");
    return;
  }
  time_t t = (time_t)(ms / 1000);
  struct tm tm;
  gmtime_r(&t, &tm);
  char day[32];
  strftime(day, sizeof(day), "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(buf, len, "%s.%03dZ", day, (int)(ms % 1000));
}

/* The highest step any member reported. */
static uint64_t job_step(const Stoker__V1__Job *job) {
  uint64_t step = 0;
  for (size_t i = 0; i < job->n_members; i++) {
    if (job->members[i]->step > step) step = job->members[i]->step;
  }
  return step;
}

void fmt_jobs_table(Stoker__V1__Job *const *jobs, size_t n_jobs, int64_t now_ms, FILE *out) {
  static const char *const headers[] = {"NAME",  "STATE", "GENERATION", "WORLD",
                                        "RANKS", "STEP",  "CHECKPOINT", "AGE"};
  struct table *t = table_new(8, headers);
  if (!t) return;
  for (size_t i = 0; i < n_jobs; i++) {
    const Stoker__V1__Job *j = jobs[i];
    const Stoker__V1__JobSpec *s = j->spec;
    char state[32], gen[24], world[24], ranks[32], step[24], ckpt[24], age[32];
    fmt_job_state(j->state, state, sizeof(state));
    snprintf(gen, sizeof(gen), "%" PRIu64, j->generation);
    snprintf(world, sizeof(world), "%u", j->world_size);
    snprintf(ranks, sizeof(ranks), "%u-%u", s ? s->min_ranks : 0, s ? s->max_ranks : 0);
    snprintf(step, sizeof(step), "%" PRIu64, job_step(j));
    int64_t ck = j->latest_checkpoint ? j->latest_checkpoint->step : 0;
    snprintf(ckpt, sizeof(ckpt), "%" PRId64, ck);
    fmt_age(now_ms, j->created_at_ms, age, sizeof(age));
    const char *row[] = {s ? s->name : NULL, state, gen, world, ranks, step, ck ? ckpt : NULL, age};
    table_add(t, row);
  }
  table_print(t, out);
  table_free(t);
}

#define EV(x) STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_##x

/* The queue and resize events as a sentence from their fields (the message
 * added where it says more); false for the other events. */
static bool event_sentence(const Stoker__V1__JobEvent *ev, FILE *out) {
  const char *msg = ev->message ? ev->message : "";
  long long step = (long long)ev->step;
  switch (ev->type) {
  case EV(QUEUED): /* The message names the queue and the position. */
    fprintf(out, "  %s", msg[0] ? msg : "queued");
    return true;
  case EV(ADMITTED):
    fprintf(out, "  admitted %u rank%s", ev->world_size, ev->world_size == 1 ? "" : "s");
    if (strncmp(msg, "admitted ", 9) == 0 && strstr(msg, " by "))
      fprintf(out, "%s", strstr(msg, " by "));
    return true;
  case EV(PREEMPTED):
    fprintf(out, "  preempted at step %lld%s%s", step, msg[0] ? ": " : "", msg);
    return true;
  case EV(SHRUNK):
  case EV(GROWN):
    fprintf(out, "  %s to %u rank%s at step %lld", ev->type == EV(SHRUNK) ? "shrunk" : "grown",
            ev->world_size, ev->world_size == 1 ? "" : "s", step);
    return true;
  case EV(RESUMED):
    fprintf(out, "  resumed at step %lld%s%s", step, msg[0] ? ": " : "", msg);
    return true;
  case EV(REJECTED): /* The message says by whom and why. */
    fprintf(out, "  %s", msg[0] ? msg : "rejected by the queue controller");
    return true;
  default:
    return false;
  }
}

void fmt_event_line(const Stoker__V1__JobEvent *ev, FILE *out) {
  char when[40], type[48];
  fmt_time_ms(ev->time_ms, when, sizeof(when));
  fmt_event_type(ev->type, type, sizeof(type));
  fprintf(out, "%" PRIu64 "  %s  %s  gen=%" PRIu64, ev->seq, when, type, ev->generation);
  if (!event_sentence(ev, out)) {
    if (ev->member_id && ev->member_id[0]) fprintf(out, "  member=%s", ev->member_id);
    if (ev->world_size) fprintf(out, "  world=%u", ev->world_size);
    if (ev->step) fprintf(out, "  step=%" PRId64, ev->step);
    if (ev->message && ev->message[0]) fprintf(out, "  %s", ev->message);
  }
  fputc('\n', out);
}
