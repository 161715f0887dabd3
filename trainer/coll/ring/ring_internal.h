/*
 * ring_internal.h: what the ring backend's files share: the group object, the
 * step plan a collective is compiled into, and the engine that runs a plan.
 *
 * A plan is a list of steps. In step k this rank sends steps[k].send_bytes to
 * the next rank and receives steps[k].recv_bytes from the previous one; the
 * two streams run concurrently and independently, constrained only by:
 *   send_dep:   step k's byte o may be sent once byte o of step send_dep is
 *               "ready" (received, and reduced when the step reduces), which
 *               is how a ring step forwards what the previous step brought in;
 *   recv_guard: step k may receive byte o only after byte o of step
 *               recv_guard was sent, so a scratch area is not overwritten
 *               before its contents left.
 * A reducing step (addend != NULL) computes out = received + addend segment
 * by segment as bytes arrive; a plain step's data is ready when received.
 * Step 0 of every plan is a header that both neighbours must agree on.
 */
#ifndef STK_RING_INTERNAL_H
#define STK_RING_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "coll.h"

struct ring_group {
  struct coll_group base;
  int next_fd;          /* Connected to rank + 1 (we send on it). */
  int prev_fd;          /* Accepted from rank - 1 (we receive on it). */
  int abort_fd;         /* eventfd, readable once aborted. */
  atomic_int aborted;   /* Set by ring abort from any thread. */
  int broken;           /* Error that broke the group, or 0. */
  uint64_t seq;         /* Collectives started, checked in the header. */
  size_t segment_bytes; /* Reduce and send granularity. */
  uint8_t *scratch;     /* Reduce-scatter partial sums, 2 chunks. */
  size_t scratch_bytes;
};

struct ring_step {
  const uint8_t *send;
  size_t send_bytes;
  int send_dep; /* Step whose ready bytes gate this send, or -1. */
  uint8_t *recv;
  size_t recv_bytes;
  int recv_guard;        /* Step whose sent bytes gate this receive, or -1. */
  const uint8_t *addend; /* Reduce: out = recv + addend; NULL: no reduce. */
  uint8_t *out;
};

struct ring_plan {
  struct ring_step *steps;
  int nsteps;
  enum coll_dtype dt;
};

/* Runs a plan to completion or until deadline_ms (CLOCK_MONOTONIC ms).
 * Returns 0, STK_ETIMEDOUT, STK_EIO, STK_ECANCELED or STK_EINVAL (header
 * mismatch: the neighbours called a different collective). */
int ring_run(struct ring_group *g, const struct ring_plan *p, int64_t deadline_ms);

/* out[i] = a[i] + b[i] over bytes / element size elements (out may alias a or
 * b). bf16 is added in f32 and rounded to nearest even. */
void ring_reduce(enum coll_dtype dt, void *out, const void *a, const void *b, size_t bytes);

/* Monotonic clock in milliseconds. */
int64_t ring_now_ms(void);

/* The collectives of coll_ops (ring_algo.c). */
int ring_all_gather(struct coll_group *cg, const void *send, void *recv, size_t count,
                    enum coll_dtype dt);
int ring_reduce_scatter(struct coll_group *cg, const void *send, void *recv, size_t count,
                        enum coll_dtype dt);
int ring_all_reduce(struct coll_group *cg, void *buf, size_t count, enum coll_dtype dt);

/* Opens a listener on exactly "HOST:PORT" (ring_conn.c). */
int ring_listen_at(const char *addr, int *ret_listener);

/* Opens the ring's two connections (ring_conn.c). */
int ring_connect_next(const char *addr, int rank, int size, int64_t deadline_ms, int *ret_fd);
int ring_accept_prev(int listener, int prev_rank, int size, int64_t deadline_ms, int *ret_fd);

#endif
