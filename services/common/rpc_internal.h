/*
 * rpc_internal: what the rpc_*.c files share and users of rpc.h never see.
 * The server is split by concern (lifecycle in rpc_server.c, one call's
 * batches in rpc_call.c, health in rpc_health.c, the server's TLS files in
 * rpc_server_tls.c, tokens and client TLS in rpc_security.c, the loop driving the completion queue
 * in rpc_loop.c, the listeners' accept in rpc_accept.c); this header is the seam between them.
 * Tests may also use the raw client call at the end.
 */
#ifndef STK_RPC_INTERNAL_H
#define STK_RPC_INTERNAL_H

#include "rpc.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <stddef.h>

struct metrics;
struct metric_counter;
struct metric_gauge;
struct metric_histogram;

#define RPC_CONTAINER(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

#define RPC_DEFAULT_MAX_BYTES (64u << 20)
#define RPC_N_CODES           17

struct rpc_pump;

/* A completion-queue tag: fn runs (on the loop for servers, on the client
 * thread for clients) when the batch started with it completes. next and ok
 * are the pump's queue links; a tag is in flight at most once at a time.
 * A tag of a call on one of the pump's parked-call queues (callback queues)
 * is handed to gRPC as its functor, the first member: gRPC runs it on one
 * of its threads, and it posts the tag to via's loop. */
struct rpc_tag {
  grpc_completion_queue_functor functor; /* First: the tag is the functor. */
  struct rpc_pump *via;                  /* Set for parked-call queues' tags. */
  void (*fn)(struct rpc_tag *tag, bool ok);
  struct rpc_tag *next;
  bool ok;
};

/* ------------------------------------------------------------- rpc_loop.c */

/* The loop thread reading cq and running each completed tag's fn, and
 * the parked-call queues whose completions it is posted. */

/* On the loop thread: from now on the loop drives cq (and the watcher
 * thread wakes it for libuv's events). */
int rpc_pump_start(uv_loop_t *loop, grpc_completion_queue *cq, struct rpc_pump **ret_pump);
/* Any thread: runs tag->fn(tag, ok) on the loop soon (deferred callbacks). */
void rpc_pump_post(struct rpc_pump *p, struct rpc_tag *tag, bool ok);
/* Loop thread: the queue to bind the next parked call to (one of several,
 * in turn), and the setup of a tag whose batch runs on such a call. */
grpc_completion_queue *rpc_pump_parked_cq(struct rpc_pump *p);
void rpc_pump_parked_tag(struct rpc_pump *p, struct rpc_tag *tag);
/* On the loop, once nothing is outstanding on cq or the parked-call
 * queues: joins the watcher, shuts every queue down (cq drained), destroys
 * them, closes the loop handles, then runs closed(arg) from the last close
 * callback and frees the pump. */
void rpc_pump_stop(struct rpc_pump *p, void (*closed)(void *arg), void *arg);

/* ----------------------------------------------------------- rpc_server.c */

/* One registered method. */
struct rpc_method {
  struct rpc_server *srv;
  char *path; /* "/pkg.Svc/Method" */
  enum rpc_kind kind;
  rpc_handler_fn handler;
  void *svc_data;
  const ProtobufCMessageDescriptor *in_desc;
  const ProtobufCMessageDescriptor *out_desc;
  bool public_;      /* Served without a bearer token (health). */
  bool parks;        /* Its calls are bound to the pump's parked-call queues. */
  bool checks_scope; /* Its handler checks a scoped token itself (rpc_scope.c). */
  void *grpc_handle;
  /* Prometheus labels in go-grpc-prometheus's names:
   * grpc_type="unary",grpc_service="pkg.Svc",grpc_method="Method". */
  char *labels;
  struct metric_counter *started;              /* grpc_server_started_total */
  struct metric_histogram *latency;            /* grpc_server_handling_seconds */
  struct metric_gauge *in_flight;              /* grpc_server_in_flight */
  struct metric_counter *by_code[RPC_N_CODES]; /* grpc_server_handled_total, on first use. */
};

enum rpc_server_state {
  RPC_SRV_NEW,      /* Created; services being added. */
  RPC_SRV_RUNNING,  /* Started; calls accepted. */
  RPC_SRV_DRAINING, /* Shutdown asked; waiting for calls and gRPC. */
  RPC_SRV_CLOSING,  /* gRPC gone; loop handles closing. */
  RPC_SRV_DONE,     /* done() ran; only rpc_server_free is left. */
};

struct rpc_health;

struct rpc_server {
  uv_loop_t *loop;
  char *listen;
  grpc_server_credentials *creds;
  struct rpc_server_tls *tls; /* NULL: plaintext. */
  struct rpc_tokens *tokens;  /* NULL: no authentication. */
  char *token_file; /* Where it came from (re-read by rpc_server_reload_token), or NULL. */
  size_t max_recv_bytes;
  size_t max_send_bytes;
  size_t max_connections;    /* 0: rpc_accept_default_max() at start. */
  int64_t max_age_ms;        /* GRPC_ARG_MAX_CONNECTION_AGE_MS; 0: none. */
  int64_t max_age_grace_ms;  /* GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS; 0: none. */
  struct rpc_accept *accept; /* While running: the guard of gRPC's listeners. */
  struct metrics *metrics;
  struct rpc_method **methods;
  size_t n_methods;
  struct rpc_health *health;
  enum rpc_server_state state;
  grpc_server *server;
  grpc_completion_queue *cq;
  struct rpc_pump *pump;
  size_t n_calls; /* Calls not yet freed, unknown-method answers included. */
  /* Call accounting, for shutdown: a call counts from arrival to free.
   * rpc_server_new sets these; rpc_call.c, below the server, calls them. */
  void (*call_opened)(struct rpc_server *s);
  void (*call_closed)(struct rpc_server *s);
  size_t n_armed; /* Requests armed with gRPC. */
  bool notified;  /* The shutdown tag arrived. */
  struct rpc_tag shutdown_tag;
  uv_timer_t *grace_timer;
  int closing_handles;
  void (*done)(void *arg);
  void *done_arg;
};

/* ---------------------------------------------------------- rpc_methods.c */

/* Checks defs against desc (rpc_server_add_service's contract) and writes
 * to ret_rows[i] (desc->n_methods entries) the row of desc->methods[i].
 * STK_EINVAL with a detail naming the method. */
int rpc_methods_check(const ProtobufCServiceDescriptor *desc, const struct rpc_method_def *defs,
                      size_t n_defs, const struct rpc_method_def **ret_rows);

/* ----------------------------------------------------------- rpc_accept.c */

/* The guard of one server's listeners (see rpc_accept.c). */
struct rpc_accept;

/* Guards the listening sockets of this process bound to port (gRPC's,
 * after grpc_server_add_http2_port, before grpc_server_start): at most
 * max_connections (0: rpc_accept_default_max()) open at once; running out
 * of descriptors never stops them. Series go to m (may be NULL).
 * Errors: STK_ENOMEM. */
int rpc_accept_new(int port, size_t max_connections, struct metrics *m,
                   struct rpc_accept **ret_accept);
/* The soft RLIMIT_NOFILE less a reserve (a quarter, at least 64, at most
 * 1024) for everything else a daemon opens. */
size_t rpc_accept_default_max(void);
void rpc_accept_stats(struct rpc_accept *a, struct rpc_accept_stats *ret_stats);
/* Stops guarding (before gRPC closes the listeners). Accepts NULL. */
void rpc_accept_free(struct rpc_accept *a);

/* ------------------------------------------------------------- rpc_call.c */

/* Takes over a call that arrived for m (md's contents and payload become
 * the call's) and runs auth, unpacking and the handler. */
void rpc_call_start(struct rpc_method *m, grpc_call *call, gpr_timespec deadline,
                    grpc_metadata_array *md, grpc_byte_buffer *payload);

/* Packs msg into a byte buffer; NULL when out of memory. */
grpc_byte_buffer *rpc_pack(const ProtobufCMessage *msg);
/* msg packed, then field `field` (length-delimited) borrowing data: see
 * rpc_send_borrowed. NULL (nothing released) for a bad field number. */
grpc_byte_buffer *rpc_pack_borrowed(const ProtobufCMessage *msg, uint32_t field, const void *data,
                                    size_t len, rpc_release_fn release, void *release_arg);
/* Unpacks a byte buffer; NULL when malformed or when a string field (at
 * any depth) holds a NUL byte, which C would silently cut short. why (may
 * be NULL) then names the field; it is "" for other malformations. */
ProtobufCMessage *rpc_unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                             char *why, size_t why_len);
/* The same for what a server receives (a request, a client stream's
 * messages): also NULL when a string field is not UTF-8 (proto3's rule,
 * which protobuf-c does not check); a client reading a reply keeps to
 * rpc_unpack, so that it can still show what a server stored earlier. */
ProtobufCMessage *rpc_unpack_request(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                                     char *why, size_t why_len);
/* Copies a grpc slice into a C string buffer, truncating. */
void rpc_slice_copy(grpc_slice slice, char *buf, size_t len);

/* ----------------------------------------------------------- rpc_health.c */

/* Makes s->health (serving ""); the server then registers the service
 * with rpc_health_rows' rows and s->health as their data. */
int rpc_health_new(struct rpc_server *s);
/* The Health service's method rows (*ret_n of them). */
const struct rpc_method_def *rpc_health_rows(size_t *ret_n);
void rpc_health_free(struct rpc_health *h);
/* Adds a service name, SERVING, if not known yet. */
int rpc_health_add(struct rpc_health *h, const char *service);
/* Shutdown: everything NOT_SERVING, Watch streams end after telling so. */
void rpc_health_shutdown(struct rpc_health *h);

/* ------------------------------------------------------------ rpc_scope.c */

/* The job a request names: its `job` field, or its spec's `job` or `name`
 * ("" when set to nothing); NULL when the request has no such field. */
const char *rpc_scope_request_job(const ProtobufCMessage *req);
/* Whether a token of scope (a job-name prefix; NULL: every job) covers job. */
bool rpc_scope_covers(const char *scope, const char *job);
/* A shallow copy of resp whose repeated message fields hold only the
 * entries (each judged by rpc_scope_request_job) that scope covers; NULL
 * when out of memory. It borrows resp's entries: free it, before resp,
 * with rpc_scope_view_free. */
ProtobufCMessage *rpc_scope_view(const char *scope, const ProtobufCMessage *resp);
void rpc_scope_view_free(ProtobufCMessage *view);

/* --------------------------------------------------------- rpc_security.c */

/* Reads a whole small file (at most 1 MiB) into a NUL-terminated malloc'd
 * string; ret_len may be NULL. STK_EINVAL with a detail naming the file. */
int rpc_security_read_file(const char *path, char **ret_text, size_t *ret_len);
/* The server's tokens (rpc.h says the file's format). */
struct rpc_token {
  char *token;
  char *scope; /* Job-name prefix the token covers; NULL: every job (an operator's). */
  char *grants[RPC_GRANT_N]; /* Its line's KEY=LIST words as written; NULL: not set. */
  size_t line;               /* In the file, for messages. */
};
struct rpc_tokens {
  struct rpc_token *v;
  size_t n;
};
/* Reads and checks the whole file; on any bad line nothing is loaded and
 * the detail names the line. */
int rpc_tokens_load(const char *path, struct rpc_tokens **ret_tokens);
void rpc_tokens_free(struct rpc_tokens *t);
/* The line whose token the call's authorization metadata carries, or NULL
 * (none, malformed, or unknown). Constant time per line, every line. */
const struct rpc_token *rpc_tokens_match(const struct rpc_tokens *t, const grpc_metadata_array *md);
/* The tenant of job: the longest team prefix in t covering it; NULL when
 * none does (operators' jobs; t NULL: a server without tokens). */
const char *rpc_tokens_tenant(const struct rpc_tokens *t, const char *job);
/* TLS or insecure channel credentials from the PEM files in opts. */
int rpc_security_channel_creds(const struct rpc_client_opts *opts,
                               grpc_channel_credentials **ret_creds);

/* -------------------------------------------------------- rpc_tls_check.c */

/* Checks PEM texts with OpenSSL (paths only name them in the detail):
 * every certificate of cert_pem and ca_pem parses, key_pem parses and
 * matches cert_pem's first certificate. cert_pem and key_pem both or
 * neither; ca_pem may be NULL. STK_EINVAL with a detail naming the file
 * and the reason. Leaves this thread's OpenSSL error queue empty. */
int rpc_tls_check(const char *cert_path, const char *cert_pem, const char *key_path,
                  const char *key_pem, const char *ca_path, const char *ca_pem);

/* ------------------------------------------------------- rpc_server_tls.c */

/* The server's TLS files and what gRPC's certificate-config fetcher hands
 * out (the threading is told in rpc_server_tls.c). */
struct rpc_server_tls;

/* Reads and checks opts' certificate, key and client CA (tls_cert_file and
 * tls_key_file set). STK_EINVAL with a detail naming the file and why. */
int rpc_server_tls_new(const struct rpc_server_opts *opts, struct rpc_server_tls **ret_tls);
/* Server credentials that ask t for their certificates before each
 * handshake (the first time at bind). t must outlive them and the server. */
int rpc_server_tls_creds(struct rpc_server_tls *t, grpc_server_credentials **ret_creds);
/* Reads and checks the files again; new handshakes use them. On an error
 * (detail as rpc_server_tls_new) the certificates in use stay. Loop thread. */
int rpc_server_tls_reload(struct rpc_server_tls *t);
/* After the server and its credentials are gone. Accepts NULL. */
void rpc_server_tls_free(struct rpc_server_tls *t);

/* ------------------------------------------------------------ rpc_client.c */

/* Unary call with an arbitrary request payload (tests of malformed input).
 * Returns as rpc_client_unary does. */
int rpc_client_unary_raw(struct rpc_client *c, const char *method, const void *req_bytes,
                         size_t req_len, const ProtobufCMessageDescriptor *resp_desc,
                         int64_t timeout_ms, ProtobufCMessage **ret_resp,
                         struct rpc_status *ret_st);

/* Internals shared by rpc_client.c and rpc_client_cstream.c. */
grpc_call *rpc_client_create_call(struct rpc_client *c, const char *method, int64_t timeout_ms);
/* The initial metadata every call sends (the bearer token, if any). */
size_t rpc_client_initial_md(struct rpc_client *c, grpc_metadata **ret_md);
void rpc_status_set(struct rpc_status *st, int code, grpc_slice details);

#endif
