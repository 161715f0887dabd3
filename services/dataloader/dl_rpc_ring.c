/*
 * Shared-memory delivery for one StreamBatches call (issue 3: a trainer on
 * the daemon's host gets tokens at memory speed instead of through two
 * socket copies). The first batch is generated on the heap and sizes the
 * ring: slots of that batch's bytes, 2 x prefetch + 2 of them (the daemon's
 * prefetch plus the client's queue, the batch the trainer holds and one in
 * hand), fewer if that is over the daemon's ring limit; it is then copied
 * into the first slot (one copy per stream), so a client that asked for
 * the ring gets every batch through it, the first included (issue 26). From
 * then on each batch is generated straight into the slot of its sequence
 * once the client has released the slot's previous batch, and the message
 * says only "sequence n". A batch that does not fit a slot (sequence length
 * or batch size grew at a step boundary) still goes inline.
 *
 * A client may ask for int64 tokens in the slots (shm_token_bytes 8): the
 * core generates uint32 tokens into the slot's first half and the worker
 * widens them in place, last token first, so a PyTorch trainer maps the
 * slot as its int64 tensor and copies nothing.
 */
#include <endian.h>
#include <stdlib.h>
#include <string.h>

#include "dl_rpc_internal.h"
#include "log.h"
#include "shm_ring.h"
#include "stk_error.h"

/* Slot bytes for b at width token_bytes: the core, generating uint32
 * tokens into the slot, wants 4 bytes of slack (in the first half when the
 * slot holds int64 tokens). */
static uint64_t slot_bytes_for(const struct dl_batch *b, uint32_t token_bytes) {
  return (uint64_t)b->lines * b->line_tokens * token_bytes + 8;
}

void dl_stream_ring_setup(struct dl_stream_ring *r, const struct dl_rpc *a, uint32_t prefetch,
                          const struct dl_batch *b) {
  if (!r->wanted || r->off || r->ring) return;
  uint64_t slot = (slot_bytes_for(b, r->token_bytes) + 4095) / 4096 * 4096;
  uint64_t slots = 2 * (uint64_t)prefetch + 2;
  if (slots > SHM_RING_MAX_SLOTS) slots = SHM_RING_MAX_SLOTS;
  while (slots > 2 && slots * slot > a->shm_ring_bytes) slots--;
  if (slots * slot > a->shm_ring_bytes) {
    r->off = true; /* Batches too big for a ring: inline. */
    return;
  }
  stk_clear_detail();
  int err = shm_ring_create(a->shm_dirfd, a->shm_dir, r->nonce, (uint32_t)slots, slot, &r->ring);
  if (err) {
    log_warn("stream", "shared-memory ring: %s (%s); sending inline", stk_strerror(err),
             stk_detail());
    r->off = true;
    return;
  }
}

uint32_t *dl_stream_ring_dest(struct dl_stream_ring *r, uint64_t after, uint64_t *ret_seq,
                              size_t *ret_bytes, bool *ret_full) {
  *ret_full = false;
  *ret_bytes = 0;
  *ret_seq = 0;
  if (!r->ring || r->off) return NULL;
  uint64_t seq = shm_ring_next_free(r->ring, after);
  if (!seq) {
    *ret_full = true;
    return NULL;
  }
  stk_clear_detail();
  if (shm_ring_reserve(r->ring, seq) != 0) { /* tmpfs full: this and later batches inline */
    log_warn("stream", "shared-memory ring: %s; sending inline", stk_detail());
    r->off = true;
    return NULL;
  }
  *ret_seq = seq;
  *ret_bytes = shm_ring_slot_bytes(r->ring) / r->token_bytes * 4;
  return (uint32_t *)(void *)shm_ring_slot(r->ring, seq);
}

uint64_t dl_stream_ring_adopt(struct dl_stream_ring *r, struct dl_batch *b) {
  uint64_t seq;
  size_t room;
  bool full;
  uint32_t *dest = dl_stream_ring_dest(r, 0, &seq, &room, &full);
  size_t bytes = (size_t)b->lines * b->line_tokens * sizeof(uint32_t);
  if (!dest || bytes > room) return 0; /* Stays inline (the slot, if any, stays free). */
  memcpy(dest, b->tokens, bytes);
  free(b->tokens);
  b->tokens = dest;
  b->tokens_borrowed = true;
  dl_stream_ring_widen(r, b);
  return seq;
}

void dl_stream_ring_written(struct dl_stream_ring *r, uint64_t seq) {
  shm_ring_written(r->ring, seq);
}

void dl_stream_ring_widen(const struct dl_stream_ring *r, struct dl_batch *b) {
  if (r->token_bytes != 8) return;
  size_t n = (size_t)b->lines * b->line_tokens;
  uint8_t *bytes = (uint8_t *)b->tokens;
  /* Token i moves from bytes [4i, 4i+4) to [8i, 8i+8): going from the last
   * down, every source is read before a wider write covers it. Bytes, not
   * typed pointers: the two widths alias. */
  for (size_t i = n; i-- > 0;) {
    uint32_t le32;
    memcpy(&le32, bytes + 4 * i, 4);
    uint64_t le64 = htole64((uint64_t)le32toh(le32));
    memcpy(bytes + 8 * i, &le64, 8);
  }
}

void dl_stream_ring_msg(struct dl_stream_ring *r, uint64_t seq, Stoker__V1__Batch *msg) {
  msg->tokens.data = NULL;
  msg->tokens.len = 0;
  msg->shm_seq = seq;
  if (!r->path_sent) {
    msg->shm_path = (char *)shm_ring_path(r->ring);
    r->path_sent = true;
  }
}

void dl_stream_ring_close(struct dl_stream_ring *r) {
  if (!r->ring) return;
  shm_ring_unlink(r->ring);
  shm_ring_free(r->ring);
  r->ring = NULL;
}
