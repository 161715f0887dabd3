/*
 * dl_sched: fair shares of the dataloader's worker threads between
 * tenants, then between each tenant's jobs.
 *
 * Every blocking core call (a unary call's work, a stream's batch
 * generation) goes through here instead of straight to libuv's threadpool,
 * whose queue is one FIFO: there, a job that queues many slow calls (long
 * replays, a slow disk) makes every other job wait behind it. Here each job
 * has a queue of its own, and no more than `workers` tasks are handed to the
 * pool at once, so the pool's FIFO stays empty and the order is decided
 * here, on two levels. A tenant (the scope of the caller's token: a team's
 * job-name prefix, "" for operators and for a daemon without tokens) holds
 * at most ceil(workers / tenants with work) workers, so a team with many
 * jobs gets no more than a team with one; inside a tenant, round-robin over
 * its jobs with work, each holding at most ceil(tenant's share / its jobs
 * with work). A tenant or job alone may use every worker; once another has
 * work, it gets the next free worker. Tasks already running are never
 * interrupted; a long one bounds itself instead (a replay gives its worker
 * back after each slice and is submitted again, dl_seek.c).
 *
 * Stuck workers: dl_sched_stuck() is true when every worker has been on
 * its current task for longer than a bound, while tasks wait; the daemon
 * then reports NOT_SERVING (see dl_rpc.c) until a worker comes free.
 *
 * Loop thread only (submit, callbacks, dl_sched_stuck); the work callbacks
 * run on the pool's threads.
 */
#ifndef STK_DL_SCHED_H
#define STK_DL_SCHED_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

struct dl_sched;

/* workers: the threadpool's size (UV_THREADPOOL_SIZE). STK_ENOMEM. */
int dl_sched_new(uv_loop_t *loop, uint32_t workers, struct dl_sched **ret_sched);
/* After every task finished (the loop drained). Accepts NULL. */
void dl_sched_free(struct dl_sched *s);

/* Queues work for job of tenant (NULL or "": operators, or calls of no
 * job, a queue of their own): work runs on a worker thread, done on the
 * loop with status 0 (or a libuv error when the pool refused it). req is
 * the caller's, as for uv_queue_work; req->data is left to the caller. */
int dl_sched_submit(struct dl_sched *s, const char *tenant, const char *job, uv_work_t *req,
                    uv_work_cb work, uv_after_work_cb done);

/* Tasks waiting for a worker, over every job. */
uint64_t dl_sched_waiting(const struct dl_sched *s);
/* True when every worker has run its current task for at least stuck_ms
 * and at least one task waits. */
bool dl_sched_stuck(const struct dl_sched *s, uint64_t stuck_ms);

#endif
