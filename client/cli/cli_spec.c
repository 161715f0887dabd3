/*
 * Turns `job create` and `job submit` flags into a JobSpec (see cli_spec.h). Only the shape
 * of each value is checked here; the coordinator validates the rest (name
 * syntax, bounds) and its message is shown as it is.
 */
#include "cli_spec.h"

#include <stdio.h>
#include <string.h>

#include "stk_error.h"

/* Parses an optional duration flag into a uint32 of milliseconds. */
static int duration_flag(const struct cli_args *a, const char *flag, uint32_t *ret_ms, char *err,
                         size_t err_len) {
  const char *v = cli_flag_value(a, flag);
  int64_t ms;
  if (!v) return 0;
  if (flag_parse_duration_ms(v, &ms) < 0 || ms > UINT32_MAX) {
    snprintf(err, err_len, "--%s: bad duration \"%s\" (e.g. 500ms, 5s, 10m)", flag, v);
    return STK_EINVAL;
  }
  *ret_ms = (uint32_t)ms;
  return 0;
}

/* Parses an integer flag; required ones must be present. */
static int uint_flag(const struct cli_args *a, const char *flag, bool required, uint64_t max,
                     uint64_t *ret_value, char *err, size_t err_len) {
  const char *v = cli_flag_value(a, flag);
  if (!v) {
    if (required) snprintf(err, err_len, "--%s N is required", flag);
    return required ? STK_EINVAL : 0;
  }
  if (flag_parse_uint(v, max, ret_value) < 0) {
    snprintf(err, err_len, "--%s: bad number \"%s\"", flag, v);
    return STK_EINVAL;
  }
  return 0;
}

static int labels(const struct cli_args *a, struct cli_spec *out, char *err, size_t err_len) {
  size_t n = 0;
  for (int i = 0; i < a->n_flags; i++) {
    if (strcmp(a->flags[i].name, "label") != 0) continue;
    char *k = out->label_text[n][0], *v = out->label_text[n][1];
    if (cli_split_label(a->flags[i].value, k, 256, v, 256) < 0) {
      snprintf(err, err_len, "--label: expected KEY=VALUE, got \"%s\"", a->flags[i].value);
      return STK_EINVAL;
    }
    stoker__v1__job_spec__labels_entry__init(&out->labels[n]);
    out->labels[n].key = k;
    out->labels[n].value = v;
    out->label_ptrs[n] = &out->labels[n];
    n++;
  }
  out->spec.n_labels = n;
  out->spec.labels = n ? out->label_ptrs : NULL;
  return 0;
}

static void storage(const struct cli_args *a, const char *flag, Stoker__V1__StorageRef *ref,
                    Stoker__V1__StorageRef **ret_field) {
  const char *v = cli_flag_value(a, flag);
  if (!v) return;
  stoker__v1__storage_ref__init(ref);
  ref->uri = (char *)v;
  *ret_field = ref;
}

int cli_spec_from_args(const struct cli_args *a, const char *name, struct cli_spec *out, char *err,
                       size_t err_len) {
  Stoker__V1__JobSpec *s = &out->spec;
  uint64_t min = 0, max = 0, misses = 0, every = 0;
  stoker__v1__job_spec__init(s);
  s->name = (char *)name;
  if (uint_flag(a, "min", true, UINT32_MAX, &min, err, err_len) < 0 ||
      uint_flag(a, "max", true, UINT32_MAX, &max, err, err_len) < 0 ||
      uint_flag(a, "misses", false, UINT32_MAX, &misses, err, err_len) < 0 ||
      uint_flag(a, "checkpoint-every", false, UINT64_MAX, &every, err, err_len) < 0 ||
      duration_flag(a, "heartbeat", &s->heartbeat_interval_ms, err, err_len) < 0 ||
      duration_flag(a, "last-call", &s->last_call_ms, err, err_len) < 0 ||
      duration_flag(a, "join-timeout", &s->join_timeout_ms, err, err_len) < 0 ||
      labels(a, out, err, err_len) < 0)
    return STK_EINVAL;
  if (min < 1 || max < min) {
    snprintf(err, err_len, "need 1 <= --min <= --max (got %llu and %llu)", (unsigned long long)min,
             (unsigned long long)max);
    return STK_EINVAL;
  }
  s->min_ranks = (uint32_t)min;
  s->max_ranks = (uint32_t)max;
  s->heartbeat_misses = (uint32_t)misses;
  s->checkpoint_every_steps = every;
  storage(a, "dataset", &out->dataset, &s->dataset);
  storage(a, "checkpoint-storage", &out->checkpoint_storage, &s->checkpoint_storage);
  return 0;
}

int cli_submission_from_args(const struct cli_args *a, const char *const *args, int n_args,
                             struct cli_spec *out, char *err, size_t err_len) {
  Stoker__V1__Submission *sub = &out->submission;
  stoker__v1__submission__init(sub);
  const char *t = cli_flag_value(a, "template");
  if (!t || !*t) {
    snprintf(err, err_len,
             "--template NAME is required (the queue controller's workload template)");
    return STK_EINVAL;
  }
  sub->template_ = (char *)t;
  const char *q = cli_flag_value(a, "queue"), *p = cli_flag_value(a, "priority");
  if (q) sub->queue = (char *)q;
  if (p) sub->priority = (char *)p;
  sub->n_args = (size_t)n_args;
  sub->args = n_args ? (char **)args : NULL;
  out->spec.submission = sub;
  return 0;
}
