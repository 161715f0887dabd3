/*
 * fd_guard: a daemon's health follows its file descriptors and gRPC's
 * accept. Every half second on the loop it counts the open descriptors
 * against the soft RLIMIT_NOFILE, and reads what the server's accept did
 * (rpc_server_accept_stats). Every service is NOT_SERVING while the daemon
 * cannot take a new client: fewer than FD_GUARD_LOW_FREE descriptors left
 * (until FD_GUARD_HIGH_FREE are free again), the connection cap reached,
 * a connection refused for want of a descriptor in the last period, or the
 * reserve descriptor not held. It is SERVING again once none holds: idle
 * connections that close give everything back. Each episode is logged
 * once when it starts (with its cause) and once when it ends (with how
 * many connections were refused meanwhile).
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
