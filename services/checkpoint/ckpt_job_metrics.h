/*
 * ckpt_job_metrics: the collector of the checkpoint daemon's per-job gauges
 * (stoker_checkpoint_job_staging_bytes, _open_attempts, each labelled
 * job="NAME"); see ckpt_job_metrics.c. Register with
 * metrics_add_collector(m, ckpt_job_metrics_collect, &svc) where svc is the
 * daemon's struct ckpt_service pointer (NULL once the service closed: no
 * series); the metrics endpoint must render on the service's loop.
 */
#ifndef STK_CKPT_JOB_METRICS_H
#define STK_CKPT_JOB_METRICS_H

#include <stdint.h>

struct strbuf;
struct usage;

/* arg: a struct ckpt_service ** (the pointer read at every scrape). */
void ckpt_job_metrics_collect(struct strbuf *out, void *arg);

/* The staging budget ("staging": staging_budget_bytes, no per-job limit)
 * and the read budgets ("read": read_budget_bytes, read_budget_per_job_bytes)
 * with what each job's attempts and reads hold, for daemon_usage (GetUsage,
 * the stoker_budget_* series). */
struct ckpt_budgets {
  struct ckpt_service *const *svc; /* Read at every call; NULL once closed. */
  uint64_t staging_bytes, read_bytes, read_per_job_bytes;
};
int ckpt_usage_collect(void *arg, struct usage *u);

#endif
