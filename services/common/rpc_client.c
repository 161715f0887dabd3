/*
 * rpc_client: the client side over gRPC C core. A client owns one channel
 * and one thread reading its NEXT completion queue; every asynchronous
 * call's callbacks run on that thread. Unary calls are one batch of six
 * ops; server streams are a start batch, a status batch and a chain of
 * receives. The blocking unary call is the asynchronous one plus a
 * condition variable, never a second engine. Open calls are listed so
 * rpc_client_free can cancel them and wait for their callbacks.
 *
 * Never block on a client (blocking calls, rpc_client_free) from its own
 * callback thread: that thread is the one that would wake you.
 */
#include "rpc_internal.h"

#include "log.h"
#include "stk_error.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rpc_client {
  grpc_channel *channel;
  grpc_completion_queue *cq;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct rpc_client_call *open; /* Asynchronous calls not yet done, under mu. */
  /* authorization: Bearer ..., or NULL. Immutable once published: a new
   * token publishes a new one (rpc_client_set_token) and the old one is
   * kept on retired until free, as a call being started may still read
   * it. Tokens change rarely, so the list stays short. */
  _Atomic(struct auth_md *) auth;
  struct auth_md *retired; /* Under mu. */
};

struct auth_md {
  grpc_metadata md;
  struct auth_md *next_retired;
};

struct rpc_client_call {
  struct rpc_client *cl;
  struct rpc_client_call *prev, *next;
  grpc_call *call;
  const ProtobufCMessageDescriptor *resp_desc;
  rpc_unary_done_fn unary_done;
  rpc_stream_msg_fn on_msg;
  rpc_stream_done_fn stream_done;
  void *arg;
  grpc_byte_buffer *send_buf;
  grpc_byte_buffer *recv_buf;
  grpc_metadata_array initial_md;
  grpc_metadata_array trailing_md;
  grpc_status_code status;
  grpc_slice details;
  int pending;    /* Stream batches outstanding. */
  bool malformed; /* A reply did not unpack. */
  struct rpc_tag main_tag, status_tag, msg_tag;
};

/* --------------------------------------------------------------- shared */

void rpc_status_set(struct rpc_status *st, int code, grpc_slice details) {
  st->code = code;
  rpc_slice_copy(details, st->message, sizeof(st->message));
}

grpc_call *rpc_client_create_call(struct rpc_client *c, const char *method, int64_t timeout_ms) {
  gpr_timespec deadline = timeout_ms > 0
                              ? gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                             gpr_time_from_millis(timeout_ms, GPR_TIMESPAN))
                              : gpr_inf_future(GPR_CLOCK_REALTIME);
  grpc_slice path = grpc_slice_from_copied_string(method);
  grpc_call *call = grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq, path,
                                             NULL, deadline, NULL);
  grpc_slice_unref(path);
  return call;
}

size_t rpc_client_initial_md(struct rpc_client *c, grpc_metadata **ret_md) {
  struct auth_md *a = atomic_load(&c->auth);
  *ret_md = a ? &a->md : NULL;
  return a ? 1 : 0;
}

static void *client_thread(void *arg) {
  struct rpc_client *c = arg;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(c->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) return NULL;
    if (ev.type == GRPC_OP_COMPLETE) {
      struct rpc_tag *t = ev.tag;
      t->fn(t, ev.success != 0);
    }
  }
}

/* ------------------------------------------------------------ lifecycle */

/* What the channel lets a server send ahead of this client's reads (its
 * HTTP/2 stream window), and the largest DATA frame it accepts. By default
 * gRPC sizes the window with its BDP probe (pings whose round trips resize
 * it; about 4 MiB ahead here) and takes 16 KiB frames, a frame header and a
 * slice to parse per 16 KiB. Token batches are half a megabyte and more, so
 * the window is fixed at several batches and frames at HTTP/2's largest:
 * together they raised the dataloader bench's wire rate (tests/bench). */
#define RPC_CLIENT_WINDOW_BYTES (8 << 20)
#define RPC_CLIENT_FRAME_BYTES  16777215 /* HTTP/2's largest. */

static grpc_channel *create_channel(const struct rpc_client_opts *o, grpc_channel_credentials *cr) {
  size_t max = o->max_recv_bytes ? o->max_recv_bytes : RPC_DEFAULT_MAX_BYTES;
  grpc_arg args[10];
  size_t n = 0;
  memset(args, 0, sizeof(args));
  args[n].type = GRPC_ARG_INTEGER;
  args[n].key = GRPC_ARG_HTTP2_BDP_PROBE; /* Off: it would resize the window below. */
  args[n++].value.integer = 0;
  args[n].type = GRPC_ARG_INTEGER;
  args[n].key = GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES;
  args[n++].value.integer = RPC_CLIENT_WINDOW_BYTES;
  args[n].type = GRPC_ARG_INTEGER;
  args[n].key = GRPC_ARG_HTTP2_MAX_FRAME_SIZE;
  args[n++].value.integer = RPC_CLIENT_FRAME_BYTES;
  args[n].type = GRPC_ARG_INTEGER;
  args[n].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  args[n++].value.integer = max > INT32_MAX ? INT32_MAX : (int)max;
  args[n].type = GRPC_ARG_INTEGER;
  args[n].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
  args[n++].value.integer = -1; /* The server's limit decides. */
  /* gRPC's reconnect backoff grows to minutes by default; a rank waiting for
   * a restarted coordinator must reconnect within seconds of its return. */
  args[n].type = GRPC_ARG_INTEGER;
  args[n].key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS;
  args[n++].value.integer = 2000;
  args[n].type = GRPC_ARG_INTEGER;
  args[n].key = GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS;
  args[n++].value.integer = 100;
  /* A restarted server pod (a rolling update, a rescheduled StatefulSet pod)
   * comes back at a new address under the same DNS name. gRPC asks DNS again
   * when a connection fails, but at most every 30 s by default, so a rank sat
   * on the old, unroutable address for a minute and more; once a second is
   * cheap for one name per channel. */
  args[n].type = GRPC_ARG_INTEGER;
  args[n].key = GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS;
  args[n++].value.integer = 1000;
  if (o->round_robin) {
    args[n].type = GRPC_ARG_STRING;
    args[n].key = GRPC_ARG_LB_POLICY_NAME;
    args[n++].value.string = "round_robin";
  }
  if (o->tls_server_name) {
    args[n].type = GRPC_ARG_STRING;
    args[n].key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
    args[n++].value.string = (char *)o->tls_server_name;
  }
  grpc_channel_args ch_args = {.num_args = n, .args = args};
  return grpc_channel_create(o->target, cr, &ch_args);
}

/* The metadata for token; NULL for no token (or on allocation failure,
 * then ret_err is STK_ENOMEM). */
static struct auth_md *auth_new(const char *token, int *ret_err) {
  char *value;
  *ret_err = 0;
  if (!token) return NULL;
  struct auth_md *a = calloc(1, sizeof(*a));
  if (!a || asprintf(&value, "Bearer %s", token) < 0) {
    free(a);
    *ret_err = STK_ENOMEM;
    return NULL;
  }
  a->md.key = grpc_slice_from_static_string("authorization");
  a->md.value = grpc_slice_from_copied_string(value);
  free(value);
  return a;
}

static void auth_free(struct auth_md *a) {
  if (!a) return;
  grpc_slice_unref(a->md.value);
  free(a);
}

int rpc_client_set_token(struct rpc_client *c, const char *token) {
  int err;
  struct auth_md *a = auth_new(token, &err);
  if (err) return err;
  struct auth_md *old = atomic_exchange(&c->auth, a);
  if (old) {
    pthread_mutex_lock(&c->mu);
    old->next_retired = c->retired;
    c->retired = old;
    pthread_mutex_unlock(&c->mu);
  }
  return 0;
}

int rpc_client_new(const struct rpc_client_opts *opts, struct rpc_client **ret_client) {
  if (!opts || !opts->target || !*opts->target) {
    stk_set_detail("rpc: client target missing");
    return STK_EINVAL;
  }
  struct rpc_client *c = calloc(1, sizeof(*c));
  if (!c) return STK_ENOMEM;
  grpc_init();
  grpc_channel_credentials *creds;
  int err = rpc_security_channel_creds(opts, &creds);
  if (err) {
    free(c);
    grpc_shutdown();
    return err;
  }
  c->channel = create_channel(opts, creds);
  grpc_channel_credentials_release(creds);
  c->cq = grpc_completion_queue_create_for_next(NULL);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  int auth_err;
  atomic_init(&c->auth, auth_new(opts->token, &auth_err));
  if (auth_err) {
    c->thread = 0;
    rpc_client_free(c);
    return auth_err;
  }
  if (pthread_create(&c->thread, NULL, client_thread, c) != 0) {
    c->thread = 0;
    rpc_client_free(c);
    stk_set_detail("rpc: cannot start the client thread");
    return STK_EINTERNAL;
  }
  *ret_client = c;
  return 0;
}

void rpc_client_free(struct rpc_client *c) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  for (struct rpc_client_call *k = c->open; k; k = k->next) grpc_call_cancel(k->call, NULL);
  while (c->open) pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
  grpc_channel_destroy(c->channel);
  grpc_completion_queue_shutdown(c->cq);
  if (c->thread)
    pthread_join(c->thread, NULL);
  else
    while (grpc_completion_queue_next(c->cq, gpr_inf_past(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
  grpc_completion_queue_destroy(c->cq);
  auth_free(atomic_load(&c->auth));
  while (c->retired) {
    struct auth_md *next = c->retired->next_retired;
    auth_free(c->retired);
    c->retired = next;
  }
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c);
  grpc_shutdown();
}

/* ----------------------------------------------------------- call state */

static struct rpc_client_call *call_new(struct rpc_client *c, const char *method,
                                        const ProtobufCMessageDescriptor *resp_desc,
                                        int64_t timeout_ms, grpc_byte_buffer *req) {
  struct rpc_client_call *k = calloc(1, sizeof(*k));
  if (!k) return NULL;
  k->call = rpc_client_create_call(c, method, timeout_ms);
  if (!k->call) {
    free(k);
    return NULL;
  }
  k->cl = c;
  k->resp_desc = resp_desc;
  k->send_buf = req;
  k->details = grpc_empty_slice();
  grpc_metadata_array_init(&k->initial_md);
  grpc_metadata_array_init(&k->trailing_md);
  pthread_mutex_lock(&c->mu);
  k->next = c->open;
  if (c->open) c->open->prev = k;
  c->open = k;
  pthread_mutex_unlock(&c->mu);
  return k;
}

static void call_free(struct rpc_client_call *k) {
  struct rpc_client *c = k->cl;
  pthread_mutex_lock(&c->mu);
  if (k->prev)
    k->prev->next = k->next;
  else
    c->open = k->next;
  if (k->next) k->next->prev = k->prev;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  grpc_call_unref(k->call);
  if (k->send_buf) grpc_byte_buffer_destroy(k->send_buf);
  if (k->recv_buf) grpc_byte_buffer_destroy(k->recv_buf);
  grpc_metadata_array_destroy(&k->initial_md);
  grpc_metadata_array_destroy(&k->trailing_md);
  grpc_slice_unref(k->details);
  free(k);
}

static void final_status(struct rpc_client_call *k, struct rpc_status *st) {
  rpc_status_set(st, (int)k->status, k->details);
  if (st->code == RPC_OK && k->malformed) {
    st->code = RPC_INTERNAL;
    snprintf(st->message, sizeof(st->message), "malformed or missing reply");
  }
}

void rpc_client_call_cancel(struct rpc_client_call *call) {
  if (call) grpc_call_cancel(call->call, NULL);
}

/* ---------------------------------------------------------------- unary */

static void on_unary(struct rpc_tag *tag, bool ok) {
  struct rpc_client_call *k = RPC_CONTAINER(tag, struct rpc_client_call, main_tag);
  ProtobufCMessage *resp = NULL;
  if (k->status == GRPC_STATUS_OK && !(resp = rpc_unpack(k->recv_buf, k->resp_desc, NULL, 0)))
    k->malformed = true;
  struct rpc_status st;
  final_status(k, &st);
  k->unary_done(k->arg, &st, resp);
  call_free(k);
}

static void unary_ops(struct rpc_client_call *k, grpc_op ops[6]) {
  memset(ops, 0, 6 * sizeof(*ops));
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[0].data.send_initial_metadata.count =
      rpc_client_initial_md(k->cl, &ops[0].data.send_initial_metadata.metadata);
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = k->send_buf;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &k->initial_md;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &k->recv_buf;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &k->trailing_md;
  ops[5].data.recv_status_on_client.status = &k->status;
  ops[5].data.recv_status_on_client.status_details = &k->details;
}

static int unary_start(struct rpc_client *c, const char *method, grpc_byte_buffer *req,
                       const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                       rpc_unary_done_fn done, void *arg, struct rpc_client_call **ret_call) {
  if (!req) return STK_ENOMEM;
  struct rpc_client_call *k = call_new(c, method, resp_desc, timeout_ms, req);
  if (!k) {
    grpc_byte_buffer_destroy(req);
    return STK_ENOMEM;
  }
  k->unary_done = done;
  k->arg = arg;
  k->main_tag.fn = on_unary;
  grpc_op ops[6];
  unary_ops(k, ops);
  if (ret_call) *ret_call = k; /* Before the batch: done may run at once. */
  if (grpc_call_start_batch(k->call, ops, 6, &k->main_tag, NULL) != GRPC_CALL_OK) {
    if (ret_call) *ret_call = NULL;
    call_free(k);
    return STK_EINTERNAL;
  }
  return 0;
}

int rpc_client_unary_async(struct rpc_client *c, const char *method, const ProtobufCMessage *req,
                           const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                           rpc_unary_done_fn done, void *arg, struct rpc_client_call **ret_call) {
  if (!req || !done) return STK_EINVAL;
  return unary_start(c, method, rpc_pack(req), resp_desc, timeout_ms, done, arg, ret_call);
}

/* A caller blocked on an asynchronous unary call. */
struct waiter {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  struct rpc_status st;
  ProtobufCMessage *resp;
};

static void on_waited(void *arg, const struct rpc_status *st, ProtobufCMessage *resp) {
  struct waiter *w = arg;
  pthread_mutex_lock(&w->mu);
  w->st = *st;
  w->resp = resp;
  w->done = true;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

static int wait_unary(struct rpc_client *c, const char *method, grpc_byte_buffer *req,
                      const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                      ProtobufCMessage **ret_resp, struct rpc_status *ret_st) {
  struct waiter w = {.done = false};
  pthread_mutex_init(&w.mu, NULL);
  pthread_cond_init(&w.cv, NULL);
  int err = unary_start(c, method, req, resp_desc, timeout_ms, on_waited, &w, NULL);
  pthread_mutex_lock(&w.mu);
  while (!err && !w.done) pthread_cond_wait(&w.cv, &w.mu);
  pthread_mutex_unlock(&w.mu);
  pthread_cond_destroy(&w.cv);
  pthread_mutex_destroy(&w.mu);
  if (err) return err;
  if (ret_st) *ret_st = w.st;
  if (w.st.code != RPC_OK) return stk_error_from_grpc(w.st.code);
  if (ret_resp)
    *ret_resp = w.resp;
  else
    protobuf_c_message_free_unpacked(w.resp, NULL);
  return 0;
}

int rpc_client_unary(struct rpc_client *c, const char *method, const ProtobufCMessage *req,
                     const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                     ProtobufCMessage **ret_resp, struct rpc_status *ret_st) {
  if (!req) return STK_EINVAL;
  return wait_unary(c, method, rpc_pack(req), resp_desc, timeout_ms, ret_resp, ret_st);
}

int rpc_client_unary_raw(struct rpc_client *c, const char *method, const void *req_bytes,
                         size_t req_len, const ProtobufCMessageDescriptor *resp_desc,
                         int64_t timeout_ms, ProtobufCMessage **ret_resp,
                         struct rpc_status *ret_st) {
  grpc_slice s = grpc_slice_from_copied_buffer(req_bytes, req_len);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  return wait_unary(c, method, bb, resp_desc, timeout_ms, ret_resp, ret_st);
}

/* ------------------------------------------------------- server streams */

static void stream_unref(struct rpc_client_call *k) {
  if (__atomic_sub_fetch(&k->pending, 1, __ATOMIC_ACQ_REL) > 0) return;
  struct rpc_status st;
  final_status(k, &st);
  k->stream_done(k->arg, &st);
  call_free(k);
}

static void on_stream_started(struct rpc_tag *tag, bool ok) {
  stream_unref(RPC_CONTAINER(tag, struct rpc_client_call, main_tag));
}

static void on_stream_status(struct rpc_tag *tag, bool ok) {
  stream_unref(RPC_CONTAINER(tag, struct rpc_client_call, status_tag));
}

static bool recv_next(struct rpc_client_call *k) {
  grpc_op op;
  memset(&op, 0, sizeof(op));
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &k->recv_buf;
  return grpc_call_start_batch(k->call, &op, 1, &k->msg_tag, NULL) == GRPC_CALL_OK;
}

static void on_stream_msg(struct rpc_tag *tag, bool ok) {
  struct rpc_client_call *k = RPC_CONTAINER(tag, struct rpc_client_call, msg_tag);
  grpc_byte_buffer *bb = k->recv_buf;
  k->recv_buf = NULL;
  if (!ok || !bb) { /* End of stream or call gone. */
    stream_unref(k);
    return;
  }
  ProtobufCMessage *msg = rpc_unpack(bb, k->resp_desc, NULL, 0);
  grpc_byte_buffer_destroy(bb);
  if (msg) {
    k->on_msg(k->arg, msg);
  } else {
    k->malformed = true;
    grpc_call_cancel_with_status(k->call, GRPC_STATUS_INTERNAL, "malformed reply", NULL);
  }
  if (!recv_next(k)) stream_unref(k);
}

/* pending starts at 3 (start, status, receive batches), so nothing can
 * finish the call before all three are started; a batch that cannot start
 * drops its count. Returns false if not even the first one started. */
static bool stream_batches(struct rpc_client_call *k) {
  grpc_op ops[4];
  memset(ops, 0, sizeof(ops));
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[0].data.send_initial_metadata.count =
      rpc_client_initial_md(k->cl, &ops[0].data.send_initial_metadata.metadata);
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = k->send_buf;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &k->initial_md;
  k->pending = 3;
  if (grpc_call_start_batch(k->call, ops, 4, &k->main_tag, NULL) != GRPC_CALL_OK) return false;
  grpc_op st;
  memset(&st, 0, sizeof(st));
  st.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  st.data.recv_status_on_client.trailing_metadata = &k->trailing_md;
  st.data.recv_status_on_client.status = &k->status;
  st.data.recv_status_on_client.status_details = &k->details;
  if (grpc_call_start_batch(k->call, &st, 1, &k->status_tag, NULL) != GRPC_CALL_OK) stream_unref(k);
  if (!recv_next(k)) stream_unref(k);
  return true;
}

int rpc_client_stream_async(struct rpc_client *c, const char *method, const ProtobufCMessage *req,
                            const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                            rpc_stream_msg_fn on_msg, rpc_stream_done_fn done, void *arg,
                            struct rpc_client_call **ret_call) {
  if (!req || !on_msg || !done) return STK_EINVAL;
  grpc_byte_buffer *bb = rpc_pack(req);
  if (!bb) return STK_ENOMEM;
  struct rpc_client_call *k = call_new(c, method, resp_desc, timeout_ms, bb);
  if (!k) {
    grpc_byte_buffer_destroy(bb);
    return STK_ENOMEM;
  }
  k->on_msg = on_msg;
  k->stream_done = done;
  k->arg = arg;
  k->main_tag.fn = on_stream_started;
  k->status_tag.fn = on_stream_status;
  k->msg_tag.fn = on_stream_msg;
  if (ret_call) *ret_call = k;
  if (!stream_batches(k)) {
    if (ret_call) *ret_call = NULL;
    call_free(k);
    return STK_EINTERNAL;
  }
  return 0;
}
