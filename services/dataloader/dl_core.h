/*
 * dl_core: the dataloader as a library ("embedded mode"). It turns datasets
 * into step-addressed token batches: GetBatch(job, step, rank, world) is a
 * pure function of the job's configuration versions and the step, so a retry,
 * a restart (state reloaded from RocksDB) or an import on another instance
 * returns identical bytes, and the lines of a global batch do not depend on
 * the world size. The gRPC daemon is a thin adapter: each Dataloader RPC
 * maps to one dl_* call below. The model is explained in README.md.
 *
 * Threading: every function may be called from any thread at once. Batch
 * generation runs in the calling thread; calls for different lanes proceed
 * in parallel (a job holds one lock per lane), so serving many ranks from a
 * thread pool scales. Configuration changes (dl_update, dl_import_state)
 * wait for batch calls of the same job to finish. dl_close must not race
 * with other calls.
 *
 * Errors: STK_EINVAL (bad argument; nothing changed), STK_ENOENT (unknown
 * job), STK_EEXIST (job exists), STK_ERANGE (the step needs more replay than
 * opts.max_replay_lines or opts.max_replay_tokens from any restorable state, or the lane ran out of
 * data), STK_EIO / STK_ECORRUPT (store or dataset; STK_ECORRUPT too for a
 * job whose dataset file shrank under it: its data is lost), STK_ESTATE (a
 * job that failed to load at start), STK_ENOMEM. A reason is left in
 * stk_detail().
 */
#ifndef STK_DL_CORE_H
#define STK_DL_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dl_source.h"
#include "stoker/v1/dataloader.pb-c.h"

struct dl;

/* Opens the dataset a spec names. The default opener understands
 * source.uri "file:///path" or "/path" (format from spec->format) and
 * "synthetic:N_DOCS:MIN_LEN:MAX_LEN:SEED" (see formats/dl_synthetic.h). */
typedef int (*dl_open_source_fn)(void *arg, const Stoker__V1__DatasetSpec *spec,
                                 struct dl_source **ret_source);

struct dl_opts {
  const char *dir;            /* RocksDB directory; created if missing. Required. */
  uint64_t max_batch_bytes;   /* Largest token payload of one reply; 0: 256 MiB. */
  int64_t max_step;           /* Steps above are refused; 0: 2^40. */
  uint64_t max_replay_lines;  /* Lines one lane may regenerate for a call; 0: 2^20. */
  uint64_t max_replay_tokens; /* Tokens of those lines (long lines cost more); 0: 2^30. */
  /* Tokens a GetBatch or Explain call may replay before it gives its thread
   * back; 0: no bound (the call replays to the line in one go). A call that
   * reaches the bound returns DL_YIELDED: each lane keeps its place (the
   * live generator, and a snapshot there), so calling again goes on from
   * it. The daemon queues the call again behind other jobs' work. */
  uint64_t replay_slice_tokens;
  uint32_t snapshot_every_lines;   /* In-memory lane snapshot spacing; 0: 32. */
  uint32_t max_snapshots_per_lane; /* In-memory snapshots kept per lane; 0: 256. */
  uint32_t keep_commits;           /* Committed states kept restorable; 0: 2. */
  /* Budget of one job's lane state in bytes; 0: 256 MiB. A lane keeps one
   * counter per shard of each dataset in its live generator, in each of up
   * to max_snapshots_per_lane snapshots and in each kept commit, so a job
   * costs about (snapshots + commits + 2) x (8 x shards of every dataset +
   * 48 x lanes x datasets) bytes. A spec whose bound is larger is refused
   * (STK_ETOOBIG naming the budget) wherever it enters: create, a mixture
   * that adds datasets, an import, a reload. The bound counts every lane of
   * the job, so every part of a scaled-out job accepts the same specs. */
  uint64_t max_job_state_bytes;
  dl_open_source_fn open_source; /* NULL: the default opener. */
  void *open_source_arg;
  uint32_t gen_threads; /* Threads generating one batch: 1 (0: the default) or 2, where a
                           spare thread generates half of a call's lanes. Measured slower on
                           a 2-vCPU host (memory-bound work, oversubscribed cores), hence off. */
  /* Scale-out (README "Scale-out"): this instance is part `part` of `parts`
   * processes serving the same jobs and generates only the lanes c with
   * c mod parts == part; batches and Explain hold only those lanes' lines,
   * commits and exports only their snapshots. parts 0 means 1: the whole job. */
  uint32_t part, parts;
};

/* Opens the store and reloads every job (reopening its datasets). A job
 * that cannot be reloaded (a dataset missing or unreadable, a corrupt
 * record) is kept as failed, with the reason: its calls fail with
 * STK_ESTATE naming it, dl_get_info shows it, dl_delete_job removes it. */
int dl_open(const struct dl_opts *opts, struct dl **ret_dl);
/* Frees everything; accepts NULL. No call may be in flight. */
void dl_close(struct dl *dl);

/* Validates the spec (defaults: logical_shards 256, lanes 8; lanes <=
 * logical_shards), opens every dataset (O(files): headers and indexes), and
 * stores the job with a synced write. A dataset that fails to open fails the
 * call with the reader's error and detail; nothing is stored. */
int dl_create_job(struct dl *dl, const Stoker__V1__LoaderSpec *spec);

/* The job's creation spec with the current (latest version's) seq_len,
 * global_batch and datasets/weights, the latest committed step (-1: none),
 * this instance's part/parts (0/0 when it serves the whole job) and the
 * lines each lane generated here; failed and failure for a job that cannot
 * serve (failed to load: spec holds only the name; data lost). Free with
 * dl_info_free. */
int dl_get_info(struct dl *dl, const char *job, Stoker__V1__LoaderInfo **ret_info);
void dl_info_free(Stoker__V1__LoaderInfo *info);

/* One rank's slice of a global batch, or on a scaled-out instance (parts >
 * 1) the part of it this instance's lanes hold. */
struct dl_batch {
  int64_t step;
  uint32_t lines;       /* global_batch / world; partial: the lines held */
  uint32_t line_tokens; /* seq_len + 1 */
  uint32_t *tokens;     /* [lines x line_tokens] */
  uint32_t *doc_starts; /* [n_doc_starts] flat indices into tokens, ascending */
  size_t n_doc_starts;
  /* Partial batches only (parts > 1; else NULL, 0, 0, 1): line i is line
   * positions[i] of the slice of slice_lines lines; ascending. */
  uint32_t *positions; /* [lines] */
  uint32_t slice_lines;
  uint32_t part, parts;
  bool tokens_borrowed; /* tokens is the caller's dest (dl_get_batch_into) */
};

/* Returned (positive, not an error) by dl_get_batch, dl_get_batch_into and
 * dl_explain when opts.replay_slice_tokens ended this slice of the replay
 * before the batch's lines: nothing is returned; call again to go on. */
#define DL_YIELDED 1

/* Fills *ret_batch (free with dl_batch_free). Lines [rank*B/world,
 * (rank+1)*B/world) of step's global batch of B lines (on a scaled-out
 * instance, those of them its lanes hold). Errors: STK_EINVAL for step < 0
 * or > max_step, world 0, rank >= world, B % world != 0, a slice over
 * max_batch_bytes; STK_ENOENT; STK_ERANGE. */
int dl_get_batch(struct dl *dl, const char *job, int64_t step, uint32_t rank, uint32_t world,
                 struct dl_batch *ret_batch);
/* The same, writing the tokens into dest when they fit in dest_bytes (4
 * bytes of slack are needed: dest_bytes >= lines x line_tokens x 4 + 4);
 * ret_batch->tokens_borrowed says whether they went there. */
int dl_get_batch_into(struct dl *dl, const char *job, int64_t step, uint32_t rank, uint32_t world,
                      uint32_t *dest, size_t dest_bytes, struct dl_batch *ret_batch);
void dl_batch_free(struct dl_batch *b); /* Leaves borrowed tokens alone. */

/* Provenance of the same slice: one LineSource per piece of a document in
 * a line (line = index in the slice): dataset, file and index of the
 * document in it, the piece's offsets in the document and in its unit.
 * Free with dl_explain_free. */
int dl_explain(struct dl *dl, const char *job, int64_t step, uint32_t rank, uint32_t world,
               Stoker__V1__ExplainResponse **ret_resp);
void dl_explain_free(Stoker__V1__ExplainResponse *resp);

/* A new configuration version from req->from_step on (see
 * UpdateMixtureRequest): a new mixture (datasets listed with weights;
 * listed datasets not yet in the job are opened and added, known ones keep
 * their position; unlisted ones get weight 0), seq_len, global_batch,
 * blocked units, blocked documents (dataset, file as Explain names it,
 * index in the file; the rest of their units is served). from_step must be greater than every kept
 * committed step; versions starting at or after it are replaced. Synced before returning. */
int dl_update_mixture(struct dl *dl, const Stoker__V1__UpdateMixtureRequest *req);

/* Makes the state after `step` durable (synced): a restart resumes from it
 * without replaying earlier steps. Older commits beyond keep_commits are
 * garbage-collected. */
int dl_commit(struct dl *dl, const char *job, int64_t step);

/* The job's configuration and its lane states after `step`, as one blob for
 * the model checkpoint (free() it). A scaled-out instance exports only its
 * own lanes. */
int dl_export_state(struct dl *dl, const char *job, int64_t step, uint8_t **ret_blob,
                    size_t *ret_len);
/* Creates (or replaces) the job the blob describes, reopening its datasets,
 * committed at the blob's step. *ret_step, if not NULL, gets that step. */
int dl_import_state(struct dl *dl, const uint8_t *blob, size_t len, int64_t *ret_step);
/* The same from the n blobs the processes of a scaled-out job exported at
 * one step (any number of processes): they must agree on the step and the
 * configuration and together hold every lane this instance serves (STK_EINVAL
 * naming a missing lane otherwise; nothing changes). Lanes it does not
 * serve are ignored. job (NULL: the blobs' own) is the target: blobs of
 * another job are STK_EINVAL and change nothing (ImportState passes the
 * request's job). */
int dl_import_states(struct dl *dl, const char *job, const uint8_t *const *blobs,
                     const size_t *lens, size_t n, int64_t *ret_step);

/* Removes the job — loaded, or failed to load at start — and every key it
 * stored (one synced write); calls in flight finish first, later ones get
 * STK_ENOENT. */
int dl_delete_job(struct dl *dl, const char *job);

/* A page of the jobs (services/common/page.h), sorted by name, each as
 * dl_get_info gives it (failed ones with failed and failure set), after
 * req's page_token, at most req's page_size of them and within the page
 * byte bound; next_page_token set when more follow. req NULL: the first
 * page of the default size. STK_EINVAL for a bad token. Free with
 * dl_list_free. */
int dl_list_jobs(struct dl *dl, const Stoker__V1__ListLoadersRequest *req,
                 Stoker__V1__ListLoadersResponse **ret_resp);
void dl_list_free(Stoker__V1__ListLoadersResponse *resp);

/* Lines lane `lane` of job generated in this instance since it opened
 * the job (replays included; lanes of other parts stay 0). */
int dl_lane_lines_generated(struct dl *dl, const char *job, uint32_t lane, uint64_t *ret_lines);

#endif
