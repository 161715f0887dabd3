/*
 * stokerctl's job subcommands: list, show, create, submit, scale (resize),
 * pause, resume, preempt, stop, delete. Each is: check operands, one call
 * through libstoker-client, print the result as a table or JSON, map the
 * outcome to an exit code.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_format.h"
#include "cli_spec.h"

/* Prints a job as JSON or in detail. */
static void print_job(const struct cli_ctx *x, const Stoker__V1__Job *job) {
  if (x->args->json) {
    cJSON *o = fmt_job_json(job);
    fmt_print_json(o, stdout);
    cJSON_Delete(o);
  } else {
    fmt_job_show(job, cli_now_ms(), stdout);
  }
}

int cli_jobs_list(const struct cli_ctx *x) {
  const char *keys[CLI_MAX_FLAGS], *values[CLI_MAX_FLAGS];
  char text[CLI_MAX_FLAGS][2][256];
  size_t n = 0;
  for (int i = 0; i < x->args->n_flags; i++) {
    const struct flag_occurrence *f = &x->args->flags[i];
    if (strcmp(f->name, "label") != 0) continue;
    if (cli_split_label(f->value, text[n][0], 256, text[n][1], 256) < 0)
      return cli_usage_error(x, "--label: expected KEY=VALUE, got \"%s\"", f->value);
    keys[n] = text[n][0];
    values[n] = text[n][1];
    n++;
  }
  struct stk_client *c;
  int rc = cli_connect(x, x->args->coordinator, &c);
  if (rc) return rc;
  Stoker__V1__ListJobsResponse *resp = NULL;
  int err = stk_job_list(c, keys, values, n, 0, &resp);
  if (err == 0) {
    if (x->args->json) {
      for (size_t i = 0; i < resp->n_jobs; i++) {
        cJSON *o = fmt_job_json(resp->jobs[i]);
        fmt_print_json(o, stdout);
        cJSON_Delete(o);
      }
    } else {
      fmt_jobs_table(resp->jobs, resp->n_jobs, cli_now_ms(), stdout);
    }
    protobuf_c_message_free_unpacked(&resp->base, NULL);
  }
  rc = err ? cli_report(x, err) : 0;
  stk_client_free(c);
  return rc;
}

int cli_job_show(const struct cli_ctx *x) {
  struct stk_client *c;
  int rc = cli_connect(x, x->args->coordinator, &c);
  if (rc) return rc;
  Stoker__V1__Job *job = NULL;
  int err = stk_job_get(c, x->name, 0, &job);
  if (err == 0) {
    print_job(x, job);
    protobuf_c_message_free_unpacked(&job->base, NULL);
  }
  rc = err ? cli_report(x, err) : 0;
  stk_client_free(c);
  return rc;
}

int cli_job_create(const struct cli_ctx *x) {
  static struct cli_spec spec; /* Large; one per process. */
  char why[256];
  if (cli_spec_from_args(x->args, x->name, &spec, why, sizeof(why)) < 0)
    return cli_usage_error(x, "%s", why);
  struct stk_client *c;
  int rc = cli_connect(x, x->args->coordinator, &c);
  if (rc) return rc;
  Stoker__V1__Job *job = NULL;
  int err = stk_job_create(c, &spec.spec, 0, &job);
  if (err == 0) {
    print_job(x, job);
    protobuf_c_message_free_unpacked(&job->base, NULL);
  }
  rc = err ? cli_report(x, err) : 0;
  stk_client_free(c);
  return rc;
}

/* job submit: job create's spec with a submission; the queue controller
 * creates the workload and reports it (see job show and job watch). */
int cli_job_submit(const struct cli_ctx *x) {
  static struct cli_spec spec; /* Large; one per process. */
  char why[256];
  if (cli_spec_from_args(x->args, x->name, &spec, why, sizeof(why)) < 0 ||
      cli_submission_from_args(x->args, x->trailing, x->n_trailing, &spec, why, sizeof(why)) < 0)
    return cli_usage_error(x, "%s", why);
  struct stk_client *c;
  int rc = cli_connect(x, x->args->coordinator, &c);
  if (rc) return rc;
  Stoker__V1__Job *job = NULL;
  int err = stk_job_create(c, &spec.spec, 0, &job);
  if (err == 0) {
    if (x->args->json) {
      print_job(x, job);
    } else {
      const Stoker__V1__Submission *s =
          job->spec && job->spec->submission ? job->spec->submission : &spec.submission;
      printf("job \"%s\" submitted to queue %s", x->name, s->queue[0] ? s->queue : "(default)");
      if (s->priority[0]) printf(", priority %s", s->priority);
      printf(", template %s; follow it with: stokerctl job watch %s\n", s->template_, x->name);
    }
    protobuf_c_message_free_unpacked(&job->base, NULL);
  }
  rc = err ? cli_report(x, err) : 0;
  stk_client_free(c);
  return rc;
}

/* Prints the job an operator action returned: JSON, or one line. */
static void print_action(const struct cli_ctx *x, const char *done, const Stoker__V1__Job *job) {
  if (x->args->json) {
    print_job(x, job);
    return;
  }
  char st[32];
  fmt_job_state(job->state, st, sizeof(st));
  printf("job \"%s\" %s: state %s, generation %" PRIu64 ", world %u", x->name, done, st,
         job->generation, job->world_size);
  if (job->target_ranks) printf(", target %u", job->target_ranks);
  printf("\n");
}

int cli_job_scale(const struct cli_ctx *x) {
  uint64_t ranks;
  if (flag_parse_uint(x->ops[1], UINT32_MAX, &ranks) < 0 || ranks == 0)
    return cli_usage_error(x, "bad rank count \"%s\"", x->ops[1]);
  struct stk_client *c;
  int rc = cli_connect(x, x->args->coordinator, &c);
  if (rc) return rc;
  Stoker__V1__Job *job = NULL;
  bool skip = cli_flag_set(x->args, "skip-checkpoint");
  int err = cli_flag_set(x->args, "in-place")
                ? stk_job_scale_in_place(c, x->name, (uint32_t)ranks, 0, &job)
                : stk_job_scale(c, x->name, (uint32_t)ranks, skip, 0, &job);
  if (err == 0) {
    print_action(x, "scaling", job);
    protobuf_c_message_free_unpacked(&job->base, NULL);
  }
  rc = err ? cli_report(x, err) : 0;
  stk_client_free(c);
  return rc;
}

/* pause, resume, stop: one shape, three verbs. */
static int job_action(const struct cli_ctx *x, enum stk_job_verb verb, const char *done) {
  struct stk_client *c;
  int rc = cli_connect(x, x->args->coordinator, &c);
  if (rc) return rc;
  Stoker__V1__Job *job = NULL;
  int err = stk_job_action(c, verb, x->name, cli_flag_set(x->args, "force"), 0, &job);
  if (err == 0) {
    print_action(x, done, job);
    protobuf_c_message_free_unpacked(&job->base, NULL);
  }
  rc = err ? cli_report(x, err) : 0;
  stk_client_free(c);
  return rc;
}

int cli_job_pause(const struct cli_ctx *x) {
  return job_action(x, STK_JOB_PAUSE, "pausing");
}

int cli_job_resume(const struct cli_ctx *x) {
  return job_action(x, STK_JOB_RESUME, "resumed");
}

int cli_job_stop(const struct cli_ctx *x) {
  return job_action(x, STK_JOB_STOP, "stopping");
}

int cli_job_preempt(const struct cli_ctx *x) {
  struct stk_client *c;
  int rc = cli_connect(x, x->args->coordinator, &c);
  if (rc) return rc;
  Stoker__V1__Job *job = NULL;
  int err = stk_job_preempt(c, x->name, cli_flag_value(x->args, "reason"), 0, &job);
  if (err == 0) {
    print_action(x, "preempted", job);
    protobuf_c_message_free_unpacked(&job->base, NULL);
  }
  rc = err ? cli_report(x, err) : 0;
  stk_client_free(c);
  return rc;
}

int cli_job_delete(const struct cli_ctx *x) {
  struct stk_client *c;
  int rc = cli_connect(x, x->args->coordinator, &c);
  if (rc) return rc;
  int err = stk_job_delete(c, x->name, cli_flag_set(x->args, "force"), 0);
  if (err == 0) {
    if (x->args->json) {
      cJSON *o = cJSON_CreateObject();
      cJSON_AddStringToObject(o, "name", x->name);
      cJSON_AddBoolToObject(o, "deleted", 1);
      fmt_print_json(o, stdout);
      cJSON_Delete(o);
    } else {
      printf("job \"%s\" deleted\n", x->name);
    }
  }
  rc = err ? cli_report(x, err) : 0;
  stk_client_free(c);
  return rc;
}
