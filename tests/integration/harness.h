/*
 * harness: runs the real stoker-coordinator binary for integration tests.
 * A test starts its own daemon on 127.0.0.1 port 0 with a fresh temporary
 * data directory, waits for the ready file, talks to it over loopback, and
 * kills it (SIGKILL) or stops it (SIGTERM) at the end. A killed daemon can
 * be restarted on the same data directory and the same port, as an operator
 * would after a crash.
 *
 * The binary's path comes from the test's command line (argv[1], given by
 * meson) or from $STOKER_COORDINATOR; harness_init() records it.
 *
 * Threads: a harness_daemon is used from one thread (the test's).
 */
#ifndef STK_HARNESS_H
#define STK_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "rpc.h"
#include "stoker/v1/coordinator.pb-c.h"
#include "stoker_admin.h"

#define HARNESS_MAX_ARGS 32

struct harness_daemon {
  pid_t pid;                    /* 0 when not running. */
  char root[256];               /* Temporary directory owning everything below. */
  char data_dir[300];           /* RocksDB state, kept across restarts. */
  char ready_file[300];         /* Rewritten by each start. */
  char addr[128];               /* "127.0.0.1:PORT" once ready; kept for restarts. */
  char *args[HARNESS_MAX_ARGS]; /* Extra daemon arguments (owned copies). */
  size_t n_args;
};

/* Records the daemon binary (argv[1] when present, else
 * $STOKER_COORDINATOR) and further positional arguments for the test.
 * Returns 0, or -1 with a message on stderr when no binary is known. */
int harness_init(int argc, char **argv);
const char *harness_binary(void);
/* Positional argument i (0 = the binary) of the test; NULL if absent. */
const char *harness_arg(int i);

/* mkdtemp under $TMPDIR (or /tmp); ret gets the path. */
int harness_tmpdir_new(char *ret_path, size_t len);
/* The same under /dev/shm (tmpfs, as shared-memory staging wants), or
 * under $TMPDIR where /dev/shm is missing. */
int harness_shm_tmpdir_new(char *ret_path, size_t len);
/* The directory /dev/shm/PREFIX* (a daemon's default "auto" shared-memory
 * directory, "stoker-ckpt-" or "stoker-dl-") whose owner record names
 * data_dir; false when there is none. */
bool harness_shm_auto_dir(const char *prefix, const char *data_dir, char *ret_dir, size_t len);
/* rm -rf of a directory tree; accepts a missing one. */
void harness_tmpdir_remove(const char *path);

/* Creates a temp root, starts the daemon with --listen 127.0.0.1:0, the
 * data dir, the ready file, --log-level warn and the NULL-terminated
 * extra args, and waits (up to 30 s) for it to be ready. Fails early when
 * the process exits. Returns NULL on failure (with a message on stderr). */
struct harness_daemon *harness_daemon_start(const char *const *extra_args);

/* The same with "--metrics-listen 127.0.0.1:PORT" first, PORT free on
 * loopback when picked (*ret_port). Another process may take the port
 * before the daemon binds it: the start is then retried on a new one. */
struct harness_daemon *harness_daemon_start_metrics(const char *const *extra_args, int *ret_port);

/* Starts the daemon again on the same data dir and the same address. */
int harness_daemon_restart(struct harness_daemon *d);

/* SIGKILL and reap. No effect when not running. */
void harness_daemon_kill(struct harness_daemon *d);

/* SIGTERM, then waits up to timeout_ms for the exit. *ret_status is the
 * exit code (or 128 + signal when killed by one). STK_ETIMEDOUT (the
 * daemon is then killed) when it does not exit in time. */
int harness_daemon_term(struct harness_daemon *d, int64_t timeout_ms, int *ret_status);

/* True while the process has not exited (reaps it if it has). */
bool harness_daemon_alive(struct harness_daemon *d);

/* Kills the daemon if running, removes its temp root, frees. NULL ok. */
void harness_daemon_free(struct harness_daemon *d);

/* ---- client helpers ------------------------------------------------------ */

/* A libstoker-client on the daemon's address (plaintext, no token). */
struct stk_client *harness_client(const struct harness_daemon *d);
/* An rpc.h client on the daemon's address (plaintext, no token). */
struct rpc_client *harness_rpc(const struct harness_daemon *d);

/* Creates job name with the given bounds and short timings (heartbeat
 * interval_ms, 3 misses, last call last_call_ms). Returns 0 or STK_E*. */
int harness_create_job(struct stk_client *c, const char *name, uint32_t min_ranks,
                       uint32_t max_ranks, uint32_t interval_ms, uint32_t last_call_ms);

/* GetJob through the client; NULL when it fails. Free with
 * protobuf_c_message_free_unpacked(&job->base, NULL). */
Stoker__V1__Job *harness_get_job(struct stk_client *c, const char *name);

/* "/pkg.Svc/Method" for a method name of desc ("KvSet"), from the
 * descriptor; a name the .proto lacks stops the test (a typo, not a server
 * answering UNIMPLEMENTED). */
void harness_method_path(const ProtobufCServiceDescriptor *desc, const char *method, char *buf,
                         size_t len);

/* A unary Coordinator call ("KvSet": the method of stoker.v1.Coordinator,
 * or a full "/pkg.Svc/Method" path) with the rpc client and a 10 s
 * deadline. Returns the gRPC status code (RPC_OK, ...); the reply is
 * freed unless ret_resp is given; ret_msg (may be NULL) gets the message. */
int harness_call(struct rpc_client *rc, const char *method, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **ret_resp,
                 char *ret_msg, size_t msg_len);

/* GET path from 127.0.0.1:port over HTTP/1.0 (5 s receive timeout):
 * the whole response, status line and headers included (malloc'd), or
 * NULL when the connection fails. */
char *harness_http_get(int port, const char *path);

/* `promtool check metrics` over body (a /metrics page): 0 when it passes,
 * -1 when promtool is not on PATH, else its exit status or 1 when it
 * printed anything; what it printed goes to ret_out. */
int harness_promtool_check(const char *body, char *ret_out, size_t out_len);

/* Descriptors process pid has open (/proc/PID/fd), or -1. */
int harness_open_fds(pid_t pid);

/* A TCP connection to 127.0.0.1:port that says nothing; -1 if it fails. */
int harness_connect_idle(int port);

/* The whole server's health status over c (grpc.health.v1), or -1 when
 * the call fails. */
int harness_health(struct stk_client *c);

/* Polls harness_health every 100 ms until it answers want or timeout_ms
 * passed; returns the last answer. */
int harness_health_becomes(struct stk_client *c, int want, int64_t timeout_ms);

/* The value of one series ("name{labels}") on the /metrics page of
 * 127.0.0.1:port; -1 when the page has no such series or cannot be read. */
long long harness_metric(int port, const char *series);

int64_t harness_now_ms(void);
void harness_sleep_ms(int64_t ms);

#endif
