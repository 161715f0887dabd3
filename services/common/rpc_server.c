/*
 * rpc_server: the server's lifecycle over gRPC C core — registering
 * methods from protobuf-c descriptors, arming requests, answering unknown
 * methods, and a graceful shutdown that leaves the loop clean.
 *
 * Threads. Every function of rpc.h's server part runs on the loop thread
 * (or before the loop runs). The loop thread itself waits in
 * grpc_completion_queue_next and runs each completed tag (rpc_loop.c);
 * every callback below therefore runs on the loop.
 *
 * Call lifecycle (the contract handlers rely on):
 *   1. Arrival. Each method keeps RPC_ARMED requests armed with
 *      grpc_server_request_registered_call (unary and server streams get
 *      the request bytes with the call; client streams get none); when one
 *      completes it is re-armed and the call handed to rpc_call.c. A generic
 *      grpc_server_request_call stays armed too and answers anything
 *      unregistered with UNIMPLEMENTED "unknown method /x.Y/Z".
 *      A method marked parks (its calls wait long, many at once) has its
 *      calls bound to the pump's parked-call queues (rpc_loop.c): their
 *      batches complete there and reach the loop through rpc_pump_post.
 *   2. Start (rpc_call.c). A RECV_CLOSE_ON_SERVER op is posted at once: its
 *      completion says whether the call was cancelled (peer cancel, deadline,
 *      shutdown) and then runs the rpc_on_cancel callback once if the call
 *      is still open. The bearer token is checked (not for health), the
 *      request unpacked (INVALID_ARGUMENT if malformed) and the handler run.
 *   3. Work. The handler may return at once and finish later. Server streams
 *      send with rpc_send (one send outstanding; its callback when the batch
 *      completes); client streams read with rpc_recv (NULL = end of stream).
 *   4. Finish, exactly once: rpc_reply/rpc_fail/rpc_finish send initial
 *      metadata (if not sent yet), the reply (unary) and the status in one
 *      batch. If the call was already cancelled nothing is sent.
 *   5. Free. Each outstanding op holds a reference, the unfinished handler
 *      one more; when the last drops the grpc_call is unreferenced, metrics
 *      recorded, and the call memory freed. The handler must not touch the
 *      call after finishing it (callbacks of ops it started still run).
 *
 * Shutdown: rpc_server_shutdown marks health NOT_SERVING, ends Watch
 * streams, calls grpc_server_shutdown_and_notify, and after grace_ms
 * grpc_server_cancel_all_calls (cancel callbacks run; handlers finish).
 * When the notify tag has arrived, every armed request has come back and
 * every call is freed, the shutdown path itself destroys the grpc_server,
 * joins the loop's watcher thread, shuts down and drains the CQ and closes
 * the loop handles (drive, idle, async, grace timer); done runs from the last close callback.
 * After done, the loop holds nothing of ours and rpc_server_free only frees
 * memory (it may be called from done). A server never started runs done at
 * once, from rpc_server_shutdown itself.
 */
#include "rpc_internal.h"

#include "grpc/health/v1/health.pb-c.h"
#include "log.h"
#include "metrics.h"
#include "net_listen.h"
#include "stk_error.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void call_opened(struct rpc_server *s);
static void call_closed(struct rpc_server *s);

#define RPC_ARMED 2

/* A registered request armed with gRPC. */
struct request {
  struct rpc_tag tag;
  struct rpc_method *m;
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array md;
  grpc_byte_buffer *payload;
};

/* The generic request, and then the UNIMPLEMENTED answer it becomes. */
struct unknown_call {
  struct rpc_tag tag;
  struct rpc_server *s;
  grpc_call *call;
  grpc_call_details details;
  grpc_metadata_array md;
  grpc_slice message;
  int cancelled;
};

static void arm_unknown(struct rpc_server *s);
static void maybe_finish_shutdown(struct rpc_server *s);

/* ------------------------------------------------------------- creation */

static void fail_new(struct rpc_server *s) {
  if (s->creds) grpc_server_credentials_release(s->creds);
  rpc_server_tls_free(s->tls); /* After the credentials that call its fetcher. */
  rpc_health_free(s->health);
  rpc_tokens_free(s->tokens);
  free(s->token_file);
  free(s->listen);
  free(s);
  grpc_shutdown();
}

static int check_opts(const struct rpc_server_opts *o) {
  if (!o || !o->listen || !*o->listen) {
    stk_set_detail("rpc: listen address missing");
    return STK_EINVAL;
  }
  if (!o->tls_cert_file != !o->tls_key_file || (o->tls_client_ca_file && !o->tls_cert_file)) {
    stk_set_detail("rpc: TLS needs both a certificate and a key (and them for a client CA)");
    return STK_EINVAL;
  }
  return 0;
}

/* TLS credentials that can be reloaded, or plaintext. */
static int server_creds(struct rpc_server *s, const struct rpc_server_opts *opts) {
  if (!opts->tls_cert_file) {
    s->creds = grpc_insecure_server_credentials_create();
    return 0;
  }
  int err = rpc_server_tls_new(opts, &s->tls);
  return err ? err : rpc_server_tls_creds(s->tls, &s->creds);
}

/* The health service, registered as any service is (rpc_health.c holds its
 * rows and state; s->health is made). */
static int add_health(struct rpc_server *s) {
  size_t n;
  const struct rpc_method_def *rows = rpc_health_rows(&n);
  return rpc_server_add_service(s, &grpc__health__v1__health__descriptor, rows, n, s->health);
}

int rpc_server_new(uv_loop_t *loop, const struct rpc_server_opts *opts,
                   struct rpc_server **ret_server) {
  int err = check_opts(opts);
  if (err) return err;
  struct rpc_server *s = calloc(1, sizeof(*s));
  if (!s) return STK_ENOMEM;
  grpc_init();
  s->loop = loop;
  s->call_opened = call_opened;
  s->call_closed = call_closed;
  s->listen = strdup(opts->listen);
  s->max_recv_bytes = opts->max_recv_bytes ? opts->max_recv_bytes : RPC_DEFAULT_MAX_BYTES;
  s->max_send_bytes = opts->max_send_bytes ? opts->max_send_bytes : RPC_DEFAULT_MAX_BYTES;
  s->max_connections = opts->max_connections;
  s->max_age_ms = opts->max_connection_age_ms;
  s->max_age_grace_ms = opts->max_connection_age_grace_ms;
  s->metrics = opts->metrics;
  err = s->listen ? 0 : STK_ENOMEM;
  if (!err) err = server_creds(s, opts);
  if (!err && opts->token_file) err = rpc_tokens_load(opts->token_file, &s->tokens);
  if (!err && opts->token_file && !(s->token_file = strdup(opts->token_file))) err = STK_ENOMEM;
  if (!err) err = rpc_health_new(s);
  if (!err) err = add_health(s);
  if (err) {
    fail_new(s);
    return err;
  }
  *ret_server = s;
  return 0;
}

/* ------------------------------------------------------------- services */

/* The conventional gRPC server series (go-grpc-prometheus names, which
 * dashboards and alerts in the wild are written against). */
static void method_metrics(struct rpc_server *s, struct rpc_method *m,
                           const ProtobufCServiceDescriptor *desc,
                           const ProtobufCMethodDescriptor *md) {
  static const char *const types[] = {[RPC_UNARY] = "unary",
                                      [RPC_SERVER_STREAM] = "server_stream",
                                      [RPC_CLIENT_STREAM] = "client_stream"};
  if (!s->metrics) return;
  if (asprintf(&m->labels, "grpc_type=\"%s\",grpc_service=\"%s\",grpc_method=\"%s\"",
               types[m->kind], desc->name, md->name) < 0) {
    m->labels = NULL;
    return;
  }
  m->started = metrics_counter(s->metrics, "grpc_server_started_total",
                               "RPCs started on the server.", m->labels);
  m->latency = metrics_histogram(
      s->metrics, "grpc_server_handling_seconds",
      "Response latency (seconds) of gRPC calls handled by the server, arrival to last op.",
      m->labels);
  m->in_flight = metrics_gauge(s->metrics, "grpc_server_in_flight",
                               "RPCs started on the server and not yet finished.", m->labels);
}

static int add_method(struct rpc_server *s, const ProtobufCServiceDescriptor *desc,
                      const ProtobufCMethodDescriptor *md, const struct rpc_method_def *def,
                      void *svc_data) {
  struct rpc_method *m = calloc(1, sizeof(*m));
  struct rpc_method **grown = realloc(s->methods, (s->n_methods + 1) * sizeof(*grown));
  if (grown) s->methods = grown;
  if (!m || !grown || asprintf(&m->path, "/%s/%s", desc->name, md->name) < 0) {
    free(m);
    return STK_ENOMEM;
  }
  m->srv = s;
  m->kind = def->kind;
  m->handler = def->handler;
  m->svc_data = svc_data;
  m->in_desc = md->input;
  m->out_desc = md->output;
  m->public_ = strcmp(desc->name, "grpc.health.v1.Health") == 0;
  m->parks = def->parks;
  m->checks_scope = def->checks_scope;
  method_metrics(s, m, desc, md);
  s->methods[s->n_methods++] = m;
  return 0;
}

int rpc_server_add_service(struct rpc_server *s, const ProtobufCServiceDescriptor *desc,
                           const struct rpc_method_def *defs, size_t n_defs, void *svc_data) {
  if (s->state != RPC_SRV_NEW || !desc) {
    stk_set_detail("rpc: services are added before start");
    return STK_EINVAL;
  }
  const struct rpc_method_def **rows = calloc(desc->n_methods + 1, sizeof(*rows));
  if (!rows) return STK_ENOMEM;
  int err = rpc_methods_check(desc, defs, n_defs, rows);
  /* Unserved methods are not registered: the generic request answers them
   * UNIMPLEMENTED, as any path the server does not know. */
  for (unsigned i = 0; !err && i < desc->n_methods; i++)
    if (rows[i]->kind != RPC_UNSERVED)
      err = add_method(s, desc, &desc->methods[i], rows[i], svc_data);
  free(rows);
  return err ? err : rpc_health_add(s->health, desc->name);
}

/* ------------------------------------------------------------- arrivals */

static void on_request(struct rpc_tag *tag, bool ok);

static void arm(struct rpc_method *m) {
  struct rpc_server *s = m->srv;
  struct request *r = calloc(1, sizeof(*r));
  if (!r) return; /* Calls wait in gRPC until another request is armed. */
  r->tag.fn = on_request;
  r->m = m;
  grpc_metadata_array_init(&r->md);
  grpc_byte_buffer **payload = m->kind == RPC_CLIENT_STREAM ? NULL : &r->payload;
  /* Arrivals are announced on the loop's queue; a parked call's own
   * batches complete on a parked-call queue (rpc_loop.c). */
  grpc_completion_queue *bound = m->parks ? rpc_pump_parked_cq(s->pump) : s->cq;
  grpc_call_error e = grpc_server_request_registered_call(
      s->server, m->grpc_handle, &r->call, &r->deadline, &r->md, payload, bound, s->cq, &r->tag);
  if (e != GRPC_CALL_OK) {
    log_debug("rpc.arm", "method=%s error=%d", m->path, (int)e);
    grpc_metadata_array_destroy(&r->md);
    free(r);
    return;
  }
  s->n_armed++;
}

static void on_request(struct rpc_tag *tag, bool ok) {
  struct request *r = RPC_CONTAINER(tag, struct request, tag);
  struct rpc_server *s = r->m->srv;
  s->n_armed--;
  if (ok) {
    if (s->state == RPC_SRV_RUNNING) arm(r->m);
    rpc_call_start(r->m, r->call, r->deadline, &r->md, r->payload);
  } else {
    grpc_metadata_array_destroy(&r->md);
  }
  free(r);
  maybe_finish_shutdown(s);
}

static void on_unknown_done(struct rpc_tag *tag, bool ok) {
  struct unknown_call *u = RPC_CONTAINER(tag, struct unknown_call, tag);
  struct rpc_server *s = u->s;
  grpc_slice_unref(u->message);
  grpc_call_details_destroy(&u->details);
  grpc_metadata_array_destroy(&u->md);
  grpc_call_unref(u->call);
  free(u);
  call_closed(s);
}

static void answer_unknown(struct unknown_call *u) {
  char path[256];
  rpc_slice_copy(u->details.method, path, sizeof(path));
  log_debug("rpc.unknown_method", "method=%s", path);
  /* A caller without the token learns nothing, not even which methods
   * exist: the token is checked first, as for every registered method. */
  bool authorized = !u->s->tokens || rpc_tokens_match(u->s->tokens, &u->md);
  char text[300];
  if (authorized)
    snprintf(text, sizeof(text), "unknown method %s", path);
  else
    snprintf(text, sizeof(text), "missing or invalid bearer token");
  u->message = grpc_slice_from_copied_string(text);
  grpc_op ops[3];
  memset(ops, 0, sizeof(ops));
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[1].data.send_status_from_server.status =
      authorized ? GRPC_STATUS_UNIMPLEMENTED : GRPC_STATUS_UNAUTHENTICATED;
  ops[1].data.send_status_from_server.status_details = &u->message;
  ops[2].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  ops[2].data.recv_close_on_server.cancelled = &u->cancelled;
  u->tag.fn = on_unknown_done;
  call_opened(u->s);
  if (grpc_call_start_batch(u->call, ops, 3, &u->tag, NULL) != GRPC_CALL_OK)
    on_unknown_done(&u->tag, false);
}

static void on_unknown(struct rpc_tag *tag, bool ok) {
  struct unknown_call *u = RPC_CONTAINER(tag, struct unknown_call, tag);
  struct rpc_server *s = u->s;
  s->n_armed--;
  if (ok && s->state == RPC_SRV_RUNNING) arm_unknown(s);
  if (ok) {
    answer_unknown(u);
  } else {
    grpc_call_details_destroy(&u->details);
    grpc_metadata_array_destroy(&u->md);
    free(u);
  }
  maybe_finish_shutdown(s);
}

static void arm_unknown(struct rpc_server *s) {
  struct unknown_call *u = calloc(1, sizeof(*u));
  if (!u) return;
  u->s = s;
  u->tag.fn = on_unknown;
  grpc_call_details_init(&u->details);
  grpc_metadata_array_init(&u->md);
  if (grpc_server_request_call(s->server, &u->call, &u->details, &u->md, s->cq, s->cq, &u->tag) !=
      GRPC_CALL_OK) {
    grpc_call_details_destroy(&u->details);
    grpc_metadata_array_destroy(&u->md);
    free(u);
    return;
  }
  s->n_armed++;
}

/* ---------------------------------------------------------------- start */

#define RPC_HANDSHAKE_TIMEOUT_MS 10000

/* A duration in ms as a gRPC integer argument (INT_MAX: gRPC's "none"). */
static int age_arg(int64_t ms) {
  return ms <= 0 || ms > INT_MAX ? INT_MAX : (int)ms;
}

static grpc_server *create_grpc_server(struct rpc_server *s) {
  grpc_arg args[6];
  memset(args, 0, sizeof(args));
  for (size_t i = 0; i < 6; i++) args[i].type = GRPC_ARG_INTEGER;
  args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  args[0].value.integer = s->max_recv_bytes > INT32_MAX ? INT32_MAX : (int)s->max_recv_bytes;
  args[1].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
  args[1].value.integer = s->max_send_bytes > INT32_MAX ? INT32_MAX : (int)s->max_send_bytes;
  args[2].key = GRPC_ARG_ALLOW_REUSEPORT; /* A taken port must fail to bind. */
  args[2].value.integer = 0;
  /* A connection that has not finished its (TLS and) HTTP/2 handshake in this
   * time is closed: silent connections cannot hold descriptors for gRPC's
   * default two minutes. */
  args[3].key = GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS;
  args[3].value.integer = RPC_HANDSHAKE_TIMEOUT_MS;
  /* Clients resolve a name once and keep their connection: without an age
   * they would never see a replica added behind the name (a checkpoint
   * scale-out) until a connection breaks. GOAWAY at the age makes them
   * reconnect and resolve again; calls in flight finish within the grace. */
  args[4].key = GRPC_ARG_MAX_CONNECTION_AGE_MS;
  args[4].value.integer = age_arg(s->max_age_ms);
  args[5].key = GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS;
  args[5].value.integer = age_arg(s->max_age_grace_ms);
  grpc_channel_args ch_args = {.num_args = 6, .args = args};
  return grpc_server_create(&ch_args, NULL);
}

static int register_methods(struct rpc_server *s) {
  for (size_t i = 0; i < s->n_methods; i++) {
    struct rpc_method *m = s->methods[i];
    grpc_server_register_method_payload_handling ph =
        m->kind == RPC_CLIENT_STREAM ? GRPC_SRM_PAYLOAD_NONE
                                     : GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER;
    m->grpc_handle = grpc_server_register_method(s->server, m->path, NULL, ph, 0);
    if (!m->grpc_handle) {
      stk_set_detail("rpc: cannot register %s (registered twice?)", m->path);
      return STK_EINVAL;
    }
  }
  return 0;
}

static void write_bound(const char *listen, int port, char *ret_bound, size_t bound_len) {
  if (!ret_bound || bound_len == 0) return;
  const char *colon = strrchr(listen, ':');
  int host_len = colon ? (int)(colon - listen) : (int)strlen(listen);
  snprintf(ret_bound, bound_len, "%.*s:%d", host_len, listen, port);
}

static int bind_and_start(struct rpc_server *s, char *ret_bound, size_t bound_len) {
  int err = register_methods(s);
  if (err) return err;
  int port = grpc_server_add_http2_port(s->server, s->listen, s->creds);
  if (port <= 0) {
    /* gRPC does not say why: a bind of our own finds the errno. */
    char why[300];
    int errnum = net_listen_probe(s->listen, why, sizeof(why));
    stk_set_detail("%s", why);
    return errnum == EADDRINUSE ? STK_EUNAVAIL : STK_EIO;
  }
  err = rpc_accept_new(port, s->max_connections, s->metrics, &s->accept);
  if (err) return err;
  err = rpc_pump_start(s->loop, s->cq, &s->pump);
  if (err) return err;
  grpc_server_start(s->server);
  write_bound(s->listen, port, ret_bound, bound_len);
  return 0;
}

int rpc_server_start(struct rpc_server *s, char *ret_bound, size_t bound_len) {
  if (s->state != RPC_SRV_NEW) return STK_ESTATE;
  s->cq = grpc_completion_queue_create_for_next(NULL);
  s->server = create_grpc_server(s);
  grpc_server_register_completion_queue(s->server, s->cq, NULL);
  int err = bind_and_start(s, ret_bound, bound_len);
  if (err) {
    rpc_accept_free(s->accept);
    s->accept = NULL;
    grpc_server_destroy(s->server); /* Never started: no shutdown needed. */
    grpc_completion_queue_shutdown(s->cq);
    grpc_completion_queue_destroy(s->cq);
    s->server = NULL;
    s->cq = NULL;
    return err;
  }
  s->state = RPC_SRV_RUNNING;
  for (size_t i = 0; i < s->n_methods; i++)
    for (int k = 0; k < RPC_ARMED; k++) arm(s->methods[i]);
  arm_unknown(s);
  log_debug("rpc.server_start", "listen=%s methods=%zu", s->listen, s->n_methods);
  return 0;
}

/* ------------------------------------------------------------- shutdown */

/* s->call_opened and s->call_closed: rpc_call.c, below the server, counts
 * its calls through them. */
static void call_opened(struct rpc_server *s) {
  s->n_calls++;
}

static void call_closed(struct rpc_server *s) {
  s->n_calls--;
  maybe_finish_shutdown(s);
}

static void on_handle_closed(void *arg) {
  struct rpc_server *s = arg;
  if (--s->closing_handles > 0) return;
  s->state = RPC_SRV_DONE;
  log_debug("rpc.server_stopped", "listen=%s", s->listen);
  if (s->done) s->done(s->done_arg);
}

static void on_timer_closed(uv_handle_t *h) {
  struct rpc_server *s = h->data;
  free(h);
  on_handle_closed(s);
}

static void maybe_finish_shutdown(struct rpc_server *s) {
  if (s->state != RPC_SRV_DRAINING || !s->notified || s->n_calls || s->n_armed) return;
  s->state = RPC_SRV_CLOSING;
  grpc_server_destroy(s->server);
  s->server = NULL;
  s->closing_handles = 1;
  if (s->grace_timer) {
    s->closing_handles++;
    uv_timer_stop(s->grace_timer);
    uv_close((uv_handle_t *)s->grace_timer, on_timer_closed);
    s->grace_timer = NULL;
  }
  struct rpc_pump *p = s->pump;
  s->pump = NULL;
  s->cq = NULL; /* The pump destroys it. */
  rpc_pump_stop(p, on_handle_closed, s);
}

static void on_notified(struct rpc_tag *tag, bool ok) {
  struct rpc_server *s = RPC_CONTAINER(tag, struct rpc_server, shutdown_tag);
  s->notified = true;
  maybe_finish_shutdown(s);
}

static void on_grace(uv_timer_t *t) {
  struct rpc_server *s = t->data;
  log_debug("rpc.grace_over", "listen=%s open_calls=%zu", s->listen, s->n_calls);
  if (s->server) grpc_server_cancel_all_calls(s->server);
}

static void start_grace_timer(struct rpc_server *s, int64_t grace_ms) {
  s->grace_timer = malloc(sizeof(*s->grace_timer));
  if (!s->grace_timer || uv_timer_init(s->loop, s->grace_timer) != 0) {
    free(s->grace_timer);
    s->grace_timer = NULL;
    grpc_server_cancel_all_calls(s->server);
    return;
  }
  s->grace_timer->data = s;
  uv_timer_start(s->grace_timer, on_grace, (uint64_t)grace_ms, 0);
}

void rpc_server_shutdown(struct rpc_server *s, int64_t grace_ms, void (*done)(void *arg),
                         void *arg) {
  if (s->state == RPC_SRV_NEW) { /* Never started: nothing to wait for. */
    s->state = RPC_SRV_DONE;
    if (done) done(arg);
    return;
  }
  if (s->state != RPC_SRV_RUNNING) return;
  s->state = RPC_SRV_DRAINING;
  s->done = done;
  s->done_arg = arg;
  log_debug("rpc.server_shutdown", "listen=%s grace_ms=%lld", s->listen, (long long)grace_ms);
  s->shutdown_tag.fn = on_notified;
  rpc_accept_free(s->accept); /* Before gRPC closes the listeners and their numbers are reused. */
  s->accept = NULL;
  grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
  rpc_health_shutdown(s->health);
  if (grace_ms <= 0)
    grpc_server_cancel_all_calls(s->server);
  else
    start_grace_timer(s, grace_ms);
  maybe_finish_shutdown(s);
}

void rpc_server_accept_stats(struct rpc_server *s, struct rpc_accept_stats *ret_stats) {
  rpc_accept_stats(s->accept, ret_stats);
}

int rpc_server_reload_token(struct rpc_server *s) {
  if (!s->token_file) return 0;
  struct rpc_tokens *tokens = NULL;
  int err = rpc_tokens_load(s->token_file, &tokens);
  if (err) return err;        /* The old tokens stay. */
  rpc_tokens_free(s->tokens); /* Calls copied their scope and grants: nothing points here. */
  s->tokens = tokens;
  return 0;
}

const char *rpc_server_tenant(const struct rpc_server *s, const char *job) {
  return rpc_tokens_tenant(s->tokens, job);
}

int rpc_server_reload_tls(struct rpc_server *s) {
  return s->tls ? rpc_server_tls_reload(s->tls) : 0;
}

void rpc_server_free(struct rpc_server *s) {
  if (!s) return;
  if (s->state != RPC_SRV_NEW && s->state != RPC_SRV_DONE) {
    log_debug("rpc.server_free", "freed before shutdown completed; leaking it");
    return;
  }
  for (size_t i = 0; i < s->n_methods; i++) {
    free(s->methods[i]->path);
    free(s->methods[i]->labels);
    free(s->methods[i]);
  }
  free(s->methods);
  fail_new(s);
}
