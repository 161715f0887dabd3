/*
 * The dataloader's unary calls a trainer makes (batch, commit,
 * export/import; the operator's are in loader_admin.c) and the one conversion every batch goes
 * through: a Batch reply checked for consistency and viewed as uint32 tokens without copying when
 * the bytes are already aligned little-endian words.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "loader_internal.h"

int stk_loader_connect(const struct stk_client_opts *opts, struct stk_client **ret_client) {
  struct stk_client_opts o = {0};
  if (opts) o = *opts;
  if (!o.address || !o.address[0]) o.address = getenv(STK_LOADER_ENV);
  if (!o.address || !o.address[0]) o.address = STK_LOADER_DEFAULT_ADDRESS;
  return stk_client_new(&o, ret_client);
}

/* What a batch owns: the reply and, when its bytes could not be viewed in
 * place, an aligned host-order copy of the tokens; or (an assembled batch)
 * no reply, the tokens and the document starts. A batch delivered through
 * shared memory also holds its ring slot (released when freed). A batch of
 * an 8-byte-token stream has int64 tokens instead: its slot in place, or a
 * widened copy of the reply's uint32 tokens (wide). */
struct batch_owner {
  Stoker__V1__Batch *msg;
  uint32_t *copy;
  int64_t *wide;
  const int64_t *tokens_i64;
  uint32_t *starts;
  struct loader_ring *ring;
  uint64_t seq;
};

static bool host_little_endian(void) {
  const uint16_t one = 1;
  return *(const uint8_t *)&one == 1;
}

/* Host-order tokens of the little-endian bytes p: in place when possible,
 * else a copy. */
static int view_tokens(struct batch_owner *o, const uint8_t *p, size_t n,
                       const uint32_t **ret_tokens) {
  if (host_little_endian() && ((uintptr_t)p % sizeof(uint32_t)) == 0) {
    *ret_tokens = (const uint32_t *)(const void *)p;
    return 0;
  }
  o->copy = malloc(n * sizeof(uint32_t) + 1);
  if (!o->copy) return STK_ENOMEM;
  for (size_t i = 0; i < n; i++)
    o->copy[i] = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
                 (uint32_t)p[4 * i + 3] << 24;
  *ret_tokens = o->copy;
  return 0;
}

/* int64 tokens of n little-endian words of token_bytes (4: the reply's
 * uint32 tokens, widened; 8: a slot written as int64) at p: in place when
 * possible, else a copy. */
static int view_tokens_i64(struct batch_owner *o, const uint8_t *p, size_t n, uint32_t token_bytes,
                           const int64_t **ret_tokens) {
  if (token_bytes == 8 && host_little_endian() && ((uintptr_t)p % sizeof(int64_t)) == 0) {
    *ret_tokens = (const int64_t *)(const void *)p;
    return 0;
  }
  o->wide = malloc(n * sizeof(int64_t) + 1);
  if (!o->wide) return STK_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    uint64_t v = 0;
    for (uint32_t k = 0; k < token_bytes; k++) v |= (uint64_t)p[token_bytes * i + k] << (8 * k);
    o->wide[i] = (int64_t)v;
  }
  *ret_tokens = o->wide;
  return 0;
}

/* True when the reply's sizes agree with each other (and, for a batch in
 * shared memory, with the ring's slots at token_bytes a token). */
static bool batch_consistent(const Stoker__V1__Batch *m, const struct loader_ring *ring,
                             uint32_t token_bytes) {
  uint64_t n = (uint64_t)m->lines * m->line_tokens;
  if (m->shm_seq == 0 && m->tokens.len != n * sizeof(uint32_t)) return false;
  if (m->shm_seq != 0 && (!ring || m->tokens.len != 0 || m->lines > UINT32_MAX / 4 ||
                          n * token_bytes > loader_ring_slot_bytes(ring)))
    return false;
  for (size_t i = 0; i < m->n_doc_starts; i++) {
    if (m->doc_starts[i] >= n || (i > 0 && m->doc_starts[i] <= m->doc_starts[i - 1])) return false;
  }
  return true;
}

int loader_batch_from_msg(ProtobufCMessage *msg, bool partial_ok, struct stk_batch *ret_batch) {
  return loader_batch_from_ring(msg, partial_ok, NULL, 4, ret_batch);
}

/* The batch's tokens at the stream's width: uint32 into *ret_tokens or
 * int64 into o->tokens_i64. */
static int take_tokens(struct batch_owner *o, const uint8_t *bytes, bool in_ring, size_t n,
                       uint32_t token_bytes, const uint32_t **ret_tokens) {
  if (token_bytes != 8) return view_tokens(o, bytes, n, ret_tokens);
  return view_tokens_i64(o, bytes, n, in_ring ? 8 : 4, &o->tokens_i64);
}

int loader_batch_from_ring(ProtobufCMessage *msg, bool partial_ok, struct loader_ring *ring,
                           uint32_t token_bytes, struct stk_batch *ret_batch) {
  Stoker__V1__Batch *m = (Stoker__V1__Batch *)msg;
  if (token_bytes != 8) token_bytes = 4;
  if (!batch_consistent(m, ring, token_bytes)) {
    protobuf_c_message_free_unpacked(msg, NULL);
    client_set_error(15, "malformed batch from the dataloader");
    return STK_ECORRUPT;
  }
  if (m->parts > 1 && !partial_ok) {
    client_set_error(9,
                     "this dataloader serves part %u of %u of the job: open the loader with "
                     "every part's address (stk_loader_open)",
                     m->part, m->parts);
    protobuf_c_message_free_unpacked(msg, NULL);
    return STK_EINVAL;
  }
  if (m->shm_seq && loader_ring_take(ring, m->shm_seq) < 0) {
    protobuf_c_message_free_unpacked(msg, NULL);
    return STK_ECORRUPT;
  }
  struct batch_owner *o = calloc(1, sizeof(*o));
  const uint32_t *tokens = NULL;
  const uint8_t *bytes = m->shm_seq ? loader_ring_slot(ring, m->shm_seq) : m->tokens.data;
  if (o) o->msg = m;
  if (!o || take_tokens(o, bytes, m->shm_seq != 0, (size_t)m->lines * m->line_tokens, token_bytes,
                        &tokens) < 0) {
    if (m->shm_seq) loader_ring_release(ring, m->shm_seq);
    free(o);
    protobuf_c_message_free_unpacked(msg, NULL);
    return client_fail(STK_ENOMEM, "batch");
  }
  if (m->shm_seq) {
    o->ring = loader_ring_ref(ring);
    o->seq = m->shm_seq;
    if (o->copy || o->wide) { /* Copied out already. */
      loader_ring_release(o->ring, o->seq);
      o->seq = 0;
    }
  }
  *ret_batch = (struct stk_batch){
      .step = m->step,
      .lines = m->lines,
      .line_tokens = m->line_tokens,
      .tokens = tokens,
      .doc_starts = m->doc_starts,
      .n_doc_starts = m->n_doc_starts,
      .priv_ = o,
  };
  return 0;
}

const Stoker__V1__Batch *loader_batch_msg(const struct stk_batch *b) {
  const struct batch_owner *o = b->priv_;
  return o ? o->msg : NULL;
}

int loader_batch_own(int64_t step, uint32_t lines, uint32_t line_tokens, uint32_t *tokens,
                     uint32_t *doc_starts, size_t n_doc_starts, struct stk_batch *ret_batch) {
  struct batch_owner *o = calloc(1, sizeof(*o));
  if (!o) {
    free(tokens);
    free(doc_starts);
    return client_fail(STK_ENOMEM, "batch");
  }
  o->copy = tokens;
  o->starts = doc_starts;
  *ret_batch = (struct stk_batch){.step = step,
                                  .lines = lines,
                                  .line_tokens = line_tokens,
                                  .tokens = tokens,
                                  .doc_starts = doc_starts,
                                  .n_doc_starts = n_doc_starts,
                                  .priv_ = o};
  return 0;
}

void stk_batch_free(struct stk_batch *b) {
  if (!b) return;
  struct batch_owner *o = b->priv_;
  if (o) {
    if (o->ring && o->seq) loader_ring_release(o->ring, o->seq);
    loader_ring_unref(o->ring);
    free(o->copy);
    free(o->wide);
    free(o->starts);
    if (o->msg) protobuf_c_message_free_unpacked(&o->msg->base, NULL);
    free(o);
  }
  memset(b, 0, sizeof(*b));
}

const int64_t *stk_batch_tokens_i64(const struct stk_batch *b) {
  const struct batch_owner *o = b ? b->priv_ : NULL;
  return o ? o->tokens_i64 : NULL;
}

uint32_t stk_batch_ring_slots(const struct stk_batch *b) {
  const struct batch_owner *o = b ? b->priv_ : NULL;
  return o && o->ring && o->seq ? loader_ring_slots(o->ring) : 0;
}

/* ----------------------------------------------------------- the calls */

int stk_loader_get_batch(struct stk_client *c, const char *job, int64_t step, uint32_t rank,
                         uint32_t world, int64_t timeout_ms, struct stk_batch *ret_batch) {
  return loader_get_batch(c, job, step, rank, world, timeout_ms, false, ret_batch);
}

int loader_get_batch(struct stk_client *c, const char *job, int64_t step, uint32_t rank,
                     uint32_t world, int64_t timeout_ms, bool partial_ok,
                     struct stk_batch *ret_batch) {
  if (!job || !ret_batch) return client_fail(STK_EINVAL, "get batch");
  Stoker__V1__GetBatchRequest req = STOKER__V1__GET_BATCH_REQUEST__INIT;
  req.job = (char *)job;
  req.step = step;
  req.rank = rank;
  req.world = world;
  Stoker__V1__Batch *resp = NULL;
  int err = DL_CALL_IDEMPOTENT(c, get_batch, &req, timeout_ms, &resp);
  return err < 0 ? err : loader_batch_from_msg(&resp->base, partial_ok, ret_batch);
}

int stk_loader_commit(struct stk_client *c, const char *job, int64_t step, int64_t timeout_ms) {
  if (!job) return client_fail(STK_EINVAL, "commit");
  Stoker__V1__CommitRequest req = STOKER__V1__COMMIT_REQUEST__INIT;
  req.job = (char *)job;
  req.step = step;
  return DL_CALL_IDEMPOTENT(c, commit, &req, timeout_ms, (Stoker__V1__Empty **)NULL);
}

int stk_loader_export(struct stk_client *c, const char *job, int64_t step, int64_t timeout_ms,
                      uint8_t **ret_blob, size_t *ret_len) {
  if (!job || !ret_blob || !ret_len) return client_fail(STK_EINVAL, "export state");
  Stoker__V1__ExportStateRequest req = STOKER__V1__EXPORT_STATE_REQUEST__INIT;
  req.job = (char *)job;
  req.step = step;
  Stoker__V1__LoaderState *st = NULL;
  int err = DL_CALL_IDEMPOTENT(c, export_state, &req, timeout_ms, &st);
  if (err < 0) return err;
  uint8_t *blob = malloc(st->state.len + 1);
  if (blob) memcpy(blob, st->state.data, st->state.len);
  size_t len = st->state.len;
  protobuf_c_message_free_unpacked(&st->base, NULL);
  if (!blob) return client_fail(STK_ENOMEM, "export state");
  *ret_blob = blob;
  *ret_len = len;
  return 0;
}

int stk_loader_import(struct stk_client *c, const char *job, int64_t step, const uint8_t *blob,
                      size_t len, int64_t timeout_ms, int64_t *ret_committed_step) {
  return loader_import_blobs(c, job, step, &blob, &len, 1, timeout_ms, ret_committed_step);
}

int loader_import_blobs(struct stk_client *c, const char *job, int64_t step,
                        const uint8_t *const *blobs, const size_t *lens, size_t n,
                        int64_t timeout_ms, int64_t *ret_committed_step) {
  for (size_t i = 0; i < n; i++)
    if (!blobs[i] || !lens[i]) return client_fail(STK_EINVAL, "import state");
  if (n == 0) return client_fail(STK_EINVAL, "import state");
  ProtobufCBinaryData *more = calloc(n, sizeof(*more));
  if (!more) return client_fail(STK_ENOMEM, "import state");
  for (size_t i = 1; i < n; i++) more[i - 1] = (ProtobufCBinaryData){lens[i], (uint8_t *)blobs[i]};
  Stoker__V1__LoaderState req = STOKER__V1__LOADER_STATE__INIT;
  req.job = (char *)(job ? job : "");
  req.step = step;
  req.state.data = (uint8_t *)blobs[0];
  req.state.len = lens[0];
  req.more_states = more;
  req.n_more_states = n - 1;
  Stoker__V1__LoaderInfo *info = NULL;
  int err = DL_CALL_IDEMPOTENT(c, import_state, &req, timeout_ms, &info);
  free(more);
  if (err < 0) return err;
  if (ret_committed_step) *ret_committed_step = info->committed_step;
  protobuf_c_message_free_unpacked(&info->base, NULL);
  return 0;
}
