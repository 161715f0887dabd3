/*
 * ckpt_staging_obj: a rank's objects and their parts as staging fills them
 * (a new object, its chunk records, the part being filled, a full part
 * handed to the uploader) and the budget's relief when nothing uploads.
 * Both feeds stand on it: bytes copied (ckpt_staging.c) and segments in
 * place (ckpt_staging_shm.c); it calls neither, only the uploader below.
 */
#include <stdlib.h>
#include <string.h>

#include "ckpt_service_int.h"
#include "stk_error.h"

/* Nothing is uploading, so nothing will free memory: seal every open object
 * so that its partial part is uploaded. */
void ckpt__staging_relieve(struct ckpt_service *s) {
  for (struct attempt *a = s->attempts; a; a = a->next)
    if (a->state == ATT_OPEN) ckpt__upload_release_held(a, true);
  if (s->parts_outstanding > 0) return;
  for (struct attempt *a = s->attempts; a; a = a->next) {
    if (a->state != ATT_OPEN) continue;
    for (uint32_t r = 0; r < a->world; r++) {
      struct obj *o = a->ranks[r].cur;
      /* A shm segment whose chunk messages have not all come yet must stay
       * open: sealing it would refuse the rest ("used once"). */
      if (o && o->size > 0 && (!o->seg || o->size == o->seg->size)) ckpt__upload_seal(o);
    }
  }
}

struct obj *ckpt__staging_obj_new(struct attempt *a, uint32_t rank) {
  struct obj *o = calloc(1, sizeof(*o));
  if (!o) return NULL;
  struct rank_state *rs = &a->ranks[rank];
  o->att = a;
  o->rank = rank;
  o->index = rs->n_objects++;
  if (rs->objs_tail)
    rs->objs_tail->next = o;
  else
    rs->objs = o;
  rs->objs_tail = o;
  rs->cur = o;
  return o;
}

int ckpt__staging_add_chunk(struct obj *o, const Stoker__V1__WriteChunk *c, uint64_t len) {
  if (o->n_chunks == o->cap_chunks) {
    size_t cap = o->cap_chunks ? o->cap_chunks * 2 : 8;
    struct chunk_rec *n = realloc(o->chunks, cap * sizeof(*n));
    if (!n) return STK_ENOMEM;
    o->chunks = n;
    o->cap_chunks = cap;
  }
  struct chunk_rec *r = &o->chunks[o->n_chunks];
  memset(r, 0, sizeof(*r));
  r->tensor = strdup(c->tensor);
  if (!r->tensor) return STK_ENOMEM;
  r->dtype = (int)c->dtype;
  r->shape.ndim = (uint32_t)c->n_global_shape;
  u64copy(r->shape.dims, c->global_shape, c->n_global_shape);
  r->box.ndim = r->shape.ndim;
  u64copy(r->box.offsets, c->box->offsets, c->box->n_offsets);
  u64copy(r->box.sizes, c->box->sizes, c->box->n_sizes);
  r->offset = o->size;
  r->length = len;
  o->n_chunks++;
  return 0;
}

struct part *ckpt__staging_open_part(struct obj *o) {
  if (o->cur) return o->cur;
  struct part *p = calloc(1, sizeof(*p));
  if (!p) return NULL;
  p->obj = o;
  p->number = ++o->parts_sent;
  o->cur = p;
  return p;
}

void ckpt__staging_part_took(struct ckpt_service *s, struct obj *o, struct part *p, size_t n) {
  p->len += n;
  if (p->len == s->o.part_bytes) {
    o->cur = NULL;
    ckpt__upload_part_ready(o, p);
  }
}
