/*
 * ckpt_box: n-dimensional boxes over a tensor's global shape, the unit of
 * checkpoint sharding. A rank saves the box of the tensor it holds; a restore
 * asks for the box its (possibly different) world size gives it.
 *
 * Legend: a shape has ndim dims (0 = a scalar with one element); a box has an
 * offset and a size per dim, all in elements; a box's bytes are laid out
 * row-major (last dim fastest), elem_bytes per element.
 *
 * All functions are pure. Functions that take boxes trust them to be checked
 * (ckpt_box_check against a shape whose byte size fits in uint64), so that
 * offset arithmetic cannot overflow; only ckpt_shape_check and ckpt_box_check
 * look at untrusted numbers.
 */
#ifndef STK_CKPT_BOX_H
#define STK_CKPT_BOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Most dims a checkpointed tensor may have. */
#define CKPT_MAX_DIMS 8

struct ckpt_shape {
  uint32_t ndim;
  uint64_t dims[CKPT_MAX_DIMS];
};

struct ckpt_box {
  uint32_t ndim;
  uint64_t offsets[CKPT_MAX_DIMS];
  uint64_t sizes[CKPT_MAX_DIMS];
};

/* Checks ndim <= CKPT_MAX_DIMS and that elements x elem_bytes fits in a
 * uint64; gives the element count. 0, STK_EINVAL or STK_ERANGE (detail set). */
int ckpt_shape_check(const struct ckpt_shape *shape, uint64_t elem_bytes, uint64_t *ret_numel);

/* Checks a box against a checked shape: same ndim, offset + size <= dim in
 * every dim (no wrap-around). 0 or STK_EINVAL (detail names the dim). */
int ckpt_box_check(const struct ckpt_box *box, const struct ckpt_shape *shape);

/* Elements in a checked box (1 for ndim 0; 0 if any size is 0). */
uint64_t ckpt_box_numel(const struct ckpt_box *box);

/* The whole shape as a box. */
void ckpt_box_of_shape(const struct ckpt_shape *shape, struct ckpt_box *ret_box);

/* True if the boxes share at least one element; ret_box (may be NULL) gets
 * the intersection then. Boxes of different ndim never intersect. */
bool ckpt_box_intersect(const struct ckpt_box *a, const struct ckpt_box *b,
                        struct ckpt_box *ret_box);

/* True if inner lies entirely inside outer (an empty inner of the same ndim
 * inside outer's range counts). */
bool ckpt_box_contains(const struct ckpt_box *outer, const struct ckpt_box *inner);

/*
 * Runs: the bytes of box x as contiguous pieces of two row-major layouts, the
 * source box src and the destination box dst (both must contain x). A run
 * copies len bytes from src_offset (within src's bytes) to dst_offset (within
 * dst's bytes). Runs come in row-major order of x, so src offsets and dst
 * offsets both increase; runs adjacent in both layouts are merged. For a pure
 * read of x from src, pass dst = x.
 */
struct ckpt_run {
  uint64_t src_offset;
  uint64_t dst_offset;
  uint64_t len;
};

/* Called once per run; a nonzero return stops the walk and is returned. */
typedef int (*ckpt_run_fn)(void *ctx, const struct ckpt_run *run);

/* 0, STK_EINVAL (x not inside src or dst, elem_bytes 0), or fn's return. */
int ckpt_box_runs(const struct ckpt_box *x, const struct ckpt_box *src, const struct ckpt_box *dst,
                  uint64_t elem_bytes, ckpt_run_fn fn, void *ctx);

/* The same runs as an array (free() it; NULL when there are none). */
int ckpt_box_runs_collect(const struct ckpt_box *x, const struct ckpt_box *src,
                          const struct ckpt_box *dst, uint64_t elem_bytes,
                          struct ckpt_run **ret_runs, size_t *ret_count);

/*
 * Byte ranges (of one object) and their coalescing for ranged reads: sorts
 * ranges by offset and merges those that overlap, touch, or are at most
 * max_gap_bytes apart (the gap is read and thrown away), as long as a merged
 * range stays within max_len_bytes (0 = no limit). Returns the new count.
 */
struct ckpt_range {
  uint64_t offset;
  uint64_t len;
};

size_t ckpt_ranges_coalesce(struct ckpt_range *ranges, size_t count, uint64_t max_gap_bytes,
                            uint64_t max_len_bytes);

/*
 * Coverage of a tensor by its chunks: every element covered exactly once.
 * Works on boxes only (a sweep over the dim where it compares the fewest
 * pairs, then a volume count), never on per-element arrays; fine for many
 * thousand chunks. Empty boxes cover nothing and overlap nothing.
 */
enum ckpt_cover_result {
  CKPT_COVER_OK = 0,      /* Exactly covered. */
  CKPT_COVER_BAD_BOX,     /* Box a does not fit the shape (wrong ndim or out of bounds). */
  CKPT_COVER_OVERLAP,     /* Boxes a and b share elements. */
  CKPT_COVER_GAP,         /* No overlaps, but covered < total elements. */
  CKPT_COVER_TOO_COMPLEX, /* Verifying would compare over CKPT_COVER_MAX_PAIRS pairs. */
};

/* Most box pairs a coverage check compares (about a second of work). Real
 * layouts (grids of a x b shards) need about n x min(a, b). */
#define CKPT_COVER_MAX_PAIRS (UINT64_C(200) * 1000 * 1000)

struct ckpt_cover_report {
  enum ckpt_cover_result result;
  size_t a, b;      /* Offending boxes (indices into the input). */
  uint64_t covered; /* Elements covered (when no overlap was found). */
  uint64_t total;   /* Elements of the shape. */
};

/* 0 if covered exactly; STK_EINVAL with detail and report filled otherwise;
 * STK_ETOOBIG for CKPT_COVER_TOO_COMPLEX; STK_ENOMEM. The shape must be
 * checked. ret_report may be NULL. */
int ckpt_box_coverage(const struct ckpt_shape *shape, const struct ckpt_box *boxes, size_t count,
                      struct ckpt_cover_report *ret_report);

/*
 * Even sharding, so that writers and readers at any world size agree.
 * ckpt_shard_dim0: rank r of world gets rows [r*N/world, (r+1)*N/world) of
 * dim 0 (balanced; empty when N < world) and all of the other dims. A scalar
 * (ndim 0) belongs to rank 0 whole; others get an empty box.
 * ckpt_shard_flat: FSDP flat shards. A 1-D parameter buffer of numel elements
 * is padded to world x ceil(numel/world); rank r holds shard_numel elements
 * starting at r*shard_numel, of which ret_box (clipped to numel, possibly
 * empty) are real and the rest padding. 0 or STK_EINVAL (world 0, rank >=
 * world).
 */
int ckpt_shard_dim0(const struct ckpt_shape *shape, uint32_t rank, uint32_t world,
                    struct ckpt_box *ret_box);
int ckpt_shard_flat(uint64_t numel, uint32_t rank, uint32_t world, struct ckpt_box *ret_box,
                    uint64_t *ret_shard_numel);

#endif
