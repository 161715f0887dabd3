/*
 * metrics_jobs: the per-job gauge families of the daemons' collectors,
 * bounded to METRICS_JOBS_MAX jobs (metrics_jobs.h). Label values are
 * escaped as the text format wants (backslash, quote, newline).
 */
#include "metrics_jobs.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strbuf.h"

static int by_job(const void *a, const void *b) {
  return strcmp(((const struct metrics_job_row *)a)->job, ((const struct metrics_job_row *)b)->job);
}

size_t metrics_jobs_merge(struct metrics_job_row *rows, size_t n) {
  if (n == 0) return 0;
  qsort(rows, n, sizeof(*rows), by_job);
  size_t out = 0;
  for (size_t i = 1; i < n; i++) {
    if (strcmp(rows[i].job, rows[out].job) == 0) {
      for (int v = 0; v < METRICS_JOB_VALUES; v++) rows[out].value[v] += rows[i].value[v];
    } else {
      rows[++out] = rows[i];
    }
  }
  return out + 1;
}

void metrics_jobs_put_label(struct strbuf *out, const char *s) {
  for (; *s; s++) {
    if (*s == '\\' || *s == '"') {
      strbuf_putc(out, '\\');
      strbuf_putc(out, *s);
    } else if (*s == '\n') {
      strbuf_puts(out, "\\n");
    } else {
      strbuf_putc(out, *s);
    }
  }
}

/* The shortest text that reads back as v (as metrics.c renders). */
static void put_value(struct strbuf *out, double v) {
  if (isnan(v)) return strbuf_puts(out, "NaN");
  if (isinf(v)) return strbuf_puts(out, v > 0 ? "+Inf" : "-Inf");
  char buf[40];
  snprintf(buf, sizeof(buf), "%.15g", v);
  if (strtod(buf, NULL) != v) snprintf(buf, sizeof(buf), "%.17g", v);
  strbuf_puts(out, buf);
}

void metrics_jobs_write(struct strbuf *out, const char *service,
                        const struct metrics_job_family *fams, size_t n_fams,
                        const struct metrics_job_row *rows, size_t n_rows, size_t n_jobs) {
  size_t shown = n_rows < METRICS_JOBS_MAX ? n_rows : METRICS_JOBS_MAX;
  for (size_t f = 0; f < n_fams && f < METRICS_JOB_VALUES; f++) {
    strbuf_printf(out, "# HELP %s %s\n# TYPE %s gauge\n", fams[f].name, fams[f].help, fams[f].name);
    for (size_t i = 0; i < shown; i++) {
      strbuf_printf(out, "%s{job=\"", fams[f].name);
      metrics_jobs_put_label(out, rows[i].job);
      strbuf_puts(out, "\"} ");
      put_value(out, rows[i].value[f]);
      strbuf_putc(out, '\n');
    }
  }
  strbuf_printf(out,
                "# HELP stoker_%s_jobs_unlabelled Jobs beyond the %d given per-job series.\n"
                "# TYPE stoker_%s_jobs_unlabelled gauge\nstoker_%s_jobs_unlabelled %zu\n",
                service, METRICS_JOBS_MAX, service, service, n_jobs > shown ? n_jobs - shown : 0);
}
