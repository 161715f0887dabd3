/*
 * dl_rpc_internal: what the unary handlers (dl_rpc.c) and StreamBatches
 * (dl_rpc_stream.c) share: the adapter, its metrics, the batch-to-message
 * conversion and the error reply. The daemon's files call downwards only:
 * main.c -> dl_rpc.c (handlers, method table) -> dl_rpc_metrics.c (per-job
 * gauges) -> dl_rpc_stream.c (StreamBatches) -> dl_rpc_ring.c (its
 * shared-memory ring) -> dl_rpc_base.c (batch messages, error text, clock),
 * with dl_sched.c beside them; all of them over dl_core.h.
 */
#ifndef STK_DL_RPC_INTERNAL_H
#define STK_DL_RPC_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "dl_rpc.h"
#include "dl_sched.h"

struct dl_stream;

struct dl_rpc {
  struct dl *dl;
  uv_loop_t *loop;
  uint32_t max_prefetch, default_prefetch;
  struct metric_counter *batches, *tokens, *shm_batches;
  struct metric_counter *replay_yields; /* Slices of replay that gave the worker back. */
  struct metric_histogram *gen_seconds;
  struct metric_gauge *prefetched; /* Generated, not yet sent, over all streams. */
  struct dl_stream *streams;       /* Open streams (doubly linked). */
  bool draining;
  int shm_dirfd;                               /* Directory of shared-memory rings; -1: off. */
  char *shm_dir;                               /* Its path. */
  uint64_t shm_ring_bytes;                     /* Largest ring of one stream. */
  uint64_t stream_bytes, stream_bytes_per_job; /* Budgets of what streams hold (dl_rpc.h). */
  uint32_t tokens_field;                       /* Batch.tokens' field number (sent borrowed). */
  struct dl_sched *sched;  /* Every core call goes through it (fair shares per job). */
  struct rpc_server *rpc;  /* For health: NOT_SERVING while the workers are stuck. */
  uv_timer_t *stuck_timer; /* Checks dl_sched_stuck every second; NULL once closed. */
  uint64_t stuck_ms;
  bool stuck;
};

/* Shared-memory delivery of one stream (dl_rpc_ring.c): after the first
 * batch, which goes inline and sizes the slots, batches are generated
 * straight into ring slots and sent as metadata. */
struct dl_stream_ring {
  bool wanted;          /* The client asked (nonce given) and the daemon has a dir. */
  bool off;             /* Given up for this stream: everything inline from here. */
  uint8_t nonce[16];    /* SHM_RING_NONCE_BYTES */
  uint32_t token_bytes; /* Width of a token in a slot: 4 (uint32) or 8 (int64). */
  struct shm_ring *ring;
  bool path_sent;
};

/* Creates the ring sized for batches like b (prefetch ahead of the client);
 * on failure (logged) the stream goes on inline. */
void dl_stream_ring_setup(struct dl_stream_ring *r, const struct dl_rpc *a, uint32_t prefetch,
                          const struct dl_batch *b);
/* Where the batch `ahead` places after the next one to be queued may be
 * generated (as uint32 tokens; *ret_bytes of room) and its sequence: a free
 * slot, or NULL when the ring is not in use (generate inline) or has no
 * further free slot (*ret_full). */
uint32_t *dl_stream_ring_dest(struct dl_stream_ring *r, uint64_t after, uint64_t *ret_seq,
                              size_t *ret_bytes, bool *ret_full);
/* Moves b, generated on the heap with its tokens encoded (the batch that
 * sized the ring), into the ring's first free slot at the ring's token
 * width: its sequence, or 0 when it stays inline. Loop thread; the caller
 * then calls dl_stream_ring_written. */
uint64_t dl_stream_ring_adopt(struct dl_stream_ring *r, struct dl_batch *b);
/* The batch of sequence seq (from dl_stream_ring_dest) is queued. */
void dl_stream_ring_written(struct dl_stream_ring *r, uint64_t seq);
/* A batch generated into its slot, its tokens encoded as little-endian
 * uint32: rewrites them in place at the ring's token width (worker thread). */
void dl_stream_ring_widen(const struct dl_stream_ring *r, struct dl_batch *b);
/* Fills msg's shm fields for a batch generated into the slot of seq. */
void dl_stream_ring_msg(struct dl_stream_ring *r, uint64_t seq, Stoker__V1__Batch *msg);
/* Removes the ring file (if the client never took it) and unmaps. */
void dl_stream_ring_close(struct dl_stream_ring *r);

/* ---- dl_rpc_base.c ---- */

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

/* ---- dl_rpc_stream.c ---- */

/* StreamBatches, started by its handler in dl_rpc.c. */
void dl_rpc_stream(struct rpc_call *call, struct dl_rpc *a,
                   const Stoker__V1__StreamBatchesRequest *r);
void dl_rpc_stream_drain(struct dl_rpc *a);

/* One open stream's queue, for the per-job gauges (dl_rpc_metrics.c). */
struct dl_stream_queue {
  const char *job;     /* The request's; valid while the stream is open. */
  uint32_t ready;      /* Batches generated and not yet sent (at most its prefetch). */
  uint64_t held_bytes; /* What it holds of the stream budgets (--stream-bytes). */
};
/* Fills ret[0..cap) with the open streams' queues (loop thread); returns
 * how many streams are open (may exceed cap). */
size_t dl_rpc_stream_queues(const struct dl_rpc *a, struct dl_stream_queue *ret, size_t cap);
/* ---- dl_rpc_metrics.c ---- */

/* The collector of the per-job gauges (metrics.h), arg the adapter; runs
 * on the loop (the daemon's metrics endpoint renders there). */
void dl_rpc_job_metrics_collect(struct strbuf *out, void *arg);

#endif
