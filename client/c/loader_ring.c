/*
 * The client's end of the dataloader's shared-memory ring (shm_ring.h): a
 * stream maps the ring the daemon names, every batch delivered in it views
 * its slot in place, and freeing the batch releases the slot. The mapping
 * lives until the stream and its last batch are gone, so a trainer may
 * keep batches after closing the stream. The ring remembers which sequence
 * each slot holds for a batch not yet freed: a daemon that writes a new
 * sequence into such a slot is caught instead of changing a batch in use.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "client_internal.h"
#include "loader_internal.h"
#include "shm_ring.h"

struct loader_ring {
  struct shm_ring *ring;
  atomic_int refs;
  _Atomic uint64_t *held; /* [slots]: the sequence a live batch views there, or 0. */
};

int loader_ring_attach(const char *path, const uint8_t nonce[16], struct loader_ring **ret) {
  struct loader_ring *r = calloc(1, sizeof(*r));
  if (!r) return STK_ENOMEM;
  int err = shm_ring_attach(path, nonce, &r->ring);
  if (err) {
    free(r);
    return err;
  }
  r->held = calloc(shm_ring_slots(r->ring), sizeof(*r->held));
  if (!r->held) {
    shm_ring_free(r->ring);
    free(r);
    return STK_ENOMEM;
  }
  atomic_init(&r->refs, 1);
  *ret = r;
  return 0;
}

struct loader_ring *loader_ring_ref(struct loader_ring *r) {
  atomic_fetch_add(&r->refs, 1);
  return r;
}

void loader_ring_unref(struct loader_ring *r) {
  if (!r || atomic_fetch_sub(&r->refs, 1) != 1) return;
  shm_ring_free(r->ring);
  free((void *)r->held);
  free(r);
}

uint64_t loader_ring_slot_bytes(const struct loader_ring *r) {
  return shm_ring_slot_bytes(r->ring);
}

uint32_t loader_ring_slots(const struct loader_ring *r) {
  return shm_ring_slots(r->ring);
}

const uint8_t *loader_ring_slot(const struct loader_ring *r, uint64_t seq) {
  return shm_ring_slot(r->ring, seq);
}

int loader_ring_take(struct loader_ring *r, uint64_t seq) {
  uint64_t none = 0;
  _Atomic uint64_t *slot = &r->held[(seq - 1) % shm_ring_slots(r->ring)];
  if (atomic_compare_exchange_strong(slot, &none, seq)) return 0;
  client_set_error(15,
                   "dataloader sent shared-memory sequence %llu in the slot of sequence %llu, "
                   "which a batch still uses",
                   (unsigned long long)seq, (unsigned long long)none);
  return STK_ECORRUPT;
}

void loader_ring_release(struct loader_ring *r, uint64_t seq) {
  uint64_t mine = seq;
  atomic_compare_exchange_strong(&r->held[(seq - 1) % shm_ring_slots(r->ring)], &mine, 0);
  shm_ring_release(r->ring, seq);
}
