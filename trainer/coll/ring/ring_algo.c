/*
 * ring_algo.c: the ring collectives, each compiled into a step plan for
 * ring_engine.c (n = size, r = rank, chunk c = the c-th of n blocks):
 *
 *   reduce-scatter: step s sends chunk r-s-1 (our own data at s = 0, after
 *     that the partial sum received in step s-1) and receives chunk r-s-2,
 *     adding our contribution; after n-1 steps chunk r holds the full sum.
 *     Partial sums alternate between two scratch chunks.
 *   all-gather: step s sends chunk r-s and receives chunk r-s-1 in place.
 *   all-reduce: reduce-scatter then all-gather in one plan over uneven
 *     chunks (count need not divide by n), so the all-gather starts
 *     forwarding our reduced chunk while its tail is still being summed.
 *
 * Each plan begins with a 32-byte header (op, dtype, count, sequence) that
 * both neighbours must match, so ranks calling different collectives fail
 * with STK_EINVAL instead of exchanging garbage.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "ring_internal.h"
#include "stk_error.h"

enum op { OP_ALL_GATHER = 1, OP_REDUCE_SCATTER = 2, OP_ALL_REDUCE = 3 };

struct header {
  uint32_t magic;
  uint32_t op;
  uint32_t dtype;
  uint32_t reserved;
  uint64_t count;
  uint64_t seq;
};

/* Chunk c of a vector: `count` elements each (even), or count split into
 * n nearly equal parts, the first count % n one element longer. */
struct layout {
  size_t count;
  int n;
  int even;
  size_t esize;
};

static int mod(int a, int n) {
  return ((a % n) + n) % n;
}

static size_t chunk_len(const struct layout *l, int c) {
  if (l->even) return l->count * l->esize;
  return (l->count / l->n + ((size_t)c < l->count % l->n)) * l->esize;
}

static size_t chunk_off(const struct layout *l, int c) {
  if (l->even) return (size_t)c * l->count * l->esize;
  size_t q = l->count / l->n, rem = l->count % l->n;
  return ((size_t)c * q + ((size_t)c < rem ? (size_t)c : rem)) * l->esize;
}

/* Reduce-scatter steps first..first+n-2 (partial sums in scratch[2]). */
static void plan_rs(struct ring_step *st, int first, int r, const struct layout *l,
                    const uint8_t *src, uint8_t *dst, uint8_t *scratch[2]) {
  int n = l->n;
  for (int s = 0; s < n - 1; s++) {
    struct ring_step *x = &st[first + s];
    int cs = mod(r - s - 1, n), cr = mod(r - s - 2, n);
    x->send = s == 0 ? src + chunk_off(l, cs) : st[first + s - 1].out;
    x->send_bytes = chunk_len(l, cs);
    x->send_dep = s == 0 ? -1 : first + s - 1;
    x->recv = scratch[s % 2];
    x->recv_bytes = chunk_len(l, cr);
    x->recv_guard = s >= 2 ? first + s - 1 : -1; /* scratch[s%2] left in step s-1. */
    x->addend = src + chunk_off(l, cr);
    x->out = s == n - 2 ? dst : scratch[s % 2];
  }
}

/* All-gather steps over buf; step 0's send waits on dep, its receive on guard. */
static void plan_ag(struct ring_step *st, int first, int r, const struct layout *l, uint8_t *buf,
                    int dep, int guard) {
  int n = l->n;
  for (int s = 0; s < n - 1; s++) {
    struct ring_step *x = &st[first + s];
    int cs = mod(r - s, n), cr = mod(r - s - 1, n);
    *x = (struct ring_step){.send = buf + chunk_off(l, cs),
                            .send_bytes = chunk_len(l, cs),
                            .send_dep = s == 0 ? dep : first + s - 1,
                            .recv = buf + chunk_off(l, cr),
                            .recv_bytes = chunk_len(l, cr),
                            .recv_guard = s == 0 ? guard : -1};
  }
}

/* Checks the group and arguments before a collective. */
static int begin(struct ring_group *g, enum coll_dtype dt, size_t count) {
  if (atomic_load(&g->aborted)) {
    stk_set_detail("ring: group aborted");
    return STK_ECANCELED;
  }
  if (g->broken) {
    stk_set_detail("ring: group broken by an earlier failure (%s)", stk_strerror(g->broken));
    return STK_ESTATE;
  }
  size_t es = coll_dtype_size(dt);
  if (es == 0 || count > SIZE_MAX / es / (size_t)g->base.size) {
    stk_set_detail("ring: bad dtype or count");
    return STK_EINVAL;
  }
  return 0;
}

/* Records a failure: the byte streams are out of step now, so shut the
 * sockets (neighbours fail at once) and refuse later calls. */
static int finish(struct ring_group *g, int rc) {
  if (rc == 0) return 0;
  g->broken = rc;
  shutdown(g->next_fd, SHUT_RDWR);
  shutdown(g->prev_fd, SHUT_RDWR);
  return rc;
}

static int ensure_scratch(struct ring_group *g, size_t bytes) {
  if (bytes < 64) bytes = 64; /* Never a NULL base, even for count 0. */
  if (g->scratch_bytes >= bytes) return 0;
  uint8_t *p = realloc(g->scratch, bytes);
  if (!p) return STK_ENOMEM;
  g->scratch = p;
  g->scratch_bytes = bytes;
  return 0;
}

/* Builds the header step and runs the plan whose data steps are st[1..]. */
static int run(struct ring_group *g, enum op op, enum coll_dtype dt, size_t count,
               struct ring_step *st, int nsteps) {
  struct header out = {
      .magic = 0x53544b43u, .op = op, .dtype = dt, .count = count, .seq = g->seq++};
  struct header in;
  st[0] = (struct ring_step){.send = (const uint8_t *)&out,
                             .send_bytes = sizeof out,
                             .send_dep = -1,
                             .recv = (uint8_t *)&in,
                             .recv_bytes = sizeof in,
                             .recv_guard = -1};
  struct ring_plan plan = {.steps = st, .nsteps = nsteps, .dt = dt};
  int64_t deadline = ring_now_ms() + g->base.timeout_ms;
  return finish(g, ring_run(g, &plan, deadline));
}

int ring_all_gather(struct coll_group *cg, const void *send, void *recv, size_t count,
                    enum coll_dtype dt) {
  struct ring_group *g = (struct ring_group *)cg;
  int rc = begin(g, dt, count);
  if (rc) return rc;
  struct layout l = {.count = count, .n = cg->size, .even = 1, .esize = coll_dtype_size(dt)};
  uint8_t *own = (uint8_t *)recv + chunk_off(&l, cg->rank);
  if (own != send && l.count) memmove(own, send, chunk_len(&l, cg->rank));
  if (cg->size == 1) return 0;
  struct ring_step *st = calloc((size_t)cg->size, sizeof *st);
  if (!st) return STK_ENOMEM;
  plan_ag(st, 1, cg->rank, &l, recv, -1, -1);
  rc = run(g, OP_ALL_GATHER, dt, count, st, cg->size);
  free(st);
  return rc;
}

int ring_reduce_scatter(struct coll_group *cg, const void *send, void *recv, size_t count,
                        enum coll_dtype dt) {
  struct ring_group *g = (struct ring_group *)cg;
  int rc = begin(g, dt, count);
  if (rc) return rc;
  struct layout l = {.count = count, .n = cg->size, .even = 1, .esize = coll_dtype_size(dt)};
  if (cg->size == 1) {
    if (recv != send && count) memmove(recv, send, chunk_len(&l, 0));
    return 0;
  }
  struct ring_step *st = calloc((size_t)cg->size, sizeof *st);
  if (!st) return STK_ENOMEM;
  rc = ensure_scratch(g, 2 * chunk_len(&l, 0));
  if (rc == 0) {
    uint8_t *scratch[2] = {g->scratch, g->scratch + chunk_len(&l, 0)};
    plan_rs(st, 1, cg->rank, &l, send, recv, scratch);
    rc = run(g, OP_REDUCE_SCATTER, dt, count, st, cg->size);
  }
  free(st);
  return rc;
}

int ring_all_reduce(struct coll_group *cg, void *buf, size_t count, enum coll_dtype dt) {
  struct ring_group *g = (struct ring_group *)cg;
  int rc = begin(g, dt, count);
  if (rc || cg->size == 1) return rc;
  int n = cg->size, r = cg->rank;
  struct layout l = {.count = count, .n = n, .even = 0, .esize = coll_dtype_size(dt)};
  struct ring_step *st = calloc(2 * (size_t)n - 1, sizeof *st);
  if (!st) return STK_ENOMEM;
  rc = ensure_scratch(g, 2 * chunk_len(&l, 0));
  if (rc == 0) {
    uint8_t *scratch[2] = {g->scratch, g->scratch + chunk_len(&l, 0)};
    plan_rs(st, 1, r, &l, buf, (uint8_t *)buf + chunk_off(&l, r), scratch);
    /* The gather's first receive overwrites chunk r-1, which the reduce-
     * scatter's first step sends from buf: guard it with that step. */
    plan_ag(st, n, r, &l, buf, n - 1, 1);
    rc = run(g, OP_ALL_REDUCE, dt, count, st, 2 * n - 1);
  }
  free(st);
  return rc;
}
