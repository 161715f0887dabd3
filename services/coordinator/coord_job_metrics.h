/*
 * coord_job_metrics: the collector of the coordinator's per-job gauges
 * (stoker_job_generation, _world_size, _step, _tokens_per_second,
 * _checkpoint_step, _waiting_joins, each labelled job="NAME"); see
 * coord_job_metrics.c. Register with metrics_add_collector(m,
 * coord_job_metrics_collect, coord); the metrics endpoint must render on
 * the coord's loop.
 */
#ifndef STK_COORD_JOB_METRICS_H
#define STK_COORD_JOB_METRICS_H

#include <stdint.h>

struct strbuf;
struct usage;

/* arg: the struct coord. */
void coord_job_metrics_collect(struct strbuf *out, void *arg);

/* The key-value budget ("kv": kv_bytes overall, kv_bytes_per_job per job)
 * and what each job holds of it, for daemon_usage (GetUsage, the
 * stoker_budget_* series). */
struct coord_kv_budget {
  const struct coord *coord;
  uint64_t kv_bytes, kv_bytes_per_job;
};
int coord_kv_usage_collect(void *arg, struct usage *u);

#endif
