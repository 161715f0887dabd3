/*
 * dl_rpc_internal: what the unary handlers (dl_rpc.c) and StreamBatches
 * (dl_rpc_stream.c) share: the adapter, its metrics, the batch-to-message
 * conversion and the error reply.
 */
#ifndef STK_DL_RPC_INTERNAL_H
#define STK_DL_RPC_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "dl_rpc.h"

struct dl_stream;

struct dl_rpc {
  struct dl *dl;
  uv_loop_t *loop;
  uint32_t max_prefetch, default_prefetch;
  struct metric_counter *batches, *tokens;
  struct metric_histogram *gen_seconds;
  struct metric_gauge *prefetched; /* Generated, not yet sent, over all streams. */
  struct dl_stream *streams;       /* Open streams (doubly linked). */
  bool draining;
};

/* Error text of a failed core call, taken on the thread that failed (the
 * detail is thread-local): one line, never empty. */
#define DL_RPC_MSG_LEN 512
void dl_rpc_capture_error(int err, char *msg, size_t len);

/* Seconds of the monotonic clock. */
double dl_rpc_now(void);

/* Encodes b's tokens in place as little-endian uint32 bytes (on the worker
 * thread) and fills msg to point into b; b must outlive msg's use. */
void dl_rpc_batch_encode(struct dl_batch *b, Stoker__V1__Batch *msg);
/* Fills msg to point into b (tokens taken as already encoded), with the
 * scale-out fields of a partial batch. */
void dl_rpc_batch_msg(struct dl_batch *b, Stoker__V1__Batch *msg);

/* Counts one served batch in the metrics. */
void dl_rpc_count_served(struct dl_rpc *a, const struct dl_batch *b);

void dl_rpc_handle_stream(struct rpc_call *call, const ProtobufCMessage *req, void *svc);
void dl_rpc_stream_drain(struct dl_rpc *a);

#endif
