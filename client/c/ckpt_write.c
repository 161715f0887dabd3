/*
 * A rank's write path: one client-streaming Write call per (attempt, rank).
 * Each write blocks until the transport took the message (rpc_client_cstream),
 * so when the service's staging memory is full and it stops reading, HTTP/2
 * flow control holds the rank back: no unbounded buffering anywhere. Boxes
 * larger than one message are cut into runs of whole rows, each sent as a
 * box of its own (the service checks coverage, so the pieces must tile the
 * box exactly, which they do by construction). The save machine
 * (ckpt_save.c) drives a writer: open, write..., end; ending and freeing
 * are apart so that the client's close may cancel a stream whose end a
 * save's thread waits for.
 *
 * When the service is on this host the bytes go through shared memory
 * instead (ckpt_seg.c): pieces are cut at the segment size and only their
 * metadata is sent; if a segment cannot be written the writer falls back
 * to bytes for the rest of the stream (a piece then cut to messages, each
 * sent as the stream takes it, as held messages are). Which path is the service's answer
 * to GetStagingInfo, asked at the first piece without waiting
 * (ckpt_writer_decide): a save on the client's engine yields until the
 * answer is in and the client's close cancels the call. A completed
 * segment's chunk messages are likewise sent one at a time as the stream
 * takes them (ckpt_writer_send_held), never in one burst that waits on
 * the service; the blocking writer calls send them in a loop.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"
#include "client_internal.h"

#define DEFAULT_MAX_CHUNK_BYTES ((size_t)4 << 20)

struct stk_ckpt_writer {
  struct stk_client *c;
  struct rpc_client_cstream *s;
  char attempt[STK_CKPT_ATTEMPT_MAX];
  uint32_t rank;
  size_t max_chunk_bytes;
  bool failed;    /* A write failed: the call is over, finish tells why. */
  bool last_sent; /* "last" sent and the half-close started (send_last). */
  int shm_mode;
  bool shm_decided;     /* The path is known (GetStagingInfo answered, at the first write). */
  bool asking;          /* GetStagingInfo started on ask. */
  bool fall_back;       /* A segment could not be written: bytes once its messages went. */
  struct waiter ask;    /* GetStagingInfo (initialised at open). */
  struct ckpt_seg *shm; /* NULL: bytes over gRPC. */
  void (*notify)(void *arg);
  void *notify_arg;
  /* A piece larger than a message after the fall-back (rest.box set, until
   * rest.done): its runs after the first go as held messages. */
  struct ckpt_put rest;
  struct stk_ckpt_box rest_box;
  uint64_t rest_off[STK_CKPT_MAX_DIMS], rest_sz[STK_CKPT_MAX_DIMS];
};

/* Emits one piece (a box that fits) on w's current path. */
typedef int (*emit_fn)(struct stk_ckpt_writer *w, Stoker__V1__WriteChunk *m, const uint8_t *data,
                       size_t len);

int stk_ckpt_writer_open(struct stk_client *c, const char *attempt, uint32_t rank,
                         int64_t timeout_ms, struct stk_ckpt_writer **ret_writer) {
  if (!c || !attempt || !attempt[0] || strlen(attempt) >= STK_CKPT_ATTEMPT_MAX || !ret_writer)
    return client_fail(STK_EINVAL, "open writer");
  char id[STK_CKPT_ATTEMPT_MAX];
  int err = ckpt_route(c, attempt, id, &c); /* The replica owning the attempt. */
  if (err < 0) return err;
  struct stk_ckpt_writer *w = calloc(1, sizeof(*w));
  if (!w) return client_fail(STK_ENOMEM, "open writer");
  snprintf(w->attempt, sizeof(w->attempt), "%s", id);
  w->c = c;
  w->rank = rank;
  w->max_chunk_bytes = DEFAULT_MAX_CHUNK_BYTES;
  w->shm_mode = ckpt_seg_mode_from_env();
  err = rpc_client_cstream_open(client_rpc(c), CKPT_METHOD(write, (Stoker__V1__WriteChunk *)NULL),
                                &stoker__v1__write_response__descriptor,
                                timeout_ms > 0 ? timeout_ms : 0, &w->s);
  if (err < 0) {
    free(w);
    return client_fail(err, "open writer");
  }
  waiter_init(&w->ask);
  *ret_writer = w;
  return 0;
}

void stk_ckpt_writer_set_max_chunk(struct stk_ckpt_writer *w, size_t max_chunk_bytes) {
  w->max_chunk_bytes = max_chunk_bytes > 0 ? max_chunk_bytes : 1;
}

void stk_ckpt_writer_set_shm(struct stk_ckpt_writer *w, enum stk_ckpt_shm_mode mode) {
  if (w && !w->shm_decided) w->shm_mode = (int)mode;
}

bool stk_ckpt_writer_shm_active(const struct stk_ckpt_writer *w) {
  return w && w->shm;
}

/* Sends one message (a box that fits, or the final "last" marker). */
static int send_chunk(struct stk_ckpt_writer *w, Stoker__V1__WriteChunk *m) {
  if (w->failed) return STK_ECANCELED;
  m->attempt = w->attempt;
  m->rank = w->rank;
  int err = rpc_client_cstream_write(w->s, &m->base);
  if (err < 0) {
    w->failed = true;
    client_set_error(1, "the checkpoint service ended the stream (finish tells why)");
  }
  return err;
}

static struct ckpt_cut plan_cut(const struct stk_ckpt_box *box, size_t elem, size_t max_bytes) {
  struct ckpt_cut k = {.d = box->ndim - 1, .row_bytes = elem};
  uint64_t below = elem;
  for (size_t d = box->ndim; d-- > 0;) {
    /* below = bytes of one index of dim d. */
    if (below > max_bytes) break;
    k.d = d;
    k.row_bytes = below;
    below *= box->sizes[d];
  }
  k.rows = max_bytes / k.row_bytes;
  if (k.rows == 0) k.rows = 1;
  return k;
}

/* Emits p's next piece (the next run of rows, or the whole box when it
 * fits) with emit, and moves p on. */
static int put_piece(struct stk_ckpt_writer *w, struct ckpt_put *p, emit_fn emit) {
  const struct stk_ckpt_box *box = p->box;
  Stoker__V1__WriteChunk m = STOKER__V1__WRITE_CHUNK__INIT;
  m.tensor = (char *)p->tensor;
  m.dtype = (Stoker__V1__DType)p->dtype; /* Same numbers. */
  m.n_global_shape = box->ndim;
  m.global_shape = (uint64_t *)p->global_shape;
  Stoker__V1__Box bm;
  if (p->whole) {
    ckpt_box_msg(box, &bm);
    m.box = &bm;
    p->done = true;
    return emit(w, &m, p->data, p->len);
  }
  const struct ckpt_cut *k = &p->k;
  uint64_t off[STK_CKPT_MAX_DIMS], sz[STK_CKPT_MAX_DIMS];
  struct stk_ckpt_box piece = {.ndim = box->ndim, .offsets = off, .sizes = sz};
  uint64_t lin = 0; /* Linear index of (idx[0..d-1], 0) in units of dim d's rows. */
  for (size_t i = 0; i < k->d; i++) lin = lin * box->sizes[i] + p->idx[i];
  lin *= box->sizes[k->d];
  for (size_t i = 0; i < box->ndim; i++) {
    off[i] = box->offsets[i] + (i < k->d ? p->idx[i] : 0);
    sz[i] = i < k->d ? 1 : box->sizes[i];
  }
  uint64_t j = p->j;
  off[k->d] = box->offsets[k->d] + j;
  sz[k->d] = box->sizes[k->d] - j < k->rows ? box->sizes[k->d] - j : k->rows;
  ckpt_box_msg(&piece, &bm);
  m.box = &bm;
  p->j += k->rows;
  if (p->j >= box->sizes[k->d]) {
    p->j = 0;
    size_t i = k->d; /* Odometer over dims [0, d). */
    while (i > 0 && ++p->idx[i - 1] == box->sizes[i - 1]) p->idx[--i] = 0;
    p->done = i == 0;
  }
  return emit(w, &m, p->data + (lin + j) * k->row_bytes, sz[k->d] * k->row_bytes);
}

/* Sets p up for box, cut to pieces of at most max bytes. */
static void put_plan(struct ckpt_put *p, const struct stk_ckpt_box *box, size_t elem, size_t max) {
  p->box = box;
  p->whole = p->len <= max;
  if (!p->whole) p->k = plan_cut(box, elem, max);
  memset(p->idx, 0, sizeof(p->idx));
  p->j = 0;
  p->done = false;
}

static int emit_grpc(struct stk_ckpt_writer *w, Stoker__V1__WriteChunk *m, const uint8_t *data,
                     size_t len) {
  m->data.data = (uint8_t *)data;
  m->data.len = len;
  return send_chunk(w, m);
}

static int send_cb(void *arg, Stoker__V1__WriteChunk *m) {
  return send_chunk(arg, m);
}

/* Sends the box in m (its bytes at data) over gRPC, cut to fit messages:
 * the first now, the others held (w->rest, ckpt_writer_send_held). The
 * name, shape and bytes stay the piece's owner's until they are sent. */
static int emit_bytes(struct stk_ckpt_writer *w, Stoker__V1__WriteChunk *m, const uint8_t *data,
                      size_t len) {
  if (len <= w->max_chunk_bytes) return emit_grpc(w, m, data, len);
  const Stoker__V1__Box *b = m->box;
  memcpy(w->rest_off, b->offsets, b->n_offsets * sizeof(*w->rest_off));
  memcpy(w->rest_sz, b->sizes, b->n_sizes * sizeof(*w->rest_sz));
  w->rest_box = (struct stk_ckpt_box){b->n_offsets, w->rest_off, w->rest_sz};
  w->rest = (struct ckpt_put){.tensor = m->tensor,
                              .dtype = (enum stk_dtype)m->dtype,
                              .global_shape = m->global_shape,
                              .data = data,
                              .len = len};
  put_plan(&w->rest, &w->rest_box, stk_ckpt_dtype_size(w->rest.dtype), w->max_chunk_bytes);
  return put_piece(w, &w->rest, emit_grpc);
}

/* Runs of a fallen-back piece wait to be sent. */
static bool rest_holds(const struct stk_ckpt_writer *w) {
  return w->rest.box && !w->rest.done;
}

/* Through the segment (CKPT_LATER while a completed segment's messages
 * wait); if it cannot be written, the segment so far is sent and then
 * this piece and the rest of the stream go as bytes. */
static int emit_shm(struct stk_ckpt_writer *w, Stoker__V1__WriteChunk *m, const uint8_t *data,
                    size_t len) {
  if (w->shm && w->fall_back) {
    if (ckpt_seg_holds(w->shm)) return CKPT_LATER;
    ckpt_seg_free(w->shm);
    w->shm = NULL;
  }
  if (!w->shm) return emit_bytes(w, m, data, len); /* Fell back at an earlier piece. */
  int err = ckpt_seg_append(w->shm, m, data, len);
  if (err != STK_EIO) return err;
  w->fall_back = true;
  err = ckpt_seg_complete(w->shm);
  return err < 0 ? err : CKPT_LATER;
}

int ckpt_writer_decide(struct stk_ckpt_writer *w) {
  if (w->shm_decided) return 0;
  if (w->shm_mode != STK_CKPT_SHM_OFF) {
    if (!w->asking) {
      w->asking = true;
      w->ask.notify = w->notify, w->ask.notify_arg = w->notify_arg;
      ckpt_seg_ask(w->c, &w->ask); /* A start that fails leaves ask done with why. */
    }
    if (!waiter_ended(&w->ask)) return CKPT_LATER;
  }
  w->shm_decided = true;
  return ckpt_seg_open(&w->ask, w->attempt, w->rank, w->shm_mode, &w->shm);
}

/* At the first write: which path the stream takes (waits for the answer). */
static int decide_path(struct stk_ckpt_writer *w) {
  int err = ckpt_writer_decide(w);
  if (err != CKPT_LATER) return err;
  waiter_join(&w->ask);
  return ckpt_writer_decide(w);
}

bool ckpt_writer_holds(const struct stk_ckpt_writer *w) {
  return rest_holds(w) || (w->shm && ckpt_seg_holds(w->shm));
}

int ckpt_writer_send_held(struct stk_ckpt_writer *w) {
  if (rest_holds(w)) return put_piece(w, &w->rest, emit_grpc);
  return w->shm ? ckpt_seg_send_held(w->shm, send_cb, w) : 0;
}

int ckpt_writer_seal(struct stk_ckpt_writer *w) {
  return w->shm ? ckpt_seg_complete(w->shm) : 0;
}

/* Sends every held message (the blocking calls: each waits on flow
 * control). */
static int send_held_all(struct stk_ckpt_writer *w) {
  int err = 0;
  while (!err && ckpt_writer_holds(w)) err = ckpt_writer_send_held(w);
  return err;
}

int ckpt_put_start(struct stk_ckpt_writer *w, struct ckpt_put *p, const char *tensor,
                   enum stk_dtype dtype, const uint64_t *global_shape,
                   const struct stk_ckpt_box *box, const void *data, size_t len) {
  size_t elem = stk_ckpt_dtype_size(dtype);
  if (!w || !tensor || !tensor[0] || !elem || !global_shape || !ckpt_box_valid(box, global_shape) ||
      !data || stk_ckpt_box_elems(box) > UINT64_MAX / elem || len != stk_ckpt_box_elems(box) * elem)
    return client_fail(STK_EINVAL, "write chunk");
  int err = decide_path(w);
  if (err < 0) return err;
  *p = (struct ckpt_put){.tensor = tensor,
                         .dtype = dtype,
                         .global_shape = global_shape,
                         .data = data,
                         .len = len,
                         .shm = w->shm != NULL};
  put_plan(p, box, elem, w->shm ? (size_t)ckpt_seg_segment_bytes(w->shm) : w->max_chunk_bytes);
  return 0;
}

int ckpt_put_next(struct stk_ckpt_writer *w, struct ckpt_put *p) {
  struct ckpt_put before = *p;
  int err = put_piece(w, p, p->shm ? emit_shm : emit_grpc);
  if (err == CKPT_LATER) *p = before; /* Not emitted: the same piece next time. */
  return err;
}

int stk_ckpt_write_chunk(struct stk_ckpt_writer *w, const char *tensor, enum stk_dtype dtype,
                         const uint64_t *global_shape, const struct stk_ckpt_box *box,
                         const void *data, size_t len) {
  struct ckpt_put p;
  int err = ckpt_put_start(w, &p, tensor, dtype, global_shape, box, data, len);
  while (!err && !p.done) {
    err = ckpt_put_next(w, &p);
    if (err >= 0) err = send_held_all(w); /* Every message out before the caller's bytes go. */
  }
  return err;
}

int stk_ckpt_writer_finish(struct stk_ckpt_writer *w, bool wait_durable, uint64_t *ret_bytes,
                           bool *ret_durable) {
  if (!w) return client_fail(STK_EINVAL, "finish writer");
  int err = ckpt_writer_end(w, true, wait_durable, ret_bytes, ret_durable);
  ckpt_writer_free(w);
  return err;
}

void stk_ckpt_writer_abort(struct stk_ckpt_writer *w) {
  if (!w) return;
  ckpt_writer_end(w, false, false, NULL, NULL);
  ckpt_writer_free(w);
}

bool ckpt_writer_failed(const struct stk_ckpt_writer *w) {
  return w->failed;
}

/* Ends the stream without "last": the segment not handed over is removed. */
static void end_quietly(struct stk_ckpt_writer *w) {
  ckpt_seg_free(w->shm);
  w->shm = NULL;
  rpc_client_cstream_end(w->s, NULL, NULL);
}

int ckpt_writer_send_last(struct stk_ckpt_writer *w, bool wait_durable) {
  int err = w->shm ? ckpt_seg_flush(w->shm, send_cb, w) : 0;
  if (err < 0 && !w->failed) { /* Chunks not sent: "last" would commit without them. */
    end_quietly(w);
    return client_fail(err, "finish writer: shm segment");
  }
  ckpt_seg_free(w->shm);
  w->shm = NULL;
  Stoker__V1__WriteChunk m = STOKER__V1__WRITE_CHUNK__INIT;
  m.tensor = "";
  m.last = true;
  m.wait_durable = wait_durable;
  send_chunk(w, &m); /* On failure the status tells why. */
  w->last_sent = true;
  return 0;
}

void ckpt_writer_close_send(struct stk_ckpt_writer *w) {
  rpc_client_cstream_close_send(w->s);
}

bool ckpt_writer_ended(struct stk_ckpt_writer *w) {
  return rpc_client_cstream_ended(w->s);
}

bool ckpt_writer_ready(struct stk_ckpt_writer *w) {
  return rpc_client_cstream_write_ready(w->s);
}

void ckpt_writer_set_notify(struct stk_ckpt_writer *w, void (*notify)(void *arg), void *arg) {
  w->notify = notify, w->notify_arg = arg; /* For GetStagingInfo, started later. */
  rpc_client_cstream_set_notify(w->s, notify, arg);
}

int ckpt_writer_end(struct stk_ckpt_writer *w, bool last, bool wait_durable, uint64_t *ret_bytes,
                    bool *ret_durable) {
  if (!last) {
    end_quietly(w);
    return 0;
  }
  int err = w->last_sent ? 0 : ckpt_writer_send_last(w, wait_durable);
  if (err < 0) return err;
  ProtobufCMessage *resp = NULL;
  struct rpc_status st;
  err = rpc_client_cstream_end(w->s, &resp, &st);
  if (err < 0) {
    client_set_error(st.code, "%s", st.message);
    return err;
  }
  const Stoker__V1__WriteResponse *r = (const Stoker__V1__WriteResponse *)resp;
  if (ret_bytes) *ret_bytes = r->bytes_staged;
  if (ret_durable) *ret_durable = r->durable;
  protobuf_c_message_free_unpacked(resp, NULL);
  return 0;
}

void ckpt_writer_cancel(struct stk_ckpt_writer *w) {
  rpc_client_cstream_cancel(w->s);
  waiter_cancel(&w->ask); /* Also one not started yet: it never will. */
}

void ckpt_writer_free(struct stk_ckpt_writer *w) {
  if (!w) return;
  if (w->asking) { /* Its callback (and notify) must be over. */
    waiter_cancel(&w->ask);
    waiter_join(&w->ask);
  }
  waiter_close(&w->ask);
  ckpt_seg_free(w->shm);
  rpc_client_cstream_free(w->s);
  free(w);
}
