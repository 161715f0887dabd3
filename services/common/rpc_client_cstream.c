/*
 * rpc_client_cstream: blocking client streams (a checkpoint rank streaming
 * its chunks). Each write is one SEND_MESSAGE batch; one may be in flight:
 * a write first waits until the transport took the previous message, which
 * is what makes gRPC's flow control reach the writer, and then starts its
 * own and returns. So the writer prepares its next message (a rank copies
 * its next 64 MiB segment) while the last one goes out, instead of waiting
 * for the client's completion thread to be scheduled after every message.
 * The final status is asked for at open, so a call the server ends early
 * is seen by the next write or by finish. Completions arrive on the
 * client's thread and only set flags here. A stream's owner may cancel it
 * from another thread until it frees it (end and free are apart for that:
 * a save the client's close cancels while its thread waits in end).
 */
#include "rpc_internal.h"

#include "stk_error.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One batch the writer may wait for. */
struct flag_tag {
  struct rpc_tag tag;
  struct rpc_client_cstream *s;
  bool done;
  bool ok;
};

struct rpc_client_cstream {
  grpc_call *call;
  const ProtobufCMessageDescriptor *resp_desc;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct flag_tag start, write, finish, status;
  grpc_byte_buffer *send_buf;
  grpc_byte_buffer *recv_buf;
  grpc_metadata_array initial_md;
  grpc_metadata_array trailing_md;
  grpc_status_code code;
  grpc_slice details;
  bool closed;               /* The half-close is started. */
  void (*notify)(void *arg); /* After each batch's end, under mu. */
  void *notify_arg;
};

static void on_flag(struct rpc_tag *tag, bool ok) {
  struct flag_tag *f = RPC_CONTAINER(tag, struct flag_tag, tag);
  pthread_mutex_lock(&f->s->mu);
  f->done = true;
  f->ok = ok;
  pthread_cond_broadcast(&f->s->cv);
  if (f->s->notify) f->s->notify(f->s->notify_arg);
  pthread_mutex_unlock(&f->s->mu);
}

static void flag_init(struct rpc_client_cstream *s, struct flag_tag *f, bool done) {
  f->tag.fn = on_flag;
  f->s = s;
  f->done = done;
}

static void wait_flag(struct rpc_client_cstream *s, struct flag_tag *f) {
  pthread_mutex_lock(&s->mu);
  while (!f->done) pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
}

static bool start(struct rpc_client_cstream *s, grpc_op *ops, size_t n, struct flag_tag *f) {
  f->done = false;
  if (grpc_call_start_batch(s->call, ops, n, &f->tag, NULL) == GRPC_CALL_OK) return true;
  f->done = true;
  f->ok = false;
  return false;
}

static void start_batches(struct rpc_client *c, struct rpc_client_cstream *s) {
  grpc_op op;
  memset(&op, 0, sizeof(op));
  op.op = GRPC_OP_SEND_INITIAL_METADATA;
  op.data.send_initial_metadata.count =
      rpc_client_initial_md(c, &op.data.send_initial_metadata.metadata);
  start(s, &op, 1, &s->start);
  memset(&op, 0, sizeof(op));
  op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  op.data.recv_status_on_client.trailing_metadata = &s->trailing_md;
  op.data.recv_status_on_client.status = &s->code;
  op.data.recv_status_on_client.status_details = &s->details;
  start(s, &op, 1, &s->status);
}

int rpc_client_cstream_open(struct rpc_client *c, const char *method,
                            const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                            struct rpc_client_cstream **ret_stream) {
  struct rpc_client_cstream *s = calloc(1, sizeof(*s));
  if (!s) return STK_ENOMEM;
  s->call = rpc_client_create_call(c, method, timeout_ms);
  if (!s->call) {
    free(s);
    return STK_EINTERNAL;
  }
  s->resp_desc = resp_desc;
  s->details = grpc_empty_slice();
  s->code = GRPC_STATUS_UNKNOWN;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  grpc_metadata_array_init(&s->initial_md);
  grpc_metadata_array_init(&s->trailing_md);
  flag_init(s, &s->start, false);
  flag_init(s, &s->write, true);
  s->write.ok = true; /* No write in flight yet. */
  flag_init(s, &s->finish, true);
  flag_init(s, &s->status, false);
  start_batches(c, s);
  *ret_stream = s;
  return 0;
}

/* Waits until the message in flight (if any) was taken; false if its
 * write failed. */
static bool wait_write(struct rpc_client_cstream *s) {
  wait_flag(s, &s->write);
  if (s->send_buf) {
    grpc_byte_buffer_destroy(s->send_buf);
    s->send_buf = NULL;
  }
  return s->write.ok;
}

int rpc_client_cstream_write(struct rpc_client_cstream *s, const ProtobufCMessage *msg) {
  if (!msg) return STK_EINVAL;
  /* A failed write means the call ended; finish tells why. */
  if (!wait_write(s)) return STK_ECANCELED;
  grpc_byte_buffer *bb = rpc_pack(msg);
  if (!bb) return STK_ENOMEM;
  grpc_op op;
  memset(&op, 0, sizeof(op));
  op.op = GRPC_OP_SEND_MESSAGE;
  op.data.send_message.send_message = bb;
  s->send_buf = bb; /* gRPC reads it until the batch completes. */
  if (!start(s, &op, 1, &s->write)) {
    wait_write(s);
    return STK_ECANCELED;
  }
  return 0;
}

static void stream_free(struct rpc_client_cstream *s) {
  grpc_call_unref(s->call);
  if (s->send_buf) grpc_byte_buffer_destroy(s->send_buf);
  if (s->recv_buf) grpc_byte_buffer_destroy(s->recv_buf);
  grpc_metadata_array_destroy(&s->initial_md);
  grpc_metadata_array_destroy(&s->trailing_md);
  grpc_slice_unref(s->details);
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

static void half_close(struct rpc_client_cstream *s) {
  grpc_op ops[3];
  memset(ops, 0, sizeof(ops));
  ops[0].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[1].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[1].data.recv_initial_metadata.recv_initial_metadata = &s->initial_md;
  ops[2].op = GRPC_OP_RECV_MESSAGE;
  ops[2].data.recv_message.recv_message = &s->recv_buf;
  start(s, ops, 3, &s->finish);
}

void rpc_client_cstream_set_notify(struct rpc_client_cstream *s, void (*notify)(void *arg),
                                   void *arg) {
  pthread_mutex_lock(&s->mu);
  s->notify = notify;
  s->notify_arg = arg;
  pthread_mutex_unlock(&s->mu);
}

bool rpc_client_cstream_write_ready(struct rpc_client_cstream *s) {
  pthread_mutex_lock(&s->mu);
  bool ready = s->write.done;
  pthread_mutex_unlock(&s->mu);
  return ready;
}

void rpc_client_cstream_close_send(struct rpc_client_cstream *s) {
  if (s->closed) return;
  wait_write(s); /* The close goes after the last message. */
  half_close(s);
  s->closed = true;
}

bool rpc_client_cstream_ended(struct rpc_client_cstream *s) {
  pthread_mutex_lock(&s->mu);
  bool ended = s->closed && s->finish.done && s->status.done && s->start.done;
  pthread_mutex_unlock(&s->mu);
  return ended;
}

int rpc_client_cstream_end(struct rpc_client_cstream *s, ProtobufCMessage **ret_resp,
                           struct rpc_status *ret_st) {
  rpc_client_cstream_close_send(s);
  wait_flag(s, &s->finish);
  wait_flag(s, &s->status);
  wait_flag(s, &s->start);
  struct rpc_status st;
  rpc_status_set(&st, (int)s->code, s->details);
  ProtobufCMessage *resp = NULL;
  if (st.code == RPC_OK && !(resp = rpc_unpack(s->recv_buf, s->resp_desc, NULL, 0))) {
    st.code = RPC_INTERNAL;
    snprintf(st.message, sizeof(st.message), "malformed or missing reply");
  }
  if (ret_st) *ret_st = st;
  if (st.code != RPC_OK) return stk_error_from_grpc(st.code);
  if (ret_resp)
    *ret_resp = resp;
  else
    protobuf_c_message_free_unpacked(resp, NULL);
  return 0;
}

void rpc_client_cstream_cancel(struct rpc_client_cstream *s) {
  grpc_call_cancel(s->call, NULL);
}

void rpc_client_cstream_free(struct rpc_client_cstream *s) {
  if (s) stream_free(s);
}

int rpc_client_cstream_finish(struct rpc_client_cstream *s, ProtobufCMessage **ret_resp,
                              struct rpc_status *ret_st) {
  int err = rpc_client_cstream_end(s, ret_resp, ret_st);
  stream_free(s);
  return err;
}
