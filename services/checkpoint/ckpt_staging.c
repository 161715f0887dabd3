/*
 * ckpt_staging: the write streams. Each chunk is validated completely
 * (names, dtype, shape, box, byte count) before a byte is buffered, then
 * copied into its rank's current part buffer within the node-wide staging
 * budget. When the budget is full the feed answers CKPT_WRITE_WAIT without
 * consuming the chunk and the writer is resumed when uploads free memory;
 * if nothing is uploading (all memory sits in partly filled parts), the
 * open objects are sealed early so that their parts can go, which keeps the
 * budget deadlock-free at any number of writers.
 *
 * Budget accounting is by buffer capacity, so staged bytes never exceed the
 * budget: buffers grow exactly as needed, doubling only when the headroom
 * allows it. Chunks staged zero-copy in shared memory (ckpt_staging_shm.c)
 * count their whole segment instead and get objects of their own.
 *
 * This file is the top of staging: the feed hands a segment's chunk to
 * ckpt_staging_shm.c, and both feeds build objects and parts with
 * ckpt_staging_obj.c, below them; neither calls back up here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_dtype.h"
#include "ckpt_service_int.h"
#include "stk_error.h"

/* ---- Budget ---- */

/* Capacity the placement of bytes into o (NULL or a segment's object: a new
 * object) would add. */
static uint64_t growth(const struct ckpt_service *s, const struct obj *o, uint64_t bytes) {
  const struct part *p = o && !o->seg ? o->cur : NULL;
  if (!p) return bytes;
  uint64_t room = s->o.part_bytes - p->len, into = bytes < room ? bytes : room;
  uint64_t grow = p->len + into > p->cap ? p->len + into - p->cap : 0;
  return grow + (bytes - into);
}

static int part_reserve(struct ckpt_service *s, struct part *p, size_t need) {
  if (need <= p->cap) return 0;
  size_t cap = p->cap * 2 > need ? p->cap * 2 : need;
  if (cap > s->o.part_bytes) cap = s->o.part_bytes;
  if (s->staged + (cap - p->cap) > s->o.staging_budget_bytes) cap = need;
  uint8_t *b = realloc(p->buf, cap);
  if (!b) return STK_ENOMEM;
  s->staged += cap - p->cap;
  p->obj->att->staged_bytes += cap - p->cap;
  if (s->staged > s->stats.staged_peak_bytes) s->stats.staged_peak_bytes = s->staged;
  p->buf = b;
  p->cap = cap;
  return 0;
}

/* ---- Placement ---- */

static int copy_in(struct ckpt_service *s, struct obj *o, const uint8_t *data, size_t len) {
  while (len > 0) {
    struct part *p = ckpt__staging_open_part(o);
    if (!p) return STK_ENOMEM;
    size_t room = s->o.part_bytes - p->len, n = len < room ? len : room;
    int err = part_reserve(s, p, p->len + n);
    if (err) return err;
    memcpy(p->buf + p->len, data, n);
    data += n;
    len -= n;
    ckpt__staging_part_took(s, o, p, n);
  }
  return 0;
}

/* Places a validated chunk (which fits the budget) into the rank's objects,
 * rolling to a new object before the part limit. */
static int place(struct ckpt_writer *w, const Stoker__V1__WriteChunk *c) {
  struct ckpt_service *s = w->svc;
  struct rank_state *rs = &w->att->ranks[w->rank];
  uint64_t len = c->data.len;
  struct obj *o = rs->cur;
  if (o && o->size > 0 &&
      (o->seg || (o->size + len + s->o.part_bytes - 1) / s->o.part_bytes > s->o.max_parts)) {
    ckpt__upload_seal(o);
    o = NULL;
  }
  if (!o && !(o = ckpt__staging_obj_new(w->att, w->rank))) return STK_ENOMEM;
  int err = ckpt__staging_add_chunk(o, c, len);
  if (!err) err = copy_in(s, o, c->data.data, len);
  if (!err) o->size += len;
  return err;
}

/* ---- Validation (before anything is buffered) ---- */

static int check_header(const struct ckpt_writer *w, const Stoker__V1__WriteChunk *c) {
  if (c->attempt && c->attempt[0] && strcmp(c->attempt, w->att->id) != 0) {
    stk_set_detail("chunk for attempt %.64s on a stream of attempt %s", c->attempt, w->att->id);
    return STK_EINVAL;
  }
  if (c->rank != w->rank) {
    stk_set_detail("chunk for rank %u on a stream of rank %u", c->rank, w->rank);
    return STK_EINVAL;
  }
  if ((!c->tensor || !c->tensor[0]) &&
      (!c->last || c->data.len > 0 || c->box || (c->shm_name && c->shm_name[0]))) {
    stk_set_detail("a chunk without a tensor name may only end the stream");
    return STK_EINVAL;
  }
  return 0;
}

/* The chunk's byte count: its data, or (staged in shm) what its box holds. */
static uint64_t chunk_len(const Stoker__V1__WriteChunk *c, uint64_t box_bytes) {
  return c->shm_name && c->shm_name[0] ? box_bytes : c->data.len;
}

static int check_chunk(const struct ckpt_service *s, const Stoker__V1__WriteChunk *c,
                       uint64_t *ret_len) {
  int err = ckpt_name_check_tensor(c->tensor);
  if (err) return err;
  uint64_t elem = ckpt_dtype_bytes((int)c->dtype), numel;
  if (elem == 0) {
    stk_set_detail("tensor %s: unknown dtype %d", c->tensor, (int)c->dtype);
    return STK_EINVAL;
  }
  if (c->n_global_shape > CKPT_MAX_DIMS || !c->box || c->box->n_offsets != c->n_global_shape ||
      c->box->n_sizes != c->n_global_shape) {
    stk_set_detail("tensor %s: shape and box must have the same 0..%d dims", c->tensor,
                   CKPT_MAX_DIMS);
    return STK_EINVAL;
  }
  if (c->dtype == STOKER__V1__DTYPE__DTYPE_BYTES && c->n_global_shape != 1) {
    stk_set_detail("blob %s must be a 1-D tensor", c->tensor);
    return STK_EINVAL;
  }
  struct ckpt_shape shape = {.ndim = (uint32_t)c->n_global_shape};
  struct ckpt_box box = {.ndim = shape.ndim};
  u64copy(shape.dims, c->global_shape, shape.ndim);
  u64copy(box.offsets, c->box->offsets, shape.ndim);
  u64copy(box.sizes, c->box->sizes, shape.ndim);
  err = ckpt_shape_check(&shape, elem, &numel);
  if (!err) err = ckpt_box_check(&box, &shape);
  if (err) {
    char d[256];
    snprintf(d, sizeof(d), "%s", stk_detail());
    stk_set_detail("tensor %s: %s", c->tensor, d);
    return STK_EINVAL;
  }
  uint64_t box_bytes = ckpt_box_numel(&box) * elem, len = chunk_len(c, box_bytes);
  if (len != box_bytes || (c->shm_name && c->shm_name[0] && c->data.len > 0)) {
    stk_set_detail("tensor %s: %zu data bytes%s, but the box holds %llu", c->tensor, c->data.len,
                   c->shm_name && c->shm_name[0] ? " beside a shm segment" : "",
                   (unsigned long long)box_bytes);
    return STK_EINVAL;
  }
  if (len > s->o.staging_budget_bytes || len > (uint64_t)s->o.max_parts * s->o.part_bytes) {
    stk_set_detail("tensor %s: a chunk of %llu bytes exceeds the staging budget; split the box",
                   c->tensor, (unsigned long long)len);
    return STK_ETOOBIG;
  }
  *ret_len = len;
  return 0;
}

/* ---- Streams ---- */

/* A bad write aborts its attempt (every writer of it gets FAILED with msg)
 * and answers err with the same message. */
static int reject(struct attempt *a, int err, const char *detail) {
  char msg[320];
  snprintf(msg, sizeof(msg), "%s", detail);
  if (a->state == ATT_OPEN) ckpt__attempt_abort(a, err, msg);
  stk_set_detail("%s", msg);
  return err;
}

int ckpt_write_open(struct ckpt_service *s, const char *attempt, uint32_t rank,
                    ckpt_write_event_fn on_event, void *arg, struct ckpt_writer **ret_writer) {
  if (s->closing) return STK_EUNAVAIL;
  struct attempt *a = attempt ? ckpt__attempt_find(s, attempt) : NULL;
  if (!a) {
    stk_set_detail("unknown attempt");
    return STK_ENOENT;
  }
  char msg[200];
  if (a->state != ATT_OPEN) {
    stk_set_detail("attempt %s takes no more data (%s)", a->id,
                   a->state == ATT_DONE && a->result == 0 ? "committed" : "committing or aborted");
    return STK_ESTATE;
  }
  if (rank >= a->world) {
    snprintf(msg, sizeof(msg), "attempt %s: rank %u outside a world of %u", a->id, rank, a->world);
    return reject(a, STK_EINVAL, msg);
  }
  if (a->ranks[rank].last_fed) {
    snprintf(msg, sizeof(msg), "attempt %s rank %u: data after the last chunk", a->id, rank);
    return reject(a, STK_EINVAL, msg);
  }
  if (a->ranks[rank].writer) { /* A reconnect racing the old stream's end: retry. */
    stk_set_detail("rank %u of attempt %s already has a stream", rank, a->id);
    return STK_EBUSY;
  }
  struct ckpt_writer *w = calloc(1, sizeof(*w));
  if (!w) return STK_ENOMEM;
  w->svc = s;
  w->att = a;
  w->rank = rank;
  w->on_event = on_event;
  w->arg = arg;
  a->ranks[rank].writer = w;
  ckpt__attempt_touch(a);
  *ret_writer = w;
  return 0;
}

void ckpt_write_abort(struct ckpt_writer *w, int err, const char *msg) {
  if (!w->att) return;
  char full[320];
  snprintf(full, sizeof(full), "attempt %s rank %u: %s", w->att->id, w->rank, msg);
  reject(w->att, err, full);
}

static int feed_fail(struct ckpt_writer *w, int err) {
  char msg[320];
  snprintf(msg, sizeof(msg), "attempt %s rank %u: %s", w->att->id, w->rank, stk_detail());
  return reject(w->att, err, msg); /* Detaches w and posts FAILED. */
}

static void finish_stream(struct ckpt_writer *w) {
  struct rank_state *rs = &w->att->ranks[w->rank];
  rs->last_fed = true;
  if (rs->cur) ckpt__upload_seal(rs->cur);
  ckpt__upload_release_held(w->att, false);
  w->staged_sent = true;
  ckpt__svc_post_event(w->svc, w, CKPT_WRITE_STAGED, 0, "");
  ckpt__upload_progress(w->att);
  ckpt__detach_progress(w->att);
}

int ckpt_write_feed(struct ckpt_writer *w, const Stoker__V1__WriteChunk *c) {
  struct ckpt_service *s = w->svc;
  if (!w->att) {
    stk_set_detail("the attempt was aborted");
    return STK_EABORTED;
  }
  if (s->closing) {
    stk_set_detail("the checkpoint service is closing");
    return STK_EUNAVAIL;
  }
  ckpt__attempt_touch(w->att);
  if (w->att->ranks[w->rank].last_fed) {
    stk_set_detail("data after the last chunk");
    return feed_fail(w, STK_EINVAL);
  }
  int err = check_header(w, c);
  bool has_data = c->tensor && c->tensor[0];
  uint64_t len = 0;
  if (!err && has_data) err = check_chunk(s, c, &len);
  if (err) return feed_fail(w, err);
  if (has_data && c->shm_name && c->shm_name[0]) {
    err = ckpt__staging_feed_shm(w, c, len);
    if (err == CKPT_WRITE_WAIT) return err;
    if (err) return feed_fail(w, err);
    w->bytes += len;
  } else if (has_data) {
    struct rank_state *rs = &w->att->ranks[w->rank];
    if (s->staged + growth(s, rs->cur, c->data.len) > s->o.staging_budget_bytes) {
      ckpt__attempt_wait_add(s, w);
      s->stats.waits++;
      ckpt__staging_relieve(s);
      return CKPT_WRITE_WAIT;
    }
    ckpt__attempt_wait_remove(s, w);
    err = place(w, c);
    if (err) return feed_fail(w, err);
    w->bytes += c->data.len;
  }
  if (c->last) finish_stream(w);
  return 0;
}

uint64_t ckpt_write_bytes(const struct ckpt_writer *w) {
  return w->bytes;
}

void ckpt_write_close(struct ckpt_writer *w) {
  if (!w) return;
  struct ckpt_service *s = w->svc;
  ckpt__attempt_wait_remove(s, w);
  ckpt__svc_forget_writer(s, w);
  if (w->att && w->att->ranks[w->rank].writer == w) {
    w->att->ranks[w->rank].writer = NULL;
    ckpt__attempt_touch(w->att);
  }
  free(w);
}
