/*
 * coord_job_metrics: per-job gauges on the coordinator's /metrics, written
 * at scrape time from coord_job_figures (a deleted job leaves no stale
 * series). The label set is bounded (metrics_jobs.h): the first
 * METRICS_JOBS_MAX jobs by name get series; stoker_coordinator_jobs_unlabelled
 * counts the rest.
 */
#include "coord_job_metrics.h"

#include "coord.h"
#include "metrics_jobs.h"

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
