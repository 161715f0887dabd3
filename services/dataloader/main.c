/*
 * stoker-dataloader: the dataloader daemon. A list of named steps: load the
 * config, size the libuv threadpool (batch generation and RocksDB writes
 * run there, never on the loop), open the core (dl_core.h), register the
 * gRPC adapter, start serving, run until SIGTERM, close the core (which
 * flushes RocksDB), exit.
 */
#include "daemon.h"
#include "daemon_usage.h"
#include "dl_core.h"
#include "dl_roots.h"
#include "dl_rpc.h"
#include "log.h"
#include "shm_ring.h"
#include "stk_error.h"

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PARTS 4096 /* a job has at most 4096 lanes (dl_job.c) */

struct dataloader_config {
  struct daemon_options daemon;
  uint64_t max_batch_bytes;
  uint64_t max_prefetch;
  uint64_t default_prefetch;
  uint64_t stream_bytes;
  uint64_t stream_bytes_per_job;
  uint64_t worker_threads;
  int64_t worker_stuck_ms;
  uint64_t keep_commits;
  int64_t max_step;
  uint64_t max_replay_lines;
  uint64_t max_replay_tokens;
  uint64_t replay_slice_tokens;
  uint64_t snapshot_every_lines;
  uint64_t max_snapshots_per_lane;
  uint64_t max_job_state_bytes;
  char *shm_dir; /* "auto", "" (off) or a path */
  uint64_t shm_ring_bytes;
  char *data_root;            /* ':'-joined directories clients may read */
  char *part;                 /* "I/P" as given */
  uint32_t part_index, parts; /* parsed from part by check_config */
};

#define DL_ROW(name, type, field, def, lo, hi, help)                                               \
  { name, type, offsetof(struct dataloader_config, field), def, lo, hi, NULL, help, 0 }

static const struct flag_spec dataloader_options[] = {
    DAEMON_OPTION_ROWS(struct dataloader_config, daemon, "127.0.0.1:7071",
                       "stoker-data/dataloader"),
    DL_ROW("max-batch-size", FLAG_SIZE, max_batch_bytes, "16MiB", 4096, (int64_t)1 << 30,
           "Largest token payload of one batch; larger requests fail (keep it at most half of "
           "max-message-size)."),
    DL_ROW("max-prefetch", FLAG_UINT64, max_prefetch, "16", 1, 1024,
           "Largest prefetch depth a StreamBatches call may ask for."),
    DL_ROW("default-prefetch", FLAG_UINT64, default_prefetch, "2", 1, 1024,
           "Prefetch depth of a StreamBatches call that asks for 0."),
    DL_ROW("stream-bytes", FLAG_SIZE, stream_bytes, "1GiB", 1 << 20, (int64_t)1 << 42,
           "What all streams may hold ahead of their clients (generated batches, ring pages); "
           "beyond, a new stream answers RESOURCE_EXHAUSTED."),
    DL_ROW("stream-bytes-per-job", FLAG_SIZE, stream_bytes_per_job, "256MiB", 1 << 20,
           (int64_t)1 << 42, "The same for the streams of one job."),
    DL_ROW("worker-threads", FLAG_UINT64, worker_threads, "4", 1, 1024,
           "Threads generating batches and writing state (the libuv threadpool size); jobs "
           "with work share them fairly."),
    DL_ROW("worker-stuck-after", FLAG_DURATION, worker_stuck_ms, "60s", 1, (int64_t)1 << 40,
           "Health turns NOT_SERVING while every worker has been on one call this long and "
           "calls wait (back to SERVING once one comes free)."),
    DL_ROW("keep-commits", FLAG_UINT64, keep_commits, "2", 1, 1000,
           "Committed states per job kept restorable; older snapshots are deleted."),
    DL_ROW("max-step", FLAG_INT64, max_step, "1099511627776", 1, (int64_t)1 << 62,
           "Steps above this are refused as invalid."),
    DL_ROW("max-replay-lines", FLAG_UINT64, max_replay_lines, "1048576", 1, (int64_t)1 << 40,
           "Lines one lane may regenerate for a call; a step further from any saved state is "
           "refused (OUT_OF_RANGE)."),
    DL_ROW("max-replay-tokens", FLAG_UINT64, max_replay_tokens, "1073741824", 1, (int64_t)1 << 50,
           "Tokens of the lines one lane may regenerate for a call (long lines cost more "
           "each); a step further is refused (OUT_OF_RANGE)."),
    DL_ROW("replay-slice-tokens", FLAG_UINT64, replay_slice_tokens, "16777216", 0, (int64_t)1 << 50,
           "Tokens a call may replay on a worker before giving it back: a long replay runs in "
           "slices of this many tokens, queued behind other tenants' and jobs' work between "
           "them (0: in one go)."),
    DL_ROW("snapshot-every-lines", FLAG_UINT64, snapshot_every_lines, "32", 1, 1 << 20,
           "Spacing of the in-memory lane snapshots that bound replay."),
    DL_ROW("max-snapshots-per-lane", FLAG_UINT64, max_snapshots_per_lane, "256", 1, 1 << 20,
           "In-memory lane snapshots kept per lane."),
    DL_ROW("max-job-state-bytes", FLAG_SIZE, max_job_state_bytes, "256MiB", 1 << 20,
           (int64_t)1 << 40,
           "Budget of one job's lane state: a lane keeps a counter per shard of each dataset in "
           "its generator, each snapshot and each kept commit; a loader spec (create, mixture, "
           "import) whose bound is larger is refused (RESOURCE_EXHAUSTED)."),
    DL_ROW("shm-dir", FLAG_STRING, shm_dir, "auto", 0, 0,
           "Shared-memory delivery of streamed batches to clients on this host: the directory "
           "of ring files (made 0700); auto: /dev/shm/stoker-dl-HASH of data-dir; empty: off "
           "(tokens over gRPC only)."),
    DL_ROW("shm-ring-max", FLAG_SIZE, shm_ring_bytes, "256MiB", 1 << 20, (int64_t)1 << 40,
           "Largest shared-memory ring of one stream; batches too big for two slots go over "
           "gRPC."),
    {"data-root", FLAG_STRING, offsetof(struct dataloader_config, data_root), "", 0, 0, NULL,
     "Directory whose files (datasets, tokenizer files) clients may name; repeat for more. "
     "Anything else is PERMISSION_DENIED; none: no file is served.",
     FLAG_REPEAT},
    DL_ROW("part", FLAG_STRING, part, "0/1", 0, 0,
           "Scale-out: I/P makes this process part I of P serving each job, generating only "
           "the lanes c with c mod P == I (0/1: the whole job)."),
};

static const struct cfg_table dataloader_table = {
    .program = "stoker-dataloader",
    .env_prefix = "DATALOADER",
    .opts = dataloader_options,
    .n_opts = sizeof(dataloader_options) / sizeof(dataloader_options[0]),
    .summary = "Serves step-addressed, resumable, rescalable token batches to trainer ranks.",
};

struct dataloader {
  struct dataloader_config cfg;
  char shm_dir[PATH_MAX];
  char shm_owner[PATH_MAX]; /* The data dir, for an auto shm dir. */
  struct daemon *daemon;
  struct dl *dl;
  struct dl_rpc *adapter;
};

/* "I/P" with P >= 1 and I < P into c->part_index and c->parts. */
static int parse_part(struct dataloader_config *c, char *err, size_t err_len) {
  const char *s = c->part ? c->part : "";
  char *end = NULL;
  unsigned long i = 0, p = 0;
  bool ok = *s >= '0' && *s <= '9';
  if (ok) i = strtoul(s, &end, 10);
  ok = ok && *end == '/' && end[1] >= '0' && end[1] <= '9';
  if (ok) p = strtoul(end + 1, &end, 10);
  ok = ok && *end == 0 && p >= 1 && p <= MAX_PARTS && i < p;
  if (!ok) {
    snprintf(err, err_len,
             "--part: expected I/P with 1 <= P <= %u and 0 <= I < P (this process is part I of "
             "P), got '%s'",
             MAX_PARTS, s);
    return STK_EINVAL;
  }
  c->part_index = (uint32_t)i;
  c->parts = (uint32_t)p;
  return 0;
}

/* A batch reply carries the tokens and up to one doc start per token. */
static int check_config(struct dataloader_config *c, char *err, size_t err_len) {
  if (parse_part(c, err, err_len) < 0) return STK_EINVAL;
  if (c->max_batch_bytes * 2 + 65536 > c->daemon.max_message_bytes) {
    snprintf(err, err_len, "max-batch-size (%llu) must be under half of max-message-size (%llu)",
             (unsigned long long)c->max_batch_bytes,
             (unsigned long long)c->daemon.max_message_bytes);
    return STK_EINVAL;
  }
  if (c->default_prefetch > c->max_prefetch) {
    snprintf(err, err_len, "default-prefetch (%llu) is over max-prefetch (%llu)",
             (unsigned long long)c->default_prefetch, (unsigned long long)c->max_prefetch);
    return STK_EINVAL;
  }
  return 0;
}

/* libuv reads UV_THREADPOOL_SIZE once, when the first work is queued. */
static void size_threadpool(const struct dataloader_config *c) {
  char n[32];
  snprintf(n, sizeof(n), "%llu", (unsigned long long)c->worker_threads);
  setenv("UV_THREADPOOL_SIZE", n, 1);
}

static int open_core(struct dataloader *d) {
  /* Before the core opens: jobs reloaded at a restart reopen their files. */
  int rc = dl_roots_set(d->cfg.data_root);
  if (rc) {
    log_error("startup", "--data-root: %s", stk_detail());
    return rc;
  }
  if (!d->cfg.data_root || !d->cfg.data_root[0])
    log_warn("startup", "no --data-root: this dataloader serves no files (synthetic datasets "
                        "only); give the directories of the datasets and tokenizer files");
  struct dl_opts o = {
      .dir = d->cfg.daemon.data_dir,
      .max_batch_bytes = d->cfg.max_batch_bytes,
      .max_step = d->cfg.max_step,
      .max_replay_lines = d->cfg.max_replay_lines,
      .max_replay_tokens = d->cfg.max_replay_tokens,
      .replay_slice_tokens = d->cfg.replay_slice_tokens,
      .snapshot_every_lines = (uint32_t)d->cfg.snapshot_every_lines,
      .max_snapshots_per_lane = (uint32_t)d->cfg.max_snapshots_per_lane,
      .keep_commits = (uint32_t)d->cfg.keep_commits,
      .max_job_state_bytes = d->cfg.max_job_state_bytes,
      .part = d->cfg.part_index,
      .parts = d->cfg.parts,
  };
  rc = dl_open(&o, &d->dl);
  if (rc == STK_EBUSY) /* Another daemon holds the directory; the detail names it. */
    log_error("startup", "%s", stk_detail());
  else if (rc)
    log_error("startup", "cannot open the state in %s: %s%s%s", o.dir, stk_strerror(rc),
              stk_detail()[0] ? ": " : "", stk_detail());
  return rc;
}

/* shm-dir "auto" becomes this daemon's directory under /dev/shm. */
static int resolve_shm_dir(struct dataloader *d) {
  const char *dir = d->cfg.shm_dir ? d->cfg.shm_dir : "";
  if (strcmp(dir, "auto") != 0) {
    snprintf(d->shm_dir, sizeof(d->shm_dir), "%s", dir);
    return 0;
  }
  int rc = shm_ring_auto_dir("dl", d->cfg.daemon.data_dir, d->shm_dir, sizeof(d->shm_dir),
                             d->shm_owner, sizeof(d->shm_owner));
  if (rc) log_error("startup", "shm-dir: %s", stk_detail());
  return rc;
}

static int register_adapter(struct dataloader *d) {
  int rc = resolve_shm_dir(d);
  if (rc) return rc;
  struct dl_rpc_opts o = {
      .max_prefetch = (uint32_t)d->cfg.max_prefetch,
      .default_prefetch = (uint32_t)d->cfg.default_prefetch,
      .metrics = daemon_metrics(d->daemon),
      .shm_dir = d->shm_dir,
      .shm_owner = d->shm_owner,
      .shm_ring_bytes = d->cfg.shm_ring_bytes,
      .workers = (uint32_t)d->cfg.worker_threads,
      .stuck_ms = (uint64_t)d->cfg.worker_stuck_ms,
      .stream_bytes = d->cfg.stream_bytes,
      .stream_bytes_per_job = d->cfg.stream_bytes_per_job,
  };
  rc = dl_rpc_register(daemon_rpc(d->daemon), daemon_loop(d->daemon), d->dl, &o, &d->adapter);
  if (rc == 0) rc = daemon_usage_serve(d->daemon, dl_rpc_usage_collect, d->adapter);
  if (rc) log_error("startup", "%s: %s", stk_strerror(rc), stk_detail());
  return rc;
}

static void drain_service(struct daemon *dm, void *arg) {
  struct dataloader *d = arg;
  (void)dm;
  dl_rpc_drain(d->adapter);
}

/* Every call has finished, so no work is in flight on the threadpool. */
static void stop_service(struct daemon *dm, void *arg) {
  struct dataloader *d = arg;
  dl_close(d->dl);
  d->dl = NULL;
  log_info("shutdown", "state flushed to RocksDB");
  daemon_service_closed(dm);
}

static int load_config(struct dataloader *d, int argc, char **argv) {
  char err[512] = "";
  int rc = cfg_load(&dataloader_table, &d->cfg, argc, argv, err, sizeof(err));
  if (rc == 0) rc = check_config(&d->cfg, err, sizeof(err));
  if (rc < 0) fprintf(stderr, "stoker-dataloader: %s\n", err);
  return rc;
}

int main(int argc, char **argv) {
  static struct dataloader d;
  char err[512] = "";
  if (argc == 2 && strcmp(argv[1], "--example-config") == 0)
    return cfg_write_example(&dataloader_table, stdout) == 0 ? 0 : 1;
  int rc = load_config(&d, argc, argv);
  if (rc != 0) {
    cfg_free(&dataloader_table, &d.cfg);
    return rc < 0 ? 2 : 0;
  }
  size_threadpool(&d.cfg);
  rc = daemon_new("stoker-dataloader", &d.cfg.daemon, err, sizeof(err), &d.daemon);
  if (rc) {
    fprintf(stderr, "stoker-dataloader: %s\n", err);
    cfg_free(&dataloader_table, &d.cfg);
    return 1;
  }
  cfg_log_effective(&dataloader_table, &d.cfg);
  rc = open_core(&d);
  if (!rc) rc = register_adapter(&d);
  if (!rc) {
    daemon_on_drain(d.daemon, drain_service, &d);
    rc = daemon_start(d.daemon, stop_service, &d, err, sizeof(err));
    if (rc) log_error("startup", "%s", err);
  }
  if (!rc) daemon_run(d.daemon);
  daemon_free(d.daemon);
  dl_rpc_free(d.adapter);
  dl_close(d.dl);
  cfg_free(&dataloader_table, &d.cfg);
  return rc ? 1 : 0;
}
