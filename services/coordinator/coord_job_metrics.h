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

struct strbuf;

/* arg: the struct coord. */
void coord_job_metrics_collect(struct strbuf *out, void *arg);

#endif
