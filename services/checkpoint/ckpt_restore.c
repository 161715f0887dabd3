/*
 * ckpt_restore: reading a committed checkpoint back at any world size, and
 * verifying one. A read is a sequence of pieces: each wanted box is cut into
 * sub-boxes of at most read_piece_bytes (whole trailing dims, a run of rows
 * of the first dim that fits), handed to the caller on the loop, in order.
 *
 * Pieces are fetched in batches, so that a restore costs few requests: a
 * batch is the next run of pieces holding at most read_batch_bytes of
 * wanted bytes (every wanted box of a small checkpoint in one). On a
 * restore thread each piece of the batch is planned (ckpt_plan: ranged
 * reads widened to CRC blocks), and the reads of all of them are merged
 * per object into spans (ckpt_plan_spans: gaps up to READ_GAP_BYTES are
 * read and thrown away, one request instead of two). Each span is one
 * ranged GET, sent to the store without holding a thread (ckpt_store.c:
 * the span's task parks until the answer) and CRC-checked block by block
 * on a restore thread, up to READ_FETCHES of one read at once. A span
 * whose bytes another read is fetching, or holds checked, uses those
 * instead of a GET of its own (ckpt_fetch.c: the ranks of one restore
 * read together and neighbours cross the same objects). The thread that checks a batch's
 * last span assembles its pieces from the spans right then, and the loop delivers them. A tensor
 * that FSDP saved as a row-block per rank thus costs a GET per object and batch, not one per stored
 * chunk: the tensors of a rank's object lie one after the other, in the order they are wanted.
 * READ_BATCHES batches of one read are in flight at once: the next is fetched while the caller
 * sends the one before, and memory stays bounded (per read, about twice the batch's spans and
 * pieces).
 *
 * Budgets: each batch reserves twice its wanted bytes (spans and assembled
 * pieces) against the service's read_budget_bytes and its job's
 * read_budget_per_job_bytes. A batch that would pass either waits, unless
 * its job holds nothing (every job always moves): a client that opens reads
 * and never takes their pieces holds at most its job's budget and a batch,
 * and another job's reads go on. A waiting read is tried again when a batch
 * of the service is freed and from the sweep timer (ckpt_read_retry).
 *
 * A read through shared memory (the request names a read file,
 * ckpt_shm_read.h) writes each piece into that file instead: the wanted
 * boxes lie there one after the other, row-major, so a piece's place is
 * the running sum of the pieces before it; the batch's worker writes the
 * fetched bytes straight there (no assembled copy) and the caller is handed
 * the piece's offset and length instead of its bytes.
 *
 * A request with pack_pieces gets the ready pieces of a batch several to a
 * message (ReadChunk.pieces, up to read_piece_bytes packed): a restore of
 * many small boxes is then a few messages, not one per box, each of which
 * cost a send, a completion and a wake-up of the loop on both sides.
 *
 * A batch's pieces are assembled one after the other into one buffer (the
 * batch's, counted by holds), so that with pack_data a message's bytes are
 * one run of it (ReadChunk.packed_data, the pieces giving their places in
 * it): the adapter hands that run to gRPC as it is (ckpt_read_hold_data,
 * rpc_send_borrowed) instead of packing a copy of every piece's bytes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_crc.h"
#include "ckpt_dtype.h"
#include "ckpt_fetch.h"
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

/* Batches of one read planned, fetched or waiting at once. */
#define READ_BATCHES 2
/* Ranged GETs of one read in flight at once (all reads together: at most
 * read_concurrency, the restore pool's limit). */
#define READ_FETCHES 4
/* Pieces per batch, at most (bounds the plans a batch holds). */
#define READ_BATCH_PIECES 4096
/* Reads of one object this close share a GET: at S3's tens of ms per
 * request, a MiB more costs less than another request. */
#define READ_GAP_BYTES (1u << 20)
/* The longest GET. */
#define READ_SPAN_BYTES (64u << 20)
/* A read through shared memory cuts pieces this many times larger: no
 * message carries them. */
#define SHM_PIECE_FACTOR 4

/* One merged ranged GET of a batch, fetched and CRC-checked on a restore
 * thread. */
struct span {
  struct ckpt_task t;          /* First: the task is the span's fetch. */
  struct ckpt_store_call call; /* Its GET, when it is the fetch's. */
  struct ckpt_fetch *f;        /* Its bytes' fetch, held (ckpt_fetch.c); set when claimed. */
  bool sent;                   /* Its own GET is out or answered: the work checks it. */
  struct batch *b;
  struct ckpt_span at;
  uint8_t *buf; /* at.len bytes (in f's) once fetched. */
  int err;
  char msg[320];
};

/* One piece of a batch: its box, its plan, what it became. */
struct piece {
  size_t wi; /* Its wanted entry. */
  struct ckpt_box box;
  struct ckpt_plan plan;
  size_t first_read; /* Its reads' numbers among the batch's (batch->read_span). */
  uint8_t *data;     /* The assembled piece, in its batch's buffer (NULL for a read file). */
  uint64_t len;
  uint64_t buf_off; /* Its place in the batch's buffer. */
  uint64_t shm_off; /* Its place in the read file. */
};

/* A batch's assembled pieces, one after the other; freed with its last
 * hold (the batch's own, and one per message gRPC still sends from it). */
struct read_buf {
  unsigned holds; /* Atomic: gRPC gives its holds back on its own threads. */
  uint8_t bytes[];
};

/* A run of pieces fetched together. Its task plans it, then assembles it. */
struct batch {
  struct ckpt_task t; /* First: the task is the batch's plan, then its assembly. */
  uint64_t reserved;  /* Of the read budgets, given back when freed. */
  struct ckpt_reader *rd;
  struct piece *pieces;
  size_t n_pieces, cap_pieces;
  size_t delivered;     /* Pieces handed to the caller. */
  struct read_buf *buf; /* The pieces' bytes once assembled (inline reads). */
  struct span *spans;
  size_t n_spans;
  size_t *read_span;       /* The span of each read of each piece, in piece order. */
  size_t started, fetched; /* Spans submitted, spans whose after ran. */
  size_t checked;          /* Spans checked (atomic: their workers count). */
  bool planned, ready;
  int err;
  char msg[320];
};

struct ckpt_reader {
  struct ckpt_task t; /* Loads the manifest and checks the wanted boxes. */
  struct ckpt_service *s;
  Stoker__V1__ReadRequest *req; /* Copied. */
  char job[CKPT_JOB_MAX_BYTES + 1];
  int64_t step;
  const struct ckpt_manifest *m; /* Shared, held in m_hold (ckpt_load_manifest). */
  struct ckpt_mcache_hold m_hold;
  int shm_fd;        /* The read file, or -1: pieces go inline. */
  uint64_t shm_size; /* Its size when opened. */
  uint64_t shm_next; /* Where the next piece taken into a batch goes. */
  char shm_name[64];
  struct wanted *w;
  size_t n_w;
  size_t wi; /* The next piece to take: piece pi of wanted entry wi. */
  uint64_t pi;
  struct batch *win[READ_BATCHES]; /* Taken, not yet delivered: head .. head + n - 1. */
  unsigned head, n;
  unsigned fetching; /* Spans submitted whose after has not run. */
  unsigned tasks;    /* Submitted tasks whose after has not run. */
  bool held, finished;
  bool waiting;                    /* A batch waits for the budgets (ckpt_read_retry). */
  uint64_t reserved;               /* What its batches reserved of the budgets. */
  struct ckpt_reader *prev, *next; /* In s->readers. */
  ckpt_piece_fn on_piece;
  struct read_buf *passing; /* The buffer of the message on_piece is given. */
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

/* ---- Workers: plan a batch, fetch a span, assemble a batch ---- */

/* Plans every piece of b and merges their reads into spans. */
static int batch_plan(struct batch *b) {
  const struct ckpt_reader *rd = b->rd;
  struct ckpt_plan_opts po = {.max_gap_bytes = READ_GAP_BYTES,
                              .max_read_bytes = READ_SPAN_BYTES,
                              .align_bytes = CKPT_CRC_BLOCK_BYTES};
  size_t reads = 0;
  for (size_t i = 0; i < b->n_pieces; i++) {
    struct piece *p = &b->pieces[i];
    const struct wanted *w = &rd->w[p->wi];
    int err = ckpt_plan_build(w->chunks, w->n_chunks, w->elem, &p->box, &po, &p->plan);
    if (err) return err;
    p->first_read = reads;
    reads += p->plan.n_reads;
  }
  struct ckpt_plan *plans = malloc((b->n_pieces ? b->n_pieces : 1) * sizeof(*plans));
  if (!plans) return STK_ENOMEM;
  for (size_t i = 0; i < b->n_pieces; i++) plans[i] = b->pieces[i].plan;
  struct ckpt_span *at;
  int err = ckpt_plan_spans(plans, b->n_pieces, READ_GAP_BYTES, READ_SPAN_BYTES, &at, &b->n_spans,
                            &b->read_span);
  free(plans);
  if (err) return err;
  b->spans = calloc(b->n_spans ? b->n_spans : 1, sizeof(*b->spans));
  if (!b->spans) {
    free(at);
    return STK_ENOMEM;
  }
  for (size_t i = 0; i < b->n_spans; i++) b->spans[i] = (struct span){.b = b, .at = at[i]};
  free(at);
  return 0;
}

/* Claims the span's bytes (ckpt_fetch.c): another read's fetch of them
 * (checked, or its GET out: the task parks until it ends), else a fetch of
 * its own whose GET it sends (the task parks until it is answered). True
 * when parked; else sp->buf holds checked bytes or sp->err is set. */
static bool span_start(const struct ckpt_reader *rd, struct span *sp) {
  const struct ckpt_object *o = &rd->m->objects[sp->at.object];
  char *key;
  sp->err = ckpt_key_object(rd->s->prefix, rd->m->job, rd->m->step, rd->m->attempt, o->key, &key);
  if (sp->err) return false;
  uint64_t first = sp->at.offset / CKPT_CRC_BLOCK_BYTES;
  uint64_t end = sp->at.len ? (sp->at.offset + sp->at.len - 1) / CKPT_CRC_BLOCK_BYTES + 1 : first;
  if (end > o->n_blocks || sp->at.offset + sp->at.len > o->size_bytes) {
    free(key);
    stk_set_detail("object %s: bytes %llu-%llu wanted past its %llu", o->key,
                   (unsigned long long)sp->at.offset,
                   (unsigned long long)(sp->at.offset + sp->at.len),
                   (unsigned long long)o->size_bytes);
    sp->err = STK_ECORRUPT;
    return false;
  }
  struct ckpt_fetch_want w = {.key = key,
                              .offset = sp->at.offset,
                              .len = sp->at.len,
                              .object_bytes = o->size_bytes,
                              .crcs = o->block_crc32c + first,
                              .n_crcs = end - first};
  enum ckpt_fetch_how how;
  int err = ckpt_fetch_claim(rd->s->fetches, &w, &sp->t, &sp->f, &how);
  if (err || how == CKPT_FETCH_WAIT) {
    free(key);
    if (err) sp->err = err;
    if (!err) ckpt_pool_park(); /* sp is the fetch's until it ends: untouched from here. */
    return !err;
  }
  sp->buf = ckpt_fetch_bytes(sp->f, sp->at.offset);
  if (how == CKPT_FETCH_READY) {
    free(key);
    return false;
  }
  struct storage_req rq = {
      .op = STORAGE_OP_GET, .key = key, .buf = sp->buf, .len = sp->at.len, .offset = sp->at.offset};
  sp->sent = true;
  ckpt__store(&sp->call, rd->s->read, &sp->t, rd->s->st, &rq); /* Copies the key. */
  free(key);
  return true;
}

/* The GET's answer: the bytes as long and as CRC'd as the manifest says. */
static int span_check(const struct ckpt_reader *rd, struct span *sp) {
  const struct ckpt_object *o = &rd->m->objects[sp->at.object];
  int err = sp->call.res.err;
  if (err) stk_set_detail("%s", sp->call.res.detail);
  if (!err && sp->call.res.len != sp->at.len) {
    stk_set_detail("object %s is shorter than its manifest says", o->key);
    return STK_ECORRUPT;
  }
  if (!err)
    err = ckpt_crc_verify(o->block_crc32c, o->n_blocks, o->size_bytes, sp->at.offset, sp->buf,
                          sp->at.len);
  if (err == STK_ECORRUPT) {
    char d[256];
    snprintf(d, sizeof(d), "%s", stk_detail());
    stk_set_detail("object %s: %s", o->key, d);
  }
  return err;
}

/* Where read i of piece p lies in the fetched spans. */
static const uint8_t *read_bytes(const struct batch *b, const struct piece *p, size_t i) {
  const struct span *sp = &b->spans[b->read_span[p->first_read + i]];
  return sp->buf + (p->plan.reads[i].offset - sp->at.offset);
}

/* The batch's buffer, every piece's place in it (one after the other). */
static int batch_buf(struct batch *b) {
  uint64_t total = 0;
  for (size_t i = 0; i < b->n_pieces; i++) {
    b->pieces[i].buf_off = total;
    total += b->pieces[i].plan.want_bytes;
  }
  b->buf = malloc(sizeof(*b->buf) + (total ? total : 1));
  if (!b->buf) return STK_ENOMEM;
  b->buf->holds = 1; /* The batch's. */
  return 0;
}

/* Piece p assembled at its place in the batch's buffer (p->len bytes). */
static int assemble(const struct batch *b, struct piece *p) {
  p->len = p->plan.want_bytes;
  p->data = b->buf->bytes + p->buf_off;
  for (size_t i = 0; i < p->plan.n_reads; i++)
    ckpt_plan_apply(&p->plan, i, read_bytes(b, p, i), p->data);
  return 0;
}

static void buf_release(struct read_buf *buf) {
  if (buf && __atomic_sub_fetch(&buf->holds, 1, __ATOMIC_ACQ_REL) == 0) free(buf);
}

/* Piece p written at its place in the read file: each read's copies go
 * straight from the fetched bytes, those with adjacent destinations in one
 * pwritev. */
static int assemble_shm(const struct batch *b, struct piece *p) {
  int fd = b->rd->shm_fd;
  p->len = p->plan.want_bytes;
  enum { BATCH = 256 };
  struct iovec iov[BATCH];
  int err = 0;
  for (size_t i = 0; !err && i < p->plan.n_reads; i++) {
    const struct ckpt_read *r = &p->plan.reads[i];
    const uint8_t *buf = read_bytes(b, p, i);
    int n = 0;
    uint64_t at = 0, end = 0;
    for (size_t c = r->first_copy; !err && c < r->first_copy + r->n_copies; c++) {
      const struct ckpt_copy *cp = &p->plan.copies[c];
      if (n > 0 && (n == BATCH || cp->dst_offset != end)) {
        err = ckpt_shm_read_putv(fd, iov, n, p->shm_off + at);
        n = 0;
      }
      if (n == 0) at = end = cp->dst_offset;
      iov[n++] = (struct iovec){.iov_base = (void *)(buf + cp->read_offset), .iov_len = cp->len};
      end += cp->len;
    }
    if (!err && n > 0) err = ckpt_shm_read_putv(fd, iov, n, p->shm_off + at);
  }
  return err;
}

/* Frees what assembly no longer needs: the spans' bytes and the plans. */
static void batch_drop_fetched(struct batch *b) {
  for (size_t i = 0; i < b->n_spans; i++) {
    ckpt_fetch_release(b->rd->s->fetches, b->spans[i].f);
    b->spans[i].f = NULL;
    b->spans[i].buf = NULL;
    storage_result_clear(&b->spans[i].call.res);
  }
  for (size_t i = 0; i < b->n_pieces; i++) ckpt_plan_close(&b->pieces[i].plan);
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
  int err = ckpt_load_manifest(rd->s, rd->job, rd->step, &rd->m, &rd->m_hold);
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

/* The error's text for the caller: the detail, else its name. */
static void note(int err, char *msg, size_t len) {
  if (err) snprintf(msg, len, "%s", stk_detail()[0] ? stk_detail() : stk_strerror(err));
}

static void prepare_work(struct ckpt_task *t) {
  struct ckpt_reader *rd = (struct ckpt_reader *)t;
  stk_clear_detail();
  rd->err = prepare(rd);
  note(rd->err, rd->msg, sizeof(rd->msg));
}

static void batch_plan_work(struct ckpt_task *t) {
  struct batch *b = (struct batch *)t;
  stk_clear_detail();
  b->err = batch_plan(b);
  note(b->err, b->msg, sizeof(b->msg));
}

static void batch_assemble_work(struct ckpt_task *t);

/* Runs twice: sends the GET, then (resumed with its answer) checks it;
 * the batch's last span checked assembles the batch. */
static void span_work(struct ckpt_task *t) {
  struct span *sp = (struct span *)t;
  const struct ckpt_reader *rd = sp->b->rd;
  stk_clear_detail();
  if (sp->sent) { /* Its own GET answered: checked, then shared. */
    sp->err = span_check(rd, sp);
    note(sp->err, sp->msg, sizeof(sp->msg));
    ckpt_fetch_end(rd->s->fetches, sp->f, sp->err, sp->msg, rd->s->read);
  } else if (sp->f) { /* Another read's fetch ended. */
    sp->err = ckpt_fetch_error(sp->f, sp->msg, sizeof(sp->msg));
    if (!sp->err) sp->buf = ckpt_fetch_bytes(sp->f, sp->at.offset);
  } else if (span_start(rd, sp)) {
    return; /* Parked; sp is the GET's or the fetch's until it ends. */
  } else {
    note(sp->err, sp->msg, sizeof(sp->msg));
  }
  /* The batch's last span checked: this worker assembles the batch at once
   * (a hop to the loop and back to a worker less per batch, each a wait
   * for a core on a loaded host). Every span's check happened before its
   * count (acq_rel), so their bytes and errors are visible here. */
  struct batch *b = sp->b;
  if (__atomic_add_fetch(&b->checked, 1, __ATOMIC_ACQ_REL) != b->n_spans) return;
  for (size_t i = 0; i < b->n_spans; i++)
    if (b->spans[i].err) return; /* Its after ends the read. */
  batch_assemble_work(&b->t);
}

static void batch_assemble_work(struct ckpt_task *t) {
  struct batch *b = (struct batch *)t;
  stk_clear_detail();
  if (b->rd->shm_fd < 0) b->err = batch_buf(b);
  for (size_t i = 0; !b->err && i < b->n_pieces; i++)
    b->err = b->rd->shm_fd >= 0 ? assemble_shm(b, &b->pieces[i]) : assemble(b, &b->pieces[i]);
  batch_drop_fetched(b);
  note(b->err, b->msg, sizeof(b->msg));
}

/* ---- Loop side ---- */

static void batch_free(struct batch *b) {
  if (!b) return;
  b->rd->s->read_reserved -= b->reserved;
  b->rd->reserved -= b->reserved;
  if (b->reserved) b->rd->s->read_freed = true;
  batch_drop_fetched(b);
  buf_release(b->buf);
  free(b->pieces);
  free(b->spans);
  free(b->read_span);
  free(b);
}

static void reader_unlink(struct ckpt_reader *rd) {
  if (rd->prev)
    rd->prev->next = rd->next;
  else if (rd->s->readers == rd)
    rd->s->readers = rd->next;
  if (rd->next) rd->next->prev = rd->prev;
  rd->prev = rd->next = NULL;
}

static void reader_free(struct ckpt_reader *rd) {
  reader_unlink(rd);
  for (size_t i = 0; i < rd->n_w; i++) {
    free(rd->w[i].tensor);
    free(rd->w[i].chunks);
  }
  free(rd->w);
  for (unsigned i = 0; i < rd->n; i++) batch_free(rd->win[(rd->head + i) % READ_BATCHES]);
  if (rd->shm_fd >= 0) close(rd->shm_fd);
  ckpt_release_manifest(rd->s, &rd->m_hold);
  if (rd->req) stoker__v1__read_request__free_unpacked(rd->req, NULL);
  free(rd);
}

/* Ends the read (done runs now); the record goes once no task is out. */
static void read_finish(struct ckpt_reader *rd, int err, const char *msg) {
  rd->finished = true;
  rd->done(rd->arg, err, msg, NULL);
  if (rd->tasks == 0) reader_free(rd);
}

static void submit(struct ckpt_reader *rd, struct ckpt_task *t) {
  rd->tasks++;
  ckpt_pool_submit(rd->s->read, t);
}

/* Appends the next piece of the read to b; false when none is left or it
 * would take b past its bytes (a batch takes at least one piece). */
static bool batch_take(struct ckpt_reader *rd, struct batch *b, uint64_t *bytes, int *ret_err) {
  while (rd->wi < rd->n_w && rd->pi >= rd->w[rd->wi].n_pieces) rd->wi++, rd->pi = 0;
  if (rd->wi >= rd->n_w || b->n_pieces == READ_BATCH_PIECES) return false;
  struct piece p = {.wi = rd->wi};
  piece_box(&rd->w[rd->wi], rd->pi, &p.box);
  uint64_t n = ckpt_box_numel(&p.box) * rd->w[rd->wi].elem;
  if (b->n_pieces > 0 && *bytes + n > rd->s->o.read_batch_bytes) return false;
  if (b->n_pieces == b->cap_pieces) {
    size_t cap = b->cap_pieces ? 2 * b->cap_pieces : 16;
    struct piece *v = realloc(b->pieces, cap * sizeof(*v));
    if (!v) {
      *ret_err = STK_ENOMEM;
      return false;
    }
    b->pieces = v;
    b->cap_pieces = cap;
  }
  p.shm_off = rd->shm_next;
  rd->shm_next += n;
  rd->pi++;
  *bytes += n;
  b->pieces[b->n_pieces++] = p;
  return true;
}

size_t ckpt_service_read_holdings(const struct ckpt_service *s, struct ckpt_read_holding *ret,
                                  size_t cap) {
  size_t n = 0;
  for (const struct ckpt_reader *r = s->readers; r; r = r->next, n++)
    if (n < cap) ret[n] = (struct ckpt_read_holding){.job = r->job, .reserved_bytes = r->reserved};
  return n;
}

/* What the reads of job hold of the budgets. */
static uint64_t job_reserved(const struct ckpt_service *s, const char *job) {
  uint64_t n = 0;
  for (const struct ckpt_reader *r = s->readers; r; r = r->next)
    if (strcmp(r->job, job) == 0) n += r->reserved;
  return n;
}

/* Whether a batch of up to `bytes` wanted bytes fits the budgets now. */
static bool budget_fits(const struct ckpt_reader *rd, uint64_t bytes) {
  const struct ckpt_service *s = rd->s;
  uint64_t job = job_reserved(s, rd->job);
  if (job == 0) return true;
  return s->read_reserved + 2 * bytes <= s->o.read_budget_bytes &&
         job + 2 * bytes <= s->o.read_budget_per_job_bytes;
}

static void fetch_more(struct ckpt_reader *rd);

/* Whether b's plan is cheap enough for the loop (read_loop_plan_chunks:
 * each piece's plan walks its tensor's chunks; 4096 of them is well under
 * a millisecond). */
static bool plan_on_loop(const struct ckpt_reader *rd, const struct batch *b) {
  uint64_t chunks = 0, max = rd->s->o.read_loop_plan_chunks;
  for (size_t i = 0; i < b->n_pieces && chunks <= max; i++)
    chunks += rd->w[b->pieces[i].wi].n_chunks;
  return chunks <= max;
}

/* Takes batches in order until the window is full, no piece is left, or
 * the budgets say wait (rd->waiting). A batch whose plan is cheap is
 * planned here, on the loop (its plan costs less than a worker's wake-up
 * and the loop's again after it: two waits for a core on a loaded host),
 * its spans submitted at once; a larger one on a restore thread. A plan
 * that fails leaves its text in rd->msg. */
static int fill(struct ckpt_reader *rd) {
  bool planned = false;
  while (rd->n < READ_BATCHES) {
    while (rd->wi < rd->n_w && rd->pi >= rd->w[rd->wi].n_pieces) rd->wi++, rd->pi = 0;
    if (rd->wi >= rd->n_w) break;
    rd->waiting = !budget_fits(rd, rd->s->o.read_batch_bytes);
    if (rd->waiting) break;
    struct batch *b = calloc(1, sizeof(*b));
    if (!b) return STK_ENOMEM;
    *b = (struct batch){.t = {.work = batch_plan_work, .after = rd->t.after}, .rd = rd};
    uint64_t bytes = 0;
    int err = 0;
    while (batch_take(rd, b, &bytes, &err)) {
    }
    b->reserved = 2 * bytes;
    rd->s->read_reserved += b->reserved;
    rd->reserved += b->reserved;
    rd->win[(rd->head + rd->n) % READ_BATCHES] = b; /* Owned by the window from here. */
    rd->n++;
    if (err) return err;
    if (!plan_on_loop(rd, b)) {
      submit(rd, &b->t);
      continue;
    }
    batch_plan_work(&b->t);
    if (b->err) {
      snprintf(rd->msg, sizeof(rd->msg), "%s", b->msg);
      return b->err;
    }
    b->planned = planned = true;
    rd->s->stats.read_loop_plans++;
    if (b->n_spans == 0) { /* Nothing to fetch (empty boxes): assemble at once. */
      b->t.work = batch_assemble_work;
      submit(rd, &b->t);
    }
  }
  if (planned) fetch_more(rd);
  return 0;
}

/* Submits spans of planned batches, oldest batch first, up to READ_FETCHES
 * of the read at once. */
static void fetch_more(struct ckpt_reader *rd) {
  for (unsigned i = 0; i < rd->n && rd->fetching < READ_FETCHES; i++) {
    struct batch *b = rd->win[(rd->head + i) % READ_BATCHES];
    while (b->planned && b->started < b->n_spans && rd->fetching < READ_FETCHES) {
      struct span *sp = &b->spans[b->started++];
      sp->t = (struct ckpt_task){.work = span_work, .after = rd->t.after};
      rd->fetching++;
      submit(rd, &sp->t);
    }
  }
}

static bool send_piece(struct ckpt_reader *rd, struct batch *b);
static int send_packed(struct ckpt_reader *rd, struct batch *b, bool *ret_more);

/* Hands the caller the pieces that are ready, in order, one message at a
 * time (a piece, or with pack_pieces the ready pieces that fit one), until
 * it holds one (or the read fails or ends). */
static void deliver(struct ckpt_reader *rd) {
  while (!rd->held && !rd->finished) {
    int err = fill(rd);
    if (err) return read_finish(rd, err, rd->msg[0] ? rd->msg : stk_strerror(err));
    if (rd->n == 0 && rd->waiting) return; /* ckpt_read_retry goes on. */
    if (rd->n == 0) return read_finish(rd, 0, "");
    struct batch *b = rd->win[rd->head];
    if (!b->ready) return;
    if (b->delivered == b->n_pieces) {
      batch_free(b);
      rd->head = (rd->head + 1) % READ_BATCHES;
      rd->n--;
      continue;
    }
    bool more = true;
    if (rd->req->pack_pieces) {
      err = send_packed(rd, b, &more);
      if (err) return read_finish(rd, err, stk_strerror(err));
    } else {
      more = send_piece(rd, b);
    }
    if (!more) rd->held = true;
  }
}

/* The message of piece p alone (its box in *box). */
static void piece_msg(const struct ckpt_reader *rd, const struct piece *p,
                      Stoker__V1__ReadChunk *rc, Stoker__V1__Box *box) {
  stoker__v1__read_chunk__init(rc);
  stoker__v1__box__init(box);
  box->n_offsets = box->n_sizes = p->box.ndim;
  box->offsets = (uint64_t *)p->box.offsets;
  box->sizes = (uint64_t *)p->box.sizes;
  rc->tensor = rd->w[p->wi].tensor;
  rc->box = box;
  if (rd->shm_fd >= 0) {
    rc->shm_offset = p->shm_off;
    rc->shm_length = p->len;
  } else if (rd->req->pack_data) {
    rc->data_length = p->len; /* data_offset: send_packed's. */
  } else {
    rc->data.data = p->data;
    rc->data.len = p->len;
  }
}

/* The next piece of b as one message; the caller's answer. */
static bool send_piece(struct ckpt_reader *rd, struct batch *b) {
  struct piece *p = &b->pieces[b->delivered++];
  Stoker__V1__ReadChunk rc;
  Stoker__V1__Box box;
  piece_msg(rd, p, &rc, &box);
  return rd->on_piece(rd->arg, &rc);
}

/* Bytes of a length-delimited field of n bytes in its message (a
 * one-byte tag, the length's varint, the bytes). */
static uint64_t field_bytes(uint64_t n) {
  uint64_t len = 1 + 1;
  for (uint64_t v = n; v >= 0x80; v >>= 7) len++;
  return len + n;
}

/* The next pieces of b that are ready, as one message listing them in
 * pieces: at least one, and as many more as keep the message within
 * read_piece_bytes packed. With pack_data their bytes are the run of the
 * batch's buffer they were assembled into, in packed_data (the pieces lie
 * there one after the other). *ret_more: the caller's answer. */
static int send_packed(struct ckpt_reader *rd, struct batch *b, bool *ret_more) {
  size_t first = b->delivered, left = b->n_pieces - first;
  Stoker__V1__ReadChunk *rcs = malloc(left * sizeof(*rcs));
  Stoker__V1__ReadChunk **ptrs = malloc(left * sizeof(*ptrs));
  Stoker__V1__Box *boxes = malloc(left * sizeof(*boxes));
  if (!rcs || !ptrs || !boxes) {
    free(rcs);
    free(ptrs);
    free(boxes);
    return STK_ENOMEM;
  }
  bool pack_data = rd->req->pack_data;
  uint64_t limit = rd->s->o.read_piece_bytes, base = b->pieces[first].buf_off;
  uint64_t packed = pack_data ? field_bytes(0) : 0, data = 0;
  size_t n = 0;
  for (; n < left; n++) {
    const struct piece *p = &b->pieces[first + n];
    piece_msg(rd, p, &rcs[n], &boxes[n]);
    if (pack_data) rcs[n].data_offset = p->buf_off - base;
    uint64_t f = field_bytes(protobuf_c_message_get_packed_size(&rcs[n].base));
    if (pack_data) f += field_bytes(data + p->len) - field_bytes(data); /* Its bytes. */
    if (n > 0 && packed + f > limit) break;
    packed += f;
    data += pack_data ? p->len : 0;
    ptrs[n] = &rcs[n];
  }
  Stoker__V1__ReadChunk msg = STOKER__V1__READ_CHUNK__INIT;
  msg.n_pieces = n;
  msg.pieces = ptrs;
  if (pack_data && data > 0) {
    msg.packed_data.data = b->buf->bytes + base;
    msg.packed_data.len = data;
    rd->passing = b->buf;
  }
  b->delivered += n;
  *ret_more = rd->on_piece(rd->arg, &msg);
  rd->passing = NULL;
  free(rcs);
  free(ptrs);
  free(boxes);
  return 0;
}

/* After of a batch's plan or assembly. */
static void batch_after(struct ckpt_reader *rd, struct batch *b) {
  if (b->err) return read_finish(rd, b->err, b->msg);
  if (!b->planned) {
    b->planned = true;
    if (b->n_spans == 0) { /* Nothing to fetch (empty boxes): assemble at once. */
      b->t.work = batch_assemble_work;
      submit(rd, &b->t);
    }
    fetch_more(rd);
    return;
  }
  b->ready = true;
  deliver(rd);
}

/* After of a span's fetch. */
static void span_after(struct ckpt_reader *rd, struct span *sp) {
  struct batch *b = sp->b;
  b->fetched++;
  if (sp->err) return read_finish(rd, sp->err, sp->msg);
  if (b->fetched == b->n_spans) { /* Every span's work ran: the last one assembled b. */
    if (b->err) return read_finish(rd, b->err, b->msg);
    b->ready = true;
  }
  fetch_more(rd);
  if (b->ready) deliver(rd);
}

/* After of every task of a read. */
static void read_task_after(struct ckpt_task *t);

/* After of every task of a read; then the reads that waited for budget a
 * freed batch gave back. */
static void read_after(struct ckpt_task *t) {
  struct ckpt_service *s = t->work == prepare_work ? ((struct ckpt_reader *)t)->s
                           : t->work == span_work  ? ((struct span *)t)->b->rd->s
                                                   : ((struct batch *)t)->rd->s;
  read_task_after(t);
  if (s->read_freed) ckpt_read_retry(s);
}

static void read_task_after(struct ckpt_task *t) {
  struct ckpt_reader *rd;
  if (t->work == prepare_work)
    rd = (struct ckpt_reader *)t;
  else if (t->work == span_work)
    rd = ((struct span *)t)->b->rd;
  else
    rd = ((struct batch *)t)->rd;
  rd->tasks--;
  if (t->work == span_work) rd->fetching--;
  if (rd->finished) { /* Ended (failed or cancelled) while tasks ran. */
    if (rd->tasks == 0) reader_free(rd);
    return;
  }
  if (t->work == prepare_work) {
    if (rd->err) return read_finish(rd, rd->err, rd->msg);
    return deliver(rd);
  }
  if (t->work == span_work) return span_after(rd, (struct span *)t);
  batch_after(rd, (struct batch *)t);
}

/* The forms of message a request asks for go together. */
static int check_forms(const Stoker__V1__ReadRequest *req) {
  if (!req->pack_data) return 0;
  if (!req->pack_pieces) {
    stk_set_detail("ReadRequest.pack_data needs pack_pieces (the bytes of a message's pieces)");
    return STK_EINVAL;
  }
  if ((req->shm_name && req->shm_name[0]) || req->shm_nonce.len > 0) {
    stk_set_detail("ReadRequest.pack_data cannot go with shm_name: pieces of a read file carry no "
                   "bytes");
    return STK_EINVAL;
  }
  return 0;
}

struct ckpt_reader *ckpt_read(struct ckpt_service *s, const Stoker__V1__ReadRequest *req,
                              ckpt_piece_fn on_piece, ckpt_done_fn done, void *arg) {
  if (s->closing) {
    ckpt__svc_fail_later(s, done, arg, STK_EUNAVAIL, "closing");
    return NULL;
  }
  int err = ckpt_name_check_job(req->job);
  if (!err) err = ckpt_name_check_step(req->step);
  if (!err) err = check_forms(req);
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
    ckpt__svc_fail_later(s, done, arg, err, stk_detail());
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
    ckpt__svc_fail_later(s, done, arg, STK_ENOMEM, "");
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
  rd->next = s->readers;
  if (s->readers) s->readers->prev = rd;
  s->readers = rd;
  ckpt_pool_submit(s->read, &rd->t);
  return rd;
}

void ckpt_read_retry(struct ckpt_service *s) {
  s->read_freed = false;
  for (struct ckpt_reader *rd = s->readers, *next; rd; rd = next) {
    next = rd->next;
    if (!rd->waiting || rd->held || rd->finished) continue;
    deliver(rd); /* May end rd; next is another read. */
  }
}

void ckpt_read_resume(struct ckpt_reader *rd) {
  if (!rd->held) return;
  rd->held = false;
  struct ckpt_service *s = rd->s;
  deliver(rd);
  if (s->read_freed) ckpt_read_retry(s);
}

void ckpt_read_cancel(struct ckpt_reader *rd) {
  struct ckpt_service *s = rd->s;
  read_finish(rd, STK_ECANCELED, "cancelled");
  if (s->read_freed) ckpt_read_retry(s);
}

void *ckpt_read_hold_data(struct ckpt_reader *rd) {
  struct read_buf *buf = rd ? rd->passing : NULL;
  if (buf) __atomic_add_fetch(&buf->holds, 1, __ATOMIC_RELAXED);
  return buf;
}

void ckpt_read_release_data(void *hold) {
  buf_release(hold);
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
  const struct ckpt_manifest *m;
  struct ckpt_mcache_hold hold;
  stk_clear_detail();
  j->err = ckpt_load_manifest(j->s, j->job, j->step, &m, &hold);
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
  ckpt_release_manifest(j->s, &hold);
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
