/*
 * Read: a server stream of ReadChunks for the boxes a rank asks for, with
 * one chunk outstanding. The core calls on_piece per assembled piece; the
 * piece is packed and sent, and the core is told to hold further pieces
 * until the transport took this one (sent), so memory stays bounded by one
 * piece in the core and one in gRPC whatever the client's speed.
 *
 * A message whose pieces' bytes are in packed_data (the request asked for
 * pack_data) is sent borrowing them: the head is packed, the bytes follow
 * as they lie in the batch's assembled buffer, held until gRPC is done
 * with them (ckpt_read_hold_data), so the service copies none of them.
 *
 * The record lives until the core's done ran and no send is outstanding;
 * the call is finished then with the core's status (DATA_LOSS names the
 * object and block of a CRC mismatch).
 */
#include <stdio.h>
#include <stdlib.h>

#include "ckpt_rpc_internal.h"
#include "stk_error.h"

struct reader {
  struct rpc_call *call;
  struct ckpt_reader *r; /* NULL once done ran (or before ckpt_read returned). */
  bool sending, done;
  int code;
  char msg[512];
};

static void finish(struct reader *x) {
  rpc_finish(x->call, x->code, "%s", x->msg);
  free(x);
}

static void sent(struct rpc_call *call, int err, void *arg) {
  struct reader *x = arg;
  x->sending = false;
  if (x->done)
    finish(x);
  else if (err)
    ckpt_read_cancel(x->r); /* done runs now and finishes. */
  else
    ckpt_read_resume(x->r);
}

/* Sends piece, its packed_data borrowed (a copy packed when none could be
 * held). */
static int send_borrowed(struct reader *x, const Stoker__V1__ReadChunk *piece) {
  void *hold = piece->packed_data.len > 0 ? ckpt_read_hold_data(x->r) : NULL;
  if (!hold) return rpc_send(x->call, &piece->base, sent, x);
  Stoker__V1__ReadChunk head = *piece;
  head.packed_data = (ProtobufCBinaryData){0};
  uint32_t field = protobuf_c_message_descriptor_get_field_by_name(
                       &stoker__v1__read_chunk__descriptor, "packed_data")
                       ->id; /* Derived from the proto, as the dataloader's tokens. */
  return rpc_send_borrowed(x->call, &head.base, field, piece->packed_data.data,
                           piece->packed_data.len, ckpt_read_release_data, hold, sent, x);
}

static bool on_piece(void *arg, const Stoker__V1__ReadChunk *piece) {
  struct reader *x = arg;
  if (send_borrowed(x, piece) == 0) {
    x->sending = true;
    return false; /* Held until sent. */
  }
  return false; /* Call gone: on_cancel cancels the read. */
}

static void on_done(void *arg, int err, const char *errmsg, const ProtobufCMessage *resp) {
  struct reader *x = arg;
  x->r = NULL;
  x->done = true;
  x->code = err ? stk_error_to_grpc(err) : RPC_OK;
  snprintf(x->msg, sizeof(x->msg), "%s",
           err ? (errmsg && errmsg[0] ? errmsg : stk_strerror(err)) : "");
  if (!x->sending) finish(x);
}

static void on_cancel(struct rpc_call *call, void *arg) {
  struct reader *x = arg;
  if (x->r && !x->done) ckpt_read_cancel(x->r);
}

void ckpt_rpc_read(struct rpc_call *call, struct ckpt_rpc *a, const Stoker__V1__ReadRequest *req) {
  if (a->draining) {
    rpc_finish(call, RPC_UNAVAILABLE, "checkpoint service is shutting down; retry");
    return;
  }
  struct reader *x = calloc(1, sizeof(*x));
  if (!x) {
    rpc_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  x->call = call;
  x->r = ckpt_read(a->svc, req, on_piece, on_done, x);
  if (!x->done) rpc_on_cancel(call, on_cancel, x);
}
