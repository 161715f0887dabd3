/*
 * dl_rpc: the dataloader's gRPC adapter. Maps every method of
 * stoker.v1.Dataloader onto the dl_* call of dl_core.h. Core calls (batch
 * generation, RocksDB writes) run on the libuv threadpool of the daemon's
 * loop; replies and stream sends happen on the loop. StreamBatches keeps at
 * most `prefetch` batches generated ahead of what was sent, one send
 * outstanding, and stops on cancel.
 */
#ifndef STK_DL_RPC_H
#define STK_DL_RPC_H

#include <stdint.h>

#include "dl_core.h"
#include "metrics.h"
#include "rpc.h"

struct dl_rpc;

struct dl_rpc_opts {
  uint32_t max_prefetch;     /* Largest prefetch a stream may ask for; 0: 16. */
  uint32_t default_prefetch; /* Prefetch of a request that gives 0; 0: 2. */
  struct metrics *metrics;   /* Batches, tokens, generation latency; may be NULL. */
  /* Shared-memory delivery to clients on this host: the directory rings
   * are made in (created 0700; NULL or "": off) and the largest ring of
   * one stream (0: 256 MiB). */
  const char *shm_dir;
  const char *shm_owner; /* Recorded in the dir (auto dirs): see shm_ring.h. */
  uint64_t shm_ring_bytes;
  uint32_t workers;  /* The loop's threadpool size (UV_THREADPOOL_SIZE); 0: 4. */
  uint64_t stuck_ms; /* Health says NOT_SERVING while every worker has been on one
                        task this long and calls wait (dl_sched.h); 0: 60 s. */
  /* What streams may hold ahead of their clients (batches generated and
   * not yet sent, ring pages reserved), all of them and one job's; beyond,
   * streams generate no further ahead than one batch and a new stream
   * answers RESOURCE_EXHAUSTED. 0: 1 GiB and 256 MiB. */
  uint64_t stream_bytes;
  uint64_t stream_bytes_per_job;
};

/* Registers stoker.v1.Dataloader on s, served by dl on loop (the server's
 * loop). Fails (STK_EINVAL with a detail) when the shm dir is unsafe. The adapter lives until
 * dl_rpc_free, after the server shut down; dl must outlive every call (close it only once the
 * server drained). */
int dl_rpc_register(struct rpc_server *s, uv_loop_t *loop, struct dl *dl,
                    const struct dl_rpc_opts *opts, struct dl_rpc **ret_adapter);

/* The stream budget ("stream": --stream-bytes overall, --stream-bytes-per-job
 * per job) and what each job's open streams hold of it, for daemon_usage
 * (GetUsage, the stoker_budget_* series); arg the adapter. Loop thread. */
struct usage;
int dl_rpc_usage_collect(void *arg, struct usage *u);

/* Ends every open stream UNAVAILABLE ("shutting down; resume from step
 * N") once its generation and send in flight complete; unary calls finish
 * as usual. */
void dl_rpc_drain(struct dl_rpc *a);

/* Accepts NULL. */
void dl_rpc_free(struct dl_rpc *a);

#endif
