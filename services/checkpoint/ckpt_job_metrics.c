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
 * The same figures, with the restores' read reservations, report the
 * staging and read budgets to daemon_usage (ckpt_usage_collect).
 */
#include "ckpt_job_metrics.h"

#include <stdlib.h>

#include "ckpt_service.h"
#include "daemon_usage.h"
#include "metrics_jobs.h"
#include "stk_error.h"

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

/* Adds the staging of every attempt and the reservations of every read. */
static int add_jobs(const struct ckpt_service *svc, struct usage *u) {
  size_t n = ckpt_service_attempt_staging(svc, NULL, 0);
  size_t m = ckpt_service_read_holdings(svc, NULL, 0);
  struct ckpt_attempt_staging *a = n ? calloc(n, sizeof(*a)) : NULL;
  struct ckpt_read_holding *r = m ? calloc(m, sizeof(*r)) : NULL;
  int rc = (n && !a) || (m && !r) ? STK_ENOMEM : 0;
  if (rc == 0) {
    ckpt_service_attempt_staging(svc, a, n);
    ckpt_service_read_holdings(svc, r, m);
  }
  for (size_t i = 0; rc == 0 && i < n; i++) rc = usage_add(u, 0, a[i].job, a[i].staged_bytes);
  for (size_t i = 0; rc == 0 && i < m; i++) rc = usage_add(u, 1, r[i].job, r[i].reserved_bytes);
  free(a);
  free(r);
  return rc;
}

int ckpt_usage_collect(void *arg, struct usage *u) {
  const struct ckpt_budgets *b = arg;
  struct ckpt_service_stats st = {0};
  if (*b->svc) ckpt_service_get_stats(*b->svc, &st);
  u->budgets[0] = (struct usage_budget){
      .name = "staging", .limit_bytes = b->staging_bytes, .used_bytes = st.staged_bytes};
  u->budgets[1] = (struct usage_budget){.name = "read",
                                        .limit_bytes = b->read_bytes,
                                        .limit_per_job_bytes = b->read_per_job_bytes,
                                        .used_bytes = st.read_reserved_bytes};
  u->n_budgets = 2;
  return *b->svc ? add_jobs(*b->svc, u) : 0;
}
