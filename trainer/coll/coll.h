/*
 * coll: the collective-communication interface FSDP runs on, with two
 * backends behind it: a CPU ring over TCP (ring/) and NCCL (nccl/, built
 * when CUDA and NCCL are found). Every rank of a group calls the same
 * collectives in the same order. Counts are in elements, not bytes.
 *
 * Semantics (n = group size, rank r):
 *   all_gather:     recv[n * count] = concat over ranks q of send_q[count]
 *   reduce_scatter: recv[count] = sum over q of send_q[r*count .. (r+1)*count)
 *   all_reduce:     buf[count] = sum over q of buf_q[count] (in place)
 * Buffers are host memory for the ring backend and device memory for NCCL.
 *
 * Every collective has a deadline: a peer that dies or stalls makes the
 * call fail with STK_ETIMEDOUT (or STK_EIO when a connection breaks)
 * instead of hanging; the group is then unusable and must be aborted and
 * rebuilt (after a RESTART from the coordinator, say). coll_why() then says
 * in one line what failed first: the collective, this rank's neighbours and
 * the backend's reason (a broken connection, a timeout).
 *
 * Threading: one thread drives a group at a time. Calls block until the
 * local part of the collective is complete.
 */
#ifndef STK_COLL_H
#define STK_COLL_H

#include <stddef.h>
#include <stdint.h>

enum coll_dtype { COLL_F32 = 1, COLL_BF16 = 2 };

struct coll_group;

struct coll_ops {
  const char *name; /* "ring", "nccl" */
  int (*all_gather)(struct coll_group *g, const void *send, void *recv, size_t count,
                    enum coll_dtype dt);
  int (*reduce_scatter)(struct coll_group *g, const void *send, void *recv, size_t count,
                        enum coll_dtype dt);
  int (*all_reduce)(struct coll_group *g, void *buf, size_t count, enum coll_dtype dt);
  /* Makes pending and future calls fail at once (safe from another thread). */
  void (*abort)(struct coll_group *g);
  void (*free)(struct coll_group *g);
};

/* Every backend's group begins with this header. */
struct coll_group {
  const struct coll_ops *ops;
  int rank;
  int size;
  int64_t timeout_ms; /* Per collective. */
  char why[320];      /* The first failure, for coll_why(); "" while none. */
};

size_t coll_dtype_size(enum coll_dtype dt);

/* bf16 conversions for callers that keep f32 and communicate in bf16:
 * narrowing rounds to nearest, ties to even (NaN stays NaN); widening is
 * exact. bf16 values are the upper 16 bits of the f32 pattern. */
void coll_bf16_from_f32(uint16_t *dst, const float *src, size_t n);
void coll_f32_from_bf16(float *dst, const uint16_t *src, size_t n);

/* Records the first failure of g (op failed with rc; the backend's detail
 * is the calling thread's stk_detail()) and returns rc. */
int coll_failed(struct coll_group *g, const char *op, int rc);
/* What failed first in g ("" while nothing did). */
const char *coll_why(const struct coll_group *g);

static inline int coll_all_gather(struct coll_group *g, const void *send, void *recv, size_t count,
                                  enum coll_dtype dt) {
  int rc = g->ops->all_gather(g, send, recv, count, dt);
  return rc ? coll_failed(g, "all-gather", rc) : 0;
}
static inline int coll_reduce_scatter(struct coll_group *g, const void *send, void *recv,
                                      size_t count, enum coll_dtype dt) {
  int rc = g->ops->reduce_scatter(g, send, recv, count, dt);
  return rc ? coll_failed(g, "reduce-scatter", rc) : 0;
}
static inline int coll_all_reduce(struct coll_group *g, void *buf, size_t count,
                                  enum coll_dtype dt) {
  int rc = g->ops->all_reduce(g, buf, count, dt);
  return rc ? coll_failed(g, "all-reduce", rc) : 0;
}
static inline void coll_abort(struct coll_group *g) {
  g->ops->abort(g);
}
static inline void coll_free(struct coll_group *g) {
  if (g) g->ops->free(g);
}

#endif
