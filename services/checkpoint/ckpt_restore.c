/*
 * ckpt_restore: reading a committed checkpoint back at any world size, and
 * verifying one. A read is a sequence of pieces: each wanted box is cut into
 * sub-boxes of at most read_piece_bytes (whole trailing dims, a run of rows
 * of the first dim that fits), and each piece is planned (ckpt_plan:
 * coalesced ranged reads widened to CRC blocks), fetched, CRC-checked block
 * by block and assembled on a worker, then handed to the caller on the loop,
 * in order. Up to READ_WINDOW pieces of one read are fetched at once (on
 * the service's restore threads) while the caller sends the one before:
 * fetching, CRC checks and sending overlap, and memory stays bounded by
 * the window plus the piece the caller holds.
 *
 * A read through shared memory (the request names a read file,
 * ckpt_shm_read.h) writes each piece into that file instead: the wanted
 * boxes lie there one after the other, row-major, so a piece's place is
 * the running sum of the pieces before it; its worker writes the fetched
 * bytes straight there (no assembled copy) and the caller is handed the
 * piece's offset and length instead of its bytes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_crc.h"
#include "ckpt_dtype.h"
#include "ckpt_manifest.h"
#include "ckpt_service_int.h"
#include "ckpt_shm_read.h"
#include "stk_error.h"

struct wanted {
  char *tensor;
  struct ckpt_box box;
  uint64_t elem;
  struct ckpt_stored_chunk *chunks;
  size_t n_chunks;
  uint32_t split_dim; /* Pieces are 1 wide in dims before it. */
  uint64_t rows;      /* Rows of split_dim per piece. */
  uint64_t n_pieces;
};

/* Pieces of one read fetched or waiting at once. */
#define READ_WINDOW 4
/* A read through shared memory cuts pieces this many times larger: no
 * message carries them, and fewer, larger ranged GETs cost the store less
 * (s3rver spent a quarter less CPU per load at 16 MiB than at 4). */
#define SHM_PIECE_FACTOR 4

/* One piece: fetched and assembled on a restore thread. */
struct piece {
  struct ckpt_task t; /* First: the task is the piece. */
  struct ckpt_reader *rd;
  size_t wi; /* Its wanted entry. */
  struct ckpt_box box;
  uint8_t *data; /* The assembled piece (NULL for a read file). */
  uint64_t len;
  uint64_t shm_off; /* Its place in the read file. */
  bool fetched;     /* Its work ran. */
  int err;
  char msg[320];
};

struct ckpt_reader {
  struct ckpt_task t; /* Loads the manifest and checks the wanted boxes. */
  struct ckpt_service *s;
  Stoker__V1__ReadRequest *req; /* Copied. */
  char job[CKPT_JOB_MAX_BYTES + 1];
  int64_t step;
  struct ckpt_manifest *m;
  int shm_fd;        /* The read file, or -1: pieces go inline. */
  uint64_t shm_size; /* Its size when opened. */
  uint64_t shm_next; /* Where the next piece started goes. */
  char shm_name[64];
  struct wanted *w;
  size_t n_w;
  size_t wi; /* The next piece to start: piece pi of wanted entry wi. */
  uint64_t pi;
  struct piece win[READ_WINDOW]; /* Started, not yet delivered: head .. head + n - 1. */
  unsigned head, n;
  unsigned tasks; /* Submitted tasks whose after has not run. */
  bool held, finished;
  ckpt_piece_fn on_piece;
  ckpt_done_fn done;
  void *arg;
  int err;
  char msg[320];
};

/* ---- Pieces ---- */

static void plan_pieces(struct wanted *w, uint64_t limit) {
  uint32_t nd = w->box.ndim;
  w->split_dim = 0;
  w->rows = 1;
  w->n_pieces = 1;
  if (nd == 0 || ckpt_box_numel(&w->box) == 0) return;
  uint64_t row = w->elem;
  int d = (int)nd - 1;
  /* row = bytes of one index of dim d (all later dims whole). */
  while (d > 0 && row * w->box.sizes[d] <= limit) row *= w->box.sizes[d--];
  w->split_dim = (uint32_t)d;
  w->rows = limit / row ? limit / row : 1;
  uint64_t outer = 1;
  for (int i = 0; i < d; i++) outer *= w->box.sizes[i];
  w->n_pieces = outer * ((w->box.sizes[d] + w->rows - 1) / w->rows);
}

static void piece_box(const struct wanted *w, uint64_t k, struct ckpt_box *ret) {
  *ret = w->box;
  if (w->box.ndim == 0 || ckpt_box_numel(&w->box) == 0) return;
  uint32_t d = w->split_dim;
  uint64_t per = (w->box.sizes[d] + w->rows - 1) / w->rows;
  uint64_t q = k / per, r = k % per;
  for (int i = (int)d - 1; i >= 0; i--) {
    ret->offsets[i] = w->box.offsets[i] + q % w->box.sizes[i];
    ret->sizes[i] = 1;
    q /= w->box.sizes[i];
  }
  ret->offsets[d] = w->box.offsets[d] + r * w->rows;
  uint64_t left = w->box.sizes[d] - r * w->rows;
  ret->sizes[d] = left < w->rows ? left : w->rows;
}

/* ---- Worker: fetch, verify, assemble ---- */

static int fetch_read(const struct ckpt_reader *rd, const struct ckpt_read *r, uint8_t *buf) {
  const struct ckpt_object *o = &rd->m->objects[r->object];
  char *key;
  int err = ckpt_key_object(rd->s->prefix, rd->m->job, rd->m->step, rd->m->attempt, o->key, &key);
  if (err) return err;
  size_t got = 0;
  err = storage_get(rd->s->st, key, r->offset, buf, r->len, &got);
  free(key);
  if (!err && got != r->len) {
    stk_set_detail("object %s is shorter than its manifest says", o->key);
    return STK_ECORRUPT;
  }
  if (!err)
    err = ckpt_crc_verify(o->block_crc32c, o->n_blocks, o->size_bytes, r->offset, buf, r->len);
  if (err == STK_ECORRUPT) {
    char d[256];
    snprintf(d, sizeof(d), "%s", stk_detail());
    stk_set_detail("object %s: %s", o->key, d);
  }
  return err;
}

/* Piece box of wanted entry w, fetched and assembled into *ret_data
 * (malloc'ed, *ret_len bytes; left to the caller to free even on error). */
static int assemble(const struct ckpt_reader *rd, const struct wanted *w,
                    const struct ckpt_box *box, uint8_t **ret_data, uint64_t *ret_len) {
  struct ckpt_plan plan;
  struct ckpt_plan_opts po = {
      .max_gap_bytes = 256 << 10, .max_read_bytes = 64 << 20, .align_bytes = CKPT_CRC_BLOCK_BYTES};
  int err = ckpt_plan_build(w->chunks, w->n_chunks, w->elem, box, &po, &plan);
  if (err) return err;
  *ret_len = plan.want_bytes;
  *ret_data = malloc(plan.want_bytes ? plan.want_bytes : 1);
  if (!*ret_data) err = STK_ENOMEM;
  for (size_t i = 0; !err && i < plan.n_reads; i++) {
    uint8_t *buf = malloc(plan.reads[i].len ? plan.reads[i].len : 1);
    err = buf ? fetch_read(rd, &plan.reads[i], buf) : STK_ENOMEM;
    if (!err) ckpt_plan_apply(&plan, i, buf, *ret_data);
    free(buf);
  }
  ckpt_plan_close(&plan);
  return err;
}

/* Piece box of wanted entry w, fetched and written at off of the read
 * file: each read's copies go straight from the fetched bytes, those with
 * adjacent destinations in one pwritev. */
static int assemble_shm(const struct ckpt_reader *rd, const struct wanted *w,
                        const struct ckpt_box *box, uint64_t off, uint64_t *ret_len) {
  struct ckpt_plan plan;
  struct ckpt_plan_opts po = {
      .max_gap_bytes = 256 << 10, .max_read_bytes = 64 << 20, .align_bytes = CKPT_CRC_BLOCK_BYTES};
  int err = ckpt_plan_build(w->chunks, w->n_chunks, w->elem, box, &po, &plan);
  if (err) return err;
  *ret_len = plan.want_bytes;
  enum { BATCH = 256 };
  struct iovec iov[BATCH];
  for (size_t i = 0; !err && i < plan.n_reads; i++) {
    const struct ckpt_read *r = &plan.reads[i];
    uint8_t *buf = malloc(r->len ? r->len : 1);
    err = buf ? fetch_read(rd, r, buf) : STK_ENOMEM;
    int n = 0;
    uint64_t at = 0, end = 0;
    for (size_t c = r->first_copy; !err && c < r->first_copy + r->n_copies; c++) {
      const struct ckpt_copy *cp = &plan.copies[c];
      if (n > 0 && (n == BATCH || cp->dst_offset != end)) {
        err = ckpt_shm_read_putv(rd->shm_fd, iov, n, off + at);
        n = 0;
      }
      if (n == 0) at = end = cp->dst_offset;
      iov[n++] = (struct iovec){.iov_base = buf + cp->read_offset, .iov_len = cp->len};
      end += cp->len;
    }
    if (!err && n > 0) err = ckpt_shm_read_putv(rd->shm_fd, iov, n, off + at);
    free(buf);
  }
  ckpt_plan_close(&plan);
  return err;
}

/* The bytes of every wanted box together must fit in the read file. */
static int check_shm_room(const struct ckpt_reader *rd) {
  uint64_t need = 0;
  for (size_t i = 0; i < rd->n_w; i++) {
    uint64_t n;
    if (__builtin_mul_overflow(ckpt_box_numel(&rd->w[i].box), rd->w[i].elem, &n) ||
        __builtin_add_overflow(need, n, &need))
      need = UINT64_MAX;
  }
  if (need > rd->shm_size - CKPT_SHM_READ_DATA) {
    stk_set_detail("shm read file %s holds %llu bytes after its header; the wanted boxes need %llu",
                   rd->shm_name, (unsigned long long)(rd->shm_size - CKPT_SHM_READ_DATA),
                   (unsigned long long)need);
    return STK_EINVAL;
  }
  return 0;
}

/* The first job also loads the manifest and checks every wanted box. */
static int prepare(struct ckpt_reader *rd) {
  int err = ckpt_load_manifest(rd->s, rd->job, rd->step, &rd->m, NULL, NULL);
  if (err) return err;
  rd->w = calloc(rd->req->n_wanted ? rd->req->n_wanted : 1, sizeof(*rd->w));
  if (!rd->w) return STK_ENOMEM;
  for (size_t i = 0; i < rd->req->n_wanted; i++) {
    const Stoker__V1__ChunkEntry *c = rd->req->wanted[i];
    struct wanted *w = &rd->w[i];
    rd->n_w = i + 1; /* counted before it holds anything: reader_free frees it on any error */
    int dtype;
    struct ckpt_shape shape;
    if (!c->tensor || ckpt_name_check_tensor(c->tensor)) return STK_EINVAL;
    err = ckpt_manifest_tensor(rd->m, c->tensor, &w->chunks, &w->n_chunks, &dtype, &shape);
    if (err == STK_ENOENT) stk_set_detail("no tensor %s in the checkpoint", c->tensor);
    if (err) return err;
    w->tensor = strdup(c->tensor);
    w->elem = ckpt_dtype_bytes(dtype);
    if (!c->box || c->box->n_offsets != shape.ndim || c->box->n_sizes != shape.ndim) {
      stk_set_detail("tensor %s: the wanted box needs %u dims", c->tensor, shape.ndim);
      return STK_EINVAL;
    }
    w->box.ndim = shape.ndim;
    u64copy(w->box.offsets, c->box->offsets, shape.ndim);
    u64copy(w->box.sizes, c->box->sizes, shape.ndim);
    if ((err = ckpt_box_check(&w->box, &shape)) != 0) return err;
    plan_pieces(w, (uint64_t)rd->s->o.read_piece_bytes * (rd->shm_fd >= 0 ? SHM_PIECE_FACTOR : 1));
  }
  return rd->shm_fd >= 0 ? check_shm_room(rd) : 0;
}

static void prepare_work(struct ckpt_task *t) {
  struct ckpt_reader *rd = (struct ckpt_reader *)t;
  stk_clear_detail();
  rd->err = prepare(rd);
  if (rd->err)
    snprintf(rd->msg, sizeof(rd->msg), "%s",
             stk_detail()[0] ? stk_detail() : stk_strerror(rd->err));
}

static void piece_work(struct ckpt_task *t) {
  struct piece *p = (struct piece *)t;
  stk_clear_detail();
  if (p->rd->shm_fd >= 0)
    p->err = assemble_shm(p->rd, &p->rd->w[p->wi], &p->box, p->shm_off, &p->len);
  else
    p->err = assemble(p->rd, &p->rd->w[p->wi], &p->box, &p->data, &p->len);
  if (p->err)
    snprintf(p->msg, sizeof(p->msg), "%s", stk_detail()[0] ? stk_detail() : stk_strerror(p->err));
}

/* ---- Loop side ---- */

static void reader_free(struct ckpt_reader *rd) {
  for (size_t i = 0; i < rd->n_w; i++) {
    free(rd->w[i].tensor);
    free(rd->w[i].chunks);
  }
  free(rd->w);
  for (unsigned i = 0; i < READ_WINDOW; i++) free(rd->win[i].data);
  if (rd->shm_fd >= 0) close(rd->shm_fd);
  ckpt_manifest_free(rd->m);
  if (rd->req) stoker__v1__read_request__free_unpacked(rd->req, NULL);
  free(rd);
}

/* Ends the read (done runs now); the record goes once no task is out. */
static void read_finish(struct ckpt_reader *rd, int err, const char *msg) {
  rd->finished = true;
  rd->done(rd->arg, err, msg, NULL);
  if (rd->tasks == 0) reader_free(rd);
}

/* Starts pieces in order until the window is full or none is left. */
static void fill(struct ckpt_reader *rd) {
  while (rd->n < READ_WINDOW) {
    while (rd->wi < rd->n_w && rd->pi >= rd->w[rd->wi].n_pieces) rd->wi++, rd->pi = 0;
    if (rd->wi >= rd->n_w) return;
    struct piece *p = &rd->win[(rd->head + rd->n) % READ_WINDOW];
    *p = (struct piece){.t = {.work = piece_work, .after = rd->t.after}, .rd = rd, .wi = rd->wi};
    piece_box(&rd->w[rd->wi], rd->pi++, &p->box);
    p->shm_off = rd->shm_next;
    rd->shm_next += ckpt_box_numel(&p->box) * rd->w[rd->wi].elem;
    rd->n++;
    rd->tasks++;
    ckpt_pool_submit(rd->s->read, &p->t);
  }
}

/* Hands the caller the pieces that are ready, in order, until it holds one
 * (or the read fails or ends). */
static void deliver(struct ckpt_reader *rd) {
  while (!rd->held && !rd->finished) {
    fill(rd);
    if (rd->n == 0) return read_finish(rd, 0, "");
    struct piece *p = &rd->win[rd->head];
    if (!p->fetched) return;
    if (p->err) return read_finish(rd, p->err, p->msg);
    struct wanted *w = &rd->w[p->wi];
    Stoker__V1__ReadChunk rc = STOKER__V1__READ_CHUNK__INIT;
    Stoker__V1__Box box = STOKER__V1__BOX__INIT;
    box.n_offsets = box.n_sizes = p->box.ndim;
    box.offsets = p->box.offsets;
    box.sizes = p->box.sizes;
    rc.tensor = w->tensor;
    rc.box = &box;
    if (rd->shm_fd >= 0) {
      rc.shm_offset = p->shm_off;
      rc.shm_length = p->len;
    } else {
      rc.data.data = p->data;
      rc.data.len = p->len;
    }
    bool more = rd->on_piece(rd->arg, &rc);
    free(p->data);
    p->data = NULL;
    rd->head = (rd->head + 1) % READ_WINDOW;
    rd->n--;
    if (!more) rd->held = true;
  }
}

/* After of the prepare task and of every piece. */
static void read_after(struct ckpt_task *t) {
  struct ckpt_reader *rd;
  if (t->work == prepare_work) {
    rd = (struct ckpt_reader *)t;
  } else {
    struct piece *p = (struct piece *)t;
    p->fetched = true;
    rd = p->rd;
  }
  rd->tasks--;
  if (rd->finished) { /* Ended (failed or cancelled) while tasks ran. */
    if (rd->tasks == 0) reader_free(rd);
    return;
  }
  if (t->work == prepare_work && rd->err) return read_finish(rd, rd->err, rd->msg);
  deliver(rd);
}

struct ckpt_reader *ckpt_read(struct ckpt_service *s, const Stoker__V1__ReadRequest *req,
                              ckpt_piece_fn on_piece, ckpt_done_fn done, void *arg) {
  if (s->closing) {
    svc_fail_later(s, done, arg, STK_EUNAVAIL, "closing");
    return NULL;
  }
  int err = ckpt_name_check_job(req->job);
  if (!err) err = ckpt_name_check_step(req->step);
  int shm_fd = -1;
  uint64_t shm_size = 0;
  if (!err && ((req->shm_name && req->shm_name[0]) || req->shm_nonce.len > 0)) {
    if (!s->shm) {
      stk_set_detail("shared-memory reads are off on this service (no shm dir): read inline");
      err = STK_ESTATE;
    } else {
      err = ckpt_shm_read_open(s->shm, req->shm_name, req->shm_nonce.data, req->shm_nonce.len,
                               &shm_fd, &shm_size);
    }
  }
  if (err) {
    svc_fail_later(s, done, arg, err, stk_detail());
    return NULL;
  }
  struct ckpt_reader *rd = calloc(1, sizeof(*rd));
  size_t n = protobuf_c_message_get_packed_size(&req->base);
  uint8_t *buf = malloc(n ? n : 1);
  if (rd && buf) {
    protobuf_c_message_pack(&req->base, buf);
    rd->req = stoker__v1__read_request__unpack(NULL, n, buf);
  }
  free(buf);
  if (!rd || !rd->req) {
    free(rd);
    if (shm_fd >= 0) close(shm_fd);
    svc_fail_later(s, done, arg, STK_ENOMEM, "");
    return NULL;
  }
  rd->shm_fd = shm_fd;
  rd->shm_size = shm_size;
  rd->shm_next = CKPT_SHM_READ_DATA;
  if (shm_fd >= 0) snprintf(rd->shm_name, sizeof(rd->shm_name), "%s", req->shm_name);
  rd->t.work = prepare_work;
  rd->t.after = read_after;
  rd->s = s;
  snprintf(rd->job, sizeof(rd->job), "%s", req->job);
  rd->step = req->step;
  rd->on_piece = on_piece;
  rd->done = done;
  rd->arg = arg;
  rd->tasks = 1;
  ckpt_pool_submit(s->work, &rd->t);
  return rd;
}

void ckpt_read_resume(struct ckpt_reader *rd) {
  if (!rd->held) return;
  rd->held = false;
  deliver(rd);
}

void ckpt_read_cancel(struct ckpt_reader *rd) {
  read_finish(rd, STK_ECANCELED, "cancelled");
}

/* ---- Verify: every byte of every object ---- */

struct verify_job {
  struct ckpt_task t;
  struct ckpt_service *s;
  char job[CKPT_JOB_MAX_BYTES + 1];
  int64_t step;
  ckpt_done_fn done;
  void *arg;
  Stoker__V1__VerifyCheckpointResponse resp;
  int err;
  char msg[320];
};

static void problem(struct verify_job *j, const char *fmt, const char *key, const char *detail) {
  char line[512];
  snprintf(line, sizeof(line), fmt, key, detail);
  char **p = realloc(j->resp.problems, (j->resp.n_problems + 1) * sizeof(*p));
  if (!p) return;
  j->resp.problems = p;
  if ((p[j->resp.n_problems] = strdup(line)) != NULL) j->resp.n_problems++;
}

static void verify_object(struct verify_job *j, const struct ckpt_manifest *m,
                          const struct ckpt_object *o, uint8_t *buf, uint64_t piece) {
  char *key;
  if (ckpt_key_object(j->s->prefix, m->job, m->step, m->attempt, o->key, &key)) return;
  uint64_t size;
  int err = storage_head(j->s->st, key, &size);
  if (err || size != o->size_bytes) {
    problem(j, "object %s: %s", o->key, err ? stk_strerror(err) : "wrong size");
    free(key);
    return;
  }
  for (uint64_t at = 0; at < o->size_bytes; at += piece) {
    uint64_t len = o->size_bytes - at < piece ? o->size_bytes - at : piece;
    size_t got;
    err = storage_get(j->s->st, key, at, buf, len, &got);
    if (!err && got != len) err = STK_ECORRUPT;
    if (!err) err = ckpt_crc_verify(o->block_crc32c, o->n_blocks, o->size_bytes, at, buf, len);
    if (err)
      problem(j, "object %s: %s", o->key, stk_detail()[0] ? stk_detail() : stk_strerror(err));
    j->resp.bytes += err ? 0 : len;
  }
  j->resp.objects++;
  j->resp.blocks += o->n_blocks;
  free(key);
}

static void verify_work(struct ckpt_task *t) {
  struct verify_job *j = (struct verify_job *)t;
  struct ckpt_manifest *m;
  stk_clear_detail();
  j->err = ckpt_load_manifest(j->s, j->job, j->step, &m, NULL, NULL);
  if (j->err) {
    snprintf(j->msg, sizeof(j->msg), "%s", stk_detail());
    return;
  }
  uint64_t piece = 8 * CKPT_CRC_BLOCK_BYTES;
  uint8_t *buf = malloc(piece);
  for (size_t i = 0; buf && i < m->n_objects; i++) {
    stk_clear_detail();
    verify_object(j, m, &m->objects[i], buf, piece);
  }
  if (!buf) j->err = STK_ENOMEM;
  free(buf);
  ckpt_manifest_free(m);
  if (!j->err && j->resp.n_problems > 0) {
    j->err = STK_ECORRUPT;
    snprintf(j->msg, sizeof(j->msg), "%s", j->resp.problems[0]);
  }
}

static void verify_after(struct ckpt_task *t) {
  struct verify_job *j = (struct verify_job *)t;
  bool ran = j->err == 0 || j->err == STK_ECORRUPT;
  j->done(j->arg, j->err, j->err ? j->msg : "", ran ? &j->resp.base : NULL);
  for (size_t i = 0; i < j->resp.n_problems; i++) free(j->resp.problems[i]);
  free(j->resp.problems);
  free(j);
}

void ckpt_verify(struct ckpt_service *s, const Stoker__V1__VerifyCheckpointRequest *req,
                 ckpt_done_fn done, void *arg) {
  if (s->closing) FAIL_LATER(s, done, arg, STK_EUNAVAIL, "closing");
  int err = ckpt_name_check_job(req->job);
  if (!err) err = ckpt_name_check_step(req->step);
  if (err) FAIL_LATER(s, done, arg, err, stk_detail());
  struct verify_job *j = calloc(1, sizeof(*j));
  if (!j) FAIL_LATER(s, done, arg, STK_ENOMEM, "");
  j->t.work = verify_work;
  j->t.after = verify_after;
  j->s = s;
  snprintf(j->job, sizeof(j->job), "%s", req->job);
  j->step = req->step;
  j->done = done;
  j->arg = arg;
  stoker__v1__verify_checkpoint_response__init(&j->resp);
  ckpt_pool_submit(s->work, &j->t);
}
