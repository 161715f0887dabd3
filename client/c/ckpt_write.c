/*
 * A rank's write path: one client-streaming Write call per (attempt, rank).
 * Each write blocks until the transport took the message (rpc_client_cstream),
 * so when the service's staging memory is full and it stops reading, HTTP/2
 * flow control holds the rank back: no unbounded buffering anywhere. Boxes
 * larger than one message are cut into runs of whole rows, each sent as a
 * box of its own (the service checks coverage, so the pieces must tile the
 * box exactly, which they do by construction). stk_ckpt_save is the
 * sequence open, write..., finish; its async twin runs it on a thread.
 *
 * When the service is on this host the bytes go through shared memory
 * instead (ckpt_seg.c): pieces are cut at the segment size and only their
 * metadata is sent; if a segment cannot be written the writer falls back
 * to bytes for the rest of the stream.
 */
#include <pthread.h>
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
  bool failed; /* A write failed: the call is over, finish tells why. */
  int shm_mode;
  bool shm_decided;     /* GetStagingInfo asked (at the first write). */
  struct ckpt_seg *shm; /* NULL: bytes over gRPC. */
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

/* The geometry of cutting one box into runs of whole rows along dim d. */
struct cut {
  size_t d;           /* Dims before d are taken one index at a time. */
  uint64_t row_bytes; /* Bytes of one index of dim d (whole trailing dims). */
  uint64_t rows;      /* Indices of dim d per piece. */
};

static struct cut plan_cut(const struct stk_ckpt_box *box, size_t elem, size_t max_bytes) {
  struct cut k = {.d = box->ndim - 1, .row_bytes = elem};
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

/* Emits the pieces of a box too large for one message (or segment). */
static int write_pieces(struct stk_ckpt_writer *w, Stoker__V1__WriteChunk *m,
                        const struct stk_ckpt_box *box, const uint8_t *data, struct cut k,
                        emit_fn emit) {
  uint64_t idx[STK_CKPT_MAX_DIMS] = {0}, off[STK_CKPT_MAX_DIMS], sz[STK_CKPT_MAX_DIMS];
  struct stk_ckpt_box piece = {.ndim = box->ndim, .offsets = off, .sizes = sz};
  Stoker__V1__Box bm;
  for (;;) {
    uint64_t lin = 0; /* Linear index of (idx[0..d-1], 0) in units of dim d's rows. */
    for (size_t i = 0; i < k.d; i++) lin = lin * box->sizes[i] + idx[i];
    lin *= box->sizes[k.d];
    for (size_t i = 0; i < box->ndim; i++) {
      off[i] = box->offsets[i] + (i < k.d ? idx[i] : 0);
      sz[i] = i < k.d ? 1 : box->sizes[i];
    }
    for (uint64_t j = 0; j < box->sizes[k.d]; j += k.rows) {
      off[k.d] = box->offsets[k.d] + j;
      sz[k.d] = box->sizes[k.d] - j < k.rows ? box->sizes[k.d] - j : k.rows;
      ckpt_box_msg(&piece, &bm);
      m->box = &bm;
      int err = emit(w, m, data + (lin + j) * k.row_bytes, sz[k.d] * k.row_bytes);
      if (err < 0) return err;
    }
    size_t i = k.d; /* Odometer over dims [0, d). */
    while (i > 0 && ++idx[i - 1] == box->sizes[i - 1]) idx[--i] = 0;
    if (i == 0) return 0;
  }
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

/* Sends the box in m (its bytes at data) over gRPC, cut to fit messages. */
static int emit_bytes(struct stk_ckpt_writer *w, Stoker__V1__WriteChunk *m, const uint8_t *data,
                      size_t len) {
  if (len <= w->max_chunk_bytes) return emit_grpc(w, m, data, len);
  const Stoker__V1__Box *b = m->box;
  uint64_t off[STK_CKPT_MAX_DIMS], sz[STK_CKPT_MAX_DIMS];
  memcpy(off, b->offsets, b->n_offsets * sizeof(*off));
  memcpy(sz, b->sizes, b->n_sizes * sizeof(*sz));
  struct stk_ckpt_box box = {.ndim = b->n_offsets, .offsets = off, .sizes = sz};
  struct cut k = plan_cut(&box, stk_ckpt_dtype_size((enum stk_dtype)m->dtype), w->max_chunk_bytes);
  return write_pieces(w, m, &box, data, k, emit_grpc);
}

/* Through the segment; if it cannot be written, the segment so far is
 * sent and the rest of the stream goes as bytes. */
static int emit_shm(struct stk_ckpt_writer *w, Stoker__V1__WriteChunk *m, const uint8_t *data,
                    size_t len) {
  int err = ckpt_seg_append(w->shm, m, data, len, send_cb, w);
  if (err != STK_EIO) return err;
  err = ckpt_seg_flush(w->shm, send_cb, w);
  ckpt_seg_free(w->shm);
  w->shm = NULL;
  return err < 0 ? err : emit_bytes(w, m, data, len);
}

/* At the first write: which path the stream takes. */
static int decide_path(struct stk_ckpt_writer *w) {
  if (w->shm_decided) return 0;
  w->shm_decided = true;
  return ckpt_seg_open(w->c, w->attempt, w->rank, w->shm_mode, &w->shm);
}

int stk_ckpt_write_chunk(struct stk_ckpt_writer *w, const char *tensor, enum stk_dtype dtype,
                         const uint64_t *global_shape, const struct stk_ckpt_box *box,
                         const void *data, size_t len) {
  size_t elem = stk_ckpt_dtype_size(dtype);
  if (!w || !tensor || !tensor[0] || !elem || !global_shape || !ckpt_box_valid(box, global_shape) ||
      !data || stk_ckpt_box_elems(box) > UINT64_MAX / elem || len != stk_ckpt_box_elems(box) * elem)
    return client_fail(STK_EINVAL, "write chunk");
  int err = decide_path(w);
  if (err < 0) return err;
  Stoker__V1__WriteChunk m = STOKER__V1__WRITE_CHUNK__INIT;
  m.tensor = (char *)tensor;
  m.dtype = (Stoker__V1__DType)dtype; /* Same numbers. */
  m.n_global_shape = box->ndim;
  m.global_shape = (uint64_t *)global_shape;
  size_t max = w->shm ? (size_t)ckpt_seg_segment_bytes(w->shm) : w->max_chunk_bytes;
  emit_fn emit = w->shm ? emit_shm : emit_grpc;
  if (len <= max) {
    Stoker__V1__Box bm;
    ckpt_box_msg(box, &bm);
    m.box = &bm;
    return emit(w, &m, data, len);
  }
  return write_pieces(w, &m, box, data, plan_cut(box, elem, max), emit);
}

int stk_ckpt_writer_finish(struct stk_ckpt_writer *w, bool wait_durable, uint64_t *ret_bytes,
                           bool *ret_durable) {
  if (!w) return client_fail(STK_EINVAL, "finish writer");
  int err = w->shm ? ckpt_seg_flush(w->shm, send_cb, w) : 0;
  if (err < 0 && !w->failed) { /* Chunks not sent: "last" would commit without them. */
    stk_ckpt_writer_abort(w);
    return client_fail(err, "finish writer: shm segment");
  }
  ckpt_seg_free(w->shm);
  Stoker__V1__WriteChunk m = STOKER__V1__WRITE_CHUNK__INIT;
  m.tensor = "";
  m.last = true;
  m.wait_durable = wait_durable;
  send_chunk(w, &m); /* On failure the status below says why. */
  ProtobufCMessage *resp = NULL;
  struct rpc_status st;
  err = rpc_client_cstream_finish(w->s, &resp, &st);
  free(w);
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

void stk_ckpt_writer_abort(struct stk_ckpt_writer *w) {
  if (!w) return;
  ckpt_seg_free(w->shm);
  rpc_client_cstream_finish(w->s, NULL, NULL);
  free(w);
}

int ckpt_save_hooked(struct stk_client *c, const char *attempt, uint32_t rank,
                     const struct stk_ckpt_tensor *tensors, size_t n_tensors,
                     const struct ckpt_save_hooks *h, uint64_t *ret_bytes) {
  bool released = false;
  struct stk_ckpt_writer *w = NULL;
  int err = (n_tensors > 0 && !tensors) ? client_fail(STK_EINVAL, "save") : 0;
  if (!err) err = stk_ckpt_writer_open(c, attempt, rank, 0, &w);
  for (size_t i = 0; i < n_tensors && err == 0; i++) {
    const struct stk_ckpt_tensor *t = &tensors[i];
    if (h && h->before_tensor) h->before_tensor(h->arg, i);
    err = stk_ckpt_write_chunk(w, t->name, t->dtype, t->global_shape, &t->box, t->data, t->len);
  }
  if (h && h->before_tensor && !err) h->before_tensor(h->arg, n_tensors);
  /* Every byte is in a segment or a packed message now: the buffers are free. */
  if (h && h->released) h->released(h->arg), released = true;
  if (w && err < 0 && !w->failed) { /* Our own failure: the server has not failed the call. */
    stk_ckpt_writer_abort(w);
    err = client_fail(err, err == STK_EINVAL ? "save: bad tensor" : "save");
  } else if (w) {
    err = stk_ckpt_writer_finish(w, false, ret_bytes, NULL);
  }
  if (h && h->released && !released) h->released(h->arg);
  return err;
}

int stk_ckpt_save(struct stk_client *c, const char *attempt, uint32_t rank,
                  const struct stk_ckpt_tensor *tensors, size_t n_tensors, uint64_t *ret_bytes) {
  return ckpt_save_hooked(c, attempt, rank, tensors, n_tensors, NULL, ret_bytes);
}

/* ------------------------------------------------------------ async save */

struct save_job {
  struct stk_client *c;
  char attempt[STK_CKPT_ATTEMPT_MAX];
  uint32_t rank;
  struct stk_ckpt_tensor *tensors;
  size_t n;
  stk_ckpt_saved_fn done;
  void *arg;
};

static void *save_thread(void *arg) {
  struct save_job *j = arg;
  uint64_t bytes = 0;
  int err = stk_ckpt_save(j->c, j->attempt, j->rank, j->tensors, j->n, &bytes);
  j->done(j->arg, err, err ? stk_client_last_error(NULL) : "", bytes);
  free(j->tensors);
  free(j);
  return NULL;
}

int stk_ckpt_save_async(struct stk_client *c, const char *attempt, uint32_t rank,
                        const struct stk_ckpt_tensor *tensors, size_t n_tensors,
                        stk_ckpt_saved_fn done, void *arg) {
  if (!c || !attempt || strlen(attempt) >= STK_CKPT_ATTEMPT_MAX || !done ||
      (n_tensors > 0 && !tensors))
    return client_fail(STK_EINVAL, "save");
  struct save_job *j = calloc(1, sizeof(*j));
  if (j) j->tensors = malloc((n_tensors ? n_tensors : 1) * sizeof(*tensors));
  if (!j || !j->tensors) {
    free(j);
    return client_fail(STK_ENOMEM, "save");
  }
  if (n_tensors) memcpy(j->tensors, tensors, n_tensors * sizeof(*tensors));
  *j = (struct save_job){
      .c = c, .rank = rank, .tensors = j->tensors, .n = n_tensors, .done = done, .arg = arg};
  snprintf(j->attempt, sizeof(j->attempt), "%s", attempt);
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  pthread_t t;
  int rc = pthread_create(&t, &at, save_thread, j);
  pthread_attr_destroy(&at);
  if (rc != 0) {
    free(j->tensors);
    free(j);
    return client_fail(STK_ENOMEM, "save: thread");
  }
  return 0;
}
