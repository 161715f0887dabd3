/*
 * ckpt_rpc: the checkpoint daemon's gRPC adapter. Maps every method of
 * stoker.v1.Checkpoint onto the ckpt_* call of ckpt_service.h; the core
 * already runs its blocking work on its own threads and answers on the
 * loop, so the adapter only translates messages, statuses and flow control:
 *
 *   Write  client stream: one chunk read at a time and fed to the core; while
 *          the core answers CKPT_WRITE_WAIT (staging budget full) no further
 *          message is read, so gRPC flow control pushes back on the rank;
 *   Read   server stream: one ReadChunk outstanding; the core holds the next
 *          piece until the previous one is handed to the transport.
 *
 * Errors become statuses with one-line messages (stk_error_to_grpc).
 */
#ifndef STK_CKPT_RPC_H
#define STK_CKPT_RPC_H

#include "ckpt_service.h"
#include "metrics.h"
#include "rpc.h"

struct ckpt_rpc;

struct ckpt_rpc_opts {
  struct metrics *metrics; /* Bytes staged/uploaded, commit latency; may be NULL. */
};

/* Registers stoker.v1.Checkpoint on s, served by svc (which lives on the
 * server's loop). svc must outlive every call. */
int ckpt_rpc_register(struct rpc_server *s, struct ckpt_service *svc,
                      const struct ckpt_rpc_opts *opts, struct ckpt_rpc **ret_adapter);

/* Answers parked Commit calls UNAVAILABLE (the attempt goes on, or is
 * recovered after the restart) so they do not hold the shutdown. A replica
 * (ckpt_rpc_set_owner) instead refuses only Begin from then on
 * (UNAVAILABLE, "draining": the client begins on another replica) and
 * serves its attempts' calls until they end (ckpt_rpc_busy). */
void ckpt_rpc_drain(struct ckpt_rpc *a);

/* Runs as one of several replicas behind one address (issue 26): Begin
 * answers owner (HOST:PORT, copied) as the attempt's owner. */
int ckpt_rpc_set_owner(struct ckpt_rpc *a, const char *owner);

/* A draining replica still holds an attempt that is not committed or
 * aborted (the daemon keeps serving while this is true). */
bool ckpt_rpc_busy(void *adapter);

/* Detaches the writers kept after their calls finished (ranks waiting to
 * become durable, for the uploaded-bytes metric). Call before closing the
 * service; after the server has shut down. */
void ckpt_rpc_detach(struct ckpt_rpc *a);

/* Accepts NULL. Detaches first. */
void ckpt_rpc_free(struct ckpt_rpc *a);

#endif
