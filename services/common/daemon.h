/*
 * daemon: what every Stoker daemon does around its service, written once.
 * The options every daemon shares (listen address, data directory, ready
 * file, metrics, logging, TLS, token, message size, connection cap), and
 * the run sequence: init (loop, logging, metrics, RPC server) -> the
 * service registers its methods -> start (bind, metrics endpoint, ready
 * file, signal handlers) -> run the loop -> on SIGTERM or SIGINT: stop
 * accepting, let calls finish within the grace period, let the service
 * flush, exit 0. On SIGHUP the token file and the TLS files are read again
 * (daemon_on_reload: the service's own files too); what does not load is
 * logged and kept as it was.
 */
#ifndef STK_DAEMON_H
#define STK_DAEMON_H

#include "config.h"
#include "metrics.h"
#include "rpc.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

struct daemon_options {
  char *listen;         /* HOST:PORT for gRPC; port 0 picks one. */
  char *data_dir;       /* RocksDB and other state. */
  char *ready_file;     /* Gets the bound HOST:PORT once serving. */
  char *metrics_listen; /* HOST:PORT for GET /metrics; "" disables. */
  int log_level;        /* enum log_level */
  bool log_json;
  char *tls_cert;
  char *tls_key;
  char *tls_client_ca;
  char *token_file;
  uint64_t max_message_bytes;
  uint64_t max_connections;            /* gRPC connections open at once; 0: from RLIMIT_NOFILE. */
  int64_t max_connection_age_ms;       /* 0: connections live as long as clients keep them. */
  int64_t max_connection_age_grace_ms; /* 0: calls on an aged connection run to their end. */
  int64_t shutdown_grace_ms;
};

/* The shared option rows for a daemon whose config struct is `type` and
 * holds a struct daemon_options in member `member`. default_listen is the
 * daemon's usual address ("127.0.0.1:7070"). */
#define DAEMON_OPTION_ROWS(type, member, default_listen, default_data_dir)                         \
  {"listen",                                                                                       \
   FLAG_STRING,                                                                                    \
   offsetof(type, member.listen),                                                                  \
   default_listen,                                                                                 \
   0,                                                                                              \
   0,                                                                                              \
   NULL,                                                                                           \
   "gRPC address HOST:PORT to serve on; port 0 picks a free port.",                                \
   0},                                                                                             \
      {"data-dir",                                                                                 \
       FLAG_STRING,                                                                                \
       offsetof(type, member.data_dir),                                                            \
       default_data_dir,                                                                           \
       0,                                                                                          \
       0,                                                                                          \
       NULL,                                                                                       \
       "Directory of the daemon's state (RocksDB).",                                               \
       0},                                                                                         \
      {"ready-file",                                                                               \
       FLAG_STRING,                                                                                \
       offsetof(type, member.ready_file),                                                          \
       "",                                                                                         \
       0,                                                                                          \
       0,                                                                                          \
       NULL,                                                                                       \
       "When set, the bound HOST:PORT is written here once the daemon is serving.",                \
       0},                                                                                         \
      {"metrics-listen",                                                                           \
       FLAG_STRING,                                                                                \
       offsetof(type, member.metrics_listen),                                                      \
       "",                                                                                         \
       0,                                                                                          \
       0,                                                                                          \
       NULL,                                                                                       \
       "HOST:PORT serving Prometheus metrics at /metrics; empty disables it.",                     \
       0},                                                                                         \
      {"log-level", FLAG_ENUM,         offsetof(type, member.log_level), "info", 0,                \
       0,           daemon_log_levels, "Least severe level logged.",     0},                       \
      {"log-json", FLAG_BOOL, offsetof(type, member.log_json),         "false", 0,                 \
       0,          NULL,      "Log JSON lines instead of text lines.", 0},                         \
      {"tls-cert",                                                                                 \
       FLAG_STRING,                                                                                \
       offsetof(type, member.tls_cert),                                                            \
       "",                                                                                         \
       0,                                                                                          \
       0,                                                                                          \
       NULL,                                                                                       \
       "PEM server certificate; set with tls-key to serve TLS. Re-read on SIGHUP.",                \
       0},                                                                                         \
      {"tls-key",                                                                                  \
       FLAG_STRING,                                                                                \
       offsetof(type, member.tls_key),                                                             \
       "",                                                                                         \
       0,                                                                                          \
       0,                                                                                          \
       NULL,                                                                                       \
       "PEM private key of tls-cert. Re-read on SIGHUP.",                                          \
       0},                                                                                         \
      {"tls-client-ca",                                                                            \
       FLAG_STRING,                                                                                \
       offsetof(type, member.tls_client_ca),                                                       \
       "",                                                                                         \
       0,                                                                                          \
       0,                                                                                          \
       NULL,                                                                                       \
       "PEM CA bundle; set: clients must present a certificate it signed (mutual TLS). "           \
       "Re-read on SIGHUP.",                                                                       \
       0},                                                                                         \
      {"token-file",                                                                               \
       FLAG_STRING,                                                                                \
       offsetof(type, member.token_file),                                                          \
       "",                                                                                         \
       0,                                                                                          \
       0,                                                                                          \
       NULL,                                                                                       \
       "File holding the bearer token every call must carry; empty: no token needed. "             \
       "Re-read on SIGHUP.",                                                                       \
       FLAG_SECRET},                                                                               \
      {"max-message-size", FLAG_SIZE, offsetof(type, member.max_message_bytes), "64MiB", 1024,     \
       (int64_t)1 << 31,   NULL,      "Largest request or reply message.",      0},                \
      {"max-connections",                                                                          \
       FLAG_UINT64,                                                                                \
       offsetof(type, member.max_connections),                                                     \
       "0",                                                                                        \
       0,                                                                                          \
       (int64_t)1 << 30,                                                                           \
       NULL,                                                                                       \
       "Most gRPC connections open at once; one more is closed as soon as accepted. 0: the "       \
       "descriptor limit less a reserve (a quarter of it, 64 to 1024).",                           \
       0},                                                                                         \
      {"max-connection-age",                                                                       \
       FLAG_DURATION,                                                                              \
       offsetof(type, member.max_connection_age_ms),                                               \
       "2m",                                                                                       \
       0,                                                                                          \
       86400000,                                                                                   \
       NULL,                                                                                       \
       "A client's connection is asked to go (HTTP/2 GOAWAY) after this long, +-10%: the client "  \
       "reconnects and resolves the name again, so replicas added behind one name get new "        \
       "calls and a server moved to a new address is found. 0: never.",                            \
       0},                                                                                         \
      {"max-connection-age-grace",                                                                 \
       FLAG_DURATION,                                                                              \
       offsetof(type, member.max_connection_age_grace_ms),                                         \
       "0",                                                                                        \
       0,                                                                                          \
       86400000,                                                                                   \
       NULL,                                                                                       \
       "How long calls still open on a connection past its max-connection-age may run before it "  \
       "is closed under them (a batch stream then resumes on a new one). 0: until they end.",      \
       0},                                                                                         \
  {                                                                                                \
    "shutdown-grace", FLAG_DURATION, offsetof(type, member.shutdown_grace_ms), "10s", 0, 3600000,  \
        NULL, "On SIGTERM, how long open calls may take before they are cancelled.", 0             \
  }

extern const char *const daemon_log_levels[];

struct daemon;

/* Called on the loop when SIGTERM/SIGINT arrived and every call finished;
 * the service closes its state and then calls daemon_service_closed(). */
typedef void (*daemon_stop_fn)(struct daemon *d, void *arg);

/* Sets up logging, the loop, metrics and the RPC server. Errors come with
 * a one-line message in err. */
int daemon_new(const char *name, const struct daemon_options *opts, char *err, size_t err_len,
               struct daemon **ret_daemon);
uv_loop_t *daemon_loop(struct daemon *d);
struct rpc_server *daemon_rpc(struct daemon *d);
struct metrics *daemon_metrics(struct daemon *d);

/* Called on the loop as soon as a stop signal arrives, before the RPC
 * server drains: the service answers its parked calls (UNAVAILABLE, so
 * clients retry elsewhere or after the restart) instead of letting them
 * hold the shutdown for the grace period. Optional; set before start. */
typedef void (*daemon_drain_fn)(struct daemon *d, void *arg);
void daemon_on_drain(struct daemon *d, daemon_drain_fn fn, void *arg);

/* Work the service finishes before its calls stop (a checkpoint replica
 * told to leave commits the attempts it owns): after the drain, busy(arg)
 * is asked every 100 ms on the loop, and the RPC server keeps serving
 * (health NOT_SERVING) until it answers false or three quarters of the
 * shutdown grace are over; the server then drains within what is left.
 * Optional; set before start. */
typedef bool (*daemon_busy_fn)(void *arg);
void daemon_hold_while(struct daemon *d, daemon_busy_fn busy, void *arg);

/* The bound HOST:PORT once started ("" before). */
const char *daemon_bound(const struct daemon *d);

/* Called on the loop on SIGHUP, after the shared files (token, TLS) were
 * re-read: the service re-reads its own (a client's CA, its token). It
 * logs what it could not load, keeps what it had then and returns an
 * error (counted in stoker_reloads_total{result="failure"}), else 0.
 * Optional; set before start. */
typedef int (*daemon_reload_fn)(struct daemon *d, void *arg);
void daemon_on_reload(struct daemon *d, daemon_reload_fn fn, void *arg);

/* Binds, starts the metrics endpoint and signal handlers, writes the ready
 * file. on_stop runs once a stop signal arrived and calls have drained. */
int daemon_start(struct daemon *d, daemon_stop_fn on_stop, void *arg, char *err, size_t err_len);

/* The service finished closing: the loop winds down and daemon_run returns. */
void daemon_service_closed(struct daemon *d);

/* Runs the loop until shutdown completes. Returns 0. */
int daemon_run(struct daemon *d);

/* Frees everything (after daemon_run returned, or after a failed start). */
void daemon_free(struct daemon *d);

/* d frees block (with free()) in daemon_free, after its server and metrics,
 * which may still call into it, are gone: for state that lives as long as the
 * daemon (daemon_usage's). One block; a second replaces and frees the first. */
void daemon_own(struct daemon *d, void *block);

#endif
