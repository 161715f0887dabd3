/*
 * libstoker-client, dataloader part: the calls a trainer rank (and
 * stokerctl) makes to stoker-dataloader. A loader client is an ordinary
 * struct stk_client opened on the dataloader's address; everything in
 * stoker_client.h about threads, errors and stk_client_last_error() holds.
 *
 * A batch is a pure function of (job, step, rank, world): retrying a call
 * returns the same bytes. A trainer usually opens one batch stream
 * (stk_batch_stream_open) from its first step and takes batches with
 * stk_batch_stream_next(); the stream prefetches up to `prefetch` batches
 * ahead (on the server and in the client) over its own channel, so a slow
 * trainer holds the server back instead of filling memory. Commit the
 * loader state with the model checkpoint (stk_loader_commit), or carry it
 * inside the checkpoint (stk_loader_export / stk_loader_import).
 *
 * Installed; operator calls on loaders (create, get, mixture, explain)
 * take protobuf-c messages and are in the in-tree stoker_admin.h.
 * timeout_ms 0: the client's default.
 */
#ifndef STOKER_LOADER_H
#define STOKER_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "stoker_client.h"

#define STK_LOADER_DEFAULT_ADDRESS "127.0.0.1:7071"
#define STK_LOADER_ENV             "STOKER_DATALOADER"

struct stk_batch_stream;

/* Opens a client to the dataloader: opts->address, else $STOKER_DATALOADER,
 * else STK_LOADER_DEFAULT_ADDRESS (opts may be NULL). Errors: as
 * stk_client_new(). Free with stk_client_free(). */
int stk_loader_connect(const struct stk_client_opts *opts, struct stk_client **ret_client);

/* One rank's slice of a global batch: lines x line_tokens tokens (each line
 * is seq_len + 1 tokens: inputs are [0, seq_len), targets [1, seq_len]).
 * doc_starts are flat indices into tokens where a document starts,
 * ascending. The arrays belong to the batch; free it with stk_batch_free(). */
struct stk_batch {
  int64_t step;
  uint32_t lines;
  uint32_t line_tokens;
  const uint32_t *tokens;     /* [lines x line_tokens] */
  const uint32_t *doc_starts; /* [n_doc_starts] */
  size_t n_doc_starts;
  void *priv_; /* The reply (and an aligned copy if one was needed). */
};

/* Frees what a batch holds and zeroes it. Accepts NULL and empty batches. */
void stk_batch_free(struct stk_batch *b);

/* ---------------------------------------------------------- unary calls */

/* GetBatch, Commit, ExportState and ImportState change nothing when
 * repeated: the four calls below are tried again while the dataloader is
 * UNAVAILABLE (it restarts, or came back at a new address under its name:
 * a rolling update), with backoff, within timeout_ms. */

/* Rank's slice of step's global batch at world size world. Errors:
 * STK_EINVAL (rank >= world, batch not divisible, bad step), STK_ENOENT,
 * STK_ERANGE (too far from any restorable state). */
int stk_loader_get_batch(struct stk_client *c, const char *job, int64_t step, uint32_t rank,
                         uint32_t world, int64_t timeout_ms, struct stk_batch *ret_batch);

/* Completion of stk_loader_get_batch_async: on err 0, batch is the
 * callee's (free it with stk_batch_free(), from any thread); otherwise
 * batch is NULL and msg the server's message. Runs on the client's thread. */
typedef void (*stk_batch_done_fn)(void *arg, int err, const char *msg, struct stk_batch *batch);
/* If it fails, done never runs; otherwise done runs exactly once. */
int stk_loader_get_batch_async(struct stk_client *c, const char *job, int64_t step, uint32_t rank,
                               uint32_t world, int64_t timeout_ms, stk_batch_done_fn done,
                               void *arg);

/* Makes the state after step durable on the dataloader. */
int stk_loader_commit(struct stk_client *c, const char *job, int64_t step, int64_t timeout_ms);

/* The loader's state after step as an opaque blob (malloc'ed; the caller
 * frees it) to store in the model checkpoint. */
int stk_loader_export(struct stk_client *c, const char *job, int64_t step, int64_t timeout_ms,
                      uint8_t **ret_blob, size_t *ret_len);
/* Recreates (or replaces) the loader a blob from stk_loader_export
 * describes, committed at its step. job and step are what the export
 * returned them for (the blob is authoritative). *ret_committed_step (may
 * be NULL): the loader's committed step afterwards. */
int stk_loader_import(struct stk_client *c, const char *job, int64_t step, const uint8_t *blob,
                      size_t len, int64_t timeout_ms, int64_t *ret_committed_step);

/* ------------------------------------------------------- batch streaming */

/* Starts streaming rank's slices from from_step on (StreamBatches) over a
 * channel of its own with the client's options; the server and this client
 * each hold at most prefetch batches (0: 4). The client c must outlive the
 * stream. Errors: STK_EINVAL, what opening a channel returns. */
int stk_batch_stream_open(struct stk_client *c, const char *job, int64_t from_step, uint32_t rank,
                          uint32_t world, uint32_t prefetch, struct stk_batch_stream **ret_stream);

/* How a stream may deliver batches (stk_batch_stream_opts.shm). */
enum stk_shm_mode {
  STK_SHM_AUTO = 0,    /* The daemon's shared-memory ring when it shares this host (unless
                        * STOKER_DL_SHM=off), else inline in the messages. */
  STK_SHM_OFF = 1,     /* Always inline in the messages. */
  STK_SHM_REQUIRE = 2, /* The ring, for every batch from the first; a ring this client cannot
                        * open (another host), or a first batch that comes inline (the daemon
                        * has no ring: its shm-dir off, a batch over its shm-ring-max, tmpfs
                        * full), ends the stream with STK_ESTATE (FAILED_PRECONDITION) instead
                        * of a fallback. A later batch larger than the ring's slots (the shape
                        * grew at a step) still comes inline. */
};

/* Options of stk_batch_stream_open_opts; zero-initialise (all zero: what
 * stk_batch_stream_open does). The layout is frozen: a new option comes
 * with a new open function. */
struct stk_batch_stream_opts {
  uint32_t prefetch;    /* 0: 4. */
  uint32_t token_bytes; /* 0 or 4: uint32 tokens in stk_batch.tokens; 8: int64 tokens, read with
                         * stk_batch_tokens_i64() (stk_batch.tokens is NULL), written as int64
                         * by the daemon into its ring (no conversion here) and widened here
                         * when inline. */
  int shm;              /* enum stk_shm_mode. */
};

/* stk_batch_stream_open with options (opts may be NULL: the defaults).
 * Errors: as stk_batch_stream_open; STK_EINVAL for a token_bytes other
 * than 0, 4 or 8 or an unknown shm mode. */
int stk_batch_stream_open_opts(struct stk_client *c, const char *job, int64_t from_step,
                               uint32_t rank, uint32_t world,
                               const struct stk_batch_stream_opts *opts,
                               struct stk_batch_stream **ret_stream);

/* The int64 tokens [lines x line_tokens] of a batch from a stream opened
 * with token_bytes 8; NULL for any other batch. Valid until stk_batch_free. */
const int64_t *stk_batch_tokens_i64(const struct stk_batch *b);

/* The number of slots of the shared-memory ring whose slot the batch's
 * tokens are (in place, until stk_batch_free releases the slot); 0 when the
 * tokens are not in a ring (inline, or copied out). A trainer that keeps
 * batches holds slots: the daemon passes over them, and stops once every
 * slot is held. */
uint32_t stk_batch_ring_slots(const struct stk_batch *b);

/* The next batch in step order (steps from_step, from_step + 1, ...),
 * waiting up to timeout_ms (< 0: forever). Returns 0 and *ret_batch (free
 * with stk_batch_free), STK_ETIMEDOUT if none arrived in time (the stream
 * goes on), or, once the stream ended and its batches were taken, its final
 * error (STK_ERANGE when the server ended it normally; the server's status
 * otherwise, message in stk_client_last_error()). A stream the server ends
 * with UNAVAILABLE (it shuts down, a rolling update replaces it, the
 * connection is lost or closed at its max age) is opened again from the
 * next step, the name resolved again, with backoff, while this call waits:
 * the batches are the same. It ends with that error after 2 minutes without
 * a batch. */
int stk_batch_stream_next(struct stk_batch_stream *s, int64_t timeout_ms,
                          struct stk_batch *ret_batch);

/* True once stk_batch_stream_next has reported the stream's normal end:
 * the server closed it with an OK status (it ends streams only when asked
 * to or when it shuts down) and every batch was taken. False while it runs
 * and after an error end, so a caller can tell "ended" from a server's
 * OUT_OF_RANGE without reading the message. Any thread. */
bool stk_batch_stream_ended(struct stk_batch_stream *s);

/* Cancels the stream, waits for its end, drops batches not taken, frees.
 * Accepts NULL. Any thread but the client's. */
void stk_batch_stream_free(struct stk_batch_stream *s);

/* ------------------------------------------------- scaled-out dataloader */

/* A job can be served by P dataloader processes, process i started with
 * --part i/P generating only its lanes and answering with partial batches
 * (services/dataloader/README.md, "Scale-out"). The single-client calls
 * above refuse partial batches (STK_EINVAL); a struct stk_loader talks to
 * every part and gives the trainer exactly the bytes one process serving
 * the whole job would. With one address it is that one process. */
struct stk_loader;

/* Opens a client per address of opts->address (else $STOKER_DATALOADER,
 * else STK_LOADER_DEFAULT_ADDRESS): a comma-separated list whose i-th
 * address is part i of P (P = the number of addresses). The other options
 * apply to every part. Free with stk_loader_close(). */
int stk_loader_open(const struct stk_client_opts *opts, struct stk_loader **ret_loader);
void stk_loader_close(struct stk_loader *l); /* Accepts NULL. */
uint32_t stk_loader_n_parts(const struct stk_loader *l);
/* Part i's client (owned by l), NULL when i >= P: for per-process calls. */
struct stk_client *stk_loader_part(struct stk_loader *l, uint32_t part);

/* Commits step on every part, in part order, stopping at the first failure
 * (the message names the part). */
int stk_loader_commit_all(struct stk_loader *l, const char *job, int64_t step, int64_t timeout_ms);

/* The rank's whole slice: every part's partial batch fetched at once and
 * assembled. STK_EINVAL when an address does not serve the part its place
 * in the list says; STK_ECORRUPT when the parts do not fit together. */
int stk_loader_batch_all(struct stk_loader *l, const char *job, int64_t step, uint32_t rank,
                         uint32_t world, int64_t timeout_ms, struct stk_batch *ret_batch);
/* A batch stream of whole slices (use stk_batch_stream_next/free): one
 * StreamBatches per part over its own channel, each prefetching `prefetch`
 * batches, assembled step by step. */
int stk_loader_stream_all(struct stk_loader *l, const char *job, int64_t from_step, uint32_t rank,
                          uint32_t world, uint32_t prefetch, struct stk_batch_stream **ret_stream);

/* Every part's state after step as one blob (malloc'ed) for the model
 * checkpoint; with one part, exactly stk_loader_export's blob. */
int stk_loader_export_all(struct stk_loader *l, const char *job, int64_t step, int64_t timeout_ms,
                          uint8_t **ret_blob, size_t *ret_len);
/* Imports a blob of stk_loader_export_all (from any number of parts) or of
 * stk_loader_export into every part: each takes the lanes it serves, so
 * this is how a job moves to a different number of processes.
 * *ret_committed_step (may be NULL): part 0's committed step afterwards. */
int stk_loader_import_all(struct stk_loader *l, const char *job, int64_t step, const uint8_t *blob,
                          size_t len, int64_t timeout_ms, int64_t *ret_committed_step);

#endif
