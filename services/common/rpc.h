/*
 * rpc: Stoker's one wrapper over gRPC C core, server and client.
 *
 * Server. A daemon registers services from their protobuf-c descriptors
 * with a table of handlers; one generic dispatcher accepts calls, unpacks
 * requests and runs the handler on the daemon's libuv loop thread (the loop
 * thread itself reads gRPC's completion queue, rpc_loop.c). A handler
 * finishes the call exactly once, now or later, with rpc_reply(),
 * rpc_fail() or (streams) rpc_finish(); the call is freed then, so its
 * pointer must not be used afterwards. Unknown methods answer
 * UNIMPLEMENTED, malformed payloads INVALID_ARGUMENT, oversized messages
 * RESOURCE_EXHAUSTED, missing or wrong bearer tokens UNAUTHENTICATED.
 * grpc.health.v1.Health (Check and Watch) is served by every server.
 *
 * Client. A client owns a channel and one completion thread; asynchronous
 * calls report on that thread. The blocking calls are thin shells over the
 * asynchronous ones.
 */
#ifndef STK_RPC_H
#define STK_RPC_H

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

struct metrics;

/* gRPC status codes (same values as grpc_status_code). */
enum rpc_code {
  RPC_OK = 0,
  RPC_CANCELLED = 1,
  RPC_UNKNOWN = 2,
  RPC_INVALID_ARGUMENT = 3,
  RPC_DEADLINE_EXCEEDED = 4,
  RPC_NOT_FOUND = 5,
  RPC_ALREADY_EXISTS = 6,
  RPC_PERMISSION_DENIED = 7,
  RPC_RESOURCE_EXHAUSTED = 8,
  RPC_FAILED_PRECONDITION = 9,
  RPC_ABORTED = 10,
  RPC_OUT_OF_RANGE = 11,
  RPC_UNIMPLEMENTED = 12,
  RPC_INTERNAL = 13,
  RPC_UNAVAILABLE = 14,
  RPC_DATA_LOSS = 15,
  RPC_UNAUTHENTICATED = 16,
};

/* "NOT_FOUND" for RPC_NOT_FOUND. */
const char *rpc_code_name(int code);

/* Sends gRPC core's log lines through log.h (event "grpc"; gRPC's ERROR
 * becomes warn). Call once, before the first server or client. */
void rpc_log_to_daemon_log(void);

/* ---------------------------------------------------------------- server */

struct rpc_server;
struct rpc_call;

struct rpc_server_opts {
  const char *listen;             /* "HOST:PORT"; port 0 picks a free one. */
  const char *tls_cert_file;      /* PEM; NULL serves plaintext. */
  const char *tls_key_file;       /* PEM; required with tls_cert_file. */
  const char *tls_client_ca_file; /* PEM; set: clients must present a cert. */
  const char *token_file;         /* Bearer tokens and their scopes (RPC_TOKENS_FILE_MAX_BYTES
                                     below says the format); NULL: no authentication. */
  size_t max_recv_bytes;          /* 0: 64 MiB. */
  size_t max_send_bytes;          /* 0: 64 MiB. */
  size_t max_connections;         /* 0: the soft descriptor limit less a reserve. */
  /* A connection gets GOAWAY after this long (gRPC adds +-10% jitter), so
   * clients reconnect and resolve the name again; 0: never. */
  int64_t max_connection_age_ms;
  /* Calls open on an aged connection may run this long before it closes
   * under them; 0: until they end. */
  int64_t max_connection_age_grace_ms;
  struct metrics *metrics; /* Per-method metrics; may be NULL. */
};

enum rpc_kind {
  RPC_UNARY,         /* One request, one reply. */
  RPC_SERVER_STREAM, /* One request, replies sent with rpc_send. */
  RPC_CLIENT_STREAM, /* Requests read with rpc_recv, one reply. */
  RPC_UNSERVED,      /* Not served here: callers get UNIMPLEMENTED. */
};

/* req is the unpacked request (NULL for client streaming); it stays valid
 * until the call finishes. Runs on the loop thread. */
typedef void (*rpc_handler_fn)(struct rpc_call *call, const ProtobufCMessage *req, void *svc_data);

/* One row of a service's method table. Rows are written with the RPC_*_ROW
 * macros below, never by hand. */
struct rpc_method_def {
  const char *name; /* The method's field in the generated service struct: "get_manifest". */
  enum rpc_kind kind;
  rpc_handler_fn handler; /* NULL for RPC_UNSERVED. */
  /* The handler usually answers much later (a rendezvous, a barrier, a
   * watch), so many such calls are open at once. Their completions go
   * through queues of their own (rpc_loop.c) so that each costs the same
   * however many are open; they reach the loop a thread hop later. Rows
   * say so with the *_PARKED_ROW macros. */
  bool parks;
  bool checks_scope; /* RPC_*_SCOPED_ROW: the handler checks a scoped token itself. */
};

/*
 * The method table. A service's table names every method of its protobuf-c
 * service by the method's field in the generated service struct
 * (Stoker__V1__Checkpoint_Service has `get_manifest` for rpc GetManifest),
 * so a row naming a method the .proto lacks does not compile, and the
 * method's name, path and metrics labels all come from the descriptor:
 *
 *   #define SVC Stoker__V1__Checkpoint_Service
 *   static const struct rpc_method_def methods[] = {
 *       RPC_UNARY_ROW(SVC, begin, handle_begin),
 *       RPC_CLIENT_STREAM_ROW(SVC, write, handle_write),
 *       RPC_UNSERVED_ROW(SVC, verify),   (answers UNIMPLEMENTED)
 *       ...
 *   };
 *
 * rpc_server_add_service() then checks the table against the descriptor:
 * every method has exactly one row, and no row names a method the
 * descriptor lacks (a table built by hand, say).
 */
#define RPC_METHOD_FIELD(svc_type, field) (&(#field)[0 * sizeof(((svc_type *)0)->field)])
#define RPC_ROW_(svc_type, field, k, fn, parked)                                                   \
  { .name = RPC_METHOD_FIELD(svc_type, field), .kind = k, .handler = fn, .parks = parked }
/* A method whose request names no job (a listing, a client stream, a call
 * naming an attempt): its handler checks a scoped caller itself with
 * rpc_call_check_job / rpc_call_denies_job. Without such a row, a scoped token
 * may call only methods whose request names the job (rpc_scope.c). */
#define RPC_SCOPED_ROW_(svc_type, field, k, fn)                                                    \
  { .name = RPC_METHOD_FIELD(svc_type, field), .kind = k, .handler = fn, .checks_scope = true }
#define RPC_UNARY_SCOPED_ROW(svc_type, field, fn) RPC_SCOPED_ROW_(svc_type, field, RPC_UNARY, fn)
#define RPC_CLIENT_STREAM_SCOPED_ROW(svc_type, field, fn)                                          \
  RPC_SCOPED_ROW_(svc_type, field, RPC_CLIENT_STREAM, fn)
#define RPC_UNARY_ROW(svc_type, field, fn) RPC_ROW_(svc_type, field, RPC_UNARY, fn, false)
#define RPC_SERVER_STREAM_ROW(svc_type, field, fn)                                                 \
  RPC_ROW_(svc_type, field, RPC_SERVER_STREAM, fn, false)
#define RPC_CLIENT_STREAM_ROW(svc_type, field, fn)                                                 \
  RPC_ROW_(svc_type, field, RPC_CLIENT_STREAM, fn, false)
#define RPC_UNSERVED_ROW(svc_type, field) RPC_ROW_(svc_type, field, RPC_UNSERVED, NULL, false)
/* Calls whose handler answers much later (see `parks`). */
#define RPC_UNARY_PARKED_ROW(svc_type, field, fn) RPC_ROW_(svc_type, field, RPC_UNARY, fn, true)
#define RPC_SERVER_STREAM_PARKED_ROW(svc_type, field, fn)                                          \
  RPC_ROW_(svc_type, field, RPC_SERVER_STREAM, fn, true)
#define RPC_N_ROWS(table) (sizeof(table) / sizeof((table)[0]))

/*
 * The one way to write a handler, whatever the call's shape (unary, parked,
 * streaming): the body sees `call`, `svc` (svc_type *) and `req` (const
 * req_type *, NULL for client streams):
 *
 *   RPC_HANDLER(handle_get_job, struct coord_rpc, Stoker__V1__GetJobRequest) {
 *     coord_get_job(svc->coord, req, answer, call);
 *   }
 *
 * The kind (unary, streams) is the row's; req_type must be the method's
 * input type (not checked: protobuf-c gives no descriptor for a C type).
 */
#define RPC_HANDLER(fn, svc_type, req_type)                                                        \
  static void fn##_typed(struct rpc_call *call, svc_type *svc, const req_type *req);               \
  static void fn(struct rpc_call *call, const ProtobufCMessage *req, void *svc) {                  \
    fn##_typed(call, (svc_type *)svc, (const req_type *)req);                                      \
  }                                                                                                \
  static void fn##_typed(struct rpc_call *call, svc_type *svc, const req_type *req)

/* The descriptor's method whose generated field name is field ("get_manifest"
 * for GetManifest: protobuf-c's lower-case-with-underscores rule); NULL if
 * the service has none. */
const ProtobufCMethodDescriptor *rpc_method_by_field(const ProtobufCServiceDescriptor *desc,
                                                     const char *field);

/* Writes the method's path "/pkg.Svc/Method" to buf (the descriptor's
 * names); STK_EINVAL if desc has no method with that field name, STK_ERANGE
 * if buf is too small. Clients name their calls' methods with
 * RPC_METHOD_PATH below. */
int rpc_method_path(const ProtobufCServiceDescriptor *desc, const char *field, char *buf,
                    size_t len);

/*
 * A client call's method, named as the generated code names it:
 *
 *   client_call(c, RPC_METHOD_PATH(stoker__v1__coordinator, create_job, &req), &req.base, ...)
 *
 * is "/stoker.v1.Coordinator/CreateJob". prefix is the service's protobuf-c
 * prefix (its descriptor is prefix__descriptor), field the method's field in
 * the generated service struct, req a pointer to the request the call sends
 * (for a client stream, a pointer of its messages' type; NULL cast to it
 * will do). The compiler checks all three against protobuf-c's generated
 * client stub prefix__field(service, input, closure, closure_data), which it
 * never calls: a method the service lacks does not compile (an undeclared
 * stub), nor does a request of another type (the method of another service,
 * the wrong method: an error, whatever the warning flags).
 * The path comes from the descriptor, written once per call site into a
 * buffer of its own that lives as long as the process (callers that keep
 * the path until the call ends may), thread-safe, one atomic load after the
 * first use. A GNU C statement expression: not for static initializers.
 */
#define RPC_METHOD_PATH_MAX 128
struct rpc_method_path_cache {
  _Atomic int state; /* 0 unwritten, 1 being written, 2 written. */
  char path[RPC_METHOD_PATH_MAX];
};
#define RPC_METHOD_PATH(prefix, field, req)                                                        \
  __extension__({                                                                                  \
    static struct rpc_method_path_cache rpc_path_cache_;                                           \
    _Pragma("GCC diagnostic push");                                                                \
    _Pragma("GCC diagnostic error \"-Wincompatible-pointer-types\"");                              \
    enum { rpc_path_checked_ = sizeof(((&prefix##__##field)(NULL, (req), NULL, NULL), 0)) };       \
    _Pragma("GCC diagnostic pop");                                                                 \
    rpc_method_path_cached(&rpc_path_cache_, &prefix##__descriptor, #field);                       \
  })

/*
 * The response descriptor of the same method, for the call that unpacks its
 * answer, so a call site never names the response type by hand:
 *
 *   client_call(c, path, &req.base, RPC_METHOD_REPLY(stoker__v1__coordinator, get_job, &req,
 *               ret_job), timeout_ms, (ProtobufCMessage **)ret_job)
 *
 * ret is a pointer to the caller's response pointer (Resp **; a typed NULL,
 * (Stoker__V1__Empty **)NULL, when the answer is dropped). The compiler
 * checks req and Resp against the generated stub, whose closure takes the
 * method's response: a wrong request or response type does not compile.
 * NULL at run time only for a field the service lacks, which does not
 * compile either.
 */
#define RPC_METHOD_REPLY(prefix, field, req, ret)                                                  \
  __extension__({                                                                                  \
    _Pragma("GCC diagnostic push");                                                                \
    _Pragma("GCC diagnostic error \"-Wincompatible-pointer-types\"");                              \
    enum {                                                                                         \
      rpc_reply_checked_ =                                                                         \
          sizeof(((&prefix##__##field)(NULL, (req),                                                \
                                       (void (*)(const __typeof__(**(ret)) *, void *))NULL, NULL), \
                  0))                                                                              \
    };                                                                                             \
    _Pragma("GCC diagnostic pop");                                                                 \
    rpc_method_output(&prefix##__descriptor, #field);                                              \
  })

/* The response descriptor of desc's method field (rpc_method_by_field);
 * NULL if desc has none. */
const ProtobufCMessageDescriptor *rpc_method_output(const ProtobufCServiceDescriptor *desc,
                                                    const char *field);

/* RPC_METHOD_PATH's writer: cache->path once, from desc's method field (a
 * field desc lacks, which RPC_METHOD_PATH does not compile, writes
 * "/pkg.Svc/field", answered UNIMPLEMENTED); returns cache->path. */
const char *rpc_method_path_cached(struct rpc_method_path_cache *cache,
                                   const ProtobufCServiceDescriptor *desc, const char *field);

/* Creates a server whose handlers run on loop. Errors: STK_EINVAL (bad
 * options, unreadable TLS or token files; stk_detail() says which). */
int rpc_server_new(uv_loop_t *loop, const struct rpc_server_opts *opts,
                   struct rpc_server **ret_server);

/* Registers the methods of desc with the handlers of defs (see "The method
 * table" above). Before start. STK_EINVAL, with a detail naming the method,
 * when a method of desc has no row or two, a row names a method desc lacks,
 * or a served row has no handler; nothing is registered then. The
 * service's health status starts SERVING. */
int rpc_server_add_service(struct rpc_server *s, const ProtobufCServiceDescriptor *desc,
                           const struct rpc_method_def *defs, size_t n_defs, void *svc_data);

/* Binds and starts serving; writes "HOST:PORT" actually bound to
 * ret_bound. Errors: STK_EUNAVAIL (the port is in use), STK_EIO (cannot
 * bind otherwise), the cause in words as stk_detail() (net_listen.h). */
int rpc_server_start(struct rpc_server *s, char *ret_bound, size_t bound_len);

/* Health status for a service name ("" is the whole server). Watchers are
 * told of changes. */
void rpc_server_set_serving(struct rpc_server *s, const char *service, bool serving);
/* The same for every service the server knows ("" included). */
void rpc_server_set_serving_all(struct rpc_server *s, bool serving);

/* Reasons a daemon reports NOT_SERVING for every service; it is SERVING
 * again only once none holds (so two watchers of the daemon's state, say
 * descriptors and workers, never clear each other's verdict). */
enum rpc_unhealthy {
  RPC_UNHEALTHY_DESCRIPTORS = 1u << 0,   /* fd_guard.h */
  RPC_UNHEALTHY_WORKERS_STUCK = 1u << 1, /* every worker on one task too long */
};
void rpc_server_set_unhealthy(struct rpc_server *s, enum rpc_unhealthy why, bool holds);

/* What the server's accept did (rpc_accept.c): gRPC connections open now
 * and the cap, connections closed as soon as accepted (over the cap, or
 * no descriptor left to hold them), and whether the reserve descriptor
 * that lets a listener empty its backlog when descriptors run out is held.
 * Counters only grow. All zero before start. Loop thread. */
struct rpc_accept_stats {
  size_t live;
  size_t max;
  uint64_t refused_limit;
  uint64_t refused_descriptors;
  bool reserve_held;
};
void rpc_server_accept_stats(struct rpc_server *s, struct rpc_accept_stats *ret_stats);

/* Graceful shutdown: stops accepting calls, marks health NOT_SERVING,
 * cancels calls still open after grace_ms (their cancel callbacks run), and
 * calls done on the loop once every call has finished. */
void rpc_server_shutdown(struct rpc_server *s, int64_t grace_ms, void (*done)(void *arg),
                         void *arg);

/* Re-reads the server's token file (a daemon's SIGHUP): calls from now on
 * must carry the new token. On failure (file gone, empty) the old token
 * stays and the error comes back with a detail. 0 without a token file.
 * Loop thread. */
int rpc_server_reload_token(struct rpc_server *s);
/* The tenant a job belongs to: the job-name prefix of the longest team
 * token in the server's token file that covers it; NULL when none does
 * (operators' jobs, or a server without scoped tokens). Loop thread; valid
 * until the next reload. */
const char *rpc_server_tenant(const struct rpc_server *s, const char *job);

/* Re-reads the server's TLS certificate, key and client CA (a daemon's
 * SIGHUP) and checks them (the chain parses, the key matches it, the CA
 * parses): new connections are served with them, open ones keep theirs.
 * On failure the certificates in use stay and the error comes back with a
 * detail naming the file and the reason. 0 without TLS. Loop thread. */
int rpc_server_reload_tls(struct rpc_server *s);

/* Frees a server after shutdown completed. Accepts NULL. */
void rpc_server_free(struct rpc_server *s);

/* Finishing a call (exactly once per call; the call is freed then). */
void rpc_reply(struct rpc_call *c, const ProtobufCMessage *resp);
void rpc_fail(struct rpc_call *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Fails with the status an STK_E* error maps to. */
void rpc_fail_err(struct rpc_call *c, int stk_err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Server streams: ends the stream with a status (RPC_OK or an error). */
void rpc_finish(struct rpc_call *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Server streams: sends one message. At most one send outstanding; sent
 * runs on the loop when the message is handed to the transport (err 0) or
 * the call is gone (err STK_ECANCELED). Returns STK_EBUSY if a send is
 * outstanding, STK_ECANCELED if the call is already cancelled. */
typedef void (*rpc_sent_fn)(struct rpc_call *c, int err, void *arg);
int rpc_send(struct rpc_call *c, const ProtobufCMessage *msg, rpc_sent_fn sent, void *arg);

/* The same without copying a large bytes field: sends msg (packed, with
 * field `field` left empty) followed by that field holding the len bytes
 * at data, which gRPC reads in place until it is done with them and then
 * calls release(release_arg) (on any thread, exactly once, also when the
 * send fails). Protobuf allows fields in any order, so the peer decodes
 * the usual message. For bulk payloads (token batches, tensor bytes). */
typedef void (*rpc_release_fn)(void *release_arg);
int rpc_send_borrowed(struct rpc_call *c, const ProtobufCMessage *msg, uint32_t field,
                      const void *data, size_t len, rpc_release_fn release, void *release_arg,
                      rpc_sent_fn sent, void *arg);

/* Client streams: asks for the next message. got runs on the loop with
 * the message (owned by the callee: protobuf_c_message_free_unpacked), or
 * msg NULL and err 0 at the end of the stream, or err < 0 on failure
 * (STK_EINVAL: malformed message; STK_ECANCELED: call gone). One receive
 * outstanding at a time. */
typedef void (*rpc_recv_fn)(struct rpc_call *c, ProtobufCMessage *msg, int err, void *arg);
int rpc_recv(struct rpc_call *c, rpc_recv_fn got, void *arg);

/* Runs once on the loop if the peer cancels or the deadline passes while
 * the call is open. The handler must still finish the call (nothing is
 * sent then); parked calls typically do that from here. */
typedef void (*rpc_cancel_fn)(struct rpc_call *c, void *arg);
void rpc_on_cancel(struct rpc_call *c, rpc_cancel_fn fn, void *arg);
bool rpc_cancelled(const struct rpc_call *c);

/* Milliseconds until the caller's deadline; INT64_MAX if none. */
int64_t rpc_deadline_remaining_ms(const struct rpc_call *c);
void rpc_call_set_data(struct rpc_call *c, void *data);
void *rpc_call_data(const struct rpc_call *c);

/* ---------------------------------------------------------------- client */

struct rpc_client;
struct rpc_client_call;

struct rpc_client_opts {
  const char *target;        /* "HOST:PORT". */
  const char *tls_ca_file;   /* PEM; set: TLS, verifying the server. */
  const char *tls_cert_file; /* PEM; client certificate for mutual TLS. */
  const char *tls_key_file;
  const char *tls_server_name; /* Override the name checked in the cert. */
  const char *token;           /* Bearer token sent with every call. */
  size_t max_recv_bytes;       /* 0: 64 MiB. */
  /* Spread calls over every address the target resolves to (gRPC's
   * round_robin policy: a DNS name's A records, or "ipv4:A:P,B:Q"), skipping
   * those that fail; false: the first that connects (pick_first). */
  bool round_robin;
};

struct rpc_status {
  int code; /* enum rpc_code */
  char message[512];
};

/* Reads a bearer token file, the one rule for every program: the file
 * holds at most RPC_TOKEN_FILE_MAX_BYTES; trailing whitespace (the final
 * newline, a CRLF, spaces) is dropped and nothing else is: what is left
 * must be non-empty and one word of printable ASCII (no inner space, no
 * second line, no leading space). ret_token is malloc'd. STK_EINVAL (or
 * STK_ENOMEM) with a detail naming the file: "token file PATH: empty". */
#define RPC_TOKEN_FILE_MAX_BYTES 4096
int rpc_read_token_file(const char *path, char **ret_token);

/* A server's token file (rpc_server_opts.token_file; re-read on SIGHUP):
 * one token per line with its scope, blank lines and '#' comments allowed:
 *
 *   s3cr3t-operator                 every job (a line with only a token)
 *   s3cr3t-operator *               the same, said explicitly
 *   t0k3n-team-a    team-a-*        jobs whose names start with "team-a-"
 *   t0k3n-team-b    team-b-*  queues=team-b,shared  priorities=low,normal
 *
 * A file of one word is an operator's token (the format before scopes).
 * A call outside its token's scope answers PERMISSION_DENIED naming the
 * rule; listings hold only what the scope covers.
 *
 * After the scope a line may grant, as KEY=LIST words (enum rpc_grant),
 * what the token may name in a service's requests; LIST is "*" (anything),
 * or names [a-z0-9][a-z0-9.-]{0,62} separated by ',', or empty (nothing).
 * The server only keeps them (rpc_call_grant); the service that reads a
 * key enforces it (the coordinator: JobSpec.submission's queue and
 * priority, services/coordinator/README.md "Tenants' queues and
 * priorities"). An unknown key, a key twice or a bad name fails the load
 * naming the line. */
#define RPC_TOKENS_FILE_MAX_BYTES (1u << 20)

/* The token file's grants (KEY=LIST words), in this order. */
enum rpc_grant {
  RPC_GRANT_QUEUES,     /* queues=: the cluster queues its jobs may be submitted to */
  RPC_GRANT_PRIORITIES, /* priorities=: the priority classes they may ask for */
  RPC_GRANT_N,
};

/* The job-name prefix the call's token covers; NULL when it covers every
 * job (an operator's token, or a server without tokens). */
const char *rpc_call_scope(const struct rpc_call *c);
/* The call's token's LIST for grant as its line writes it, or NULL when
 * the line sets none (or the server has no tokens). */
const char *rpc_call_grant(const struct rpc_call *c, enum rpc_grant grant);
/* Whether list (as rpc_call_grant returns it) holds name: "*" holds every
 * name but "", a list its names. NULL and "" hold nothing. */
bool rpc_grant_holds(const char *list, const char *name);
/* rpc_reply for a listing: the entries of resp's repeated message fields
 * that the call's token does not cover are left out (each entry judged by
 * its `job`, or its spec's `job` or `name`). */
void rpc_reply_listing(struct rpc_call *c, const ProtobufCMessage *resp);
/* Whether the call's token does not cover job; when so, why (naming the
 * scope) goes to why. For a handler that ends its call its own way (a
 * client stream). */
bool rpc_call_denies_job(const struct rpc_call *c, const char *job, char *why, size_t why_len);
/* True when the call's token covers job; else fails the call with
 * PERMISSION_DENIED naming the scope and returns false. */
bool rpc_call_check_job(struct rpc_call *c, const char *job);

int rpc_client_new(const struct rpc_client_opts *opts, struct rpc_client **ret_client);
/* Cancels calls still open, waits for their callbacks, frees. Accepts NULL. */
void rpc_client_free(struct rpc_client *c);
/* Calls started from now on carry token (NULL: none); calls already
 * started keep the one they were sent with. Any thread. 0 or STK_ENOMEM
 * (the old token stays). */
int rpc_client_set_token(struct rpc_client *c, const char *token);

/* Unary, asynchronous. done runs once on the client's thread with the
 * status and, on RPC_OK, the reply (owned by the callee). method is
 * "/pkg.Svc/Method"; timeout_ms <= 0 means none. The call handle stays
 * valid until done returns. */
typedef void (*rpc_unary_done_fn)(void *arg, const struct rpc_status *st, ProtobufCMessage *resp);
int rpc_client_unary_async(struct rpc_client *c, const char *method, const ProtobufCMessage *req,
                           const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                           rpc_unary_done_fn done, void *arg, struct rpc_client_call **ret_call);

/* Server streaming, asynchronous: on_msg for each reply (owned by the
 * callee), then done once with the final status. */
typedef void (*rpc_stream_msg_fn)(void *arg, ProtobufCMessage *msg);
typedef void (*rpc_stream_done_fn)(void *arg, const struct rpc_status *st);
int rpc_client_stream_async(struct rpc_client *c, const char *method, const ProtobufCMessage *req,
                            const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                            rpc_stream_msg_fn on_msg, rpc_stream_done_fn done, void *arg,
                            struct rpc_client_call **ret_call);

/* Asks an open call to stop; its callback still runs, with CANCELLED. */
void rpc_client_call_cancel(struct rpc_client_call *call);

/* Unary, blocking. Returns 0 and *ret_resp on RPC_OK; otherwise the mapped
 * STK_E* error with the status in *ret_st (may be NULL). */
int rpc_client_unary(struct rpc_client *c, const char *method, const ProtobufCMessage *req,
                     const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                     ProtobufCMessage **ret_resp, struct rpc_status *ret_st);

/* Client streaming, blocking: open, write messages, then finish to
 * half-close and receive the reply. A write packs its message (the caller
 * may free it on return), waits until the transport took the previous one
 * (flow control) and sends; STK_ECANCELED once the call has ended. */
struct rpc_client_cstream;
int rpc_client_cstream_open(struct rpc_client *c, const char *method,
                            const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                            struct rpc_client_cstream **ret_stream);
int rpc_client_cstream_write(struct rpc_client_cstream *s, const ProtobufCMessage *msg);
/* Frees the stream. Returns as rpc_client_unary does. */
int rpc_client_cstream_finish(struct rpc_client_cstream *s, ProtobufCMessage **ret_resp,
                              struct rpc_status *ret_st);
/* finish in two halves: end half-closes and waits for the reply (returns as
 * finish), free frees (accepts NULL). Between open and free, any thread may
 * cancel the call: a write or end waiting on it returns (CANCELLED). */
int rpc_client_cstream_end(struct rpc_client_cstream *s, ProtobufCMessage **ret_resp,
                           struct rpc_status *ret_st);
void rpc_client_cstream_cancel(struct rpc_client_cstream *s);
void rpc_client_cstream_free(struct rpc_client_cstream *s);
/* For a caller that must not block (a state machine on an engine): notify
 * runs on the client's thread after each of the stream's batches ends (a
 * write taken, the reply, the status), under the stream's lock: it must not
 * call the stream. write_ready: a write would not wait. close_send starts
 * the half-close (after the write in flight: call it once write_ready);
 * ended: the reply and status are in, so end returns at once. */
void rpc_client_cstream_set_notify(struct rpc_client_cstream *s, void (*notify)(void *arg),
                                   void *arg);
bool rpc_client_cstream_write_ready(struct rpc_client_cstream *s);
void rpc_client_cstream_close_send(struct rpc_client_cstream *s);
bool rpc_client_cstream_ended(struct rpc_client_cstream *s);

#endif
