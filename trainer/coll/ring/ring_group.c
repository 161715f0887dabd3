/*
 * ring_group.c: the life of a ring group: joining the ring (one connection
 * to each neighbour), abort from any thread (flag, eventfd and socket
 * shutdown, so both our own waits and our neighbours' end at once), and
 * freeing. The collectives themselves are in ring_algo.c.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ring.h"
#include "ring_internal.h"
#include "stk_error.h"

#define DEFAULT_SEGMENT_BYTES (512u << 10)

static void group_abort(struct coll_group *cg);
static void group_free(struct coll_group *cg);

static const struct coll_ops ring_ops = {
    .name = "ring",
    .all_gather = ring_all_gather,
    .reduce_scatter = ring_reduce_scatter,
    .all_reduce = ring_all_reduce,
    .abort = group_abort,
    .free = group_free,
};

static struct ring_group *group_alloc(int rank, int size, int64_t timeout_ms) {
  struct ring_group *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->base =
      (struct coll_group){.ops = &ring_ops, .rank = rank, .size = size, .timeout_ms = timeout_ms};
  g->next_fd = g->prev_fd = -1;
  g->segment_bytes = DEFAULT_SEGMENT_BYTES;
  g->abort_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (g->abort_fd < 0) {
    free(g);
    return NULL;
  }
  return g;
}

static void group_free(struct coll_group *cg) {
  struct ring_group *g = (struct ring_group *)cg;
  if (!g) return;
  if (g->next_fd >= 0) close(g->next_fd);
  if (g->prev_fd >= 0) close(g->prev_fd);
  close(g->abort_fd);
  free(g->scratch);
  free(g);
}

static int join(struct ring_group *g, const char *const *addrs, int listener) {
  int rank = g->base.rank, size = g->base.size;
  int64_t deadline = ring_now_ms() + g->base.timeout_ms;
  fcntl(listener, F_SETFL, fcntl(listener, F_GETFL) | O_NONBLOCK);
  /* Connecting first cannot deadlock: the kernel completes it from the
   * backlog before the neighbour calls accept. */
  int rc = ring_connect_next(addrs[(rank + 1) % size], rank, size, deadline, &g->next_fd);
  if (rc == 0)
    rc = ring_accept_prev(listener, (rank + size - 1) % size, size, deadline, &g->prev_fd);
  return rc;
}

int ring_group_new(int rank, int size, const char *const *addrs, int64_t timeout_ms, int listener,
                   struct coll_group **ret_group) {
  int rc = 0;
  if (size < 1 || rank < 0 || rank >= size || timeout_ms <= 0 || (size > 1 && !addrs)) {
    stk_set_detail("ring: bad rank %d / size %d / timeout", rank, size);
    rc = STK_EINVAL;
  }
  if (rc == 0 && size > 1 && listener < 0) rc = ring_listen_at(addrs[rank], &listener);
  struct ring_group *g = rc ? NULL : group_alloc(rank, size, timeout_ms);
  if (rc == 0 && !g) rc = STK_ENOMEM;
  if (rc == 0 && size > 1) rc = join(g, addrs, listener);
  if (listener >= 0) close(listener);
  if (rc) {
    group_free(g ? &g->base : NULL);
    return rc;
  }
  *ret_group = &g->base;
  return 0;
}

void ring_set_segment_bytes(struct coll_group *cg, size_t segment_bytes) {
  struct ring_group *g = (struct ring_group *)cg;
  segment_bytes &= ~(size_t)3;
  g->segment_bytes = segment_bytes < 4 ? 4 : segment_bytes;
}

/* Safe from any thread while another runs a collective. */
static void group_abort(struct coll_group *cg) {
  struct ring_group *g = (struct ring_group *)cg;
  atomic_store(&g->aborted, 1);
  uint64_t one = 1;
  ssize_t n = write(g->abort_fd, &one, sizeof one);
  (void)n;
  if (g->next_fd >= 0) shutdown(g->next_fd, SHUT_RDWR);
  if (g->prev_fd >= 0) shutdown(g->prev_fd, SHUT_RDWR);
}
