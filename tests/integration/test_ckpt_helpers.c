/*
 * test_ckpt_helpers: the model, writers and readers of the checkpoint
 * integration tests (see test_ckpt_helpers.h). Byte b of tensor t sits at
 * flat byte index i and equals pattern(t, i), so any byte read back can be
 * checked without keeping a copy.
 */
#include "test_ckpt_helpers.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define CHUNK_MAX_BYTES (1u << 20)

struct tensor {
  const char *name;
  Stoker__V1__DType dtype;
  uint64_t rows, cols, esize;
};

/* 384 KiB of floats and 24 MiB of bytes: 6 MiB per rank at 4 ranks, over
 * one 5 MiB part, so the ranks' objects go up as multipart uploads. */
static const struct tensor model[] = {
    {"model/w", STOKER__V1__DTYPE__DTYPE_F32, 96, 1024, 4},
    {"model/emb", STOKER__V1__DTYPE__DTYPE_U8, 8192, 3072, 1},
};
#define N_MODEL (sizeof(model) / sizeof(model[0]))

static uint8_t pattern(uint32_t seed, uint64_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)seed << 32);
  x ^= x >> 29;
  return (uint8_t)(x ^ (x >> 17));
}

static uint32_t name_seed(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
  return h;
}

char tck_shm_root[256], tck_shm_dir[300];

int tck_shm_setup(void **state) {
  (void)state;
  if (harness_shm_tmpdir_new(tck_shm_root, sizeof(tck_shm_root)) != 0) return -1;
  snprintf(tck_shm_dir, sizeof(tck_shm_dir), "%s/ckpt", tck_shm_root);
  return 0;
}

int tck_shm_teardown(void **state) {
  (void)state;
  harness_tmpdir_remove(tck_shm_root);
  return 0;
}

int tck_call(struct rpc_client *rc, const char *method, const ProtobufCMessage *req,
             const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **ret_resp,
             char *ret_msg, size_t msg_len) {
  char path[128];
  harness_method_path(&stoker__v1__checkpoint__descriptor, method, path, sizeof(path));
  struct rpc_status st = {0};
  ProtobufCMessage *resp = NULL;
  rpc_client_unary(rc, path, req, resp_desc, 30000, &resp, &st);
  if (ret_msg) snprintf(ret_msg, msg_len, "%s", st.message);
  if (ret_resp)
    *ret_resp = resp;
  else if (resp)
    protobuf_c_message_free_unpacked(resp, NULL);
  return st.code;
}

int tck_begin(struct rpc_client *rc, const char *job, int64_t step, uint32_t world,
              char *ret_attempt) {
  Stoker__V1__BeginRequest req = STOKER__V1__BEGIN_REQUEST__INIT;
  req.job = (char *)job;
  req.step = step;
  req.world = world;
  ProtobufCMessage *resp = NULL;
  int code =
      tck_call(rc, "Begin", &req.base, &stoker__v1__begin_response__descriptor, &resp, NULL, 0);
  if (code == RPC_OK) {
    snprintf(ret_attempt, 64, "%s", ((Stoker__V1__BeginResponse *)resp)->attempt);
    protobuf_c_message_free_unpacked(resp, NULL);
  }
  return code;
}

int tck_commit(struct rpc_client *rc, const char *attempt, int64_t *ret_step, char *msg,
               size_t msg_len) {
  Stoker__V1__CommitCheckpointRequest req = STOKER__V1__COMMIT_CHECKPOINT_REQUEST__INIT;
  req.attempt = (char *)attempt;
  ProtobufCMessage *resp = NULL;
  int code = tck_call(rc, "Commit", &req.base, &stoker__v1__checkpoint_ref__descriptor, &resp, msg,
                      msg_len);
  if (code == RPC_OK) {
    if (ret_step) *ret_step = ((Stoker__V1__CheckpointRef *)resp)->step;
    protobuf_c_message_free_unpacked(resp, NULL);
  }
  return code;
}

/* ------------------------------------------------------------- writing */

/* One chunk: rows [r0, r0 + n) of t, or the whole blob when t is NULL. */
static int send_chunk(struct rpc_client_cstream *s, const char *attempt, uint32_t rank,
                      const char *name, Stoker__V1__DType dtype, uint64_t rows, uint64_t cols,
                      uint64_t esize, uint64_t r0, uint64_t n) {
  uint64_t shape[2] = {rows, cols}, off[2] = {r0, 0}, sz[2] = {n, cols};
  size_t dims = cols ? 2 : 1, len = (size_t)(n * (cols ? cols : 1) * esize);
  uint8_t *data = malloc(len ? len : 1);
  uint64_t base = r0 * (cols ? cols : 1) * esize;
  uint32_t seed = name_seed(name);
  for (size_t i = 0; i < len; i++) data[i] = pattern(seed, base + i);
  Stoker__V1__Box box = STOKER__V1__BOX__INIT;
  box.n_offsets = box.n_sizes = dims;
  box.offsets = off;
  box.sizes = sz;
  Stoker__V1__WriteChunk ch = STOKER__V1__WRITE_CHUNK__INIT;
  ch.attempt = (char *)attempt;
  ch.rank = rank;
  ch.tensor = (char *)name;
  ch.dtype = dtype;
  ch.n_global_shape = dims;
  ch.global_shape = shape;
  ch.box = &box;
  ch.data.data = data;
  ch.data.len = len;
  int rc = rpc_client_cstream_write(s, &ch.base);
  free(data);
  return rc;
}

void tck_chunk_u8(struct tck_chunk *c, const char *attempt, uint32_t rank, const char *tensor,
                  uint64_t shape, uint64_t off, uint64_t len) {
  c->shape = shape;
  c->off = off;
  c->len = len;
  stoker__v1__box__init(&c->box);
  c->box.n_offsets = c->box.n_sizes = 1;
  c->box.offsets = &c->off;
  c->box.sizes = &c->len;
  stoker__v1__write_chunk__init(&c->ch);
  c->ch.attempt = (char *)attempt;
  c->ch.rank = rank;
  c->ch.tensor = (char *)tensor;
  c->ch.dtype = STOKER__V1__DTYPE__DTYPE_U8;
  c->ch.n_global_shape = 1;
  c->ch.global_shape = &c->shape;
  c->ch.box = &c->box;
}

int tck_write_finish(struct rpc_client_cstream *s, const char *attempt, uint32_t rank,
                     bool wait_durable, char *msg, size_t msg_len) {
  Stoker__V1__WriteChunk last = STOKER__V1__WRITE_CHUNK__INIT;
  last.attempt = (char *)attempt;
  last.rank = rank;
  last.last = true;
  last.wait_durable = wait_durable;
  rpc_client_cstream_write(s, &last.base);
  struct rpc_status st = {0};
  ProtobufCMessage *resp = NULL;
  rpc_client_cstream_finish(s, &resp, &st);
  if (msg) snprintf(msg, msg_len, "%s", st.message);
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  return st.code;
}

static int write_rank_chunks(struct rpc_client_cstream *s, const char *attempt, uint32_t rank,
                             uint32_t world) {
  int rc = 0;
  for (size_t t = 0; rc == 0 && t < N_MODEL; t++) {
    const struct tensor *m = &model[t];
    uint64_t lo = m->rows * rank / world, hi = m->rows * (rank + 1) / world;
    uint64_t step = CHUNK_MAX_BYTES / (m->cols * m->esize);
    for (uint64_t r = lo; rc == 0 && r < hi; r += step)
      rc = send_chunk(s, attempt, rank, m->name, m->dtype, m->rows, m->cols, m->esize, r,
                      r + step > hi ? hi - r : step);
  }
  char blob[64];
  snprintf(blob, sizeof(blob), "blob/rank-%u", rank);
  if (rc == 0)
    rc = send_chunk(s, attempt, rank, blob, STOKER__V1__DTYPE__DTYPE_BYTES, 1000 + rank, 0, 1, 0,
                    1000 + rank);
  return rc;
}

int tck_write_rank(struct rpc_client *rc, const char *attempt, uint32_t rank, uint32_t world,
                   bool wait_durable, char *msg, size_t msg_len) {
  struct rpc_client_cstream *s = NULL;
  if (rpc_client_cstream_open(rc, "/stoker.v1.Checkpoint/Write",
                              &stoker__v1__write_response__descriptor, 60000, &s) != 0)
    return RPC_UNAVAILABLE;
  write_rank_chunks(s, attempt, rank, world); /* A failure shows in the status. */
  return tck_write_finish(s, attempt, rank, wait_durable, msg, msg_len);
}

struct writer_arg {
  const char *addr, *attempt;
  uint32_t rank, world;
  int code;
  pthread_t th;
};

static void *writer_main(void *p) {
  struct writer_arg *w = p;
  struct rpc_client *rc = NULL;
  struct rpc_client_opts o = {.target = w->addr};
  w->code = RPC_UNAVAILABLE;
  if (rpc_client_new(&o, &rc) != 0) return NULL;
  char msg[512];
  w->code = tck_write_rank(rc, w->attempt, w->rank, w->world, false, msg, sizeof(msg));
  if (w->code != RPC_OK) fprintf(stderr, "rank %u: Write: %d %s\n", w->rank, w->code, msg);
  rpc_client_free(rc);
  return NULL;
}

int tck_write_all(const char *addr, const char *attempt, uint32_t world) {
  struct writer_arg *w = calloc(world, sizeof(*w));
  for (uint32_t r = 0; r < world; r++) {
    w[r] = (struct writer_arg){.addr = addr, .attempt = attempt, .rank = r, .world = world};
    pthread_create(&w[r].th, NULL, writer_main, &w[r]);
  }
  int code = RPC_OK;
  for (uint32_t r = 0; r < world; r++) {
    pthread_join(w[r].th, NULL);
    if (code == RPC_OK) code = w[r].code;
  }
  free(w);
  return code;
}

void tck_save_ok(struct rpc_client *rc, const char *addr, const char *job, int64_t step,
                 uint32_t world) {
  char attempt[64], msg[512];
  assert_int_equal(tck_begin(rc, job, step, world, attempt), RPC_OK);
  assert_int_equal(tck_write_all(addr, attempt, world), RPC_OK);
  assert_int_equal(tck_commit(rc, attempt, NULL, msg, sizeof(msg)), RPC_OK);
}

/* ------------------------------------------------------------- reading */

struct read_state {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done, mismatch;
  enum tck_form form; /* What the request asked for. */
  uint64_t bytes, messages, pieces;
  struct rpc_status st;
};

static const struct tensor *find_tensor(const char *name, struct tensor *blob) {
  for (size_t t = 0; t < N_MODEL; t++)
    if (strcmp(model[t].name, name) == 0) return &model[t];
  unsigned r;
  if (sscanf(name, "blob/rank-%u", &r) != 1) return NULL;
  *blob = (struct tensor){name, STOKER__V1__DTYPE__DTYPE_BYTES, 1000 + r, 0, 1};
  return blob;
}

/* Pieces are runs of whole rows: the bytes are contiguous in the tensor.
 * Under rs->mu; false when the piece's len bytes at data are not the
 * model's. */
static bool check_piece(struct read_state *rs, const Stoker__V1__ReadChunk *p, const uint8_t *data,
                        uint64_t len) {
  struct tensor blob;
  const struct tensor *t = find_tensor(p->tensor, &blob);
  bool bad = !t || !p->box || p->box->n_offsets < 1 || p->n_pieces > 0;
  if (!bad) {
    uint64_t base = p->box->offsets[0] * (t->cols ? t->cols : 1) * t->esize;
    uint32_t seed = name_seed(t->name);
    for (size_t i = 0; !bad && i < len; i++) bad = data[i] != pattern(seed, base + i);
  }
  rs->bytes += len;
  rs->pieces++;
  return !bad;
}

/* A message of the pack_data form: its pieces' bytes one after the other
 * in packed_data, each piece's run given by data_offset and data_length,
 * none in a piece's own data. Under rs->mu; false on any other form. */
static bool check_packed_data(struct read_state *rs, const Stoker__V1__ReadChunk *m) {
  uint64_t at = 0;
  bool ok = true;
  for (size_t k = 0; ok && k < m->n_pieces; k++) {
    const Stoker__V1__ReadChunk *p = m->pieces[k];
    ok = p->data.len == 0 && p->data_offset == at && p->data_length <= m->packed_data.len - at &&
         check_piece(rs, p, m->packed_data.data + at, p->data_length);
    at += p->data_length;
  }
  return ok && at == m->packed_data.len;
}

/* A message: one piece, or (pack_pieces asked) a list of them, their bytes
 * in each piece's data or (pack_data asked) in packed_data; any other form
 * than the one asked for is a mismatch. */
static void on_piece(void *arg, ProtobufCMessage *msg) {
  struct read_state *rs = arg;
  Stoker__V1__ReadChunk *p = (Stoker__V1__ReadChunk *)msg;
  pthread_mutex_lock(&rs->mu);
  rs->messages++;
  if (rs->form == TCK_ONE_PER_MESSAGE) {
    rs->mismatch |=
        p->packed_data.len || p->data_length || !check_piece(rs, p, p->data.data, p->data.len);
  } else {
    rs->mismatch |= p->n_pieces == 0 || (p->tensor && p->tensor[0]) || p->box || p->data.len;
    if (rs->form == TCK_PACK_DATA) {
      rs->mismatch |= !check_packed_data(rs, p);
    } else {
      rs->mismatch |= p->packed_data.len > 0;
      for (size_t k = 0; k < p->n_pieces; k++) {
        const Stoker__V1__ReadChunk *q = p->pieces[k];
        rs->mismatch |= q->data_length || !check_piece(rs, q, q->data.data, q->data.len);
      }
    }
  }
  pthread_mutex_unlock(&rs->mu);
  protobuf_c_message_free_unpacked(msg, NULL);
}

static void on_done(void *arg, const struct rpc_status *st) {
  struct read_state *rs = arg;
  pthread_mutex_lock(&rs->mu);
  rs->st = *st;
  rs->done = true;
  pthread_cond_signal(&rs->cv);
  pthread_mutex_unlock(&rs->mu);
}

#define MAX_WANTED 64
struct wanted {
  Stoker__V1__ChunkEntry e[MAX_WANTED], *ep[MAX_WANTED];
  Stoker__V1__Box box[MAX_WANTED];
  uint64_t off[MAX_WANTED][2], sz[MAX_WANTED][2];
  char names[MAX_WANTED][64];
  size_t n;
  uint64_t bytes;
};

static void want(struct wanted *w, const char *name, uint64_t r0, uint64_t n, uint64_t cols,
                 uint64_t esize) {
  size_t k = w->n++;
  snprintf(w->names[k], sizeof(w->names[k]), "%s", name);
  stoker__v1__box__init(&w->box[k]);
  w->off[k][0] = r0;
  w->sz[k][0] = n;
  w->off[k][1] = 0;
  w->sz[k][1] = cols;
  w->box[k].n_offsets = w->box[k].n_sizes = cols ? 2 : 1;
  w->box[k].offsets = w->off[k];
  w->box[k].sizes = w->sz[k];
  stoker__v1__chunk_entry__init(&w->e[k]);
  w->e[k].tensor = w->names[k];
  w->e[k].box = &w->box[k];
  w->ep[k] = &w->e[k];
  w->bytes += n * (cols ? cols : 1) * esize;
}

/* One Read of w's boxes; RPC_OK, the stream's status or TCK_MISMATCH. */
static int read_wanted(struct rpc_client *rc, const char *job, int64_t step, const struct wanted *w,
                       struct read_state *rs, char *msg, size_t msg_len) {
  Stoker__V1__ReadRequest req = STOKER__V1__READ_REQUEST__INIT;
  req.job = (char *)job;
  req.step = step;
  req.n_wanted = w->n;
  req.wanted = (Stoker__V1__ChunkEntry **)w->ep;
  req.pack_pieces = rs->form != TCK_ONE_PER_MESSAGE && rs->form != TCK_PACK_DATA_ALONE;
  req.pack_data =
      rs->form == TCK_PACK_DATA || rs->form == TCK_PACK_DATA_ALONE || rs->form == TCK_PACK_DATA_SHM;
  if (rs->form == TCK_PACK_DATA_SHM) req.shm_name = "read-0123abcd";
  int rc2 = rpc_client_stream_async(rc, "/stoker.v1.Checkpoint/Read", &req.base,
                                    &stoker__v1__read_chunk__descriptor, 60000, on_piece, on_done,
                                    rs, NULL);
  int code = RPC_UNAVAILABLE;
  if (rc2 == 0) {
    pthread_mutex_lock(&rs->mu);
    while (!rs->done) pthread_cond_wait(&rs->cv, &rs->mu);
    pthread_mutex_unlock(&rs->mu);
    code = rs->st.code;
    if (msg) snprintf(msg, msg_len, "%s", rs->st.message);
    if (code == RPC_OK && (rs->mismatch || rs->bytes != w->bytes)) code = TCK_MISMATCH;
  }
  return code;
}

int tck_read_rank(struct rpc_client *rc, const char *job, int64_t step, uint32_t rank,
                  uint32_t world, uint32_t write_world, char *msg, size_t msg_len) {
  return tck_read_rank_form(rc, job, step, rank, world, write_world, TCK_ONE_PER_MESSAGE, msg,
                            msg_len);
}

int tck_read_rank_form(struct rpc_client *rc, const char *job, int64_t step, uint32_t rank,
                       uint32_t world, uint32_t write_world, enum tck_form form, char *msg,
                       size_t msg_len) {
  struct wanted *w = calloc(1, sizeof(*w));
  for (size_t t = 0; t < N_MODEL; t++) {
    uint64_t lo = model[t].rows * rank / world, hi = model[t].rows * (rank + 1) / world;
    if (hi > lo) want(w, model[t].name, lo, hi - lo, model[t].cols, model[t].esize);
  }
  for (uint32_t r = rank; r < write_world && w->n < 16; r += world) {
    char blob[64];
    snprintf(blob, sizeof(blob), "blob/rank-%u", r);
    want(w, blob, 0, 1000 + r, 0, 1);
  }
  struct read_state rs = {
      .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .form = form};
  int code = read_wanted(rc, job, step, w, &rs, msg, msg_len);
  free(w);
  return code;
}

int tck_read_rows(struct rpc_client *rc, const char *job, int64_t step, uint32_t rows,
                  enum tck_form form, uint64_t *ret_messages, uint64_t *ret_pieces) {
  struct wanted *w = calloc(1, sizeof(*w));
  for (uint32_t r = 0; r < rows && r < MAX_WANTED && r < model[0].rows; r++)
    want(w, model[0].name, r, 1, model[0].cols, model[0].esize);
  struct read_state rs = {
      .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .form = form};
  int code = read_wanted(rc, job, step, w, &rs, NULL, 0);
  *ret_messages = rs.messages;
  *ret_pieces = rs.pieces;
  free(w);
  return code;
}

int tck_read_all(struct rpc_client *rc, const char *job, int64_t step, uint32_t world,
                 uint32_t write_world) {
  for (uint32_t r = 0; r < world; r++) {
    char msg[512] = "";
    int code = tck_read_rank(rc, job, step, r, world, write_world, msg, sizeof(msg));
    if (code != RPC_OK) {
      fprintf(stderr, "read rank %u/%u of %s@%lld: %d %s\n", r, world, job, (long long)step, code,
              msg);
      return code;
    }
  }
  return RPC_OK;
}

int tck_list(struct rpc_client *rc, const char *job, int64_t *ret_steps, size_t max) {
  Stoker__V1__ListCheckpointsRequest req = STOKER__V1__LIST_CHECKPOINTS_REQUEST__INIT;
  req.job = (char *)job;
  ProtobufCMessage *resp = NULL;
  if (tck_call(rc, "List", &req.base, &stoker__v1__list_checkpoints_response__descriptor, &resp,
               NULL, 0) != RPC_OK)
    return -1;
  Stoker__V1__ListCheckpointsResponse *l = (Stoker__V1__ListCheckpointsResponse *)resp;
  size_t n = l->n_checkpoints < max ? l->n_checkpoints : max;
  for (size_t i = 0; i < n; i++) ret_steps[i] = l->checkpoints[i]->step;
  protobuf_c_message_free_unpacked(resp, NULL);
  return (int)n;
}
