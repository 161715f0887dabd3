/*
 * metrics_jobs: per-job gauge families that a daemon's collector
 * (metrics_add_collector) writes at scrape time, labelled job="NAME", with
 * a bounded label set. A cluster may hold thousands of jobs; Prometheus
 * pays per series. So the first METRICS_JOBS_MAX jobs by name get series
 * and the gauge stoker_<service>_jobs_unlabelled counts the jobs left out
 * (0 in the common case). Written at scrape time, a job that is gone
 * leaves no stale series.
 */
#ifndef STK_METRICS_JOBS_H
#define STK_METRICS_JOBS_H

#include <stddef.h>

struct strbuf;

#define METRICS_JOBS_MAX   500 /* Jobs given series per daemon. */
#define METRICS_JOB_VALUES 6   /* Gauges per job, at most. */

/* One job's figures: value[i] belongs to family i. job is borrowed. */
struct metrics_job_row {
  const char *job;
  double value[METRICS_JOB_VALUES];
};

/* A gauge family: its name and HELP text (one line, no backslash). */
struct metrics_job_family {
  const char *name;
  const char *help;
};

/* Sorts rows by job name and folds rows of the same job into one, summing
 * their values. Returns how many rows are left (distinct jobs). */
size_t metrics_jobs_merge(struct metrics_job_row *rows, size_t n);

/* Writes each of the n_fams families (HELP, TYPE gauge, one sample per job
 * for the first METRICS_JOBS_MAX of the n_rows rows: distinct jobs sorted
 * by name), then stoker_<service>_jobs_unlabelled: the n_jobs jobs there
 * are (n_jobs >= n_rows; rows may hold only the first ones) less those
 * given series. */
void metrics_jobs_write(struct strbuf *out, const char *service,
                        const struct metrics_job_family *fams, size_t n_fams,
                        const struct metrics_job_row *rows, size_t n_rows, size_t n_jobs);

/* Appends a label value escaped as the text format wants (backslash,
 * quote, newline). */
void metrics_jobs_put_label(struct strbuf *out, const char *value);

#endif
