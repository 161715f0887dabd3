/*
 * The client's end of the dataloader's shared-memory ring (shm_ring.h): a
 * stream maps the ring the daemon names, every batch delivered in it views
 * its slot in place, and freeing the batch releases the slot. The mapping
 * lives until the stream and its last batch are gone, so a trainer may
 * keep batches after closing the stream.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "client_internal.h"
#include "loader_internal.h"
#include "shm_ring.h"

struct loader_ring {
  struct shm_ring *ring;
  atomic_int refs;
};

int loader_ring_attach(const char *path, const uint8_t nonce[16], struct loader_ring **ret) {
  struct loader_ring *r = calloc(1, sizeof(*r));
  if (!r) return STK_ENOMEM;
  int err = shm_ring_attach(path, nonce, &r->ring);
  if (err) {
    free(r);
    return err;
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
  free(r);
}

uint64_t loader_ring_slot_bytes(const struct loader_ring *r) {
  return shm_ring_slot_bytes(r->ring);
}

const uint8_t *loader_ring_slot(const struct loader_ring *r, uint64_t seq) {
  return shm_ring_slot(r->ring, seq);
}

void loader_ring_release(struct loader_ring *r, uint64_t seq) {
  shm_ring_release(r->ring, seq);
}
