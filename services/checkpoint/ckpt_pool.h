/*
 * ckpt_pool: a fixed set of worker threads for the checkpoint service's
 * blocking work (storage calls, synced RocksDB writes, CRCs), with
 * completions delivered on the owning libuv loop. A dedicated pool, not the
 * libuv threadpool, so that its size is the upload concurrency and uploads
 * never starve other libuv users.
 *
 * Tasks are embedded in the caller's job struct. work runs on a worker
 * thread; after runs later on the loop thread (never inside submit).
 *
 * A task may wait for an asynchronous call (a storage request) without
 * holding its worker: its work calls ckpt_pool_park, starts the call and
 * returns at once, touching the task no more; the call's completion (any
 * thread) hands it back with ckpt_pool_resume, and work runs again. The
 * task counts as pending throughout, so ckpt_pool_free waits for it.
 */
#ifndef STK_CKPT_POOL_H
#define STK_CKPT_POOL_H

#include <stddef.h>
#include <uv.h>

struct ckpt_task {
  void (*work)(struct ckpt_task *t);  /* Worker thread. */
  void (*after)(struct ckpt_task *t); /* Loop thread. */
  struct ckpt_task *next;             /* Private. */
};

struct ckpt_pool;

/* Workers run at nice value nice (0: the process's; best effort, Linux
 * sets it per thread). 0, STK_EINVAL (threads 0), STK_ENOMEM, STK_EIO
 * (thread or handle). */
int ckpt_pool_new(uv_loop_t *loop, unsigned threads, int nice, struct ckpt_pool **ret_pool);

/* At most max_out tasks started and not finished (running or parked) at
 * once; the rest wait in the queue. Default: the thread count, which is
 * what blocking tasks allow. Loop thread, before the first submit. */
void ckpt_pool_set_limit(struct ckpt_pool *p, unsigned max_out);

/* Queues t (FIFO). Loop thread only. */
void ckpt_pool_submit(struct ckpt_pool *p, struct ckpt_task *t);

/* From inside work: when work returns, the task is not finished but
 * parked, and its after does not run until it is resumed and a later run
 * of work returns unparked. */
void ckpt_pool_park(void);

/* Queues a parked task to run work again (at the tail). Any thread. */
void ckpt_pool_resume(struct ckpt_pool *p, struct ckpt_task *t);

/* Tasks submitted whose after has not run yet. */
size_t ckpt_pool_pending(const struct ckpt_pool *p);

/* Runs every queued task, joins the threads, runs the remaining afters,
 * closes the handle and frees p; done(arg) is called on the loop once the
 * handle is closed. Afters that submit more tasks during close are run too.
 * Accepts NULL (done is then called at once). */
void ckpt_pool_free(struct ckpt_pool *p, void (*done)(void *arg), void *arg);

#endif
