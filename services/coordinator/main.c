/*
 * stoker-coordinator: the coordinator daemon. A list of named steps: load
 * the config, open the core (coord.h) on the daemon's loop, register the
 * gRPC adapter, start serving, run until SIGTERM, close the core (which
 * flushes RocksDB), exit.
 */
#include "coord.h"
#include "coord_job_metrics.h"
#include "coord_rpc.h"
#include "daemon.h"
#include "daemon_usage.h"
#include "log.h"
#include "metrics.h"
#include "stk_error.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Parked calls that must have ended since their peak before the heap's
 * free pages go back to the system (release_memory): about 3.5 MB. */
#define TRIM_CALLS 256

struct coordinator_config {
  struct daemon_options daemon;
  int64_t tick_ms;
  uint64_t max_events_per_job;
  uint64_t watch_queue_max;
  int64_t stats_flush_ms;
  uint64_t scale_timeout_beats;
  uint64_t kv_bytes_per_job;
  uint64_t kv_bytes;
  uint64_t write_buffer;
};

static const struct flag_spec coordinator_options[] = {
    DAEMON_OPTION_ROWS(struct coordinator_config, daemon, "127.0.0.1:7070",
                       "stoker-data/coordinator"),
    {"tick", FLAG_DURATION, offsetof(struct coordinator_config, tick_ms), "20ms", 1, 1000, NULL,
     "Period of the sweep that expires leases, closes rounds and times out parked joins.", 0},
    {"max-events-per-job", FLAG_UINT64, offsetof(struct coordinator_config, max_events_per_job),
     "10000", 10, 10000000, NULL, "Events kept per job; older ones are deleted.", 0},
    {"watch-queue-max", FLAG_UINT64, offsetof(struct coordinator_config, watch_queue_max), "1024",
     1, 1000000, NULL, "Events a watcher may fall behind before its stream is ended.", 0},
    {"stats-flush", FLAG_DURATION, offsetof(struct coordinator_config, stats_flush_ms), "2s", 10,
     3600000, NULL, "How often heartbeat statistics (step, loss, tokens/s) are persisted.", 0},
    {"scale-timeout-beats", FLAG_UINT64, offsetof(struct coordinator_config, scale_timeout_beats),
     "10", 1, 10000, NULL,
     "Heartbeat intervals a scale or pause waits for a checkpoint before going ahead.", 0},
    {"kv-bytes-per-job", FLAG_SIZE, offsetof(struct coordinator_config, kv_bytes_per_job), "64MiB",
     4096, (int64_t)1 << 40, NULL,
     "Key-value bytes one job's generation may hold; KvSet answers RESOURCE_EXHAUSTED beyond.", 0},
    {"kv-bytes", FLAG_SIZE, offsetof(struct coordinator_config, kv_bytes), "1GiB", 4096,
     (int64_t)1 << 42, NULL, "Key-value bytes all jobs together may hold.", 0},
    {"write-buffer", FLAG_SIZE, offsetof(struct coordinator_config, write_buffer), "16MiB",
     (int64_t)1 << 20, (int64_t)1 << 30, NULL,
     "RocksDB memtable size: state written since the last flush, held in memory (two while one "
     "flushes).",
     0},
};

static const struct cfg_table coordinator_table = {
    .program = "stoker-coordinator",
    .env_prefix = "COORDINATOR",
    .opts = coordinator_options,
    .n_opts = sizeof(coordinator_options) / sizeof(coordinator_options[0]),
    .summary = "Holds job state for training: rendezvous, heartbeats, generations, barriers, KV.",
};

struct coordinator {
  struct coordinator_config cfg;
  struct daemon *daemon;
  struct coord *coord;
  struct coord_rpc *adapter;
  uv_timer_t stats_timer;
  struct metric_gauge *jobs, *members, *parked, *watchers;
  struct metric_counter *synced_writes, *heartbeats, *joins, *events;
  struct metric_counter *events_by_type[COORD_EVENT_TYPES]; /* NULL: no such type. */
  struct metric_histogram *preempt_stage; /* Notice to every rank staged (preempt_staged). */
  struct coord_stats last;
  struct coord_kv_budget kv_budget; /* For daemon_usage. */
  bool trim_due;                    /* Many parked calls ended: trim at the next tick. */
};

static void publish_stats(struct coordinator *co);
static void release_memory(struct coordinator *co);

/* Once a second: the core's figures as metrics, and the memory parked
 * calls left behind back to the system. */
static void each_second(uv_timer_t *t) {
  struct coordinator *co = t->data;
  publish_stats(co);
  release_memory(co);
}

static void publish_stats(struct coordinator *co) {
  struct coord_stats s;
  coord_get_stats(co->coord, &s);
  metric_gauge_set(co->jobs, (double)s.jobs);
  metric_gauge_set(co->members, (double)s.members);
  metric_gauge_set(co->parked, (double)s.parked);
  metric_gauge_set(co->watchers, (double)s.watchers);
  metric_counter_add(co->synced_writes, s.synced_writes - co->last.synced_writes);
  metric_counter_add(co->heartbeats, s.heartbeats - co->last.heartbeats);
  metric_counter_add(co->joins, s.joins - co->last.joins);
  metric_counter_add(co->events, s.events - co->last.events);
  for (int t = 0; t < COORD_EVENT_TYPES; t++)
    if (co->events_by_type[t])
      metric_counter_add(co->events_by_type[t], s.events_by_type[t] - co->last.events_by_type[t]);
  co->last = s;
}

static double rss_mib(void) {
  long pages = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f) {
    if (fscanf(f, "%*d %ld", &pages) != 1) pages = 0;
    fclose(f);
  }
  return (double)pages * (double)sysconf(_SC_PAGESIZE) / (1 << 20);
}

/* A rendezvous of N ranks holds N Joins open at once, about 14 KB each
 * (gRPC's call arena, about 11 KB, the HTTP/2 stream, the request, the
 * core's wait). When the round closes they are freed, but glibc keeps the
 * freed pages in its heap, between records that live on: the daemon held
 * 13-14 KB per rank after every rendezvous (1.4 GB at 100,000 ranks, of
 * which 66 MB in use). So once the parked calls have fallen TRIM_CALLS
 * below their peak, the next tick (their last sends done by then) gives
 * every free page back with malloc_trim, which costs a walk of the free
 * lists (milliseconds; logged). */
static void release_memory(struct coordinator *co) {
#ifdef __GLIBC__
  uint64_t now, peak;
  coord_rpc_parked_span(co->adapter, &now, &peak);
  if (co->trim_due) {
    co->trim_due = false;
    double before = rss_mib();
    uint64_t t0 = uv_hrtime();
    malloc_trim(0);
    log_info("memory",
             "free heap pages given back after parked calls ended: RSS %.0f -> %.0f MiB in %.1f ms",
             before, rss_mib(), (double)(uv_hrtime() - t0) / 1e6);
  }
  if (peak - now >= TRIM_CALLS) co->trim_due = true;
#else
  (void)co;
#endif
}

static void register_event_types(struct coordinator *co, struct metrics *m);

static void register_metrics(struct coordinator *co) {
  struct metrics *m = daemon_metrics(co->daemon);
  co->jobs = metrics_gauge(m, "stoker_coordinator_jobs", "Jobs known.", NULL);
  co->members =
      metrics_gauge(m, "stoker_coordinator_members", "Members of current generations.", NULL);
  co->parked = metrics_gauge(m, "stoker_coordinator_parked_calls",
                             "Parked Join, Barrier and KvGet calls.", NULL);
  co->watchers = metrics_gauge(m, "stoker_coordinator_watchers", "Open WatchJob streams.", NULL);
  co->synced_writes = metrics_counter(m, "stoker_coordinator_synced_writes_total",
                                      "RocksDB batches written with fsync.", NULL);
  co->heartbeats =
      metrics_counter(m, "stoker_coordinator_heartbeats_total", "Heartbeats handled.", NULL);
  co->joins = metrics_counter(m, "stoker_coordinator_joins_total", "Joins handled.", NULL);
  co->events = metrics_counter(m, "stoker_coordinator_events_total", "Job events recorded.", NULL);
  co->preempt_stage = metrics_histogram(
      m, "stoker_preempt_stage_seconds",
      "From a preemption notice to every rank of the job staged and gone (what a pod's "
      "terminationGracePeriodSeconds must cover).",
      NULL);
  register_event_types(co, m);
  if (metrics_add_collector(m, coord_job_metrics_collect, co->coord) != 0)
    log_warn("metrics", "no per-job series: out of memory");
  uv_timer_init(daemon_loop(co->daemon), &co->stats_timer);
  co->stats_timer.data = co;
  uv_timer_start(&co->stats_timer, each_second, 1000, 1000);
}

/* stoker_job_events_total{type="QUEUED"}: every job's events by type (the
 * proto's names without JOB_EVENT_), each series there from the start. */
static void register_event_types(struct coordinator *co, struct metrics *m) {
  const ProtobufCEnumDescriptor *d = &stoker__v1__job_event_type__descriptor;
  for (unsigned i = 0; i < d->n_values; i++) {
    int v = d->values[i].value;
    if (v <= 0 || v >= COORD_EVENT_TYPES) continue;
    const char *name = d->values[i].name;
    if (strncmp(name, "JOB_EVENT_", 10) == 0) name += 10;
    char labels[64];
    snprintf(labels, sizeof(labels), "type=\"%s\"", name);
    co->events_by_type[v] = metrics_counter(m, "stoker_job_events_total",
                                            "Job events recorded, all jobs, by type.", labels);
  }
}

static void drain_service(struct daemon *d, void *arg) {
  struct coordinator *co = arg;
  coord_rpc_drain(co->adapter);
}

static void coord_closed(void *arg) {
  struct coordinator *co = arg;
  co->coord = NULL;
  log_info("shutdown", "state flushed to RocksDB");
  daemon_service_closed(co->daemon);
}

static void stop_service(struct daemon *d, void *arg) {
  struct coordinator *co = arg;
  uv_close((uv_handle_t *)&co->stats_timer, NULL);
  coord_close(co->coord, coord_closed, co);
}

/* A preempted job's ranks all staged their checkpoint and left. */
static void preempt_staged(void *arg, const char *job, double seconds) {
  struct coordinator *co = arg;
  if (co->preempt_stage) metric_histogram_observe(co->preempt_stage, seconds);
  log_info("preempt.staged", "job=%s seconds=%.3f", job, seconds);
}

static int open_core(struct coordinator *co) {
  struct coord_opts o = {
      .dir = co->cfg.daemon.data_dir,
      .tick_ms = (uint32_t)co->cfg.tick_ms,
      .max_events_per_job = (uint32_t)co->cfg.max_events_per_job,
      .watch_queue_max = (uint32_t)co->cfg.watch_queue_max,
      .stats_flush_ms = (uint32_t)co->cfg.stats_flush_ms,
      .scale_timeout_beats = (uint32_t)co->cfg.scale_timeout_beats,
      .kv_bytes_per_job = co->cfg.kv_bytes_per_job,
      .kv_bytes = co->cfg.kv_bytes,
      .write_buffer_bytes = co->cfg.write_buffer,
      .preempt_staged = preempt_staged,
      .preempt_staged_arg = co,
  };
  int rc = coord_open(daemon_loop(co->daemon), &o, &co->coord);
  if (rc == STK_EBUSY) /* Another daemon holds the directory; the detail names it. */
    log_error("startup", "%s", stk_detail());
  else if (rc)
    log_error("startup", "cannot open the state in %s: %s%s%s", o.dir, stk_strerror(rc),
              stk_detail()[0] ? ": " : "", stk_detail());
  return rc;
}

int main(int argc, char **argv) {
  static struct coordinator co;
  char err[512] = "";
  if (argc == 2 && strcmp(argv[1], "--example-config") == 0)
    return cfg_write_example(&coordinator_table, stdout) == 0 ? 0 : 1;
  int rc = cfg_load(&coordinator_table, &co.cfg, argc, argv, err, sizeof(err));
  if (rc != 0) {
    if (rc < 0) fprintf(stderr, "stoker-coordinator: %s\n", err);
    cfg_free(&coordinator_table, &co.cfg);
    return rc < 0 ? 2 : 0;
  }
  rc = daemon_new("stoker-coordinator", &co.cfg.daemon, err, sizeof(err), &co.daemon);
  if (rc) {
    fprintf(stderr, "stoker-coordinator: %s\n", err);
    cfg_free(&coordinator_table, &co.cfg);
    return 1;
  }
  cfg_log_effective(&coordinator_table, &co.cfg);
  rc = open_core(&co);
  if (!rc) rc = coord_rpc_register(daemon_rpc(co.daemon), co.coord, &co.adapter);
  if (!rc) {
    co.kv_budget = (struct coord_kv_budget){.coord = co.coord,
                                            .kv_bytes = co.cfg.kv_bytes,
                                            .kv_bytes_per_job = co.cfg.kv_bytes_per_job};
    rc = daemon_usage_serve(co.daemon, coord_kv_usage_collect, &co.kv_budget);
  }
  if (!rc) {
    register_metrics(&co);
    daemon_on_drain(co.daemon, drain_service, &co);
    rc = daemon_start(co.daemon, stop_service, &co, err, sizeof(err));
    if (rc) log_error("startup", "%s", err);
  }
  if (!rc) daemon_run(co.daemon);
  daemon_free(co.daemon);
  coord_rpc_free(co.adapter);
  cfg_free(&coordinator_table, &co.cfg);
  return rc ? 1 : 0;
}
