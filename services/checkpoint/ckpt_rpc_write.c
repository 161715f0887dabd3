/*
 * Write: a rank's client stream of WriteChunks fed to the core's writer.
 * One message is read at a time; when the core answers CKPT_WRITE_WAIT the
 * chunk is held and nothing more is read until CKPT_WRITE_RESUME, so a full
 * staging budget pushes back on the rank through gRPC flow control.
 *
 * The first chunk names the attempt and rank (every later one must repeat
 * them, or leave the attempt empty) and opens the core's writer. A bad
 * stream aborts the attempt like a bad chunk (the core checks each chunk's
 * attempt and rank; a malformed message is reported to the core). After the chunk marked `last` the
 * reply goes out when the core says STAGED, or DURABLE when the rank asked wait_durable. The writer
 * is kept after the reply until the rank is durable (for the uploaded-bytes metric); a stream that
 * ends or is cancelled before `last` leaves the rank unfinished, so the attempt cannot commit until
 * another stream finishes the rank.
 *
 * The record lives until the call is finished, no receive is outstanding
 * and the writer is closed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_rpc_internal.h"
#include "stk_error.h"

struct ckpt_rpc_writer {
  struct ckpt_rpc *a;
  struct rpc_call *call; /* NULL once finished. */
  struct ckpt_rpc_writer *prev, *next;
  struct ckpt_writer *w; /* NULL before the first chunk and once closed. */
  char attempt[64];
  uint32_t rank;
  Stoker__V1__WriteChunk *held; /* Fed again after CKPT_WRITE_RESUME. */
  bool receiving, last_fed, wait_durable;
};

static void recv_next(struct ckpt_rpc_writer *x);

static void maybe_free(struct ckpt_rpc_writer *x) {
  if (x->call || x->receiving || x->w) return;
  if (x->held) stoker__v1__write_chunk__free_unpacked(x->held, NULL);
  if (x->prev)
    x->prev->next = x->next;
  else
    x->a->writers = x->next;
  if (x->next) x->next->prev = x->prev;
  free(x);
}

static void close_writer(struct ckpt_rpc_writer *x) {
  if (x->w) ckpt_write_close(x->w);
  x->w = NULL;
}

/* Fails the call (once) and drops the writer: what it consumed stays, but
 * the rank is left unfinished. */
static void fail(struct ckpt_rpc_writer *x, int code, const char *fmt, const char *detail) {
  close_writer(x);
  if (x->call) {
    struct rpc_call *c = x->call;
    x->call = NULL;
    rpc_fail(c, code, fmt, detail);
  }
  maybe_free(x);
}

static void reply(struct ckpt_rpc_writer *x, bool durable) {
  if (!x->call) return;
  Stoker__V1__WriteResponse r = STOKER__V1__WRITE_RESPONSE__INIT;
  r.bytes_staged = x->w ? ckpt_write_bytes(x->w) : 0;
  r.durable = durable;
  r.staged = true; /* Every reply comes after "last" was consumed. */
  struct rpc_call *c = x->call;
  x->call = NULL;
  rpc_reply(c, &r.base);
}

static void on_event(void *arg, enum ckpt_write_event ev, int err, const char *errmsg);

/* Feeds x->held. Returns true when the stream may read on. */
static bool feed_held(struct ckpt_rpc_writer *x) {
  Stoker__V1__WriteChunk *ch = x->held;
  uint64_t before = ckpt_write_bytes(x->w);
  int rc = ckpt_write_feed(x->w, ch);
  if (rc == CKPT_WRITE_WAIT) return false;
  if (rc < 0) {
    const char *d = stk_detail();
    fail(x, stk_error_to_grpc(rc), "%s", d && d[0] ? d : stk_strerror(rc));
    return false;
  }
  if (x->a->bytes_staged) metric_counter_add(x->a->bytes_staged, ckpt_write_bytes(x->w) - before);
  x->last_fed = ch->last;
  x->wait_durable = ch->wait_durable;
  x->held = NULL;
  stoker__v1__write_chunk__free_unpacked(ch, NULL);
  return !x->last_fed;
}

/* The first chunk opens the writer; later ones must name the same rank. */
static int bind_writer(struct ckpt_rpc_writer *x, const Stoker__V1__WriteChunk *ch) {
  if (x->w) return 0; /* The core checks that the chunk names the stream's attempt and rank. */
  if (strlen(ch->attempt) >= sizeof(x->attempt)) {
    fail(x, RPC_INVALID_ARGUMENT, "%s", "attempt id too long");
    return -1;
  }
  const char *job = ckpt_service_attempt_job(x->a->svc, ch->attempt);
  char why[400]; /* Refused before it can touch the attempt. */
  if (job && rpc_call_denies_job(x->call, job, why, sizeof why)) {
    fail(x, RPC_PERMISSION_DENIED, "%s", why);
    return -1;
  }
  stk_clear_detail();
  int rc = ckpt_write_open(x->a->svc, ch->attempt, ch->rank, on_event, x, &x->w);
  if (rc < 0) {
    const char *d = stk_detail();
    x->w = NULL;
    fail(x, stk_error_to_grpc(rc), "%s", d && d[0] ? d : stk_strerror(rc));
    return -1;
  }
  snprintf(x->attempt, sizeof(x->attempt), "%s", ch->attempt);
  x->rank = ch->rank;
  return 0;
}

static void got(struct rpc_call *call, ProtobufCMessage *msg, int err, void *arg) {
  struct ckpt_rpc_writer *x = arg;
  x->receiving = false;
  if (err < 0 || !x->call) {
    if (msg) protobuf_c_message_free_unpacked(msg, NULL);
    if (err == STK_EINVAL && x->w && x->call) {
      ckpt_write_abort(x->w, STK_EINVAL, "malformed WriteChunk");
      fail(x, RPC_INVALID_ARGUMENT, "%s", stk_detail());
      return;
    }
    fail(x, err == STK_EINVAL ? RPC_INVALID_ARGUMENT : RPC_CANCELLED, "%s",
         err == STK_EINVAL ? "malformed WriteChunk" : "cancelled before the last chunk");
    return;
  }
  if (!msg) {
    fail(x, RPC_FAILED_PRECONDITION, "%s",
         "stream ended before a chunk marked last; the rank is not finished");
    return;
  }
  Stoker__V1__WriteChunk *ch = (Stoker__V1__WriteChunk *)msg;
  if (bind_writer(x, ch) < 0) {
    protobuf_c_message_free_unpacked(msg, NULL);
    return;
  }
  x->held = ch;
  if (feed_held(x)) recv_next(x);
}

static void recv_next(struct ckpt_rpc_writer *x) {
  int rc = rpc_recv(x->call, got, x);
  if (rc == 0)
    x->receiving = true;
  else
    fail(x, RPC_CANCELLED, "%s", "cancelled before the last chunk");
}

static void on_event(void *arg, enum ckpt_write_event ev, int err, const char *errmsg) {
  struct ckpt_rpc_writer *x = arg;
  switch (ev) {
  case CKPT_WRITE_RESUME:
    if (x->held && x->call && feed_held(x)) recv_next(x);
    break;
  case CKPT_WRITE_STAGED:
    if (!x->wait_durable) reply(x, false);
    break;
  case CKPT_WRITE_DURABLE:
    if (x->a->bytes_uploaded && x->w)
      metric_counter_add(x->a->bytes_uploaded, ckpt_write_bytes(x->w));
    reply(x, true);
    close_writer(x);
    maybe_free(x);
    break;
  case CKPT_WRITE_FAILED:
    fail(x, stk_error_to_grpc(err), "%s", errmsg && errmsg[0] ? errmsg : stk_strerror(err));
    break;
  }
}

/* A cancel with a receive outstanding is handled when the receive fails. */
static void on_cancel(struct rpc_call *call, void *arg) {
  struct ckpt_rpc_writer *x = arg;
  if (x->receiving || !x->call) return;
  if (x->last_fed) { /* The rank is finished: keep the writer for DURABLE. */
    x->call = NULL;
    rpc_fail(call, RPC_CANCELLED, "cancelled");
    return;
  }
  fail(x, RPC_CANCELLED, "%s", "cancelled before the last chunk");
}

void ckpt_rpc_write(struct rpc_call *call, struct ckpt_rpc *a) {
  if (a->draining) {
    rpc_fail(call, RPC_UNAVAILABLE, "checkpoint service is shutting down; retry");
    return;
  }
  struct ckpt_rpc_writer *x = calloc(1, sizeof(*x));
  if (!x) {
    rpc_fail(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  *x = (struct ckpt_rpc_writer){.a = a, .call = call, .next = a->writers};
  if (a->writers) a->writers->prev = x;
  a->writers = x;
  rpc_on_cancel(call, on_cancel, x);
  recv_next(x);
}

void ckpt_rpc_writers_detach(struct ckpt_rpc *a) {
  for (struct ckpt_rpc_writer *x = a->writers, *next; x; x = next) {
    next = x->next;
    close_writer(x);
    maybe_free(x);
  }
}
