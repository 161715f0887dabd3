/*
 * ckpt_job_metrics: the checkpoint daemon's per-job gauges, written at
 * scrape time from the service's attempts (ckpt_service_attempt_staging):
 * stoker_checkpoint_job_staging_bytes (staging memory the job's attempts
 * hold: bytes received and not yet uploaded, counted as
 * stoker_checkpoint_staging_bytes counts them) and
 * stoker_checkpoint_job_open_attempts. A job has series while the service
 * keeps an attempt of it (open, or ended within the last 10 minutes: then
 * 0 and 0). The label set is bounded as metrics_jobs.h says
 * (stoker_checkpoint_jobs_unlabelled counts the jobs left out).
 */
#include "ckpt_job_metrics.h"

#include <stdlib.h>

#include "ckpt_service.h"
#include "metrics_jobs.h"

/* value[i] of a row is family i. */
static const struct metrics_job_family families[] = {
    {"stoker_checkpoint_job_staging_bytes",
     "Staging memory the job's attempts hold: bytes received, not yet uploaded."},
    {"stoker_checkpoint_job_open_attempts", "Attempts of the job not yet committed or aborted."},
};

void ckpt_job_metrics_collect(struct strbuf *out, void *arg) {
  struct ckpt_service *const *svc = arg;
  size_t n = *svc ? ckpt_service_attempt_staging(*svc, NULL, 0) : 0;
  struct ckpt_attempt_staging *a = n ? calloc(n, sizeof(*a)) : NULL;
  struct metrics_job_row *rows = n ? calloc(n, sizeof(*rows)) : NULL;
  if (n && (!a || !rows)) n = 0; /* Out of memory: this scrape shows no job. */
  if (n) ckpt_service_attempt_staging(*svc, a, n);
  for (size_t i = 0; i < n; i++)
    rows[i] = (struct metrics_job_row){.job = a[i].job,
                                       .value = {(double)a[i].staged_bytes, a[i].open ? 1 : 0}};
  size_t jobs = metrics_jobs_merge(rows, n);
  metrics_jobs_write(out, "checkpoint", families, sizeof(families) / sizeof(families[0]), rows,
                     jobs, jobs);
  free(rows);
  free(a);
}
