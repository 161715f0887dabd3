/*
 * rpc_call: one server call from arrival to free — the batches it starts
 * (close notification, stream sends and receives, the final status), the
 * reference count that frees it when the last of them completes, and the
 * per-method metrics recorded then. The lifecycle is told at the top of
 * rpc_server.c; everything here runs on the loop thread.
 */
#include "rpc_internal.h"

#include "log.h"
#include "metrics.h"
#include "stk_error.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/support/alloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rpc_call {
  struct rpc_method *m;
  struct rpc_server *s;
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array md;
  grpc_byte_buffer *payload;
  ProtobufCMessage *req;
  unsigned refs;     /* Outstanding ops, plus one until the handler finishes. */
  bool finished;     /* rpc_reply/rpc_fail/rpc_finish was called. */
  bool cancelled;    /* Close reported cancellation while open. */
  bool md_sent;      /* Initial metadata is in a started batch. */
  bool sending;      /* A SEND_MESSAGE is outstanding. */
  bool receiving;    /* A RECV_MESSAGE is outstanding. */
  int close_flag;    /* RECV_CLOSE_ON_SERVER's cancelled output. */
  int code;          /* Status the call ended with, for metrics. */
  uint64_t start_ns; /* uv_hrtime() at arrival. */
  rpc_cancel_fn cancel_fn;
  void *cancel_arg;
  rpc_sent_fn sent_fn;
  void *sent_arg;
  rpc_recv_fn got_fn;
  void *got_arg;
  grpc_byte_buffer *send_buf;
  grpc_byte_buffer *recv_buf;
  grpc_byte_buffer *reply_buf;
  grpc_slice details;
  void *data;
  char *scope;               /* The token's job-name prefix (copied); NULL: every job. */
  char *grants[RPC_GRANT_N]; /* The token's grants (copied); NULL: not set. */
  struct rpc_tag close_tag, send_tag, recv_tag, finish_tag, cancel_tag;
};

/* ------------------------------------------------------------- payloads */

grpc_byte_buffer *rpc_pack(const ProtobufCMessage *msg) {
  size_t n = protobuf_c_message_get_packed_size(msg);
  grpc_slice slice = grpc_slice_malloc(n);
  protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(slice));
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&slice, 1);
  grpc_slice_unref(slice);
  return bb;
}

static size_t put_varint(uint8_t *out, uint64_t v) {
  size_t n = 0;
  for (; v >= 0x80; v >>= 7) out[n++] = (uint8_t)(v | 0x80);
  out[n++] = (uint8_t)v;
  return n;
}

grpc_byte_buffer *rpc_pack_borrowed(const ProtobufCMessage *msg, uint32_t field, const void *data,
                                    size_t len, rpc_release_fn release, void *release_arg) {
  if (field == 0 || field > 536870911u || !release) return NULL;
  size_t head_len = protobuf_c_message_get_packed_size(msg);
  grpc_slice head = grpc_slice_malloc(head_len + 20);
  uint8_t *p = GRPC_SLICE_START_PTR(head);
  protobuf_c_message_pack(msg, p);
  size_t n = head_len + put_varint(p + head_len, (uint64_t)field << 3 | 2); /* Length-delimited. */
  n += put_varint(p + n, len);
  head = grpc_slice_sub_no_ref(head, 0, n);
  grpc_slice slices[2] = {head,
                          grpc_slice_new_with_user_data((void *)data, len, release, release_arg)};
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(slices, 2);
  grpc_slice_unref(slices[0]);
  grpc_slice_unref(slices[1]); /* The buffer holds the last reference: release runs with it. */
  return bb;
}

void rpc_slice_copy(grpc_slice slice, char *buf, size_t len) {
  size_t n = GRPC_SLICE_LENGTH(slice);
  if (n >= len) n = len - 1;
  memcpy(buf, GRPC_SLICE_START_PTR(slice), n);
  buf[n] = '\0';
}

/* -------------------------------------------------------------- freeing */

static void record_metrics(struct rpc_call *c) {
  struct rpc_method *m = c->m;
  if (!c->s->metrics || !m->labels) return;
  int code = c->code >= 0 && c->code < RPC_N_CODES ? c->code : RPC_UNKNOWN;
  if (!m->by_code[code]) {
    char labels[512];
    snprintf(labels, sizeof(labels), "%s,grpc_code=\"%s\"", m->labels, rpc_code_name(code));
    m->by_code[code] =
        metrics_counter(c->s->metrics, "grpc_server_handled_total",
                        "RPCs completed on the server, regardless of success or failure.", labels);
  }
  if (m->by_code[code]) metric_counter_add(m->by_code[code], 1);
  if (m->latency) metric_histogram_observe(m->latency, (double)(uv_hrtime() - c->start_ns) / 1e9);
  if (m->in_flight) metric_gauge_add(m->in_flight, -1);
}

static void unref(struct rpc_call *c) {
  if (--c->refs > 0) return;
  struct rpc_server *s = c->s;
  record_metrics(c);
  grpc_call_unref(c->call);
  grpc_metadata_array_destroy(&c->md);
  if (c->payload) grpc_byte_buffer_destroy(c->payload);
  if (c->req) protobuf_c_message_free_unpacked(c->req, NULL);
  grpc_slice_unref(c->details);
  free(c->scope);
  for (int g = 0; g < RPC_GRANT_N; g++) free(c->grants[g]);
  free(c);
  s->call_closed(s);
}

static bool start_batch(struct rpc_call *c, grpc_op *ops, size_t n, struct rpc_tag *tag) {
  c->refs++;
  grpc_call_error e = grpc_call_start_batch(c->call, ops, n, tag, NULL);
  if (e == GRPC_CALL_OK) return true;
  log_debug("rpc.batch_error", "method=%s error=%d", c->m->path, (int)e);
  c->refs--;
  return false;
}

/* ----------------------------------------------------------- finishing */

static void on_finished(struct rpc_tag *tag, bool ok) {
  struct rpc_call *c = RPC_CONTAINER(tag, struct rpc_call, finish_tag);
  if (c->reply_buf) grpc_byte_buffer_destroy(c->reply_buf);
  c->reply_buf = NULL;
  unref(c);
}

static void finish(struct rpc_call *c, int code, const char *msg, grpc_byte_buffer *reply) {
  if (c->finished) {
    log_debug("rpc.finish_twice", "method=%s", c->m->path);
    if (reply) grpc_byte_buffer_destroy(reply);
    return;
  }
  c->finished = true;
  c->code = c->cancelled ? RPC_CANCELLED : code;
  if (c->cancelled) {
    if (reply) grpc_byte_buffer_destroy(reply);
    unref(c);
    return;
  }
  grpc_op ops[3];
  size_t n = 0;
  memset(ops, 0, sizeof(ops));
  if (!c->md_sent) ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
  c->md_sent = true;
  if (reply) {
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = reply;
  }
  c->details = grpc_slice_from_copied_string(msg ? msg : "");
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.status = (grpc_status_code)code;
  ops[n++].data.send_status_from_server.status_details = &c->details;
  c->reply_buf = reply;
  if (!start_batch(c, ops, n, &c->finish_tag)) { /* No batch: its reference is not held. */
    if (c->reply_buf) grpc_byte_buffer_destroy(c->reply_buf);
    c->reply_buf = NULL;
  }
  unref(c); /* The handler's reference. */
}

static void vfinish(struct rpc_call *c, int code, const char *fmt, va_list ap) {
  char msg[512] = "";
  if (fmt) vsnprintf(msg, sizeof(msg), fmt, ap);
  finish(c, code, msg, NULL);
}

void rpc_reply(struct rpc_call *c, const ProtobufCMessage *resp) {
  if (!resp || resp->descriptor != c->m->out_desc || c->sending) {
    rpc_fail(c, RPC_INTERNAL, "server replied with the wrong message for %s", c->m->path);
    return;
  }
  grpc_byte_buffer *bb = rpc_pack(resp);
  if (!bb) {
    rpc_fail(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  finish(c, RPC_OK, "", bb);
}

void rpc_fail(struct rpc_call *c, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfinish(c, code, fmt, ap);
  va_end(ap);
}

void rpc_fail_err(struct rpc_call *c, int stk_err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfinish(c, stk_error_to_grpc(stk_err), fmt, ap);
  va_end(ap);
}

void rpc_finish(struct rpc_call *c, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfinish(c, code, fmt, ap);
  va_end(ap);
}

/* -------------------------------------------------------- cancellation */

static void run_cancel(struct rpc_tag *tag, bool ok) {
  struct rpc_call *c = RPC_CONTAINER(tag, struct rpc_call, cancel_tag);
  rpc_cancel_fn fn = c->cancel_fn;
  c->cancel_fn = NULL;
  if (fn && !c->finished) fn(c, c->cancel_arg);
  unref(c);
}

static void on_close(struct rpc_tag *tag, bool ok) {
  struct rpc_call *c = RPC_CONTAINER(tag, struct rpc_call, close_tag);
  if ((c->close_flag || !ok) && !c->finished) {
    c->cancelled = true;
    log_debug("rpc.cancelled", "method=%s", c->m->path);
    c->refs++;
    run_cancel(&c->cancel_tag, true);
  }
  unref(c);
}

void rpc_on_cancel(struct rpc_call *c, rpc_cancel_fn fn, void *arg) {
  c->cancel_fn = fn;
  c->cancel_arg = arg;
  if (c->cancelled && fn) { /* Already cancelled: run it soon, not now. */
    c->refs++;
    c->cancel_tag.fn = run_cancel;
    rpc_pump_post(c->s->pump, &c->cancel_tag, true);
  }
}

bool rpc_cancelled(const struct rpc_call *c) {
  return c->cancelled;
}

/* ------------------------------------------------------------- streams */

static int send_buffer(struct rpc_call *c, grpc_byte_buffer *bb, rpc_sent_fn sent, void *arg);

static void on_sent(struct rpc_tag *tag, bool ok) {
  struct rpc_call *c = RPC_CONTAINER(tag, struct rpc_call, send_tag);
  grpc_byte_buffer_destroy(c->send_buf);
  c->send_buf = NULL;
  c->sending = false;
  if (c->sent_fn) c->sent_fn(c, ok ? 0 : STK_ECANCELED, c->sent_arg);
  unref(c);
}

static int check_send(const struct rpc_call *c, const ProtobufCMessage *msg) {
  if (c->finished) return STK_EINVAL;
  if (c->cancelled) return STK_ECANCELED;
  if (c->sending) return STK_EBUSY;
  if (!msg || msg->descriptor != c->m->out_desc) return STK_EINVAL;
  return 0;
}

int rpc_send(struct rpc_call *c, const ProtobufCMessage *msg, rpc_sent_fn sent, void *arg) {
  int err = check_send(c, msg);
  if (err) return err;
  grpc_byte_buffer *bb = rpc_pack(msg);
  if (!bb) return STK_ENOMEM;
  return send_buffer(c, bb, sent, arg);
}

int rpc_send_borrowed(struct rpc_call *c, const ProtobufCMessage *msg, uint32_t field,
                      const void *data, size_t len, rpc_release_fn release, void *release_arg,
                      rpc_sent_fn sent, void *arg) {
  int err = check_send(c, msg);
  grpc_byte_buffer *bb =
      err ? NULL : rpc_pack_borrowed(msg, field, data, len, release, release_arg);
  if (!bb) {
    if (release) release(release_arg);
    return err ? err : STK_EINVAL;
  }
  return send_buffer(c, bb, sent, arg); /* Destroying bb releases the bytes. */
}

/* Sends bb (owned from here on) as the next message of a server stream. */
static int send_buffer(struct rpc_call *c, grpc_byte_buffer *bb, rpc_sent_fn sent, void *arg) {
  grpc_op ops[2];
  size_t n = 0;
  memset(ops, 0, sizeof(ops));
  if (!c->md_sent) ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  ops[n++].data.send_message.send_message = bb;
  c->send_buf = bb;
  c->sent_fn = sent;
  c->sent_arg = arg;
  c->sending = true;
  if (!start_batch(c, ops, n, &c->send_tag)) {
    c->sending = false;
    c->send_buf = NULL;
    grpc_byte_buffer_destroy(bb);
    return STK_ECANCELED;
  }
  c->md_sent = true;
  return 0;
}

static void on_received(struct rpc_tag *tag, bool ok) {
  struct rpc_call *c = RPC_CONTAINER(tag, struct rpc_call, recv_tag);
  grpc_byte_buffer *bb = c->recv_buf;
  c->recv_buf = NULL;
  c->receiving = false;
  ProtobufCMessage *msg = NULL;
  int err = 0;
  if (!ok)
    err = STK_ECANCELED;
  else if (bb && !(msg = rpc_unpack_request(bb, c->m->in_desc, NULL, 0)))
    err = STK_EINVAL;
  if (bb) grpc_byte_buffer_destroy(bb);
  c->got_fn(c, msg, err, c->got_arg);
  unref(c);
}

int rpc_recv(struct rpc_call *c, rpc_recv_fn got, void *arg) {
  if (c->finished || !got) return STK_EINVAL;
  if (c->cancelled) return STK_ECANCELED;
  if (c->receiving) return STK_EBUSY;
  grpc_op op;
  memset(&op, 0, sizeof(op));
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &c->recv_buf;
  c->got_fn = got;
  c->got_arg = arg;
  c->receiving = true;
  if (!start_batch(c, &op, 1, &c->recv_tag)) {
    c->receiving = false;
    return STK_ECANCELED;
  }
  return 0;
}

/* ------------------------------------------------------------- arrival */

static struct rpc_call *call_new(struct rpc_method *m, grpc_call *call, gpr_timespec deadline,
                                 grpc_metadata_array *md, grpc_byte_buffer *payload) {
  struct rpc_call *c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  c->m = m;
  c->s = m->srv;
  c->call = call;
  c->deadline = deadline;
  c->md = *md;
  c->payload = payload;
  c->refs = 1;
  c->start_ns = uv_hrtime();
  c->details = grpc_empty_slice();
  c->close_tag.fn = on_close;
  c->send_tag.fn = on_sent;
  c->recv_tag.fn = on_received;
  c->finish_tag.fn = on_finished;
  c->cancel_tag.fn = run_cancel;
  if (m->parks) { /* Bound to a parked-call queue (rpc_server.c's arm). */
    rpc_pump_parked_tag(c->s->pump, &c->close_tag);
    rpc_pump_parked_tag(c->s->pump, &c->send_tag);
    rpc_pump_parked_tag(c->s->pump, &c->recv_tag);
    rpc_pump_parked_tag(c->s->pump, &c->finish_tag);
  }
  c->s->call_opened(c->s);
  if (m->started) metric_counter_add(m->started, 1);
  if (m->in_flight) metric_gauge_add(m->in_flight, 1);
  return c;
}

static void watch_close(struct rpc_call *c) {
  grpc_op op;
  memset(&op, 0, sizeof(op));
  op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  op.data.recv_close_on_server.cancelled = &c->close_flag;
  start_batch(c, &op, 1, &c->close_tag);
}

void rpc_call_start(struct rpc_method *m, grpc_call *call, gpr_timespec deadline,
                    grpc_metadata_array *md, grpc_byte_buffer *payload) {
  struct rpc_call *c = call_new(m, call, deadline, md, payload);
  if (!c) {
    grpc_call_cancel_with_status(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory", NULL);
    grpc_call_unref(call);
    grpc_metadata_array_destroy(md);
    if (payload) grpc_byte_buffer_destroy(payload);
    return;
  }
  watch_close(c);
  if (m->srv->tokens && !m->public_) {
    const struct rpc_token *t = rpc_tokens_match(m->srv->tokens, &c->md);
    if (!t) {
      rpc_fail(c, RPC_UNAUTHENTICATED, "missing or invalid bearer token");
      return;
    }
    bool oom = t->scope && !(c->scope = strdup(t->scope));
    for (int g = 0; g < RPC_GRANT_N; g++)
      oom |= t->grants[g] && !(c->grants[g] = strdup(t->grants[g]));
    if (oom) {
      rpc_fail(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
      return;
    }
  }
  char why[200];
  if (m->kind != RPC_CLIENT_STREAM &&
      !(c->req = rpc_unpack_request(payload, m->in_desc, why, sizeof(why)))) {
    rpc_fail(c, RPC_INVALID_ARGUMENT, "%s for %s", why[0] ? why : "malformed request", m->path);
    return;
  }
  if (c->scope && !m->checks_scope) {
    const char *job = rpc_scope_request_job(c->req);
    if (!job) {
      rpc_fail(c, RPC_PERMISSION_DENIED,
               "%s is for operators: this token covers only jobs named '%s*'", m->path, c->scope);
      return;
    }
    if (!rpc_call_check_job(c, job)) return;
  }
  m->handler(c, c->req, m->svc_data);
}

/* ----------------------------------------------------------- accessors */

int64_t rpc_deadline_remaining_ms(const struct rpc_call *c) {
  gpr_timespec d = gpr_convert_clock_type(c->deadline, GPR_CLOCK_MONOTONIC);
  if (gpr_time_cmp(d, gpr_inf_future(GPR_CLOCK_MONOTONIC)) >= 0) return INT64_MAX;
  gpr_timespec left = gpr_time_sub(d, gpr_now(GPR_CLOCK_MONOTONIC));
  return gpr_time_to_millis(left);
}

void rpc_call_set_data(struct rpc_call *c, void *data) {
  c->data = data;
}

void *rpc_call_data(const struct rpc_call *c) {
  return c->data;
}

const char *rpc_call_scope(const struct rpc_call *c) {
  return c->scope;
}

const char *rpc_call_grant(const struct rpc_call *c, enum rpc_grant grant) {
  return (unsigned)grant < RPC_GRANT_N ? c->grants[grant] : NULL;
}

void rpc_reply_listing(struct rpc_call *c, const ProtobufCMessage *resp) {
  if (!c->scope) {
    rpc_reply(c, resp);
    return;
  }
  ProtobufCMessage *view = rpc_scope_view(c->scope, resp);
  if (!view) {
    rpc_fail(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  rpc_reply(c, view);
  rpc_scope_view_free(view);
}

bool rpc_call_denies_job(const struct rpc_call *c, const char *job, char *why, size_t why_len) {
  if (rpc_scope_covers(c->scope, job)) return false;
  snprintf(why, why_len,
           "this token covers only jobs named '%s*' (its scope in the server's token file); "
           "job '%.128s' is outside it",
           c->scope, job ? job : "");
  return true;
}

bool rpc_call_check_job(struct rpc_call *c, const char *job) {
  char why[400];
  if (!rpc_call_denies_job(c, job, why, sizeof why)) return true;
  rpc_fail(c, RPC_PERMISSION_DENIED, "%s", why);
  return false;
}
