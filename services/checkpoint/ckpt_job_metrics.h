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

struct strbuf;

/* arg: a struct ckpt_service ** (the pointer read at every scrape). */
void ckpt_job_metrics_collect(struct strbuf *out, void *arg);

#endif
