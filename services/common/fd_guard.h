/*
 * fd_guard: a daemon's health follows its file descriptors. Every half
 * second on the loop it counts the open descriptors against the soft
 * RLIMIT_NOFILE; fewer than FD_GUARD_LOW_FREE left turns every service
 * NOT_SERVING (back to SERVING once FD_GUARD_HIGH_FREE are free), so a
 * probe or an orchestrator sees a daemon about to refuse connections
 * before it does. gRPC C core (1.51) stops accepting for good once an
 * accept fails for want of descriptors; rpc_log notices its log line, and
 * from then on the guard keeps the daemon NOT_SERVING (logged once, as an
 * error naming the cure: a restart), since new clients can no longer
 * connect however many descriptors are freed.
 */
#ifndef STK_FD_GUARD_H
#define STK_FD_GUARD_H

#include <uv.h>

#include "rpc.h"

#define FD_GUARD_LOW_FREE  32
#define FD_GUARD_HIGH_FREE 64

struct fd_guard;

/* Starts the timer on loop (the guard's thread). Errors: STK_ENOMEM. */
int fd_guard_start(uv_loop_t *loop, struct rpc_server *rpc, struct fd_guard **ret_guard);
/* Stops and closes the timer; the guard is freed in its close callback.
 * Accepts NULL. */
void fd_guard_stop(struct fd_guard *g);

#endif
