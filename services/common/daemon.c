/*
 * The run sequence every daemon shares (see daemon.h): logging, loop,
 * metrics endpoint, RPC server with TLS/token options, ready file written
 * atomically once serving, and a graceful stop on SIGTERM/SIGINT.
 */
#include "daemon.h"

#include "fd_guard.h"

#include "log.h"
#include "stk_config.h"
#include "stk_error.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

const char *const daemon_log_levels[] = {"debug", "info", "warn", "error", "off", NULL};

struct daemon {
  void *owned; /* Freed last, in daemon_free (daemon_own). */
  const char *name;
  const struct daemon_options *opts;
  uv_loop_t loop;
  struct metrics *metrics;
  struct metrics_http *http;
  struct rpc_server *rpc;
  struct fd_guard *fds; /* health from descriptor headroom */
  uv_signal_t sigterm, sigint, sighup;
  daemon_stop_fn on_stop;
  void *stop_arg;
  daemon_drain_fn on_drain;
  void *drain_arg;
  daemon_busy_fn busy; /* daemon_hold_while */
  void *busy_arg;
  uv_timer_t hold_timer;
  uint64_t hold_start_ms;
  daemon_reload_fn on_reload;
  void *reload_arg;
  struct metric_gauge *reload_ok; /* stoker_reload_last_successful */
  bool stopping;
  char bound[128];
};

static const char *nonempty(const char *s) {
  return (s && *s) ? s : NULL;
}

/* stoker_build_info{version,service} 1: the version every scrape carries,
 * so a dashboard can tell which build answers. The service label is the
 * daemon's name without "stoker-". */
static void publish_build_info(struct daemon *d) {
  const char *service = strncmp(d->name, "stoker-", 7) == 0 ? d->name + 7 : d->name;
  char labels[256];
  snprintf(labels, sizeof(labels), "version=\"%s\",service=\"%s\"", STK_VERSION, service);
  metric_gauge_set(metrics_gauge(d->metrics, "stoker_build_info",
                                 "Always 1; the labels name the build and the service.", labels),
                   1);
}

/* Raises the soft limit on open descriptors to the hard one: every client
 * connection, dataset map and RocksDB file costs one, and a distribution's
 * default soft limit (1024) is far below what a busy daemon needs. */
static void raise_nofile_limit(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max) return;
  rlim_t was = rl.rlim_cur;
  rl.rlim_cur = rl.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
    log_info("nofile_raised", "from=%llu to=%llu", (unsigned long long)was,
             (unsigned long long)rl.rlim_cur);
}

int daemon_new(const char *name, const struct daemon_options *opts, char *err, size_t err_len,
               struct daemon **ret_daemon) {
  log_init((enum log_level)opts->log_level, opts->log_json);
  rpc_log_to_daemon_log();
  log_info("start", "daemon=%s version=%s pid=%d", name, STK_VERSION, (int)getpid());
  raise_nofile_limit();
  struct daemon *d = calloc(1, sizeof(*d));
  if (!d) return STK_ENOMEM;
  d->name = name;
  d->opts = opts;
  uv_loop_init(&d->loop);
  d->metrics = metrics_new();
  publish_build_info(d);
  d->reload_ok = metrics_gauge(d->metrics, "stoker_reload_last_successful",
                               "1 when the last SIGHUP reloaded every file (or none came), 0 "
                               "when some file did not load.",
                               NULL);
  metric_gauge_set(d->reload_ok, 1);
  metrics_add_collector(d->metrics, metrics_process_collect, NULL);
  struct rpc_server_opts ro = {
      .listen = opts->listen,
      .tls_cert_file = nonempty(opts->tls_cert),
      .tls_key_file = nonempty(opts->tls_key),
      .tls_client_ca_file = nonempty(opts->tls_client_ca),
      .token_file = nonempty(opts->token_file),
      .max_recv_bytes = opts->max_message_bytes,
      .max_send_bytes = opts->max_message_bytes,
      .max_connections = opts->max_connections,
      .max_connection_age_ms = opts->max_connection_age_ms,
      .max_connection_age_grace_ms = opts->max_connection_age_grace_ms,
      .metrics = d->metrics,
  };
  int rc = rpc_server_new(&d->loop, &ro, &d->rpc);
  if (rc) {
    snprintf(err, err_len, "%s", stk_detail()[0] ? stk_detail() : stk_strerror(rc));
    daemon_free(d);
    return rc;
  }
  *ret_daemon = d;
  return 0;
}

uv_loop_t *daemon_loop(struct daemon *d) {
  return &d->loop;
}

struct rpc_server *daemon_rpc(struct daemon *d) {
  return d->rpc;
}

struct metrics *daemon_metrics(struct daemon *d) {
  return d->metrics;
}

/* Writes the bound address to a temporary file and renames it into place,
 * so a reader never sees a partial address. */
static int write_ready_file(const char *path, const char *addr, char *err, size_t err_len) {
  char tmp[4096];
  snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f || fprintf(f, "%s\n", addr) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
    snprintf(err, err_len, "cannot write ready file %s: %s", path, strerror(errno));
    return STK_EIO;
  }
  return 0;
}

static void rpc_drained(void *arg) {
  struct daemon *d = arg;
  log_info("shutdown", "calls drained; closing the service");
  d->on_stop(d, d->stop_arg);
}

/* The reload series, as Prometheus's own: an alert can tell that a SIGHUP
 * left some file unloaded. */
static void publish_reload(struct daemon *d, bool ok) {
  metric_counter_add(metrics_counter(d->metrics, "stoker_reloads_total",
                                     "SIGHUP reloads, by result (failure: some file did not load "
                                     "and what it held stays as it was).",
                                     ok ? "result=\"success\"" : "result=\"failure\""),
                     1);
  metric_gauge_set(d->reload_ok, ok ? 1 : 0);
}

/* SIGHUP: re-read what an operator rotates without a restart: the token
 * file, the TLS certificate, key and client CA, then the service's own
 * files. Each is kept as it was when its files do not load (logged as an
 * error naming the file). */
static void on_sighup(uv_signal_t *h, int signum) {
  struct daemon *d = h->data;
  (void)signum;
  if (d->stopping) return;
  stk_clear_detail();
  int token_rc = rpc_server_reload_token(d->rpc);
  if (token_rc)
    log_error("reload", "signal=SIGHUP token file not reloaded, the old token stays: %s",
              stk_detail()[0] ? stk_detail() : stk_strerror(token_rc));
  else
    log_info("reload", "signal=SIGHUP token=%s",
             nonempty(d->opts->token_file) ? "reloaded" : "off");
  stk_clear_detail();
  int tls_rc = rpc_server_reload_tls(d->rpc);
  if (tls_rc)
    log_error("reload", "signal=SIGHUP TLS certificates not reloaded, the old ones stay in use: %s",
              stk_detail()[0] ? stk_detail() : stk_strerror(tls_rc));
  else
    log_info("reload", "signal=SIGHUP tls=%s", nonempty(d->opts->tls_cert) ? "reloaded" : "off");
  int service_rc = d->on_reload ? d->on_reload(d, d->reload_arg) : 0;
  publish_reload(d, !token_rc && !tls_rc && !service_rc);
}

static void hold_tick(uv_timer_t *t);

static void on_signal(uv_signal_t *h, int signum) {
  struct daemon *d = h->data;
  if (d->stopping) return;
  d->stopping = true;
  log_info("shutdown", "signal=%s grace_ms=%lld", signum == SIGTERM ? "SIGTERM" : "SIGINT",
           (long long)d->opts->shutdown_grace_ms);
  uv_signal_stop(&d->sigterm);
  uv_signal_stop(&d->sigint);
  uv_signal_stop(&d->sighup);
  fd_guard_stop(d->fds);
  d->fds = NULL;
  metrics_http_stop(d->http);
  d->http = NULL;
  if (d->on_drain) d->on_drain(d, d->drain_arg);
  if (d->busy && d->busy(d->busy_arg)) {
    rpc_server_set_serving_all(d->rpc, false);
    d->hold_start_ms = uv_now(&d->loop);
    uv_timer_init(&d->loop, &d->hold_timer);
    d->hold_timer.data = d;
    uv_timer_start(&d->hold_timer, hold_tick, 100, 100);
    log_info("shutdown", "finishing the service's work before the calls stop");
    return;
  }
  rpc_server_shutdown(d->rpc, d->opts->shutdown_grace_ms, rpc_drained, d);
}

/* While held: the service's work ended, or three quarters of the grace
 * did; the server drains within the rest. */
static void hold_tick(uv_timer_t *t) {
  struct daemon *d = t->data;
  uint64_t grace = (uint64_t)d->opts->shutdown_grace_ms, used = uv_now(&d->loop) - d->hold_start_ms;
  bool busy = d->busy(d->busy_arg);
  if (busy && used < grace / 4 * 3) return;
  uv_timer_stop(t);
  uv_close((uv_handle_t *)t, NULL);
  if (busy) log_warn("shutdown", "grace running out: stopping with the service's work unfinished");
  rpc_server_shutdown(d->rpc, (int64_t)(grace > used ? grace - used : 0), rpc_drained, d);
}

void daemon_hold_while(struct daemon *d, daemon_busy_fn busy, void *arg) {
  d->busy = busy;
  d->busy_arg = arg;
}

const char *daemon_bound(const struct daemon *d) {
  return d->bound;
}

void daemon_on_drain(struct daemon *d, daemon_drain_fn fn, void *arg) {
  d->on_drain = fn;
  d->drain_arg = arg;
}

void daemon_on_reload(struct daemon *d, daemon_reload_fn fn, void *arg) {
  d->on_reload = fn;
  d->reload_arg = arg;
}

/* True for an address only this host can reach: 127.x, [::1], localhost. */
static bool loopback_only(const char *addr) {
  return strncmp(addr, "127.", 4) == 0 || strncmp(addr, "[::1]", 5) == 0 ||
         strncmp(addr, "localhost:", 10) == 0;
}

/* A token sent without TLS crosses the network in clear; a daemon open
 * beyond loopback with neither serves anyone who can reach it. */
static void warn_insecure(const struct daemon *d) {
  bool tls = nonempty(d->opts->tls_cert), token = nonempty(d->opts->token_file);
  if (token && !tls)
    log_warn("insecure", "a bearer token is required but TLS is off: the token crosses the "
                         "network in clear (set --tls-cert and --tls-key)");
  if (!tls && !token && !loopback_only(d->bound))
    log_warn("insecure",
             "listening on %s beyond loopback with neither TLS nor a token: anyone "
             "who reaches the port may call every method",
             d->bound);
}

int daemon_start(struct daemon *d, daemon_stop_fn on_stop, void *arg, char *err, size_t err_len) {
  d->on_stop = on_stop;
  d->stop_arg = arg;
  int rc = rpc_server_start(d->rpc, d->bound, sizeof(d->bound));
  if (rc) {
    snprintf(err, err_len, "cannot listen on %s: %s", d->opts->listen,
             stk_detail()[0] ? stk_detail() : stk_strerror(rc));
    return rc;
  }
  if (nonempty(d->opts->metrics_listen)) {
    char mbound[128];
    rc = metrics_http_start(&d->loop, d->metrics, d->opts->metrics_listen, mbound, sizeof(mbound),
                            &d->http);
    if (rc) {
      snprintf(err, err_len, "cannot serve metrics on %s: %s", d->opts->metrics_listen,
               stk_detail()[0] ? stk_detail() : stk_strerror(rc));
      return rc;
    }
    log_info("metrics", "listen=%s", mbound);
  }
  if ((rc = fd_guard_start(&d->loop, d->rpc, &d->fds)) != 0) {
    snprintf(err, err_len, "%s", stk_strerror(rc));
    return rc;
  }
  uv_signal_init(&d->loop, &d->sigterm);
  uv_signal_init(&d->loop, &d->sigint);
  uv_signal_init(&d->loop, &d->sighup);
  d->sigterm.data = d->sigint.data = d->sighup.data = d;
  uv_signal_start(&d->sigterm, on_signal, SIGTERM);
  uv_signal_start(&d->sigint, on_signal, SIGINT);
  uv_signal_start(&d->sighup, on_sighup, SIGHUP);
  signal(SIGPIPE, SIG_IGN);
  if (nonempty(d->opts->ready_file)) {
    rc = write_ready_file(d->opts->ready_file, d->bound, err, err_len);
    if (rc) return rc;
  }
  struct rpc_accept_stats conns;
  rpc_server_accept_stats(d->rpc, &conns);
  log_info("serving",
           "daemon=%s listen=%s tls=%s token=%s max_connections=%zu max_connection_age_ms=%lld "
           "max_connection_age_grace_ms=%lld",
           d->name, d->bound, nonempty(d->opts->tls_cert) ? "on" : "off",
           nonempty(d->opts->token_file) ? "on" : "off", conns.max,
           (long long)d->opts->max_connection_age_ms,
           (long long)d->opts->max_connection_age_grace_ms);
  warn_insecure(d);
  return 0;
}

static void close_handle(uv_handle_t *h, void *arg) {
  if (!uv_is_closing(h)) uv_close(h, NULL);
}

void daemon_service_closed(struct daemon *d) {
  uv_close((uv_handle_t *)&d->sigterm, NULL);
  uv_close((uv_handle_t *)&d->sigint, NULL);
  uv_close((uv_handle_t *)&d->sighup, NULL);
}

int daemon_run(struct daemon *d) {
  uv_run(&d->loop, UV_RUN_DEFAULT);
  log_info("shutdown", "daemon=%s stopped", d->name);
  return 0;
}

void daemon_free(struct daemon *d) {
  if (!d) return;
  fd_guard_stop(d->fds);
  metrics_http_stop(d->http);
  rpc_server_free(d->rpc);
  uv_walk(&d->loop, close_handle, NULL);
  uv_run(&d->loop, UV_RUN_DEFAULT);
  uv_loop_close(&d->loop);
  metrics_free(d->metrics);
  free(d->owned);
  free(d);
}

void daemon_own(struct daemon *d, void *block) {
  free(d->owned);
  d->owned = block;
}
