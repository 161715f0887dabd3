/*
 * Restore: one server-streaming Read call for all the boxes a rank wants.
 * The service cuts each wanted box into pieces (sub-boxes, CRC-checked on
 * its side) and sends several to a message (the request asks for
 * pack_pieces: a restore of many small boxes is a few messages), their
 * bytes in the message's one packed_data (pack_data: the service sends them
 * as assembled and rpc_unpack copies them once out of the received
 * slices, instead of protobuf-c copying each piece's); here each
 * piece is placed into the caller's buffer for the box that contains it,
 * row by row, on the client's completion thread. A piece that fits no
 * wanted box, or boxes not filled exactly, end the read as STK_ECORRUPT:
 * the caller never gets a silently partial restore.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"
#include "client_internal.h"

struct read_state {
  const struct stk_ckpt_want *wanted;
  size_t n;
  uint64_t *got; /* Bytes placed per wanted box. */
  size_t hint;   /* The wanted box of the last piece. */
  uint64_t total;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  int local_err;
  char local_msg[256];
  struct rpc_client_call *call;
  struct rpc_status st;
};

/* True when piece (ndim dims) lies inside the wanted box. */
static bool box_inside(const Stoker__V1__Box *p, const struct stk_ckpt_box *w) {
  if (!p || p->n_offsets != w->ndim || p->n_sizes != w->ndim) return false;
  for (size_t i = 0; i < w->ndim; i++) {
    if (p->sizes[i] == 0 || p->offsets[i] < w->offsets[i] ||
        p->offsets[i] - w->offsets[i] > w->sizes[i] ||
        p->sizes[i] > w->sizes[i] - (p->offsets[i] - w->offsets[i]))
      return false;
  }
  return true;
}

static uint64_t piece_elems(const Stoker__V1__Box *p) {
  uint64_t n = 1;
  for (size_t i = 0; i < p->n_sizes; i++) n *= p->sizes[i];
  return n;
}

/* A piece's bytes: its own data, or (pack_data) its run of the message's
 * packed_data. */
struct bytes {
  const uint8_t *data;
  uint64_t len;
};

/* Copies the piece's row-major bytes into w's buffer, innermost rows. */
static void place(const Stoker__V1__ReadChunk *m, struct bytes b, const struct stk_ckpt_want *w,
                  size_t elem) {
  const Stoker__V1__Box *p = m->box;
  size_t nd = w->box.ndim;
  uint64_t idx[STK_CKPT_MAX_DIMS] = {0};
  size_t row = p->sizes[nd - 1] * elem;
  const uint8_t *src = b.data;
  for (;;) {
    uint64_t lin = 0; /* Element index in the wanted box of (idx..., 0). */
    for (size_t i = 0; i < nd; i++) {
      uint64_t at = p->offsets[i] - w->box.offsets[i] + (i + 1 < nd ? idx[i] : 0);
      lin = lin * w->box.sizes[i] + at;
    }
    memcpy((uint8_t *)w->dst + lin * elem, src, row);
    src += row;
    size_t i = nd - 1; /* Odometer over the piece's dims [0, nd-1). */
    while (i > 0 && ++idx[i - 1] == p->sizes[i - 1]) idx[--i] = 0;
    if (i == 0) return;
  }
}

/* The wanted box this piece belongs to and its element size, or -1.
 * Pieces come in request order: the search starts at the last box found. */
static long find_box(struct read_state *r, const Stoker__V1__ReadChunk *m, uint64_t len,
                     size_t *ret_elem) {
  uint64_t pe = m->box ? piece_elems(m->box) : 0;
  for (size_t k = 0; pe && m->tensor && k < r->n; k++) {
    size_t i = (r->hint + k) % r->n;
    const struct stk_ckpt_want *w = &r->wanted[i];
    if (strcmp(w->tensor, m->tensor) != 0 || !box_inside(m->box, &w->box)) continue;
    uint64_t we = stk_ckpt_box_elems(&w->box);
    if (len % pe != 0 || w->len != we * (len / pe)) continue;
    *ret_elem = len / pe;
    r->hint = i;
    return (long)i;
  }
  return -1;
}

static bool fail(struct read_state *r, const char *what, const Stoker__V1__ReadChunk *m) {
  if (!r->local_err) {
    r->local_err = STK_ECORRUPT;
    snprintf(r->local_msg, sizeof(r->local_msg), "read: a piece of \"%s\" %s",
             m->tensor ? m->tensor : "", what);
  }
  return false;
}

/* Places one piece of message msg; false (the read failed) when it fits no
 * wanted box, lists pieces of its own, or its bytes are not where it says.
 * Under r->mu. */
static bool take(struct read_state *r, const Stoker__V1__ReadChunk *msg,
                 const Stoker__V1__ReadChunk *m) {
  struct bytes b = {m->data.data, m->data.len};
  if (m->data_length > 0) { /* Its run of packed_data (pack_data). */
    if (m->data.len > 0 || m->data_offset > msg->packed_data.len ||
        m->data_length > msg->packed_data.len - m->data_offset)
      return fail(r, "lies outside its message's bytes", m);
    b = (struct bytes){msg->packed_data.data + m->data_offset, m->data_length};
  }
  size_t elem = 0;
  long i = m->n_pieces ? -1 : find_box(r, m, b.len, &elem);
  if (i < 0 || r->got[i] + b.len > r->wanted[i].len) return fail(r, "fits no wanted box", m);
  place(m, b, &r->wanted[i], elem);
  r->got[i] += b.len;
  r->total += b.len;
  return true;
}

/* A message: one piece, or (pack_pieces) several in m->pieces. */
static void read_msg(void *arg, ProtobufCMessage *msg) {
  struct read_state *r = arg;
  const Stoker__V1__ReadChunk *m = (const Stoker__V1__ReadChunk *)msg;
  pthread_mutex_lock(&r->mu);
  bool ok = !r->local_err;
  if (ok && m->n_pieces == 0) ok = take(r, m, m);
  for (size_t k = 0; ok && k < m->n_pieces; k++) ok = take(r, m, m->pieces[k]);
  if (!ok && r->call) rpc_client_call_cancel(r->call); /* Alive: we run on it. */
  pthread_mutex_unlock(&r->mu);
  protobuf_c_message_free_unpacked(msg, NULL);
}

static void read_done(void *arg, const struct rpc_status *st) {
  struct read_state *r = arg;
  pthread_mutex_lock(&r->mu);
  r->st = *st;
  r->done = true;
  r->call = NULL;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

/* The request: wanted boxes as ChunkEntry (tensor + box). */
static int build_request(const struct stk_ckpt_want *wanted, size_t n, Stoker__V1__ReadRequest *req,
                         Stoker__V1__ChunkEntry *ents, Stoker__V1__ChunkEntry **ptrs,
                         Stoker__V1__Box *boxes) {
  for (size_t i = 0; i < n; i++) {
    const struct stk_ckpt_want *w = &wanted[i];
    if (!w->tensor || !w->tensor[0] || !ckpt_box_valid(&w->box, NULL) || !w->dst || !w->len)
      return STK_EINVAL;
    stoker__v1__chunk_entry__init(&ents[i]);
    ents[i].tensor = (char *)w->tensor;
    ckpt_box_msg(&w->box, &boxes[i]);
    ents[i].box = &boxes[i];
    ptrs[i] = &ents[i];
  }
  req->n_wanted = n;
  req->wanted = ptrs;
  return 0;
}

/* Runs the call and waits for its end; returns the outcome. */
static int run_read(struct stk_client *c, struct read_state *r, Stoker__V1__ReadRequest *req,
                    int64_t timeout_ms) {
  struct rpc_client_call *call = NULL;
  pthread_mutex_lock(&r->mu);
  int err = rpc_client_stream_async(client_rpc(c), CKPT_METHOD(read, req), &req->base,
                                    &stoker__v1__read_chunk__descriptor,
                                    client_timeout(c, timeout_ms), read_msg, read_done, r, &call);
  if (err == 0 && !r->done) r->call = call;
  pthread_mutex_unlock(&r->mu);
  if (err < 0) return client_fail(err, "read");
  pthread_mutex_lock(&r->mu);
  while (!r->done) pthread_cond_wait(&r->cv, &r->mu);
  pthread_mutex_unlock(&r->mu);
  if (r->local_err) {
    client_set_error(stk_error_to_grpc(r->local_err), "%s", r->local_msg);
    return r->local_err;
  }
  if (r->st.code != RPC_OK) {
    client_set_error(r->st.code, "%s", r->st.message);
    return stk_error_from_grpc(r->st.code);
  }
  for (size_t i = 0; i < r->n; i++) {
    if (r->got[i] != r->wanted[i].len) {
      client_set_error(15, "read: box %zu of \"%s\" got %llu of %zu bytes", i, r->wanted[i].tensor,
                       (unsigned long long)r->got[i], r->wanted[i].len);
      return STK_ECORRUPT;
    }
  }
  return 0;
}

int stk_ckpt_read(struct stk_client *c, const char *job, int64_t step,
                  const struct stk_ckpt_want *wanted, size_t n_wanted, int64_t timeout_ms,
                  uint64_t *ret_bytes) {
  if (!c || !job || !wanted || n_wanted == 0) return client_fail(STK_EINVAL, "read");
  struct read_state r = {.wanted = wanted, .n = n_wanted};
  Stoker__V1__ReadRequest req = STOKER__V1__READ_REQUEST__INIT;
  req.job = (char *)job;
  req.step = step;
  req.pack_pieces = true; /* Several pieces a message, */
  req.pack_data = true;   /* their bytes in one field: read_msg takes every form. */
  Stoker__V1__ChunkEntry *ents = calloc(n_wanted, sizeof(*ents));
  Stoker__V1__ChunkEntry **ptrs = calloc(n_wanted, sizeof(*ptrs));
  Stoker__V1__Box *boxes = calloc(n_wanted, sizeof(*boxes));
  r.got = calloc(n_wanted, sizeof(*r.got));
  int err = ents && ptrs && boxes && r.got ? 0 : STK_ENOMEM;
  if (err == 0) err = build_request(wanted, n_wanted, &req, ents, ptrs, boxes);
  if (err < 0) {
    client_fail(err, "read");
  } else {
    pthread_mutex_init(&r.mu, NULL);
    client_cond_init(&r.cv);
    err = run_read(c, &r, &req, timeout_ms);
    pthread_cond_destroy(&r.cv);
    pthread_mutex_destroy(&r.mu);
  }
  if (err == 0 && ret_bytes) *ret_bytes = r.total;
  free(ents);
  free(ptrs);
  free(boxes);
  free(r.got);
  return err;
}
