/*
 * ckpt_staging_shm: zero-copy staging. A chunk that names a shared-memory
 * segment instead of carrying bytes is placed without copying: the segment
 * is checked and mapped (ckpt_shm.h) and becomes an object of its own
 * whose byte x is the segment's byte x, so its parts are slices of the
 * mapping and are CRC'd and uploaded from it exactly as staged buffers are
 * (a segment of up to ONE_PUT_PARTS parts: one PUT of the whole object once
 * it is sealed). Later chunks of the same segment must follow on
 * contiguously; a chunk naming another segment (or carrying
 * bytes) seals the object. The segment is released (recycled or removed)
 * when its object is done, or when the attempt ends.
 *
 * The staging budget counts what chunks have named of a segment, not the
 * segment's size: a file truncated out to the largest size with nothing
 * written (or a rank hung after its first chunk) holds only what it sent.
 * A new segment waits until its first chunk fits; the chunks that follow on
 * in a segment already taken are never made to wait, so every segment taken
 * can be finished and no two ranks wait on each other's half-fed segments
 * (the budget may be passed by at most the unfed rest of the segments in
 * progress, pages their writers already hold).
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_service_int.h"
#include "stk_error.h"

/* A segment of at most this many parts goes as one PUT when its object is
 * sealed: a multipart upload of a few parts buys no parallelism (a rank's
 * segments upload side by side), costs a begin and a complete, and stores
 * that join parts on complete copy every byte twice. */
#define ONE_PUT_PARTS 4

/* Grows the object by len bytes already in place in its segment: one
 * part spanning a small segment, sent at seal; else each full part is
 * handed to the uploader. */
static int extend(struct ckpt_service *s, struct obj *o, uint64_t len) {
  if (o->seg->size <= ONE_PUT_PARTS * s->o.part_bytes) {
    if (!o->cur && !(o->cur = calloc(1, sizeof(*o->cur)))) return STK_ENOMEM;
    struct part *p = o->cur;
    p->obj = o;
    p->number = o->parts_sent = 1;
    p->borrowed = true;
    p->buf = (uint8_t *)o->seg->map;
    p->len += len;
    o->size += len;
    return 0;
  }
  while (len > 0) {
    struct part *p = ckpt__staging_open_part(o);
    if (!p) return STK_ENOMEM;
    if (!p->buf) { /* Fresh: it views its slice of the segment. */
      p->borrowed = true;
      p->buf = (uint8_t *)o->seg->map + (uint64_t)(p->number - 1) * s->o.part_bytes;
    }
    uint64_t room = s->o.part_bytes - p->len, n = len < room ? len : room;
    o->size += n;
    len -= n;
    ckpt__staging_part_took(s, o, p, n);
  }
  return 0;
}

static int follow_on(struct ckpt_service *s, struct obj *o, const Stoker__V1__WriteChunk *c,
                     uint64_t len) {
  if (c->shm_offset != o->size || len > o->seg->size - o->size) {
    stk_set_detail("shm segment %s: chunk at offset %" PRIu64 " (%" PRIu64
                   " bytes) must follow on at %" PRIu64 " within %" PRIu64 " bytes",
                   o->seg->name, c->shm_offset, len, o->size, o->seg->size);
    return STK_EINVAL;
  }
  int err = ckpt__staging_add_chunk(o, c, len);
  uint64_t before = o->size;
  if (!err) err = extend(s, o, len);
  s->staged += o->size - before;
  o->att->staged_bytes += o->size - before;
  if (s->staged > s->stats.staged_peak_bytes) s->stats.staged_peak_bytes = s->staged;
  return err;
}

static bool used_before(const struct rank_state *rs, const char *name) {
  for (const struct obj *o = rs->objs; o; o = o->next)
    if (o->seg && strcmp(o->seg->name, name) == 0) return true;
  return false;
}

/* Maps a segment not seen before; CKPT_WRITE_WAIT when it does not fit the
 * budget now (the file is left as it is). */
static int take(struct ckpt_writer *w, const Stoker__V1__WriteChunk *c, uint64_t len,
                struct ckpt_shm_seg **ret_seg) {
  struct ckpt_service *s = w->svc;
  struct rank_state *rs = &w->att->ranks[w->rank];
  int err = ckpt_shm_check_name(c->shm_name, w->att->id, w->rank);
  if (err) return err;
  if (used_before(rs, c->shm_name) || c->shm_offset != 0) {
    stk_set_detail("shm segment %s: a new segment starts at offset 0 and is used once",
                   c->shm_name);
    return STK_EINVAL;
  }
  struct ckpt_shm_seg *seg;
  err = ckpt_shm_map(s->shm, c->shm_name, &seg);
  if (err) return err;
  if (len > seg->size) {
    stk_set_detail("shm segment %s: %" PRIu64 " bytes, too short for a chunk of %" PRIu64,
                   seg->name, seg->size, len);
    ckpt_shm_unmap(seg);
    return STK_EINVAL;
  }
  if (s->staged + len > s->o.staging_budget_bytes) {
    ckpt_shm_unmap(seg);
    ckpt__attempt_wait_add(s, w);
    s->stats.waits++;
    ckpt__staging_relieve(s);
    return CKPT_WRITE_WAIT;
  }
  *ret_seg = seg;
  return 0;
}

int ckpt__staging_feed_shm(struct ckpt_writer *w, const Stoker__V1__WriteChunk *c, uint64_t len) {
  struct ckpt_service *s = w->svc;
  struct rank_state *rs = &w->att->ranks[w->rank];
  if (!s->shm) {
    stk_set_detail("shared-memory staging is off on this service; send the bytes");
    return STK_EINVAL;
  }
  if (rs->cur && rs->cur->seg && strcmp(rs->cur->seg->name, c->shm_name) == 0)
    return follow_on(s, rs->cur, c, len);
  struct ckpt_shm_seg *seg = NULL;
  int err = take(w, c, len, &seg);
  if (err) return err;
  ckpt__attempt_wait_remove(s, w);
  if (rs->cur) ckpt__upload_seal(rs->cur);
  struct obj *o = ckpt__staging_obj_new(w->att, w->rank);
  if (!o) {
    ckpt_shm_unmap(seg);
    return STK_ENOMEM;
  }
  o->seg = seg;
  rs->shm = true;
  return follow_on(s, o, c, len);
}
