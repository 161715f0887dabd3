/*
 * s3_sync: the blocking S3 API, a thin shell over s3_client. It runs one
 * client on a private libuv loop in its own thread; s3_sync_do posts an
 * operation there and waits for its callback. Thread-safe: any number of
 * threads may call s3_sync_do at once, and they share the client's
 * connection pool, concurrency limit and SlowDown back-off.
 */
#ifndef STK_S3_SYNC_H
#define STK_S3_SYNC_H

#include "s3_client.h"

struct s3_sync;

int s3_sync_new(const struct s3_config *cfg, struct s3_sync **ret);
/* Cancels what is in flight (those calls return STK_ECANCELED) and joins
 * the thread. Accepts NULL. */
void s3_sync_free(struct s3_sync *s);

/* Runs op to completion. *ret receives the result (clear it with
 * s3_result_clear); the return value is ret->err. */
int s3_sync_do(struct s3_sync *s, const struct s3_op *op, struct s3_result *ret);

#endif
