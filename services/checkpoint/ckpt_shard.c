/*
 * ckpt_shard: the even sharding rules writers and readers share, so a test
 * (or a trainer) can save at 4 ranks and restore at 3 or 8 by asking each
 * rank's box at the new world size.
 */
#include "ckpt_box.h"
#include "stk_error.h"

static int check_rank(uint32_t rank, uint32_t world) {
  if (world == 0 || rank >= world) {
    stk_set_detail("rank %u outside world %u", rank, world);
    return STK_EINVAL;
  }
  return 0;
}

/* floor(i * n / world) without overflow. */
static uint64_t split_point(uint64_t n, uint32_t i, uint32_t world) {
  return (uint64_t)((unsigned __int128)n * i / world);
}

int ckpt_shard_dim0(const struct ckpt_shape *shape, uint32_t rank, uint32_t world,
                    struct ckpt_box *ret_box) {
  int rc = check_rank(rank, world);
  if (rc != 0) return rc;
  struct ckpt_box b;
  ckpt_box_of_shape(shape, &b);
  if (shape->ndim == 0) {
    /* A scalar cannot be split (a 0-d box is never empty): rank 0 holds it. */
    *ret_box = b;
    return rank == 0 ? 0 : STK_ENOENT;
  }
  uint64_t lo = split_point(shape->dims[0], rank, world);
  uint64_t hi = split_point(shape->dims[0], rank + 1, world);
  b.offsets[0] = lo;
  b.sizes[0] = hi - lo;
  *ret_box = b;
  return 0;
}

int ckpt_shard_flat(uint64_t numel, uint32_t rank, uint32_t world, struct ckpt_box *ret_box,
                    uint64_t *ret_shard_numel) {
  int rc = check_rank(rank, world);
  if (rc != 0) return rc;
  uint64_t shard = numel / world + (numel % world != 0);
  uint64_t lo = (uint64_t)((unsigned __int128)shard * rank);
  uint64_t hi = lo + shard;
  if (lo > numel) lo = numel;
  if (hi > numel) hi = numel;
  *ret_box = (struct ckpt_box){.ndim = 1, .offsets = {lo}, .sizes = {hi - lo}};
  *ret_shard_numel = shard;
  return 0;
}
