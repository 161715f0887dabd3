/*
 * fd_guard: health from descriptor headroom and from gRPC's accept
 * (see fd_guard.h). Counting /proc/self/fd costs one pass over a
 * directory of a few hundred entries every 500 ms.
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
  bool low;         /* Fewer than FD_GUARD_LOW_FREE free, not yet back to HIGH. */
  bool accept_dead; /* gRPC stopped accepting. */
  bool serving;     /* What health says now. */
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

static void check(uv_timer_t *t) {
  struct fd_guard *g = (struct fd_guard *)t;
  long left = free_fds();
  if (!g->low && left < FD_GUARD_LOW_FREE) {
    g->low = true;
    log_warn("fds_low", "free=%ld: NOT_SERVING until %d descriptors are free", left,
             FD_GUARD_HIGH_FREE);
  } else if (g->low && left >= FD_GUARD_HIGH_FREE) {
    g->low = false;
    log_info("fds_recovered", "free=%ld", left);
  }
  if (!g->accept_dead && rpc_accept_failed()) {
    g->accept_dead = true;
    log_error("accept_failed", "the gRPC listener stopped accepting after running out of "
                               "descriptors: NOT_SERVING until the daemon is restarted");
  }
  bool serving = !g->low && !g->accept_dead;
  if (serving != g->serving) {
    g->serving = serving;
    rpc_server_set_unhealthy(g->rpc, RPC_UNHEALTHY_DESCRIPTORS, !serving);
  }
}

int fd_guard_start(uv_loop_t *loop, struct rpc_server *rpc, struct fd_guard **ret_guard) {
  struct fd_guard *g = calloc(1, sizeof(*g));
  if (!g) return STK_ENOMEM;
  g->rpc = rpc;
  g->serving = true;
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
