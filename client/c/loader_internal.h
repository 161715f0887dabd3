/*
 * What the dataloader parts of libstoker-client share: the method names,
 * the Batch reply to struct stk_batch conversion, the assembly of the
 * partial batches of a scaled-out job, and the single-part calls the
 * scaled-out loader (stk_loader) builds on.
 */
#ifndef STK_LOADER_INTERNAL_H
#define STK_LOADER_INTERNAL_H

#include <stdbool.h>

#include "client_internal.h"
#include "stoker/v1/dataloader.pb-c.h"
#include "stoker_loader.h"

/* DL_METHOD(get_batch, &req): as COORD_METHOD (client_internal.h). */
#define DL_METHOD(field, req) RPC_METHOD_PATH(stoker__v1__dataloader, field, req)
#define DL_CALL(c, field, req, timeout_ms, ret)                                                    \
  CLIENT_CALL(stoker__v1__dataloader, c, field, req, timeout_ms, ret)
/* The trainer's calls whose repeat changes nothing (GetBatch, Commit,
 * ExportState, ImportState): tried again while a part is UNAVAILABLE (it
 * restarts, or comes back at a new address: a rolling update), within the
 * call's timeout. */
#define DL_CALL_IDEMPOTENT(c, field, req, timeout_ms, ret)                                         \
  CLIENT_CALL_IDEMPOTENT(stoker__v1__dataloader, c, field, req, timeout_ms, ret)

/* Takes msg (a Stoker__V1__Batch) in every case: on success it belongs to
 * *ret_batch; on failure (STK_ECORRUPT: sizes disagree; STK_EINVAL: a
 * partial batch and !partial_ok; STK_ENOMEM) it is freed and this thread's
 * last error set. */
int loader_batch_from_msg(ProtobufCMessage *msg, bool partial_ok, struct stk_batch *ret_batch);

/* stk_loader_get_batch, taking a part's partial batch when partial_ok
 * (retried while UNAVAILABLE within timeout_ms, as it is). */
int loader_get_batch(struct stk_client *c, const char *job, int64_t step, uint32_t rank,
                     uint32_t world, int64_t timeout_ms, bool partial_ok,
                     struct stk_batch *ret_batch);

/* A shared-memory ring a stream's batches are delivered in (loader_ring.c):
 * counted references, one per stream and per batch viewing a slot. */
struct loader_ring;
/* Maps path (the daemon's ring, checked against nonce). STK_ENOENT: no such
 * file here (the daemon is on another host); others: see shm_ring_attach. */
int loader_ring_attach(const char *path, const uint8_t nonce[16], struct loader_ring **ret);
struct loader_ring *loader_ring_ref(struct loader_ring *r);
void loader_ring_unref(struct loader_ring *r); /* Accepts NULL. */
uint64_t loader_ring_slot_bytes(const struct loader_ring *r);
uint32_t loader_ring_slots(const struct loader_ring *r);
const uint8_t *loader_ring_slot(const struct loader_ring *r, uint64_t seq);
/* A batch views seq in its slot from now on: STK_ECORRUPT (with the
 * error set) when a batch still views another sequence there. */
int loader_ring_take(struct loader_ring *r, uint64_t seq);
/* The client no longer reads seq: the daemon may reuse its slot. */
void loader_ring_release(struct loader_ring *r, uint64_t seq);

/* As loader_batch_from_msg, for a stream with a ring (may be NULL): a
 * batch with shm_seq views its slot until freed. token_bytes 8: the ring
 * holds int64 tokens and the batch's tokens are int64
 * (stk_batch_tokens_i64; inline ones widened); otherwise uint32. */
int loader_batch_from_ring(ProtobufCMessage *msg, bool partial_ok, struct loader_ring *ring,
                           uint32_t token_bytes, struct stk_batch *ret_batch);

/* The reply a batch views (NULL for an assembled batch). */
const Stoker__V1__Batch *loader_batch_msg(const struct stk_batch *b);

/* A batch owning host-order arrays (malloc'd; taken in every case). */
int loader_batch_own(int64_t step, uint32_t lines, uint32_t line_tokens, uint32_t *tokens,
                     uint32_t *doc_starts, size_t n_doc_starts, struct stk_batch *ret_batch);

/* The whole slice from the partial batches parts[0..n) of one step, parts[i]
 * from part i of n (freed in every case). STK_ECORRUPT (with the last
 * error) when they do not fit together. */
int loader_assemble(struct stk_batch *parts, uint32_t n, struct stk_batch *ret_batch);

/* stk_loader_get_batch_async, accepting partial batches when partial_ok. */
int loader_get_batch_async(struct stk_client *c, const char *job, int64_t step, uint32_t rank,
                           uint32_t world, int64_t timeout_ms, bool partial_ok,
                           stk_batch_done_fn done, void *arg);

/* stk_batch_stream_open_opts (opts not NULL), accepting partial batches
 * when partial_ok. */
int loader_stream_open(struct stk_client *c, const char *job, int64_t from_step, uint32_t rank,
                       uint32_t world, const struct stk_batch_stream_opts *opts, bool partial_ok,
                       struct stk_batch_stream **ret_stream);

/* A batch stream whose batches come from elsewhere (a scaled-out job's,
 * assembled in loader_parts_stream.c): stk_batch_stream_next, _ended and
 * _free call these with impl. */
struct loader_stream_ops {
  int (*next)(void *impl, int64_t timeout_ms, struct stk_batch *ret_batch);
  bool (*ended)(void *impl);
  void (*free)(void *impl);
};
/* A struct stk_batch_stream over impl (taken in every case: freed with
 * ops->free when the wrap fails). */
int loader_stream_wrap(const struct loader_stream_ops *ops, void *impl,
                       struct stk_batch_stream **ret_stream);

/* The loader of a scaled-out job (loader_parts.c). */
struct stk_loader {
  uint32_t n;
  struct stk_client **parts; /* [n] part i's client */
};

/* Prefixes this thread's last error with "dataloader part i of n" (n > 1);
 * returns err. */
int loader_part_failed(uint32_t n, uint32_t i, int err);

/* ImportState of blobs[0..n) together (LoaderState.state and more_states);
 * *ret_committed_step (may be NULL): the loader's committed step after it. */
int loader_import_blobs(struct stk_client *c, const char *job, int64_t step,
                        const uint8_t *const *blobs, const size_t *lens, size_t n,
                        int64_t timeout_ms, int64_t *ret_committed_step);

#endif
