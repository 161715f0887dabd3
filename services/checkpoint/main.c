/*
 * stoker-checkpoint: the checkpoint daemon. A list of named steps: load the
 * config, resolve the storage URL (file://<data-dir>/objects by default;
 * S3 options exported as the AWS_* environment storage.h reads; the shm
 * staging directory, by default one per data dir under /dev/shm), open the
 * core (ckpt_service.h, which recovers interrupted attempts before serving),
 * register the gRPC adapter, start serving, run until SIGTERM, close the
 * core (uploads and commits in flight finish or stay journaled), exit.
 */
#include "ckpt_job_metrics.h"
#include "ckpt_rpc.h"
#include "ckpt_rpc_report.h"
#include "ckpt_service.h"
#include "daemon.h"
#include "daemon_usage.h"
#include "log.h"
#include "s3_config.h"
#include "shm_ring.h"
#include "stk_error.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct checkpoint_config {
  struct daemon_options daemon;
  char *storage;
  char *key_prefix;
  char *s3_endpoint;
  char *s3_region;
  char *s3_access_key;
  char *s3_secret_key;
  uint64_t staging_budget_bytes;
  uint64_t upload_concurrency;
  uint64_t part_bytes;
  uint64_t read_piece_bytes;
  uint64_t read_batch_bytes;
  uint64_t read_budget_bytes;
  uint64_t read_budget_per_job_bytes;
  uint64_t read_concurrency;
  uint64_t keep_last;
  uint64_t keep_every;
  int64_t attempt_timeout_ms;
  int64_t attempt_idle_timeout_ms;
  uint64_t max_open_attempts;
  uint64_t max_open_attempts_per_job;
  int64_t orphan_upload_grace_ms;
  int64_t orphan_attempt_grace_ms;
  char *coordinator;
  char *coordinator_token_file;
  char *coordinator_tls_ca;
  char *coordinator_tls_cert;
  char *coordinator_tls_key;
  char *shm_dir;
  uint64_t shm_pool_bytes;
  char *advertise_host;
  bool shared_storage;
};

#define CK_ROW(name, type, field, def, lo, hi, help, flags)                                        \
  { name, type, offsetof(struct checkpoint_config, field), def, lo, hi, NULL, help, flags }

static const struct flag_spec checkpoint_options[] = {
    DAEMON_OPTION_ROWS(struct checkpoint_config, daemon, "127.0.0.1:7072",
                       "stoker-data/checkpoint"),
    CK_ROW(
        "storage", FLAG_STRING, storage, "", 0, 0,
        "Where checkpoints go: s3://bucket/prefix or file:///dir; empty: file://DATA-DIR/objects.",
        0),
    CK_ROW("key-prefix", FLAG_STRING, key_prefix, "", 0, 0,
           "Deployment prefix of every key inside the store.", 0),
    CK_ROW("s3-endpoint", FLAG_STRING, s3_endpoint, "", 0, 0,
           "S3 endpoint URL (http://host:port); empty: $AWS_ENDPOINT_URL or AWS's.", 0),
    CK_ROW("s3-region", FLAG_STRING, s3_region, "", 0, 0,
           "S3 region; empty: $AWS_REGION or us-east-1.", 0),
    CK_ROW("s3-access-key", FLAG_STRING, s3_access_key, "", 0, 0,
           "S3 access key id; empty: $AWS_ACCESS_KEY_ID.", 0),
    CK_ROW("s3-secret-key", FLAG_STRING, s3_secret_key, "", 0, 0,
           "S3 secret access key; empty: $AWS_SECRET_ACCESS_KEY.", FLAG_SECRET),
    CK_ROW("staging-budget", FLAG_SIZE, staging_budget_bytes, "1GiB", 16 << 20, (int64_t)1 << 44,
           "Memory for staged checkpoint bytes, all writers together (back-pressure when full).",
           0),
    CK_ROW("upload-concurrency", FLAG_UINT64, upload_concurrency, "8", 1, 256,
           "Uploads out at once (multipart parts, PUTs, completes).", 0),
    CK_ROW("part-size", FLAG_SIZE, part_bytes, "16MiB", 5 << 20, (int64_t)5 << 30,
           "Multipart part size: a multiple of 1MiB, at least 5MiB.", 0),
    CK_ROW("read-piece-size", FLAG_SIZE, read_piece_bytes, "4MiB", 4096, 1 << 30,
           "Most data bytes per ReadChunk (keep it under max-message-size).", 0),
    CK_ROW("read-concurrency", FLAG_UINT64, read_concurrency, "8", 1, 256,
           "Ranged GETs of restores out at once, all reads together.", 0),
    CK_ROW("read-batch-size", FLAG_SIZE, read_batch_bytes, "64MiB", 1 << 20, (int64_t)1 << 34,
           "Wanted bytes a restore fetches together (one GET per object and batch); a read "
           "holds about four times this.",
           0),
    CK_ROW("read-budget", FLAG_SIZE, read_budget_bytes, "1GiB", 1 << 20, (int64_t)1 << 42,
           "What all restores may hold at once (each batch twice its wanted bytes); beyond, "
           "a read waits unless its job holds nothing.",
           0),
    CK_ROW("read-budget-per-job", FLAG_SIZE, read_budget_per_job_bytes, "256MiB", 1 << 20,
           (int64_t)1 << 42, "The same for the restores of one job.", 0),
    CK_ROW("keep-last", FLAG_UINT64, keep_last, "0", 0, 1000000,
           "Retention: keep the newest N committed steps per job; 0 keeps all.", 0),
    CK_ROW("keep-every", FLAG_UINT64, keep_every, "0", 0, (int64_t)1 << 40,
           "Retention: also keep every step divisible by M; 0: none.", 0),
    CK_ROW("attempt-timeout", FLAG_DURATION, attempt_timeout_ms, "10m", 100, 86400000,
           "An attempt whose ranks have not all finished by then is aborted.", 0),
    CK_ROW("attempt-idle-timeout", FLAG_DURATION, attempt_idle_timeout_ms, "2m", 100, 86400000,
           "An attempt with unfinished ranks, no stream and no data this long is aborted.", 0),
    CK_ROW("max-open-attempts", FLAG_UINT64, max_open_attempts, "16", 1, 4096,
           "Attempts open at once, at most; Begin answers RESOURCE_EXHAUSTED beyond.", 0),
    CK_ROW("max-open-attempts-per-job", FLAG_UINT64, max_open_attempts_per_job, "4", 1, 4096,
           "Attempts one job may hold open; its Begin answers RESOURCE_EXHAUSTED beyond.", 0),
    CK_ROW("orphan-upload-grace", FLAG_DURATION, orphan_upload_grace_ms, "1h", 1000, 2592000000,
           "Multipart uploads that no open attempt owns are aborted once this old.", 0),
    CK_ROW("orphan-attempt-grace", FLAG_DURATION, orphan_attempt_grace_ms, "1h", 100, 2592000000,
           "Attempt directories in storage with no manifest and no journal record are removed "
           "once found so this long.",
           0),
    CK_ROW("coordinator", FLAG_STRING, coordinator, "", 0, 0,
           "Coordinator HOST:PORT told of each commit (ReportCheckpoint); empty: none.", 0),
    CK_ROW("coordinator-token-file", FLAG_STRING, coordinator_token_file, "", 0, 0,
           "File holding the bearer token for the coordinator; empty: none. Re-read on SIGHUP.",
           FLAG_SECRET),
    CK_ROW("coordinator-tls-ca", FLAG_STRING, coordinator_tls_ca, "", 0, 0,
           "PEM CA bundle: reach the coordinator over TLS, verifying it; empty: plaintext. "
           "Re-read on SIGHUP.",
           0),
    CK_ROW("coordinator-tls-cert", FLAG_STRING, coordinator_tls_cert, "", 0, 0,
           "PEM client certificate for a coordinator that asks for mutual TLS. Re-read on SIGHUP.",
           0),
    CK_ROW("coordinator-tls-key", FLAG_STRING, coordinator_tls_key, "", 0, 0,
           "PEM private key of coordinator-tls-cert. Re-read on SIGHUP.", 0),
    CK_ROW("shm-dir", FLAG_STRING, shm_dir, "auto", 0, 0,
           "Directory (tmpfs) where ranks on this host stage zero-copy; auto: "
           "/dev/shm/stoker-ckpt-HASH of data-dir; empty: off (bytes over gRPC only).",
           0),
    CK_ROW("shm-pool", FLAG_SIZE, shm_pool_bytes, "1GiB", 0, (int64_t)1 << 44,
           "Released shm segments kept for reuse by the next checkpoint (capped at "
           "staging-budget); 0: none.",
           0),
    CK_ROW("advertise-host", FLAG_STRING, advertise_host, "", 0, 0,
           "Replicas behind one address: the host name (or IP) under which ranks reach this "
           "replica; Begin answers it with the bound port as the attempt's owner; empty: "
           "ranks keep the address Begin went to (one replica).",
           0),
    CK_ROW("shared-storage", FLAG_BOOL, shared_storage, "false", 0, 0,
           "Replicas share the storage prefix: storage is the catalogue (List, GetManifest, "
           "Read and Begin see every replica's checkpoints).",
           0),
};

static const struct cfg_table checkpoint_table = {
    .program = "stoker-checkpoint",
    .env_prefix = "CHECKPOINT",
    .opts = checkpoint_options,
    .n_opts = sizeof(checkpoint_options) / sizeof(checkpoint_options[0]),
    .summary = "Stages, uploads, commits and restores sharded training checkpoints.",
};

struct checkpoint {
  struct checkpoint_config cfg;
  char storage_url[PATH_MAX + 16];
  char shm_dir[PATH_MAX];
  char shm_owner[PATH_MAX]; /* Data dir recorded in an auto shm dir; "" otherwise. */
  char *token;
  struct daemon *daemon;
  struct ckpt_service *svc;
  struct ckpt_rpc *adapter;
  struct ckpt_report *report;
  uv_timer_t stats_timer;
  bool timer_on;
  struct metric_gauge *staged;
  struct metric_counter *parts, *objects, *commits, *aborts;
  struct metric_counter *orphan_uploads;
  struct metric_counter *orphan_attempts, *orphan_attempt_objects;
  struct metric_counter *restore_gets, *restore_gets_shared;
  struct ckpt_service_stats last;
  struct ckpt_budgets budgets; /* For daemon_usage. */
};

static int check_config(const struct checkpoint_config *c, char *err, size_t err_len) {
  if (c->part_bytes % (1 << 20) != 0) {
    snprintf(err, err_len, "part-size (%llu) must be a multiple of 1MiB",
             (unsigned long long)c->part_bytes);
    return STK_EINVAL;
  }
  if (c->read_piece_bytes + 65536 > c->daemon.max_message_bytes) {
    snprintf(err, err_len, "read-piece-size (%llu) must be under max-message-size (%llu)",
             (unsigned long long)c->read_piece_bytes,
             (unsigned long long)c->daemon.max_message_bytes);
    return STK_EINVAL;
  }
  if (c->staging_budget_bytes < c->part_bytes) {
    snprintf(err, err_len, "staging-budget must hold at least one part (part-size)");
    return STK_EINVAL;
  }
  /* Another replica's attempt lives at most attempt-timeout: its uploads
   * and directory must not look orphaned before that. */
  if (c->shared_storage && (c->orphan_upload_grace_ms <= c->attempt_timeout_ms ||
                            c->orphan_attempt_grace_ms <= c->attempt_timeout_ms)) {
    snprintf(err, err_len,
             "with shared-storage, orphan-upload-grace and orphan-attempt-grace must exceed "
             "attempt-timeout (another replica's attempt would look orphaned)");
    return STK_EINVAL;
  }
  if (c->advertise_host && strchr(c->advertise_host, ':')) {
    snprintf(err, err_len, "advertise-host %s: a host name or IPv4 address, no port",
             c->advertise_host);
    return STK_EINVAL;
  }
  return 0;
}

/* file://<absolute data dir>/objects unless a storage URL is given. */
static int resolve_storage(struct checkpoint *ck, char *err, size_t err_len) {
  const char *url = ck->cfg.storage;
  if (url && url[0]) {
    snprintf(ck->storage_url, sizeof(ck->storage_url), "%s", url);
    return 0;
  }
  char abs[PATH_MAX];
  mkdir(ck->cfg.daemon.data_dir, 0755);
  if (!realpath(ck->cfg.daemon.data_dir, abs)) {
    snprintf(err, err_len, "data-dir %s: cannot resolve", ck->cfg.daemon.data_dir);
    return STK_EINVAL;
  }
  snprintf(ck->storage_url, sizeof(ck->storage_url), "file://%s/objects", abs);
  return 0;
}

/* shm-dir "auto": /dev/shm/stoker-ckpt-<hash of the absolute data dir>
 * (shm_ring.h: one per service on the host; the dirs of deleted data dirs
 * are swept), off where /dev/shm is missing. */
static int resolve_shm(struct checkpoint *ck, char *err, size_t err_len) {
  const char *dir = ck->cfg.shm_dir ? ck->cfg.shm_dir : "";
  if (strcmp(dir, "auto") != 0) {
    snprintf(ck->shm_dir, sizeof(ck->shm_dir), "%s", dir);
    return 0;
  }
  if (shm_ring_auto_dir("ckpt", ck->cfg.daemon.data_dir, ck->shm_dir, sizeof(ck->shm_dir),
                        ck->shm_owner, sizeof(ck->shm_owner)) != 0) {
    snprintf(err, err_len, "%s", stk_detail());
    return STK_EINVAL;
  }
  if (!ck->shm_dir[0]) ck->shm_owner[0] = '\0';
  return 0;
}

static const char *nonempty(const char *s) {
  return s && s[0] ? s : NULL;
}

/* The reporter's options: the coordinator flags and token. */
static struct ckpt_report_opts reporter_opts(struct checkpoint *ck, const char *token) {
  const struct checkpoint_config *c = &ck->cfg;
  return (struct ckpt_report_opts){
      .target = c->coordinator,
      .token = token,
      .tls_ca_file = nonempty(c->coordinator_tls_ca),
      .tls_cert_file = nonempty(c->coordinator_tls_cert),
      .tls_key_file = nonempty(c->coordinator_tls_key),
      .metrics = daemon_metrics(ck->daemon),
  };
}

static int start_reporter(struct checkpoint *ck) {
  if (!nonempty(ck->cfg.coordinator)) return 0;
  const char *tf = nonempty(ck->cfg.coordinator_token_file);
  stk_clear_detail();
  if (tf && rpc_read_token_file(tf, &ck->token) != 0) {
    log_error("startup", "coordinator-token-file: %s", stk_detail());
    return STK_EINVAL;
  }
  if (ck->token && !nonempty(ck->cfg.coordinator_tls_ca))
    log_warn("insecure",
             "coordinator-token-file is set without coordinator-tls-ca: the token "
             "crosses the network in clear to %s",
             ck->cfg.coordinator);
  struct ckpt_report_opts o = reporter_opts(ck, ck->token);
  stk_clear_detail();
  int rc = ckpt_report_new(&o, &ck->report);
  if (rc)
    log_error("startup", "coordinator %s: %s", ck->cfg.coordinator,
              stk_detail()[0] ? stk_detail() : stk_strerror(rc));
  return rc;
}

/* SIGHUP: the coordinator's CA, our client certificate and the token file
 * are read again into a new client; what does not load is logged and the
 * client in use stays. */
static int reload_reporter(struct daemon *d, void *arg) {
  struct checkpoint *ck = arg;
  (void)d;
  if (!ck->report) return 0;
  const char *tf = nonempty(ck->cfg.coordinator_token_file);
  char *token = NULL;
  stk_clear_detail();
  int rc = tf ? rpc_read_token_file(tf, &token) : 0;
  struct ckpt_report_opts o = reporter_opts(ck, token);
  if (!rc) rc = ckpt_report_reload(ck->report, &o);
  if (rc) {
    log_error("reload",
              "signal=SIGHUP coordinator client not reloaded, the old one stays in use: %s",
              stk_detail()[0] ? stk_detail() : stk_strerror(rc));
    free(token);
    return rc;
  }
  free(ck->token);
  ck->token = token;
  log_info("reload", "signal=SIGHUP coordinator_client=reloaded");
  return 0;
}

static void on_commit(void *arg, const char *job, int64_t step, const char *manifest_uri) {
  struct checkpoint *ck = arg;
  log_info("checkpoint.committed", "job=%s step=%lld uri=%s", job, (long long)step, manifest_uri);
  if (ck->report) ckpt_report_commit(ck->report, job, step, manifest_uri);
}

/* Every abort, once, whatever its cause (the Abort call, a failed write or
 * upload, the attempt or idle timeout, a later Begin superseding it). */
static void on_abort(void *arg, const char *job, int64_t step, const char *attempt,
                     const char *reason) {
  (void)arg;
  log_warn("checkpoint.aborted", "job=%s step=%lld attempt=%s: %s", job, (long long)step, attempt,
           reason);
}

static int open_core(struct checkpoint *ck) {
  char db[PATH_MAX];
  snprintf(db, sizeof(db), "%s/journal", ck->cfg.daemon.data_dir);
  /* Unset fields fall back to AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID,
   * AWS_SECRET_ACCESS_KEY (s3_config.h); nothing is written to the environment. */
  const struct checkpoint_config *c = &ck->cfg;
  struct s3_config s3 = {.endpoint = c->s3_endpoint,
                         .region = c->s3_region,
                         .access_key = c->s3_access_key,
                         .secret_key = c->s3_secret_key};
  struct ckpt_service_opts o = {
      .db_dir = db,
      .storage_url = ck->storage_url,
      .s3 = &s3,
      .key_prefix = ck->cfg.key_prefix,
      .staging_budget_bytes = ck->cfg.staging_budget_bytes,
      .upload_concurrency = (uint32_t)ck->cfg.upload_concurrency,
      .part_bytes = ck->cfg.part_bytes,
      .keep_last = (uint32_t)ck->cfg.keep_last,
      .keep_every = (uint32_t)ck->cfg.keep_every,
      .attempt_timeout_ms = (uint32_t)ck->cfg.attempt_timeout_ms,
      .attempt_idle_timeout_ms = (uint32_t)ck->cfg.attempt_idle_timeout_ms,
      .max_open_attempts = (uint32_t)ck->cfg.max_open_attempts,
      .max_open_attempts_per_job = (uint32_t)ck->cfg.max_open_attempts_per_job,
      .read_piece_bytes = (uint32_t)ck->cfg.read_piece_bytes,
      .read_concurrency = (uint32_t)ck->cfg.read_concurrency,
      .read_batch_bytes = ck->cfg.read_batch_bytes,
      .read_budget_bytes = ck->cfg.read_budget_bytes,
      .read_budget_per_job_bytes = ck->cfg.read_budget_per_job_bytes,
      .shm_dir = ck->shm_dir,
      .shm_pool_bytes = ck->cfg.shm_pool_bytes,
      .orphan_upload_grace_ms = (uint32_t)ck->cfg.orphan_upload_grace_ms,
      .orphan_attempt_grace_ms = (uint32_t)ck->cfg.orphan_attempt_grace_ms,
      .shared_storage = ck->cfg.shared_storage,
      .commit_hook = on_commit,
      .commit_hook_arg = ck,
      .abort_hook = on_abort,
  };
  stk_clear_detail();
  int rc = ckpt_service_open(daemon_loop(ck->daemon), &o, &ck->svc);
  if (rc == STK_EBUSY) /* Another daemon holds the directory; the detail names it. */
    log_error("startup", "%s", stk_detail());
  else if (rc)
    log_error("startup", "cannot open the checkpoint service (%s, %s): %s%s%s", db, ck->storage_url,
              stk_strerror(rc), stk_detail()[0] ? ": " : "", stk_detail());
  else
    log_info("startup", "shm staging %s%s", ck->shm_dir[0] ? "in " : "off",
             ck->shm_dir[0] ? ck->shm_dir : "");
  if (rc == 0 && ck->shm_owner[0]) shm_ring_record_owner(ck->shm_dir, ck->shm_owner);
  return rc;
}

/* Publishes the core's figures as metrics twice a second. */
static void publish_stats(uv_timer_t *t) {
  struct checkpoint *ck = t->data;
  struct ckpt_service_stats s;
  if (!ck->svc) return;
  ckpt_service_get_stats(ck->svc, &s);
  metric_gauge_set(ck->staged, (double)s.staged_bytes);
  metric_counter_add(ck->parts, s.parts_uploaded - ck->last.parts_uploaded);
  metric_counter_add(ck->objects, s.objects_uploaded - ck->last.objects_uploaded);
  metric_counter_add(ck->commits, s.commits - ck->last.commits);
  metric_counter_add(ck->aborts, s.aborts - ck->last.aborts);
  metric_counter_add(ck->orphan_uploads,
                     s.orphan_uploads_aborted - ck->last.orphan_uploads_aborted);
  uint64_t attempts = s.orphan_attempts_removed - ck->last.orphan_attempts_removed;
  uint64_t objects = s.orphan_attempt_objects_removed - ck->last.orphan_attempt_objects_removed;
  metric_counter_add(ck->orphan_attempts, attempts);
  metric_counter_add(ck->orphan_attempt_objects, objects);
  metric_counter_add(ck->restore_gets, s.read_gets - ck->last.read_gets);
  metric_counter_add(ck->restore_gets_shared, s.read_gets_shared - ck->last.read_gets_shared);
  if (attempts)
    log_info("orphan_attempts_removed",
             "attempts=%llu objects=%llu (attempt directories with no manifest and no journal "
             "record for over --orphan-attempt-grace)",
             (unsigned long long)attempts, (unsigned long long)objects);
  ck->last = s;
}

static int register_adapter(struct checkpoint *ck) {
  struct metrics *m = daemon_metrics(ck->daemon);
  ck->staged = metrics_gauge(m, "stoker_checkpoint_staging_bytes",
                             "Staging memory held now (buffer capacity).", NULL);
  ck->parts = metrics_counter(m, "stoker_checkpoint_parts_uploaded_total", "Parts uploaded.", NULL);
  ck->objects =
      metrics_counter(m, "stoker_checkpoint_objects_uploaded_total", "Objects uploaded.", NULL);
  ck->commits =
      metrics_counter(m, "stoker_checkpoint_commits_total", "Checkpoints committed.", NULL);
  ck->aborts = metrics_counter(m, "stoker_checkpoint_aborts_total", "Attempts aborted.", NULL);
  ck->orphan_uploads =
      metrics_counter(m, "stoker_checkpoint_orphan_uploads_aborted_total",
                      "Multipart uploads no open attempt owned, aborted by GC.", NULL);
  ck->orphan_attempts = metrics_counter(
      m, "stoker_checkpoint_orphan_attempts_removed_total",
      "Attempt directories no manifest and no journal record claimed, removed.", NULL);
  ck->orphan_attempt_objects =
      metrics_counter(m, "stoker_checkpoint_orphan_attempt_objects_removed_total",
                      "Objects deleted from orphaned attempt directories.", NULL);
  ck->restore_gets = metrics_counter(m, "stoker_checkpoint_restore_gets_total",
                                     "Ranged GETs of checkpoint objects made by reads.", NULL);
  ck->restore_gets_shared = metrics_counter(
      m, "stoker_checkpoint_restore_gets_shared_total",
      "Spans of reads answered by another read's GET of the same bytes (shared fetches).", NULL);
  /* Fails only out of memory: the per-job gauges are then missing. */
  metrics_add_collector(m, ckpt_job_metrics_collect, &ck->svc);
  uv_timer_init(daemon_loop(ck->daemon), &ck->stats_timer);
  ck->stats_timer.data = ck;
  uv_timer_start(&ck->stats_timer, publish_stats, 500, 500);
  ck->timer_on = true;
  struct ckpt_rpc_opts o = {.metrics = m};
  int rc = ckpt_rpc_register(daemon_rpc(ck->daemon), ck->svc, &o, &ck->adapter);
  ck->budgets = (struct ckpt_budgets){.svc = &ck->svc,
                                      .staging_bytes = ck->cfg.staging_budget_bytes,
                                      .read_bytes = ck->cfg.read_budget_bytes,
                                      .read_per_job_bytes = ck->cfg.read_budget_per_job_bytes};
  return rc ? rc : daemon_usage_serve(ck->daemon, ckpt_usage_collect, &ck->budgets);
}

static void drain_service(struct daemon *dm, void *arg) {
  struct checkpoint *ck = arg;
  (void)dm;
  ckpt_rpc_drain(ck->adapter);
}

static void service_closed(void *arg) {
  struct checkpoint *ck = arg;
  log_info("shutdown", "uploads, commits and the journal are flushed");
  /* The core removed its segments; the auto directory's owner record and
   * the directory go too, so a clean stop leaves nothing in /dev/shm. */
  if (ck->shm_owner[0]) shm_ring_forget_owner(ck->shm_dir);
  daemon_service_closed(ck->daemon);
}

/* Every call has finished: detach lingering writers, close the core. */
static void stop_service(struct daemon *dm, void *arg) {
  struct checkpoint *ck = arg;
  (void)dm;
  uv_close((uv_handle_t *)&ck->stats_timer, NULL);
  ck->timer_on = false;
  ckpt_rpc_detach(ck->adapter);
  struct ckpt_service *svc = ck->svc;
  ck->svc = NULL;
  ckpt_service_close(svc, service_closed, ck);
}

/* With --advertise-host: one of several replicas behind one address.
 * Begin names this replica (the host and the bound port) as the owner of
 * the attempts it starts, and a stop signal lets the attempts it holds end
 * (committed or aborted) before the calls stop. */
static int become_replica(struct checkpoint *ck) {
  const char *host = ck->cfg.advertise_host;
  if (!host || !host[0]) return 0;
  const char *bound = daemon_bound(ck->daemon), *port = strrchr(bound, ':');
  char owner[320];
  snprintf(owner, sizeof(owner), "%s:%s", host, port ? port + 1 : "");
  int rc = ckpt_rpc_set_owner(ck->adapter, owner);
  if (rc) return rc;
  daemon_hold_while(ck->daemon, ckpt_rpc_busy, ck->adapter);
  log_info("replica", "owner=%s shared_storage=%s", owner,
           ck->cfg.shared_storage ? "true" : "false");
  return 0;
}

static int load_config(struct checkpoint *ck, int argc, char **argv) {
  char err[512] = "";
  int rc = cfg_load(&checkpoint_table, &ck->cfg, argc, argv, err, sizeof(err));
  if (rc == 0) rc = check_config(&ck->cfg, err, sizeof(err));
  if (rc == 0) rc = resolve_storage(ck, err, sizeof(err));
  if (rc == 0) rc = resolve_shm(ck, err, sizeof(err));
  if (rc < 0) fprintf(stderr, "stoker-checkpoint: %s\n", err);
  return rc;
}

static void set_flag(void *arg) {
  *(bool *)arg = true;
}

/* After a failed start: close what was opened on the loop and let the
 * loop run until the core has closed. */
static void close_after_failure(struct checkpoint *ck) {
  uv_loop_t *loop = ck->daemon ? daemon_loop(ck->daemon) : NULL;
  if (!loop) return;
  if (ck->timer_on) uv_close((uv_handle_t *)&ck->stats_timer, NULL);
  ck->timer_on = false;
  bool closed = ck->svc == NULL;
  if (ck->svc) ckpt_service_close(ck->svc, set_flag, &closed);
  ck->svc = NULL;
  while (!closed) uv_run(loop, UV_RUN_ONCE);
  uv_run(loop, UV_RUN_NOWAIT);
}

int main(int argc, char **argv) {
  static struct checkpoint ck;
  char err[512] = "";
  if (argc == 2 && strcmp(argv[1], "--example-config") == 0)
    return cfg_write_example(&checkpoint_table, stdout) == 0 ? 0 : 1;
  int rc = load_config(&ck, argc, argv);
  if (rc != 0) {
    cfg_free(&checkpoint_table, &ck.cfg);
    return rc < 0 ? 2 : 0;
  }
  rc = daemon_new("stoker-checkpoint", &ck.cfg.daemon, err, sizeof(err), &ck.daemon);
  if (rc) {
    fprintf(stderr, "stoker-checkpoint: %s\n", err);
    cfg_free(&checkpoint_table, &ck.cfg);
    return 1;
  }
  cfg_log_effective(&checkpoint_table, &ck.cfg);
  rc = start_reporter(&ck);
  if (!rc) rc = open_core(&ck);
  if (!rc) rc = register_adapter(&ck);
  if (!rc) {
    daemon_on_drain(ck.daemon, drain_service, &ck);
    daemon_on_reload(ck.daemon, reload_reporter, &ck);
    rc = daemon_start(ck.daemon, stop_service, &ck, err, sizeof(err));
    if (rc) log_error("startup", "%s", err);
  }
  if (!rc) rc = become_replica(&ck);
  if (!rc) daemon_run(ck.daemon);
  ckpt_rpc_free(ck.adapter);
  close_after_failure(&ck);
  daemon_free(ck.daemon);
  ckpt_report_free(ck.report, 5000);
  free(ck.token);
  cfg_free(&checkpoint_table, &ck.cfg);
  return rc ? 1 : 0;
}
