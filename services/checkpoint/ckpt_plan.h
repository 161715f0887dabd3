/*
 * ckpt_plan: the resharding planner. Given the stored chunks of one tensor
 * (each a box whose row-major bytes sit at an offset in an object) and the
 * box a restoring rank wants, it lists the ranged reads to issue (coalesced
 * per object, optionally widened to CRC blocks so each read can be verified)
 * and the copies that assemble the wanted box's row-major bytes from them.
 *
 * Pure: the caller fetches the reads however it likes (S3 ranged GETs, file
 * preads) and applies the copies with ckpt_plan_apply.
 */
#ifndef STK_CKPT_PLAN_H
#define STK_CKPT_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt_box.h"

struct ckpt_stored_chunk {
  struct ckpt_box box;    /* In the tensor's global coordinates (checked). */
  uint32_t object;        /* The caller's index of the object holding it. */
  uint64_t object_offset; /* Where the chunk's bytes start in the object. */
  uint64_t object_bytes;  /* The object's size (bounds reads when aligning). */
};

struct ckpt_plan_opts {
  uint64_t max_gap_bytes;  /* Merge reads of one object this close (0: only touching). */
  uint64_t max_read_bytes; /* Do not merge reads beyond this size (0: no limit). */
  uint64_t align_bytes;    /* Widen reads to multiples of this (0: exact), e.g.
                              CKPT_CRC_BLOCK_BYTES to verify every read. */
};

/* One ranged read; its copies are copies[first_copy .. first_copy + n_copies). */
struct ckpt_read {
  uint32_t object;
  uint64_t offset;
  uint64_t len;
  size_t first_copy;
  size_t n_copies;
};

/* Copy len bytes from read_offset within read `read`'s bytes to dst_offset
 * within the wanted box's row-major bytes. */
struct ckpt_copy {
  size_t read;
  uint64_t read_offset;
  uint64_t dst_offset;
  uint64_t len;
};

struct ckpt_plan {
  struct ckpt_read *reads; /* Sorted by (object, offset). */
  size_t n_reads;
  struct ckpt_copy *copies; /* Grouped by read, in read order. */
  size_t n_copies;
  uint64_t want_bytes; /* Bytes of the wanted box. */
  uint64_t read_bytes; /* Bytes all reads fetch (>= want_bytes with gaps). */
};

/*
 * Builds the plan. All boxes must already be checked against the tensor's
 * shape (ckpt_box_check; a manifest's chunks are, by parse). opts may be NULL (exact, touching-only
 * merges). 0; STK_EINVAL (elem_bytes 0, boxes of mismatched ndim, a chunk past its object's end);
 * STK_ENOENT if the chunks do not cover the wanted box; STK_ECORRUPT if they overlap inside it;
 * STK_ENOMEM. Close with ckpt_plan_close (also safe after a failure).
 */
int ckpt_plan_build(const struct ckpt_stored_chunk *chunks, size_t n_chunks, uint64_t elem_bytes,
                    const struct ckpt_box *want, const struct ckpt_plan_opts *opts,
                    struct ckpt_plan *ret_plan);

/* Copies what read `read` brought (data, plan->reads[read].len bytes) into
 * dst, the wanted box's buffer of plan->want_bytes. */
void ckpt_plan_apply(const struct ckpt_plan *plan, size_t read, const void *data, void *dst);

void ckpt_plan_close(struct ckpt_plan *plan);

/* One ranged GET shared by the reads of several plans (of one restore):
 * bytes [offset, offset + len) of an object. */
struct ckpt_span {
  uint32_t object;
  uint64_t offset;
  uint64_t len;
};

/*
 * Merges the reads of plans[0 .. n_plans) into spans: reads of one object
 * that overlap, touch or lie at most max_gap_bytes apart share a span (the
 * gap is read and thrown away: one request instead of two), as long as the
 * span stays within max_span_bytes (0: no limit; a longer read stays whole).
 * *ret_spans (n, sorted by object and offset) and *ret_read_span, the span
 * holding each read, numbered across the plans in order (plan 0's reads,
 * then plan 1's...), are malloc'ed for the caller to free. A read lies
 * wholly inside its span, at reads[i].offset - span.offset; reads aligned
 * to CRC blocks give spans aligned to them. 0 or STK_ENOMEM.
 */
int ckpt_plan_spans(const struct ckpt_plan *plans, size_t n_plans, uint64_t max_gap_bytes,
                    uint64_t max_span_bytes, struct ckpt_span **ret_spans, size_t *ret_n_spans,
                    size_t **ret_read_span);

#endif
