/*
 * coll_nccl: the GPU backend of coll.h on NCCL. Buffers are device memory;
 * collectives are enqueued on a CUDA stream and each call waits for its
 * stream to finish (the coll.h contract: the local part is complete on
 * return). The communicator is non-blocking (config.blocking = 0), so every
 * wait polls ncclCommGetAsyncError against the group's deadline and the
 * abort flag; a timeout or abort calls ncclCommAbort, which is what
 * releases kernels stuck on a dead peer. Every rank must then abort too
 * (the coordinator's RESTART tells them).
 *
 * This header needs neither CUDA nor NCCL headers; the backend is compiled
 * only when meson found NCCL (HAVE_NCCL in stk_config.h).
 */
#ifndef STK_COLL_NCCL_H
#define STK_COLL_NCCL_H

#include <stdint.h>

#include "coll.h"

#define COLL_NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */

/* Rank 0 creates the id and publishes it (the coordinator's KV). Needs no
 * GPU, but this process must live until every rank has joined. */
int coll_nccl_unique_id(uint8_t ret_id[COLL_NCCL_ID_BYTES]);

/*
 * Joins the communicator identified by id as rank of size, on CUDA device
 * `device`, waiting at most timeout_ms (also every collective's deadline).
 * stream is a cudaStream_t to run on, or NULL for a stream of the group's
 * own. Returns 0, STK_ETIMEDOUT, STK_EINVAL, STK_EIO (NCCL system or remote
 * error) or STK_EINTERNAL (CUDA or NCCL internal error).
 */
int coll_nccl_group_new(int rank, int size, const uint8_t id[COLL_NCCL_ID_BYTES], int device,
                        void *stream, int64_t timeout_ms, struct coll_group **ret_group);

#endif
