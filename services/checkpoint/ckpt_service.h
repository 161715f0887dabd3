/*
 * ckpt_service: the checkpoint service as a library ("embedded mode"). The
 * gRPC daemon is a thin adapter over this header: each Checkpoint RPC maps
 * to one ckpt_* call below, with the unpacked request and a completion
 * callback; trainers and tests run the same engine in-process. Semantics are
 * those of proto/stoker/v1/checkpoint.proto; the design is in README.md.
 *
 * Threading: a struct ckpt_service lives on ONE libuv loop (given to
 * ckpt_service_open). Every call below must be made on that loop's thread
 * and every callback runs on it, never synchronously inside the call that
 * started it. Synced RocksDB writes, CRCs and copies run on the
 * service's worker threads (an upload pool and a restore pool, and two
 * threads for journal and commit work); uploads and restores hand their
 * storage requests to the store's engine without holding a thread, at most
 * upload_concurrency and read_concurrency requests out at once.
 *
 * Completion: ckpt_done_fn is called exactly once; resp is the reply message
 * named at each call, valid only during the callback; on failure err is a
 * negative STK_E* code, errmsg a one-line reason and resp NULL.
 *
 * Errors common to all calls: STK_EINVAL (bad name, box, shape; nothing is
 * changed), STK_ENOENT (unknown attempt, checkpoint or tensor), STK_EUNAVAIL
 * (closing), STK_EIO/STK_EUNAVAIL (the store failed after retries).
 */
#ifndef STK_CKPT_SERVICE_H
#define STK_CKPT_SERVICE_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "stoker/v1/checkpoint.pb-c.h"

struct ckpt_service;
struct ckpt_writer;
struct ckpt_reader;

typedef void (*ckpt_done_fn)(void *arg, int err, const char *errmsg, const ProtobufCMessage *resp);

/* Called on the loop after a checkpoint is committed (the daemon reports it
 * to the coordinator). manifest_uri is storage URL + "/" + manifest key. */
typedef void (*ckpt_commit_hook_fn)(void *arg, const char *job, int64_t step,
                                    const char *manifest_uri);

/* Called on the loop once per attempt that ends aborted, when its cleanup is
 * done (what the aborts statistic counts), and after open for each attempt
 * recovery aborted (recovered_aborts): its job, step, id and reason (the
 * message its Commit answers). The daemon logs it. */
typedef void (*ckpt_abort_hook_fn)(void *arg, const char *job, int64_t step, const char *attempt,
                                   const char *reason);

/* Test probe: called on worker threads at named instants of the protocol
 * ("part_journaled", "rank_finished", "before_manifest", "manifest_written",
 * "committed"), so a test can crash the process at an exact point. NULL in
 * production. */
typedef void (*ckpt_probe_fn)(void *arg, const char *point);

struct s3_config;

struct ckpt_service_opts {
  const char *db_dir;            /* RocksDB directory (kv.h); created if missing. Required. */
  const char *storage_url;       /* file:///dir or s3://bucket/prefix. Required. */
  const struct s3_config *s3;    /* S3 endpoint, region, keys (storage_open_with), read during
                                    the open only; NULL: from the environment. */
  struct storage *storage;       /* Or an open store (borrowed; then storage_url is only
                                    used to render URIs). */
  const char *key_prefix;        /* Deployment prefix inside the store; "" default. */
  uint64_t staging_budget_bytes; /* Staging memory, all writers; 1 GiB default. */
  uint32_t upload_concurrency;   /* Upload requests out at once; 8 default. */
  uint64_t part_bytes;           /* Multipart part size: a multiple of 1 MiB, >= 5 MiB; 16 MiB. */
  uint32_t max_parts;            /* Parts per object before rolling; 10000 (tests lower it). */
  uint32_t keep_last;            /* Retention: keep the newest K committed steps; 0 = all. */
  uint32_t keep_every;           /* ... and every step divisible by M; 0 = none. */
  uint32_t attempt_timeout_ms;   /* Abort attempts not finished by then; 600000. */
  uint32_t attempt_idle_timeout_ms;   /* Abort an abandoned attempt (a rank unfinished, no
                                         stream attached, nothing fed) this long; 120000. */
  uint32_t max_open_attempts;         /* Attempts not yet committed or aborted, at most; Begin
                                         answers STK_EBUSY beyond; 16 default. */
  uint32_t max_open_attempts_per_job; /* The same for one job (ckpt_admit.c); 4 default,
                                         at most max_open_attempts. */
  uint32_t read_piece_bytes;          /* Most bytes per ReadChunk; 4 MiB. */
  uint32_t read_concurrency;          /* Restore GETs out at once, all reads; 8. */
  uint64_t read_batch_bytes;          /* Wanted bytes fetched together (merged ranged GETs per
                                         object, ckpt_restore.c); 64 MiB. */
  uint64_t read_budget_bytes;         /* What all reads' batches may hold (twice their wanted
                                         bytes); beyond, a batch waits unless its job holds
                                         none; 1 GiB. */
  uint64_t read_budget_per_job_bytes; /* The same for one job's reads; 256 MiB. */
  uint32_t read_loop_plan_chunks;     /* A batch whose pieces' tensors have at most this many
                                         chunks in all is planned on the loop, not a worker
                                         (ckpt_restore.c); 4096. No flag: tests set 1. */
  const char *shm_dir;                /* Zero-copy staging directory (ckpt_shm.h), absolute, on
                                         tmpfs; NULL or "": off. Unique to this service on the
                                         host. */
  uint64_t shm_pool_bytes;            /* Released segments kept for reuse, at most this many bytes
                                         (capped at the budget); 0: none. */
  /* Multipart uploads under the prefix that no open attempt owns are aborted
   * once this old (at open, then periodically); 1 h default. */
  uint32_t orphan_upload_grace_ms;
  /* Attempt directories in storage with no manifest and no journal record
   * (an attempt whose record was lost, an abort whose cleanup failed) are
   * removed once found so for this long; swept every quarter of it (100 ms
   * to 10 min); 1 h default. */
  uint32_t orphan_attempt_grace_ms;
  /* Several replicas write under the same prefix (issue 26): storage, not
   * this journal, is the catalogue. Begin refuses a step some replica
   * committed (STK_EEXIST), List answers the manifests storage holds, and
   * GetManifest, Read and Verify find a checkpoint another replica
   * committed (each imported into the journal when first seen). */
  bool shared_storage;
  ckpt_commit_hook_fn commit_hook;
  void *commit_hook_arg;
  ckpt_abort_hook_fn abort_hook;
  void *abort_hook_arg;
  ckpt_probe_fn probe;
  void *probe_arg;
};

struct ckpt_service_stats {
  uint64_t staged_bytes;        /* Staging memory held now (buffer capacity). */
  uint64_t staged_peak_bytes;   /* Highest staged_bytes seen. */
  uint64_t read_reserved_bytes; /* What reads' batches hold of the read budgets now. */
  /* Ranged GETs reads made, and spans another read's GET answered (its
   * bytes shared, ckpt_fetch.c); fetched bytes the open reads hold now. */
  uint64_t read_gets;
  uint64_t read_gets_shared;
  uint64_t read_fetched_bytes;
  uint64_t read_loop_plans; /* Batches planned on the loop (read_loop_plan_chunks). */
  uint64_t parts_uploaded;
  uint64_t objects_uploaded;
  uint64_t commits;
  uint64_t aborts;
  uint64_t recovered_commits; /* Attempts completed by recovery at open. */
  uint64_t recovered_aborts;  /* Attempts aborted by recovery at open. */
  uint64_t waits;             /* Feeds answered CKPT_WRITE_WAIT. */
  /* Multipart uploads no open attempt owned, aborted by orphan GC. */
  uint64_t orphan_uploads_aborted;
  uint64_t abandoned;  /* Open attempts aborted as abandoned (attempt_idle_timeout_ms). */
  uint64_t superseded; /* Idle attempts aborted by their job's Begin for a later step. */
  uint64_t preempted;  /* Attempts aborted at the service cap to make room for another job. */
  /* Orphaned attempt directories removed by the periodic sweep, and their objects. */
  uint64_t orphan_attempts_removed;
  uint64_t orphan_attempt_objects_removed;
};

/*
 * Opens the journal and the store, then recovers synchronously (before
 * returning): each journaled open attempt whose ranks all finished and whose
 * parts are all journaled is completed and committed; every other one is
 * aborted (multipart uploads aborted, objects deleted); interrupted deletions
 * are finished. Errors: STK_EINVAL, STK_EIO, STK_EBUSY (journal locked).
 */
int ckpt_service_open(uv_loop_t *loop, const struct ckpt_service_opts *opts,
                      struct ckpt_service **ret_service);

/* Stops accepting calls (STK_EUNAVAIL), fails writers that wait for staging
 * memory, lets queued uploads, journal writes and commits finish (attempts
 * left open are recovered at the next open), closes the store and the
 * journal, frees s and calls done(arg) on the loop. */
void ckpt_service_close(struct ckpt_service *s, void (*done)(void *arg), void *arg);

void ckpt_service_get_stats(const struct ckpt_service *s, struct ckpt_service_stats *ret_stats);

/* The job of an attempt the service holds (open or answered lately), for
 * the daemon's check of a caller's scope; NULL when unknown. Owned by s,
 * valid until control returns to the loop. */
const char *ckpt_service_attempt_job(const struct ckpt_service *s, const char *attempt);

/* One attempt's staging, for per-job figures (the daemon's gauges). */
struct ckpt_attempt_staging {
  const char *job;       /* Owned by s; valid until control returns to the loop. */
  uint64_t staged_bytes; /* Staging memory it holds now (as staged_bytes counts). */
  bool open;             /* Not yet committed or aborted. */
};
/* Fills ret[0..cap) with the attempts s keeps (open ones, and those that
 * ended within the last 10 minutes); returns how many there are (may
 * exceed cap). Loop thread. */
size_t ckpt_service_attempt_staging(const struct ckpt_service *s, struct ckpt_attempt_staging *ret,
                                    size_t cap);

/* What one open read (a restore) holds of the read budgets. */
struct ckpt_read_holding {
  const char *job;         /* Owned by s; valid until control returns to the loop. */
  uint64_t reserved_bytes; /* Its batches' reservations (read_reserved_bytes counts them). */
};
/* Fills ret[0..cap) with the open reads' holdings; returns how many reads
 * are open (may exceed cap). Loop thread. */
size_t ckpt_service_read_holdings(const struct ckpt_service *s, struct ckpt_read_holding *ret,
                                  size_t cap);

/* Fills ret with how ranks may stage through shared memory (strings owned
 * by s; an empty shm_dir when off). Synchronous. */
void ckpt_staging_info(const struct ckpt_service *s, Stoker__V1__StagingInfo *ret);

/* resp: Stoker__V1__BeginResponse (attempt: 32 random hex digits, journaled
 * with a synced write). STK_EEXIST if the step is already committed (with
 * shared_storage: by any service over the store; one LIST of the step's
 * directory). The owner is the daemon's to fill in (ckpt_rpc). */
void ckpt_begin(struct ckpt_service *s, const Stoker__V1__BeginRequest *req, ckpt_done_fn done,
                void *arg);

/* ---- Writing: one stream per (attempt, rank) ---------------------------- */

enum ckpt_write_event {
  CKPT_WRITE_RESUME,  /* Staging memory freed: feed the held chunk again. */
  CKPT_WRITE_STAGED,  /* "last" consumed: every byte of the rank is staged or durable. */
  CKPT_WRITE_DURABLE, /* Every byte of the rank is uploaded and journaled. */
  CKPT_WRITE_FAILED,  /* The attempt was aborted (err, errmsg say why); the writer is dead. */
};

typedef void (*ckpt_write_event_fn)(void *arg, enum ckpt_write_event ev, int err,
                                    const char *errmsg);

/* A positive answer of ckpt_write_feed: the chunk was NOT consumed. */
#define CKPT_WRITE_WAIT 1

/* Opens a stream for rank of attempt. Several streams may write one rank
 * one after another (a reconnecting writer continues); only one at a time
 * (STK_EBUSY). STK_ESTATE if the rank already sent "last" or the attempt is
 * no longer open; STK_EINVAL for rank >= world. */
int ckpt_write_open(struct ckpt_service *s, const char *attempt, uint32_t rank,
                    ckpt_write_event_fn on_event, void *arg, struct ckpt_writer **ret_writer);

/*
 * Feeds one chunk: a whole box of one tensor (data = box elements x dtype
 * size, row-major); opaque blobs are DTYPE_BYTES 1-D tensors (give each
 * rank's blob its own name). A chunk with an empty tensor and last set only
 * ends the stream. Everything is validated before a byte is buffered.
 * A chunk with shm_name has no data: its bytes are in that segment at
 * shm_offset; the segment is checked and mapped, not copied, and the
 * service owns it from then on (see ckpt_shm.h; STK_EINVAL for a bad
 * name or segment).
 * Returns 0 (consumed: the bytes are copied), CKPT_WRITE_WAIT (staging memory
 * is full; nothing was consumed: keep the chunk and feed it again after
 * CKPT_WRITE_RESUME; a gRPC handler stops reading meanwhile), or a negative
 * error (STK_EINVAL, STK_ETOOBIG for a chunk larger than the budget): the
 * attempt is then aborted and nothing of it is ever committed.
 */
int ckpt_write_feed(struct ckpt_writer *w, const Stoker__V1__WriteChunk *chunk);

/* A bad stream found by the caller (a malformed message): aborts the
 * writer's attempt with err and msg, as a bad chunk does. */
void ckpt_write_abort(struct ckpt_writer *w, int err, const char *msg);

/* Bytes this writer has had consumed. */
uint64_t ckpt_write_bytes(const struct ckpt_writer *w);

/* Detaches and frees the writer (the client went away). Bytes already
 * consumed are kept: if "last" was consumed the rank is finished and the
 * attempt commits without the writer. No event is delivered after this. */
void ckpt_write_close(struct ckpt_writer *w);

/* ---- Commit, list, read, delete, verify -------------------------------- */

/* resp: Stoker__V1__CheckpointRef. Commits happen by themselves once every
 * rank sent "last" and all data is durable; this call waits for that
 * outcome: the reference, or the reason the attempt was aborted
 * (STK_EABORTED, STK_EINVAL for a coverage error, STK_ETIMEDOUT). A
 * committed attempt answers at once. With req->detach the answer comes once
 * the commit is decided (every rank staged, the staged chunks checked, the
 * decision journaled: ckpt_detach.c), the reference without a uri. */
void ckpt_commit(struct ckpt_service *s, const Stoker__V1__CommitCheckpointRequest *req,
                 ckpt_done_fn done, void *arg);

/* resp: Stoker__V1__ListCheckpointsResponse, steps ascending, from the
 * journal; from the manifests in storage when the journal knows none of the
 * job's checkpoints (they are then journaled). */
void ckpt_list(struct ckpt_service *s, const Stoker__V1__ListCheckpointsRequest *req,
               ckpt_done_fn done, void *arg);

/* resp: Stoker__V1__Manifest, as stored (checked). */
void ckpt_get_manifest(struct ckpt_service *s, const Stoker__V1__GetManifestRequest *req,
                       ckpt_done_fn done, void *arg);

/* Called per message: an assembled piece (a sub-box of a wanted box, at
 * most read_piece_bytes of data), or, when the request asks for
 * pack_pieces, a message listing in pieces the next ready pieces that fit
 * read_piece_bytes packed (at least one; with pack_data their bytes in the
 * message's packed_data, which points into the batch's assembled buffer).
 * Return true for the next message at once, false to hold delivery until
 * ckpt_read_resume (flow control). The message and its bytes are valid
 * only during the call, unless held (ckpt_read_hold_data). */
typedef bool (*ckpt_piece_fn)(void *arg, const Stoker__V1__ReadChunk *piece);

/* Streams the wanted boxes (any world size) from a committed checkpoint:
 * planned with ckpt_plan (coalesced ranged reads), every block read CRC
 * checked. done: resp NULL; STK_ECORRUPT names the object and block. The
 * handle is valid until done begins. */
struct ckpt_reader *ckpt_read(struct ckpt_service *s, const Stoker__V1__ReadRequest *req,
                              ckpt_piece_fn on_piece, ckpt_done_fn done, void *arg);
void ckpt_read_resume(struct ckpt_reader *r);
/* Ends the read now: done is called synchronously with STK_ECANCELED. */
void ckpt_read_cancel(struct ckpt_reader *r);
/* Only inside on_piece, for a message with packed_data: a hold on the
 * buffer those bytes lie in, so that the caller may hand them on after
 * on_piece returns (to gRPC, sent without a copy) whatever becomes of the
 * read. NULL when the message has no packed_data or out of memory.
 * ckpt_read_release_data gives a hold back, once, on any thread (it is an
 * rpc_release_fn); the buffer is freed with the last hold. */
void *ckpt_read_hold_data(struct ckpt_reader *r);
void ckpt_read_release_data(void *hold);

/* resp: Stoker__V1__Empty. Journals the deletion, deletes the manifest
 * first, then the objects. */
void ckpt_delete(struct ckpt_service *s, const Stoker__V1__DeleteCheckpointRequest *req,
                 ckpt_done_fn done, void *arg);

/* resp: Stoker__V1__VerifyCheckpointResponse after re-reading every byte of
 * every object; err STK_ECORRUPT (resp still given) if anything is wrong. */
void ckpt_verify(struct ckpt_service *s, const Stoker__V1__VerifyCheckpointRequest *req,
                 ckpt_done_fn done, void *arg);

/* Aborts an open attempt (writers get STK_EABORTED, staging is freed at
 * once), cleans it up in storage and the journal, then collects the job's
 * orphaned attempt directories (as ckpt_gc). resp: Stoker__V1__Empty once
 * cleaned; at once for an attempt already aborted. STK_ENOENT: not known
 * here (never begun, or over for more than 10 min); STK_ESTATE: committing
 * or committed. */
void ckpt_abort(struct ckpt_service *s, const Stoker__V1__AbortCheckpointRequest *req,
                ckpt_done_fn done, void *arg);

/* Deletes what no manifest and no journal record claims under the job's
 * directory (attempts of a lost journal). resp: Stoker__V1__Empty. */
void ckpt_gc(struct ckpt_service *s, const char *job, ckpt_done_fn done, void *arg);

#endif
