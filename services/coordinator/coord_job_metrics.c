/*
 * coord_job_metrics: per-job gauges on the coordinator's /metrics, written
 * at scrape time from coord_job_figures (a deleted job leaves no stale
 * series). The label set is bounded: the first COORD_METRICS_MAX_JOBS jobs
 * by name get series; stoker_coordinator_jobs_unlabelled counts the rest.
 */
#include "coord_job_metrics.h"

#include <inttypes.h>
#include <stdlib.h>

#include "coord.h"
#include "strbuf.h"

#define COORD_METRICS_MAX_JOBS 500

/* A Prometheus label value: backslash, quote and newline escaped. */
static void put_label(struct strbuf *out, const char *s) {
  for (; *s; s++) {
    if (*s == '\\' || *s == '"')
      strbuf_printf(out, "\\%c", *s);
    else if (*s == '\n')
      strbuf_puts(out, "\\n");
    else
      strbuf_printf(out, "%c", *s);
  }
}

static void family(struct strbuf *out, const char *name, const char *help,
                   const struct coord_job_figures *f, size_t n, int field) {
  strbuf_printf(out, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
  for (size_t i = 0; i < n; i++) {
    strbuf_printf(out, "%s{job=\"", name);
    put_label(out, f[i].name);
    strbuf_puts(out, "\"} ");
    switch (field) {
    case 0:
      strbuf_printf(out, "%" PRIu64 "\n", f[i].generation);
      break;
    case 1:
      strbuf_printf(out, "%" PRIu32 "\n", f[i].world_size);
      break;
    case 2:
      strbuf_printf(out, "%" PRIu64 "\n", f[i].step);
      break;
    case 3:
      strbuf_printf(out, "%.17g\n", f[i].tokens_per_s);
      break;
    case 4:
      strbuf_printf(out, "%" PRId64 "\n", f[i].checkpoint_step);
      break;
    default:
      strbuf_printf(out, "%" PRIu32 "\n", f[i].joiners);
      break;
    }
  }
}

void coord_job_metrics_collect(struct strbuf *out, void *arg) {
  const struct coord *c = arg;
  static struct coord_job_figures f[COORD_METRICS_MAX_JOBS]; /* One render at a time. */
  size_t total = coord_job_figures(c, f, COORD_METRICS_MAX_JOBS);
  size_t n = total < COORD_METRICS_MAX_JOBS ? total : COORD_METRICS_MAX_JOBS;
  family(out, "stoker_job_generation", "Current generation of the job.", f, n, 0);
  family(out, "stoker_job_world_size", "Members of the job's current generation.", f, n, 1);
  family(out, "stoker_job_step", "Highest step a member of the job reported.", f, n, 2);
  family(out, "stoker_job_tokens_per_second", "Tokens/s the job's members reported, summed.", f, n,
         3);
  family(out, "stoker_job_checkpoint_step", "Step of the job's latest committed checkpoint.", f, n,
         4);
  family(out, "stoker_job_waiting_joins", "Joins parked in the job's open round.", f, n, 5);
  strbuf_printf(out,
                "# HELP stoker_coordinator_jobs_unlabelled Jobs beyond the %d given per-job "
                "series.\n# TYPE stoker_coordinator_jobs_unlabelled gauge\n"
                "stoker_coordinator_jobs_unlabelled %zu\n",
                COORD_METRICS_MAX_JOBS, total - n);
}
