/*
 * ckpt_svc_fixture: shared helpers of the checkpoint service tests (see the
 * header).
 */
#include "ckpt_svc_fixture.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "ckpt_dtype.h"
#include "stk_error.h"

static void on_hook(void *arg, const char *job, int64_t step, const char *uri) {
  (void)job;
  (void)uri;
  struct fx *f = arg;
  f->hooks++;
  f->hook_step = step;
}

static void on_abort_hook(void *arg, const char *job, int64_t step, const char *attempt,
                          const char *reason) {
  (void)job;
  (void)attempt;
  struct fx *f = arg;
  f->abort_hooks++;
  f->abort_step = step;
  snprintf(f->abort_reason, sizeof(f->abort_reason), "%s", reason);
}

void fx_init(struct fx *f) {
  memset(f, 0, sizeof(*f));
  snprintf(f->dir, sizeof(f->dir), "/tmp/stk-ckpt-svc-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  snprintf(f->db, sizeof(f->db), "%s/db", f->dir);
  snprintf(f->data, sizeof(f->data), "%s/data", f->dir);
  snprintf(f->url, sizeof(f->url), "file://%s", f->data);
  char cmd[256];
  snprintf(cmd, sizeof(cmd), "mkdir -p %s", f->data);
  assert_int_equal(system(cmd), 0);
  assert_int_equal(uv_loop_init(&f->loop), 0);
  f->opts.db_dir = f->db;
  f->opts.storage_url = f->url;
  f->opts.staging_budget_bytes = 64 << 20;
  f->opts.upload_concurrency = 4;
  f->opts.part_bytes = 5 << 20;
  f->opts.commit_hook = on_hook;
  f->opts.commit_hook_arg = f;
  f->opts.abort_hook = on_abort_hook;
  f->opts.abort_hook_arg = f;
}

int fx_open(struct fx *f) {
  return ckpt_service_open(&f->loop, &f->opts, &f->svc);
}

static void on_closed(void *arg) {
  *(bool *)arg = true;
}

void fx_close(struct fx *f) {
  if (!f->svc) return;
  bool closed = false;
  ckpt_service_close(f->svc, on_closed, &closed);
  fx_run_until(f, &closed, 30000);
  f->svc = NULL;
}

void fx_fini(struct fx *f) {
  fx_close(f);
  uv_run(&f->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&f->loop), 0);
  char cmd[160];
  snprintf(cmd, sizeof(cmd), "rm -rf %s", f->dir);
  assert_int_equal(system(cmd), 0);
}

static void on_timeout(uv_timer_t *t) {
  *(bool *)t->data = true;
}

void fx_run_until(struct fx *f, const bool *flag, uint32_t timeout_ms) {
  uv_timer_t t;
  bool expired = false;
  uv_timer_init(&f->loop, &t);
  t.data = &expired;
  uv_timer_start(&t, on_timeout, timeout_ms, 0);
  while (!*flag && !expired) uv_run(&f->loop, UV_RUN_ONCE);
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(&f->loop, UV_RUN_NOWAIT);
  if (!*flag) fail_msg("timed out after %u ms", timeout_ms);
}

int64_t fx_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void fx_run_for(struct fx *f, uint32_t ms) {
  int64_t end = fx_now_ms() + ms;
  while (fx_now_ms() < end) uv_run(&f->loop, UV_RUN_ONCE);
}

/* ---- Blocking wrappers ---- */

struct call {
  bool done;
  int err;
  char msg[512];
  char attempt[65];
  int64_t steps[64];
  size_t n;
  uint64_t problems;
  char next[128]; /* List: next_page_token */
};

static void on_done(void *arg, int err, const char *msg, const ProtobufCMessage *resp) {
  struct call *c = arg;
  c->done = true;
  c->err = err;
  snprintf(c->msg, sizeof(c->msg), "%s", msg ? msg : "");
  if (!resp) return;
  if (resp->descriptor == &stoker__v1__begin_response__descriptor)
    snprintf(c->attempt, sizeof(c->attempt), "%s",
             ((const Stoker__V1__BeginResponse *)resp)->attempt);
  if (resp->descriptor == &stoker__v1__list_checkpoints_response__descriptor) {
    const Stoker__V1__ListCheckpointsResponse *l = (const void *)resp;
    for (size_t i = 0; i < l->n_checkpoints && c->n < 64; i++)
      c->steps[c->n++] = l->checkpoints[i]->step;
    snprintf(c->next, sizeof(c->next), "%s", l->next_page_token);
  }
  if (resp->descriptor == &stoker__v1__verify_checkpoint_response__descriptor)
    c->problems = ((const Stoker__V1__VerifyCheckpointResponse *)resp)->n_problems;
}

int fx_begin(struct fx *f, const char *job, int64_t step, uint32_t world, char ret_attempt[65]) {
  struct call c = {0};
  Stoker__V1__BeginRequest req = STOKER__V1__BEGIN_REQUEST__INIT;
  req.job = (char *)job;
  req.step = step;
  req.world = world;
  ckpt_begin(f->svc, &req, on_done, &c);
  fx_run_until(f, &c.done, 10000);
  if (!c.err) memcpy(ret_attempt, c.attempt, 65);
  return c.err;
}

int fx_commit(struct fx *f, const char *attempt, char *ret_msg, size_t msg_len) {
  struct call c = {0};
  Stoker__V1__CommitCheckpointRequest req = STOKER__V1__COMMIT_CHECKPOINT_REQUEST__INIT;
  req.attempt = (char *)attempt;
  ckpt_commit(f->svc, &req, on_done, &c);
  fx_run_until(f, &c.done, 60000);
  if (ret_msg) snprintf(ret_msg, msg_len, "%s", c.msg);
  return c.err;
}

int fx_list(struct fx *f, const char *job, int64_t *ret_steps, size_t max, size_t *ret_n) {
  struct call c = {0};
  Stoker__V1__ListCheckpointsRequest req = STOKER__V1__LIST_CHECKPOINTS_REQUEST__INIT;
  req.job = (char *)job;
  ckpt_list(f->svc, &req, on_done, &c);
  fx_run_until(f, &c.done, 10000);
  *ret_n = c.n < max ? c.n : max;
  memcpy(ret_steps, c.steps, *ret_n * sizeof(int64_t));
  return c.err;
}

int fx_list_page(struct fx *f, const char *job, uint32_t page_size, const char *token,
                 int64_t *ret_steps, size_t max, size_t *ret_n, char ret_next[128]) {
  struct call c = {0};
  Stoker__V1__ListCheckpointsRequest req = STOKER__V1__LIST_CHECKPOINTS_REQUEST__INIT;
  req.job = (char *)job;
  req.page_size = page_size;
  if (token) req.page_token = (char *)token;
  ckpt_list(f->svc, &req, on_done, &c);
  fx_run_until(f, &c.done, 10000);
  *ret_n = c.n < max ? c.n : max;
  memcpy(ret_steps, c.steps, *ret_n * sizeof(int64_t));
  memcpy(ret_next, c.next, 128);
  if (c.err) snprintf(ret_next, 128, "%.127s", c.msg);
  return c.err;
}

int fx_verify(struct fx *f, const char *job, int64_t step, uint64_t *ret_problems) {
  struct call c = {0};
  Stoker__V1__VerifyCheckpointRequest req = STOKER__V1__VERIFY_CHECKPOINT_REQUEST__INIT;
  req.job = (char *)job;
  req.step = step;
  ckpt_verify(f->svc, &req, on_done, &c);
  fx_run_until(f, &c.done, 30000);
  *ret_problems = c.problems;
  return c.err;
}

int fx_delete(struct fx *f, const char *job, int64_t step) {
  struct call c = {0};
  Stoker__V1__DeleteCheckpointRequest req = STOKER__V1__DELETE_CHECKPOINT_REQUEST__INIT;
  req.job = (char *)job;
  req.step = step;
  ckpt_delete(f->svc, &req, on_done, &c);
  fx_run_until(f, &c.done, 10000);
  return c.err;
}

/* ---- The synthetic model ---- */

static uint8_t byte_at(uint64_t seed, uint64_t i) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + seed * 0xD1B54A32D192ED03ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return (uint8_t)(x >> 40);
}

static void add_tensor(struct model *m, const char *name, int dtype, enum tkind kind, uint32_t ndim,
                       const uint64_t *dims, uint32_t owner, uint64_t seed) {
  struct tspec *t = &m->t[m->n++];
  snprintf(t->name, sizeof(t->name), "%s", name);
  t->dtype = dtype;
  t->kind = kind;
  t->owner = owner;
  t->shape.ndim = ndim;
  uint64_t numel = 1;
  for (uint32_t i = 0; i < ndim; i++) numel *= (t->shape.dims[i] = dims[i]);
  t->bytes = numel * ckpt_dtype_bytes(dtype);
  t->full = malloc(t->bytes ? t->bytes : 1);
  assert_non_null(t->full);
  for (uint64_t i = 0; i < t->bytes; i++) t->full[i] = byte_at(seed * 131 + m->n, i);
}

struct model *model_new(uint32_t world, uint64_t flat_numel, uint64_t seed) {
  struct model *m = calloc(1, sizeof(*m));
  m->t = calloc(8 + world, sizeof(*m->t));
  uint64_t embed[2] = {96, 64}, proj[2] = {10, 7}, flat[1] = {flat_numel},
           avg[1] = {flat_numel / 2 + 1};
  add_tensor(m, "model/embed", STOKER__V1__DTYPE__DTYPE_F32, T_DIM0, 2, embed, 0, seed);
  add_tensor(m, "model/proj", STOKER__V1__DTYPE__DTYPE_BF16, T_DIM0, 2, proj, 0, seed);
  add_tensor(m, "model/flat0", STOKER__V1__DTYPE__DTYPE_F32, T_FLAT, 1, flat, 0, seed);
  add_tensor(m, "optim/flat0.exp_avg", STOKER__V1__DTYPE__DTYPE_BF16, T_FLAT, 1, avg, 0, seed);
  add_tensor(m, "optim/step", STOKER__V1__DTYPE__DTYPE_I64, T_SCALAR, 0, NULL, 0, seed);
  for (uint32_t r = 0; r < world; r++) {
    char name[64];
    uint64_t len[1] = {37 + r};
    snprintf(name, sizeof(name), "extra/rank-%u/rng", r);
    add_tensor(m, name, STOKER__V1__DTYPE__DTYPE_BYTES, T_BLOB, 1, len, r, seed);
  }
  return m;
}

struct model *model_new_fsdp(uint32_t n, uint64_t rows, uint64_t cols, uint64_t seed) {
  struct model *m = calloc(1, sizeof(*m));
  m->t = calloc(n, sizeof(*m->t));
  uint64_t dims[2] = {rows, cols};
  for (uint32_t i = 0; i < n; i++) {
    char name[64];
    snprintf(name, sizeof(name), "model/layer%u.weight", i);
    add_tensor(m, name, STOKER__V1__DTYPE__DTYPE_F32, T_DIM0, 2, dims, 0, seed);
  }
  return m;
}

void model_free(struct model *m) {
  if (!m) return;
  for (size_t i = 0; i < m->n; i++) free(m->t[i].full);
  free(m->t);
  free(m);
}

/* The box rank r of world holds (false: nothing). */
static bool shard_of(const struct tspec *t, uint32_t r, uint32_t world, struct ckpt_box *box) {
  uint64_t shard;
  switch (t->kind) {
  case T_DIM0:
    assert_int_equal(ckpt_shard_dim0(&t->shape, r, world, box), 0);
    break;
  case T_FLAT:
    assert_int_equal(ckpt_shard_flat(t->shape.dims[0], r, world, box, &shard), 0);
    break;
  case T_SCALAR:
    if (r != 0) return false;
    ckpt_box_of_shape(&t->shape, box);
    break;
  case T_BLOB:
    if (r != t->owner) return false;
    ckpt_box_of_shape(&t->shape, box);
    break;
  }
  return ckpt_box_numel(box) > 0 || t->shape.ndim == 0;
}

struct copy_ctx {
  const uint8_t *src;
  uint8_t *dst;
};

static int copy_run(void *ctx, const struct ckpt_run *run) {
  struct copy_ctx *c = ctx;
  memcpy(c->dst + run->dst_offset, c->src + run->src_offset, run->len);
  return 0;
}

/* The bytes of box x of t (malloc'd). */
static uint8_t *box_bytes(const struct tspec *t, const struct ckpt_box *x) {
  uint64_t elem = ckpt_dtype_bytes(t->dtype), n = ckpt_box_numel(x) * elem;
  uint8_t *out = malloc(n ? n : 1);
  struct ckpt_box whole;
  ckpt_box_of_shape(&t->shape, &whole);
  struct copy_ctx c = {t->full, out};
  assert_int_equal(ckpt_box_runs(x, &whole, x, elem, copy_run, &c), 0);
  return out;
}

/* ---- Writers ---- */

struct wchunk {
  const struct tspec *t;
  struct ckpt_box box;
};

struct wstate {
  struct ckpt_writer *w;
  struct wchunk *chunks;
  size_t n, next;
  bool resumed, failed, staged, durable, done;
};

static void on_wevent(void *arg, enum ckpt_write_event ev, int err, const char *msg) {
  struct wstate *ws = arg;
  if (ev == CKPT_WRITE_RESUME) ws->resumed = true;
  (void)err;
  (void)msg;
  if (ev == CKPT_WRITE_FAILED) ws->failed = ws->resumed = ws->staged = ws->durable = true;
  if (ev == CKPT_WRITE_STAGED) ws->staged = true;
  if (ev == CKPT_WRITE_DURABLE) ws->durable = true;
}

/* Splits a box along dim 0 into pieces of at most max bytes. */
static void split(const struct tspec *t, const struct ckpt_box *b, uint64_t max,
                  struct wstate *ws) {
  uint64_t elem = ckpt_dtype_bytes(t->dtype), row = elem;
  for (uint32_t i = 1; i < b->ndim; i++) row *= b->sizes[i];
  uint64_t rows = b->ndim == 0 ? 1 : (max / row ? max / row : 1);
  uint64_t total = b->ndim == 0 ? 1 : b->sizes[0];
  for (uint64_t at = 0; at < total; at += rows) {
    struct wchunk *c = &ws->chunks[ws->n++];
    c->t = t;
    c->box = *b;
    if (b->ndim > 0) {
      c->box.offsets[0] = b->offsets[0] + at;
      c->box.sizes[0] = total - at < rows ? total - at : rows;
    }
  }
}

static void plan_rank(const struct model *m, uint32_t r, const struct write_opts *wo,
                      struct wstate *ws) {
  uint64_t max = wo->max_chunk_bytes ? wo->max_chunk_bytes : 1 << 20;
  size_t cap = 0;
  for (size_t i = 0; i < m->n; i++) cap += m->t[i].bytes / max + 2;
  ws->chunks = calloc(cap, sizeof(*ws->chunks));
  for (size_t i = 0; i < m->n; i++) {
    struct ckpt_box b;
    if (shard_of(&m->t[i], r, wo->world, &b)) split(&m->t[i], &b, max, ws);
  }
}

/* Feeds the next chunk of a rank: 1 fed, 0 waiting, <0 error. */
static int feed_one(const char *attempt, uint32_t r, struct wstate *ws, const struct write_opts *wo,
                    uint64_t *waits) {
  Stoker__V1__WriteChunk c = STOKER__V1__WRITE_CHUNK__INIT;
  Stoker__V1__Box box = STOKER__V1__BOX__INIT;
  c.attempt = (char *)attempt;
  c.rank = r;
  uint8_t *data = NULL;
  bool end = ws->next == ws->n;
  if (!end) {
    const struct wchunk *k = &ws->chunks[ws->next];
    data = box_bytes(k->t, &k->box);
    c.tensor = (char *)k->t->name;
    c.dtype = k->t->dtype;
    c.n_global_shape = k->t->shape.ndim;
    c.global_shape = (uint64_t *)k->t->shape.dims;
    box.n_offsets = box.n_sizes = k->box.ndim;
    box.offsets = (uint64_t *)k->box.offsets;
    box.sizes = (uint64_t *)k->box.sizes;
    c.box = &box;
    c.data.data = data;
    c.data.len = ckpt_box_numel(&k->box) * ckpt_dtype_bytes(k->t->dtype);
  }
  c.last = end && (int64_t)r != wo->skip_last_rank;
  ws->resumed = false;
  if (end && !c.last) {
    ws->done = true; /* This rank never ends its stream. */
    return 1;
  }
  int rc = ckpt_write_feed(ws->w, &c);
  free(data);
  if (rc == CKPT_WRITE_WAIT) {
    (*waits)++;
    return 0;
  }
  if (rc < 0) return rc;
  if (end)
    ws->done = true;
  else
    ws->next++;
  return 1;
}

int fx_feed_1d(struct ckpt_writer *w, const struct chunk_1d *c) {
  uint64_t shape[1] = {c->dim}, offs[1] = {c->off}, sizes[1] = {c->size};
  Stoker__V1__Box box = STOKER__V1__BOX__INIT;
  box.n_offsets = box.n_sizes = 1;
  box.offsets = offs;
  box.sizes = sizes;
  Stoker__V1__WriteChunk wc = STOKER__V1__WRITE_CHUNK__INIT;
  wc.attempt = (char *)c->attempt;
  wc.rank = c->rank;
  wc.tensor = (char *)c->tensor;
  wc.dtype = c->dtype;
  wc.n_global_shape = 1;
  wc.global_shape = shape;
  wc.box = &box;
  wc.data.data = calloc(1, c->data_len ? c->data_len : 1);
  assert_non_null(wc.data.data);
  wc.data.len = c->data_len;
  wc.last = c->last;
  int rc = ckpt_write_feed(w, &wc); /* Consumed or not, the bytes are not kept. */
  free(wc.data.data);
  return rc;
}

int fx_write_model(struct fx *f, const char *attempt, const struct model *m,
                   const struct write_opts *wo, uint64_t *ret_waits) {
  struct wstate *ws = calloc(wo->world, sizeof(*ws));
  uint64_t waits = 0;
  int err = 0;
  for (uint32_t r = 0; r < wo->world && !err; r++) {
    plan_rank(m, r, wo, &ws[r]);
    err = ckpt_write_open(f->svc, attempt, r, on_wevent, &ws[r], &ws[r].w);
  }
  for (bool more = true; more && !err;) {
    more = false;
    for (uint32_t r = 0; r < wo->world && !err; r++) {
      if (ws[r].done) continue;
      more = true;
      int rc = feed_one(attempt, r, &ws[r], wo, &waits);
      if (rc < 0) {
        err = rc;
        print_message("# feed rank %u: %s: %s\n", r, stk_errname(rc), stk_detail());
      }
      if (rc == 0) fx_run_until(f, &ws[r].resumed, 30000);
    }
  }
  for (uint32_t r = 0; r < wo->world; r++) {
    if (!err && (int64_t)r != wo->skip_last_rank) {
      fx_run_until(f, &ws[r].staged, 30000);
      if (!wo->close_after_staged) fx_run_until(f, &ws[r].durable, 60000);
    }
    ckpt_write_close(ws[r].w);
    free(ws[r].chunks);
  }
  free(ws);
  if (ret_waits) *ret_waits = waits;
  return err;
}

/* ---- Reading ---- */

struct rstate {
  const struct ckpt_box *want;
  uint64_t elem;
  uint8_t *out;
  bool done;
  int err;
  char msg[512];
  uint64_t pieces;
};

static bool on_piece(void *arg, const Stoker__V1__ReadChunk *p) {
  struct rstate *rs = arg;
  struct ckpt_box pb = {.ndim = (uint32_t)p->box->n_offsets};
  if (pb.ndim) {
    memcpy(pb.offsets, p->box->offsets, pb.ndim * sizeof(uint64_t));
    memcpy(pb.sizes, p->box->sizes, pb.ndim * sizeof(uint64_t));
  }
  assert_int_equal(p->data.len, ckpt_box_numel(&pb) * rs->elem);
  struct copy_ctx c = {p->data.data, rs->out};
  assert_int_equal(ckpt_box_runs(&pb, &pb, rs->want, rs->elem, copy_run, &c), 0);
  rs->pieces++;
  return true;
}

static void on_read_done(void *arg, int err, const char *msg, const ProtobufCMessage *resp) {
  (void)resp;
  struct rstate *rs = arg;
  rs->done = true;
  rs->err = err;
  snprintf(rs->msg, sizeof(rs->msg), "%s", msg);
}

int fx_read_check(struct fx *f, const char *job, int64_t step, const struct tspec *t,
                  const struct ckpt_box *want, char *msg, size_t msg_len) {
  uint64_t elem = ckpt_dtype_bytes(t->dtype), n = ckpt_box_numel(want) * elem;
  struct rstate rs = {.want = want, .elem = elem, .out = calloc(1, n ? n : 1)};
  Stoker__V1__ReadRequest req = STOKER__V1__READ_REQUEST__INIT;
  Stoker__V1__ChunkEntry ce = STOKER__V1__CHUNK_ENTRY__INIT, *cep = &ce;
  Stoker__V1__Box box = STOKER__V1__BOX__INIT;
  box.n_offsets = box.n_sizes = want->ndim;
  box.offsets = (uint64_t *)want->offsets;
  box.sizes = (uint64_t *)want->sizes;
  ce.tensor = (char *)t->name;
  ce.box = &box;
  req.job = (char *)job;
  req.step = step;
  req.n_wanted = 1;
  req.wanted = &cep;
  ckpt_read(f->svc, &req, on_piece, on_read_done, &rs);
  fx_run_until(f, &rs.done, 30000);
  if (msg) snprintf(msg, msg_len, "%s", rs.msg);
  int rc = rs.err;
  if (!rc) {
    uint8_t *expect = box_bytes(t, want);
    if (memcmp(expect, rs.out, n) != 0) rc = -1000;
    free(expect);
  }
  free(rs.out);
  return rc;
}

/* One Read of many boxes: the wanted boxes and where their bytes go. */
struct mstate {
  const struct model *m;
  struct ckpt_box *want; /* Per tensor (numel 0: not wanted). */
  uint8_t **out;
  bool pack; /* The request asked for pack_pieces. */
  struct fx_read_counts counts;
  bool done;
  int err;
  char msg[512];
};

static void multi_place(struct mstate *ms, const Stoker__V1__ReadChunk *p) {
  assert_int_equal(p->n_pieces, 0);
  size_t i = 0;
  while (i < ms->m->n && strcmp(ms->m->t[i].name, p->tensor) != 0) i++;
  assert_true(i < ms->m->n);
  uint64_t elem = ckpt_dtype_bytes(ms->m->t[i].dtype);
  struct ckpt_box pb = {.ndim = (uint32_t)p->box->n_offsets};
  memcpy(pb.offsets, p->box->offsets, pb.ndim * sizeof(uint64_t));
  memcpy(pb.sizes, p->box->sizes, pb.ndim * sizeof(uint64_t));
  assert_int_equal(p->data.len, ckpt_box_numel(&pb) * elem);
  struct copy_ctx c = {p->data.data, ms->out[i]};
  assert_int_equal(ckpt_box_runs(&pb, &pb, &ms->want[i], elem, copy_run, &c), 0);
  ms->counts.pieces++;
}

/* A message: one piece, or (pack) its list of pieces, never both. */
static bool on_multi_piece(void *arg, const Stoker__V1__ReadChunk *p) {
  struct mstate *ms = arg;
  ms->counts.messages++;
  if (!ms->pack) {
    multi_place(ms, p);
    return true;
  }
  assert_true(p->n_pieces >= 1);
  assert_true(!p->tensor || !p->tensor[0]);
  assert_null(p->box);
  assert_int_equal(p->data.len, 0);
  for (size_t k = 0; k < p->n_pieces; k++) multi_place(ms, p->pieces[k]);
  if (p->n_pieces > 1) {
    uint64_t n = protobuf_c_message_get_packed_size(&p->base);
    if (n > ms->counts.max_packed_bytes) ms->counts.max_packed_bytes = n;
  }
  return true;
}

static void on_multi_done(void *arg, int err, const char *msg, const ProtobufCMessage *resp) {
  (void)resp;
  struct mstate *ms = arg;
  ms->done = true;
  ms->err = err;
  snprintf(ms->msg, sizeof(ms->msg), "%s", msg);
}

/* The Read request of ms's wanted boxes (arrays of m->n, freed by the caller). */
static void multi_request(struct mstate *ms, Stoker__V1__ChunkEntry *ce, Stoker__V1__Box *box,
                          Stoker__V1__ChunkEntry **cep, size_t *ret_n) {
  size_t n = 0;
  for (size_t i = 0; i < ms->m->n; i++) {
    if (ckpt_box_numel(&ms->want[i]) == 0) continue;
    stoker__v1__chunk_entry__init(&ce[n]);
    stoker__v1__box__init(&box[n]);
    box[n].n_offsets = box[n].n_sizes = ms->want[i].ndim;
    box[n].offsets = ms->want[i].offsets;
    box[n].sizes = ms->want[i].sizes;
    ce[n].tensor = (char *)ms->m->t[i].name;
    ce[n].box = &box[n];
    cep[n] = &ce[n];
    n++;
  }
  *ret_n = n;
}

int fx_read_rank(struct fx *f, const char *job, int64_t step, const struct model *m, uint32_t rank,
                 uint32_t world) {
  return fx_read_rank_counted(f, job, step, m, rank, world, false, NULL);
}

/* Starts a Read of rank's share of every tensor of m at world size world
 * into a new mstate (its boxes, its buffers, its request's arrays). */
static struct mstate *multi_start(struct fx *f, const char *job, int64_t step,
                                  const struct model *m, uint32_t rank, uint32_t world, bool pack) {
  struct mstate *ms = calloc(1, sizeof(*ms));
  *ms = (struct mstate){.m = m,
                        .want = calloc(m->n, sizeof(*ms->want)),
                        .out = calloc(m->n, sizeof(*ms->out)),
                        .pack = pack};
  for (size_t i = 0; i < m->n; i++) {
    if (!shard_of(&m->t[i], rank, world, &ms->want[i])) ms->want[i] = (struct ckpt_box){0};
    uint64_t n = ckpt_box_numel(&ms->want[i]) * ckpt_dtype_bytes(m->t[i].dtype);
    ms->out[i] = calloc(1, n ? n : 1);
  }
  Stoker__V1__ChunkEntry *ce = calloc(m->n, sizeof(*ce)), **cep = calloc(m->n, sizeof(*cep));
  Stoker__V1__Box *box = calloc(m->n, sizeof(*box));
  Stoker__V1__ReadRequest req = STOKER__V1__READ_REQUEST__INIT;
  req.job = (char *)job;
  req.step = step;
  req.wanted = cep;
  req.pack_pieces = pack;
  multi_request(ms, ce, box, cep, &req.n_wanted);
  ckpt_read(f->svc, &req, on_multi_piece, on_multi_done, ms); /* Copies the request. */
  free(ce);
  free(cep);
  free(box);
  return ms;
}

/* A finished Read's answer: its error, or -1000 when a byte differs from
 * the model's; ms freed. */
static int multi_finish(struct mstate *ms, uint32_t rank, uint32_t world) {
  int rc = ms->err;
  if (rc) print_error("read rank %u/%u: %d %s\n", rank, world, rc, ms->msg);
  for (size_t i = 0; i < ms->m->n; i++) {
    uint64_t n = ckpt_box_numel(&ms->want[i]) * ckpt_dtype_bytes(ms->m->t[i].dtype);
    if (!rc && n > 0) {
      uint8_t *expect = box_bytes(&ms->m->t[i], &ms->want[i]);
      if (memcmp(expect, ms->out[i], n) != 0) rc = -1000;
      free(expect);
    }
    free(ms->out[i]);
  }
  free(ms->out);
  free(ms->want);
  free(ms);
  return rc;
}

int fx_read_rank_counted(struct fx *f, const char *job, int64_t step, const struct model *m,
                         uint32_t rank, uint32_t world, bool pack,
                         struct fx_read_counts *ret_counts) {
  struct mstate *ms = multi_start(f, job, step, m, rank, world, pack);
  fx_run_until(f, &ms->done, 60000);
  if (ret_counts) *ret_counts = ms->counts;
  return multi_finish(ms, rank, world);
}

int fx_read_together(struct fx *f, const struct fx_read *reads, size_t n, int *ret_rcs) {
  struct mstate **ms = calloc(n, sizeof(*ms));
  for (size_t i = 0; i < n; i++)
    ms[i] = multi_start(f, reads[i].job, reads[i].step, reads[i].m, reads[i].rank, reads[i].world,
                        true);
  int rc = 0;
  for (size_t i = 0; i < n; i++) {
    fx_run_until(f, &ms[i]->done, 60000);
    ret_rcs[i] = multi_finish(ms[i], reads[i].rank, reads[i].world);
    if (ret_rcs[i] && !rc) rc = ret_rcs[i];
  }
  free(ms);
  return rc;
}

int fx_read_all(struct fx *f, const char *job, int64_t step, const struct model *m,
                uint32_t world) {
  char msg[512];
  for (size_t i = 0; i < m->n; i++) {
    const struct tspec *t = &m->t[i];
    for (uint32_t r = 0; r < world; r++) {
      struct ckpt_box b;
      if (t->kind == T_BLOB && r > 0) break;
      if (t->kind == T_BLOB || t->kind == T_SCALAR)
        ckpt_box_of_shape(&t->shape, &b);
      else if (!shard_of(t, r, world, &b))
        continue;
      int rc = fx_read_check(f, job, step, t, &b, msg, sizeof(msg));
      if (rc) {
        print_error("read %s rank %u/%u: %d %s\n", t->name, r, world, rc, msg);
        return rc;
      }
    }
  }
  return 0;
}
