/*
 * s3_thread: the S3 client (s3_client.h) on a private libuv loop in its own
 * thread, so that threads that have no loop of their own can drive it.
 * s3_thread_submit hands an operation to that loop from any thread and its
 * callback fires there; every caller shares the one client's connection
 * pool, concurrency limit and SlowDown back-off. s3_thread_do is the thin
 * blocking wait over it, for callers that truly wait (the capability probe
 * at open, listings, tests).
 */
#ifndef STK_S3_THREAD_H
#define STK_S3_THREAD_H

#include "s3_client.h"

struct s3_thread;

int s3_thread_new(const struct s3_config *cfg, struct s3_thread **ret);
/* Cancels what is in flight (those callbacks fire with STK_ECANCELED) and
 * joins the thread. No submit may follow or race it. Accepts NULL. */
void s3_thread_free(struct s3_thread *s);

/* Thread-safe. The op struct is copied; what it points to is borrowed until
 * done fires. done fires exactly once, on the client's loop thread (with
 * res->err set if the client refused the operation), or at once in the
 * caller when out of memory. done must not block. */
void s3_thread_submit(struct s3_thread *s, const struct s3_op *op, s3_done_fn done, void *arg);

/* Runs op to completion: submit, then wait. *ret receives the result
 * (clear it with s3_result_clear); the return value is ret->err. Never
 * from the client's loop thread (a done callback). */
int s3_thread_do(struct s3_thread *s, const struct s3_op *op, struct s3_result *ret);

#endif
