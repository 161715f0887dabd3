/*
 * fd_guard: health from descriptor headroom and from gRPC's accept (see
 * fd_guard.h). Counting /proc/self/fd costs one pass over a directory of a
 * few hundred entries every 500 ms.
 */
#include "fd_guard.h"

#include <dirent.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "log.h"
#include "stk_error.h"

#define CHECK_MS 500

struct fd_guard {
  uv_timer_t timer; /* First: the handle's address is the guard's. */
  struct rpc_server *rpc;
  bool low;                    /* Fewer than FD_GUARD_LOW_FREE free, not yet back to HIGH. */
  struct rpc_accept_stats was; /* At the last check. */
  uint64_t refused_at_start;   /* Both refusal counters, when the episode began. */
  bool serving;                /* What health says now. */
};

/* Descriptors still free under the soft limit; 0 when not even the count
 * can be taken (opening /proc/self/fd needs one). */
static long free_fds(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return FD_GUARD_HIGH_FREE;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return 0;
  long open = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) open += e->d_name[0] != '.';
  closedir(d);
  return (long)rl.rlim_cur - open;
}

/* Why a new client cannot be taken now, or NULL. The accept's figures
 * count only while it guards the listener (max 0: not started, or
 * shutting down). */
static const char *cannot_accept(const struct fd_guard *g, const struct rpc_accept_stats *now) {
  if (g->low) return "descriptors";
  if (!now->max) return NULL;
  if (now->refused_descriptors != g->was.refused_descriptors || !now->reserve_held)
    return "descriptors";
  if (now->live >= now->max) return "limit";
  return NULL;
}

static void check(uv_timer_t *t) {
  struct fd_guard *g = (struct fd_guard *)t;
  long left = free_fds();
  if (!g->low && left < FD_GUARD_LOW_FREE)
    g->low = true;
  else if (g->low && left >= FD_GUARD_HIGH_FREE)
    g->low = false;
  struct rpc_accept_stats now;
  rpc_server_accept_stats(g->rpc, &now);
  const char *why = cannot_accept(g, &now);
  uint64_t refused = now.refused_limit + now.refused_descriptors;
  if (why && g->serving) {
    g->refused_at_start = g->was.refused_limit + g->was.refused_descriptors;
    log_warn("accept_blocked",
             "reason=%s free_fds=%ld connections=%zu max_connections=%zu: NOT_SERVING until new "
             "clients can connect",
             why, left, now.live, now.max);
  } else if (!why && !g->serving) {
    log_info("accept_recovered", "refused=%llu free_fds=%ld connections=%zu",
             (unsigned long long)(refused - g->refused_at_start), left, now.live);
  }
  g->was = now;
  if (!why != g->serving) {
    g->serving = !why;
    rpc_server_set_unhealthy(g->rpc, RPC_UNHEALTHY_DESCRIPTORS, !g->serving);
  }
}

int fd_guard_start(uv_loop_t *loop, struct rpc_server *rpc, struct fd_guard **ret_guard) {
  struct fd_guard *g = calloc(1, sizeof(*g));
  if (!g) return STK_ENOMEM;
  g->rpc = rpc;
  g->serving = true;
  rpc_server_accept_stats(rpc, &g->was);
  uv_timer_init(loop, &g->timer);
  uv_timer_start(&g->timer, check, CHECK_MS, CHECK_MS);
  *ret_guard = g;
  return 0;
}

static void on_closed(uv_handle_t *h) {
  free(h);
}

void fd_guard_stop(struct fd_guard *g) {
  if (!g) return;
  uv_timer_stop(&g->timer);
  uv_close((uv_handle_t *)&g->timer, on_closed);
}
