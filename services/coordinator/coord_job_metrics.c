/*
 * coord_job_metrics: per-job gauges on the coordinator's /metrics, written
 * at scrape time from coord_job_figures (a deleted job leaves no stale
 * series). The label set is bounded (metrics_jobs.h): the first
 * METRICS_JOBS_MAX jobs by name get series; stoker_coordinator_jobs_unlabelled
 * counts the rest. It also reports the key-value budget per job to
 * daemon_usage (stoker_budget_*{budget="kv"} and GetUsage).
 */
#include "coord_job_metrics.h"

#include <stdlib.h>

#include "coord.h"
#include "daemon_usage.h"
#include "metrics_jobs.h"
#include "stk_error.h"

/* value[i] of a row is family i. */
static const struct metrics_job_family families[] = {
    {"stoker_job_generation", "Current generation of the job."},
    {"stoker_job_world_size", "Members of the job's current generation."},
    {"stoker_job_step", "Highest step a member of the job reported."},
    {"stoker_job_tokens_per_second", "Tokens/s the job's members reported, summed."},
    {"stoker_job_checkpoint_step", "Step of the job's latest committed checkpoint."},
    {"stoker_job_waiting_joins", "Joins parked in the job's open round."},
};

void coord_job_metrics_collect(struct strbuf *out, void *arg) {
  const struct coord *c = arg;
  /* One render at a time (the coord's loop): static storage is safe. */
  static struct coord_job_figures f[METRICS_JOBS_MAX];
  static struct metrics_job_row rows[METRICS_JOBS_MAX];
  size_t total = coord_job_figures(c, f, METRICS_JOBS_MAX);
  size_t n = total < METRICS_JOBS_MAX ? total : METRICS_JOBS_MAX;
  for (size_t i = 0; i < n; i++)
    rows[i] = (struct metrics_job_row){
        .job = f[i].name,
        .value = {(double)f[i].generation, f[i].world_size, (double)f[i].step, f[i].tokens_per_s,
                  (double)f[i].checkpoint_step, f[i].joiners},
    };
  metrics_jobs_write(out, "coordinator", families, sizeof(families) / sizeof(families[0]), rows, n,
                     total);
}

int coord_kv_usage_collect(void *arg, struct usage *u) {
  const struct coord_kv_budget *b = arg;
  struct coord_stats st;
  coord_get_stats(b->coord, &st);
  u->budgets[0] = (struct usage_budget){.name = "kv",
                                        .limit_bytes = b->kv_bytes,
                                        .limit_per_job_bytes = b->kv_bytes_per_job,
                                        .used_bytes = st.kv_bytes};
  u->n_budgets = 1;
  size_t n = coord_job_figures(b->coord, NULL, 0);
  struct coord_job_figures *f = n ? calloc(n, sizeof(*f)) : NULL;
  if (n && !f) return STK_ENOMEM;
  n = f ? coord_job_figures(b->coord, f, n) : 0;
  int rc = 0;
  for (size_t i = 0; rc == 0 && i < n; i++) rc = usage_add(u, 0, f[i].name, f[i].kv_bytes);
  free(f);
  return rc;
}
