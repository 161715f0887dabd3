/*
 * metrics: counters, gauges and latency histograms, exposed in the
 * Prometheus text format. A registry is shared by a daemon's modules;
 * updates are lock-free atomics and may come from any thread. Series are
 * identified by name plus a label string ("method=\"/a.B/C\",code=\"OK\""),
 * created on first use and never removed.
 */
#ifndef STK_METRICS_H
#define STK_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

struct metrics;
struct metric_counter;
struct metric_gauge;
struct metric_histogram;

struct metrics *metrics_new(void);
void metrics_free(struct metrics *m); /* Accepts NULL. */

/* Finds or creates a series. help is kept from the first call per name.
 * labels may be NULL or "". Returns NULL only when out of memory. */
struct metric_counter *metrics_counter(struct metrics *m, const char *name, const char *help,
                                       const char *labels);
struct metric_gauge *metrics_gauge(struct metrics *m, const char *name, const char *help,
                                   const char *labels);
/* Latency histogram in seconds with fixed buckets from 50 us to 60 s. */
struct metric_histogram *metrics_histogram(struct metrics *m, const char *name, const char *help,
                                           const char *labels);

void metric_counter_add(struct metric_counter *c, uint64_t n);
void metric_gauge_set(struct metric_gauge *g, double v);
void metric_gauge_add(struct metric_gauge *g, double delta);
void metric_histogram_observe(struct metric_histogram *h, double seconds);

/* A collector appends whole families (HELP, TYPE, samples) in the text
 * format at render time, for figures read on demand rather than updated
 * as they change. It runs under the registry's lock on the rendering
 * thread and must not call back into the registry. */
struct strbuf;
typedef void (*metrics_collect_fn)(struct strbuf *out, void *arg);
/* Adds a collector, run after the registry's own series on every render.
 * Returns 0, STK_EINVAL (m or fn NULL) or STK_ENOMEM. */
int metrics_add_collector(struct metrics *m, metrics_collect_fn fn, void *arg);

/* The collector of the process_* series Prometheus client libraries
 * export (metrics_process.c): process_cpu_seconds_total,
 * process_resident_memory_bytes, process_virtual_memory_bytes,
 * process_open_fds, process_max_fds, process_start_time_seconds, read from
 * /proc at scrape time. arg is unused. */
void metrics_process_collect(struct strbuf *out, void *arg);

/* Renders every series in the Prometheus text exposition format (0.0.4).
 * Returns a malloc'd string (free()), NULL when out of memory. */
char *metrics_render(struct metrics *m, size_t *ret_len);

/* Serves GET /metrics (and GET / with a pointer to it) over HTTP/1.1 on
 * listen ("HOST:PORT", port 0 picks one) from the loop. Writes the bound
 * address to ret_bound. */
struct metrics_http;
int metrics_http_start(uv_loop_t *loop, struct metrics *m, const char *listen, char *ret_bound,
                       size_t bound_len, struct metrics_http **ret_http);
/* Closes the listener and open connections. Accepts NULL. */
void metrics_http_stop(struct metrics_http *h);

#endif
