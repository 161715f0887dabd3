/*
 * dl_rpc_metrics: the dataloader's per-job gauges, written at scrape time
 * from the open StreamBatches calls (a job whose streams ended leaves no
 * series): stoker_dataloader_job_streams (streams open) and
 * stoker_dataloader_job_queued_batches (batches generated ahead and not yet
 * sent, summed over the job's streams: a trainer that reads slower than
 * the daemon generates keeps this at its prefetch depth). A process of a
 * scaled-out dataloader counts its own streams; sum over the parts. The
 * label set is bounded as metrics_jobs.h says
 * (stoker_dataloader_jobs_unlabelled counts the jobs left out). The same
 * walk over the streams reports the stream budget to daemon_usage.
 */
#include <stdlib.h>

#include "daemon_usage.h"
#include "dl_rpc_internal.h"
#include "metrics_jobs.h"
#include "stk_error.h"

/* value[i] of a row is family i. */
static const struct metrics_job_family families[] = {
    {"stoker_dataloader_job_streams", "Open StreamBatches calls of the job on this process."},
    {"stoker_dataloader_job_queued_batches",
     "Batches generated for the job's streams and not yet sent, summed over its streams."},
};

void dl_rpc_job_metrics_collect(struct strbuf *out, void *arg) {
  const struct dl_rpc *a = arg;
  size_t n = dl_rpc_stream_queues(a, NULL, 0);
  struct dl_stream_queue *q = n ? calloc(n, sizeof(*q)) : NULL;
  struct metrics_job_row *rows = n ? calloc(n, sizeof(*rows)) : NULL;
  if (n && (!q || !rows)) n = 0; /* Out of memory: this scrape shows no job. */
  dl_rpc_stream_queues(a, q, n);
  for (size_t i = 0; i < n; i++)
    rows[i] = (struct metrics_job_row){.job = q[i].job, .value = {1, q[i].ready}};
  size_t jobs = metrics_jobs_merge(rows, n);
  metrics_jobs_write(out, "dataloader", families, sizeof(families) / sizeof(families[0]), rows,
                     jobs, jobs);
  free(rows);
  free(q);
}

int dl_rpc_usage_collect(void *arg, struct usage *u) {
  const struct dl_rpc *a = arg;
  size_t n = dl_rpc_stream_queues(a, NULL, 0);
  struct dl_stream_queue *q = n ? calloc(n, sizeof(*q)) : NULL;
  if (n && !q) return STK_ENOMEM;
  dl_rpc_stream_queues(a, q, n);
  uint64_t all = 0;
  int rc = 0;
  for (size_t i = 0; rc == 0 && i < n; i++) {
    all += q[i].held_bytes;
    rc = usage_add(u, 0, q[i].job, q[i].held_bytes);
  }
  u->budgets[0] = (struct usage_budget){.name = "stream",
                                        .limit_bytes = a->stream_bytes,
                                        .limit_per_job_bytes = a->stream_bytes_per_job,
                                        .used_bytes = all};
  u->n_budgets = 1;
  free(q);
  return rc;
}
