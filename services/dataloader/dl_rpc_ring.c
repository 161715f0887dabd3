/*
 * Shared-memory delivery for one StreamBatches call (issue 3: a trainer on
 * the daemon's host gets tokens at memory speed instead of through two
 * socket copies). The first batch goes inline and sizes the ring: slots of
 * that batch's bytes, 2 x prefetch + 2 of them (the daemon's prefetch plus
 * the client's queue, the batch the trainer holds and one in hand), fewer
 * if that is over the daemon's ring limit. From then on each batch is
 * generated straight into the slot of its sequence once the client has
 * released the slot's previous batch, and the message says only "sequence
 * n". A batch that does not fit a slot (sequence length or batch size grew
 * at a step boundary) still goes inline.
 */
#include <stdlib.h>
#include <string.h>

#include "dl_rpc_internal.h"
#include "log.h"
#include "shm_ring.h"
#include "stk_error.h"

/* Slot bytes for b: the core wants 4 bytes of slack. */
static uint64_t slot_bytes_for(const struct dl_batch *b) {
  return (uint64_t)b->lines * b->line_tokens * 4 + 4;
}

void dl_stream_ring_setup(struct dl_stream_ring *r, const struct dl_rpc *a, uint32_t prefetch,
                          const struct dl_batch *b) {
  if (!r->wanted || r->off || r->ring) return;
  uint64_t slot = (slot_bytes_for(b) + 4095) / 4096 * 4096;
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
  r->next_seq = 1;
}

uint32_t *dl_stream_ring_dest(struct dl_stream_ring *r, uint32_t ahead, size_t *ret_bytes,
                              bool *ret_full) {
  *ret_full = false;
  *ret_bytes = 0;
  if (!r->ring || r->off) return NULL;
  uint64_t seq = r->next_seq + ahead;
  if (ahead >= shm_ring_slots(r->ring) || !shm_ring_writable(r->ring, seq)) {
    *ret_full = true;
    return NULL;
  }
  *ret_bytes = shm_ring_slot_bytes(r->ring);
  return (uint32_t *)(void *)shm_ring_slot(r->ring, seq);
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
