/*
 * dl_internal: the dataloader core's shared types. Legend of the letters
 * used in comments:
 *   L  logical shards per dataset (per dataset Ld = min(L, units))
 *   C  lanes; lane c owns shards c, c+C, c+2C, ... of every dataset
 *   B  global batch (lines per step) of a version;  T = seq_len + 1 tokens per line
 *   v  configuration version (index into job->ver, ordered by from_step)
 *   k  a lane's line number within a version
 * Global line n of version v (n = (step - from_step) * B + position) is line
 * k = n / C of lane n % C.
 */
#ifndef STK_DL_INTERNAL_H
#define STK_DL_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "dl_core.h"
#include "kv.h"

/* A dataset of a job. The table is append-only: an index names a dataset
 * for the job's whole life (versions weight them by index). */
struct dl_ds {
  Stoker__V1__DatasetSpec *spec; /* Own copy (unpacked from our own packing). */
  struct dl_source *src;         /* read with the spec's tokenizer (tokenizer 0) */
  /* The dataset's tokenizers, append-only like the table (versions name
   * them by index): tok_name[0] is the spec's ("bytes" when empty),
   * tok_src[0] == src; others were asked for by later versions (text
   * datasets only) and read the same files with that tokenizer. */
  char **tok_name;            /* [n_tok] */
  struct dl_source **tok_src; /* [n_tok] */
  uint32_t n_tok;
  struct map_guard_group *faults; /* its maps' SIGBUS record (services/common/map_guard.h) */
  uint64_t units;
  uint64_t key;    /* Hash of the name: keys this dataset's shuffles. */
  uint32_t shards; /* Ld = min(L, units) */
};

struct dl_block {
  uint32_t ds;
  uint64_t unit;
};

/* A blocked document: document `doc` of file `file` of dataset ds. */
struct dl_doc_block {
  uint32_t ds, file;
  uint64_t doc;
};

/* One configuration version, in force for steps [from_step, next's from_step). */
struct dl_version {
  uint64_t id; /* Never reused (snapshots name versions by id). */
  int64_t from_step;
  uint32_t seq_len, global_batch;
  double *weights; /* [n_weights]; datasets past the end weigh 0 */
  uint32_t n_weights;
  struct dl_block *blocked; /* [n_blocked] sorted by (ds, unit) */
  size_t n_blocked;
  struct dl_doc_block *doc_blocked; /* [n_doc_blocked] sorted by (ds, file, doc) */
  size_t n_doc_blocked;
  uint32_t *tok; /* [n_tok] each dataset's tokenizer (index into dl_ds.tok_name); past the end: 0 */
  uint32_t n_tok;
};

/* Per (lane, dataset) progress through the lane's shards. */
struct dl_lds {
  uint32_t epoch;
  uint32_t rr;    /* Next shard (index in the lane's shard list) in round robin. */
  uint64_t left;  /* Units not yet taken in this epoch. */
  uint64_t taken; /* Tokens taken in the current version (mixing counter). */
  uint8_t flags;  /* DL_LDS_* */
  uint64_t *pos;  /* [Ld shards of this lane] units taken from each shard this epoch */
  uint32_t n_pos;
};
#define DL_LDS_STARTED 1u /* epoch initialised */
#define DL_LDS_TOOK    2u /* took tokens in this epoch */
#define DL_LDS_DEAD    4u /* an epoch gave no tokens: never picked again */

/* A lane's generator: the serializable state (a pointer into the data,
 * never a buffer of tokens) plus the current unit as read (a cache). */
struct dl_gen {
  uint32_t vi;    /* version index */
  uint64_t k;     /* next line */
  int32_t cur_ds; /* -1: no current unit */
  uint32_t cur_epoch;
  uint64_t cur_unit;
  uint64_t off;      /* next token of the current unit (served coordinates) */
  struct dl_lds *ds; /* [n_ds] */
  uint32_t n_ds;
  /* Current unit as served: BOS/EOS inserted. */
  struct dl_unit unit;
  uint32_t *xtok; /* [n_xtok] (== unit.tokens when nothing is inserted; NULL when the
                     unit is borrowed: read through dl_unit_copy) */
  size_t n_xtok;
  uint32_t *seg_x;       /* [n_seg] served offset where each piece starts */
  uint8_t *seg_new;      /* [n_seg] 1: the piece starts a document */
  uint64_t *seg_doc;     /* [n_seg] index of the piece's document in unit.file (when ids) */
  uint64_t *seg_doc_off; /* [n_seg] offset of the piece's first token in it (when ids) */
  uint8_t *seg_blk;      /* [n_seg] 1: the piece's document is blocked in version vi
                            (allocated once a version blocks documents of the dataset) */
  size_t n_seg;
  size_t n_blk; /* pieces blocked; 0: seg_blk is all 0 */
  bool ids;     /* seg_doc and seg_doc_off are set (dl_source_unit_docs was asked) */
  /* A delimited unit (unit.raw != NULL, dl_lane_take.c) is read as lines
   * are filled: raw_pos is the raw index matching served offset `off`, and
   * the unit is charged to its dataset's mixing counter, from served
   * offset charge_from on, when it is used up. */
  uint64_t raw_pos;
  uint64_t charge_from;
  /* res_rel > 0: the current unit was read from a place (a version changed
   * its dataset's tokenizer in the middle of it): from its document
   * res_rel (counted as dl_unit.doc_rel) on, that document from byte
   * res_byte of its text as the leading piece when res_lead. Offsets are in
   * the unit as so read. */
  uint32_t res_rel;
  uint64_t res_byte;
  bool res_lead;
  /* Explain's byte cursor: served offset bc_off of piece bc_piece is byte
   * bc_bytes of its document (SIZE_MAX: none). */
  size_t bc_piece;
  uint64_t bc_off, bc_bytes;
};

struct dl_snap {
  uint32_t vi;
  uint64_t ver_id, k;
  bool pinned; /* a kept commit: never evicted */
  uint8_t *blob;
  size_t len;
};

struct dl_lane {
  pthread_mutex_t mu;
  uint64_t generated; /* lines generated (atomic: read without mu) */
  struct dl_gen live;
  bool live_ok;
  struct dl_snap *snaps; /* sorted by (vi, k) */
  size_t n_snaps, cap_snaps;
};

struct dl_commit {
  int64_t step;
  uint64_t *ver_id, *k; /* [C] each lane's position after the step */
};

struct dl_job {
  char *name;
  Stoker__V1__LoaderSpec *spec; /* creation spec (own packing) */
  uint64_t seed;
  uint32_t L, C;
  bool add_bos, add_eos;
  uint32_t bos_id, eos_id;
  struct dl_ds *ds;
  uint32_t n_ds;
  struct dl_version *ver;
  uint32_t n_ver;
  uint64_t next_ver_id;
  struct dl_commit *commits; /* oldest first */
  uint32_t n_commits;
  struct dl_lane *lanes; /* [C] */
  pthread_rwlock_t lock; /* read: serving; write: configuration changes */
  pthread_mutex_t commit_mu;
  struct dl *dl;
  unsigned refs; /* the table's and each call's (dl->mu); the last frees */
  bool deleted;  /* DeleteLoader removed its keys (set under lock and commit_mu) */
};

struct dl_failed;

struct dl {
  struct kv *kv;
  struct dl_opts opts;
  struct dl_helper *helper; /* NULL: batches are generated on the calling thread only */
  pthread_mutex_t mu;       /* guards the job table */
  struct dl_job **jobs;
  size_t n_jobs;
  struct dl_failed *failed; /* jobs that failed to load at start (dl_jobs.c) */
  size_t n_failed;
};

/*
 * The core's files call downwards only (README.md, "How the files stack"):
 * the sections below run from the top of the ladder to its base. A file
 * calls the files of the sections after its own, never those before.
 */

/* ---- dl_core.c, dl_serve.c, dl_update.c, dl_commit.c, dl_import.c: the
 * entry points of dl_core.h ---- */
/* Scale-out: whether this instance serves lane c (dl_opts.part/parts). */
static inline bool dl_owns_lane(const struct dl *dl, uint32_t c) {
  return c % dl->opts.parts == dl->opts.part;
}

/* ---- dl_load.c: the stored jobs at open ---- */
/* Loads every job of the catalog into the table; a job that cannot load is
 * added as failed (with the reason). Fails only on RocksDB or memory. */
int dl_load(struct dl *dl);

/* ---- dl_jobs.c: the job table ---- */
/* The loaded job `name` with a reference (give it back with dl_job_put):
 * STK_ENOENT, or STK_ESTATE with the reason for a job that failed to load. */
int dl_job_get(struct dl *dl, const char *name, struct dl_job **ret_job);
void dl_job_put(struct dl *dl, struct dl_job *j);        /* accepts NULL */
bool dl_job_name_taken(struct dl *dl, const char *name); /* loaded or failed */
/* Adds j holding the table's reference; STK_EEXIST when the name is taken. */
int dl_add_job(struct dl *dl, struct dl_job *j);
/* Takes j out of the table (dropping the table's reference). */
void dl_remove_job(struct dl *dl, struct dl_job *j);
int dl_add_failed(struct dl *dl, const char *name, const char *reason);
/* The info of a failed job; STK_ENOENT when `job` is not one. */
int dl_failed_info(struct dl *dl, const char *job, Stoker__V1__LoaderInfo **ret_info);
/* Deletes the failed entry `job` with every key it stored (synced), under
 * the table's lock; STK_ENOENT when `job` is not a failed entry. */
int dl_delete_failed(struct dl *dl, const char *job);
/* Every name in the table, loaded or failed, sorted (malloc'd copies). */
int dl_job_names(struct dl *dl, char ***ret, size_t *ret_n);
void dl_jobs_close(struct dl *dl); /* dl_close: frees every entry */

/* ---- dl_store.c: RocksDB ---- */
int dl_store_put_config(struct dl *dl, struct dl_job *j, bool is_new);
/* Writes the kept commit list (its last entry new, with snapshot blobs[C])
 * and deletes the snapshots of dropped commits, in one synced batch. */
int dl_store_commit(struct dl *dl, struct dl_job *j, const struct dl_commit *list, uint32_t n,
                    uint8_t *const *blobs, const size_t *lens, const struct dl_commit *drop,
                    uint32_t n_drop);
/* Deletes every stored key of the job, synced. */
int dl_store_delete(struct dl *dl, const char *job);
/* Replaces every stored key of the job. */
int dl_store_replace(struct dl *dl, struct dl_job *j, const struct dl_commit *c,
                     uint8_t *const *blobs, const size_t *lens);
/* Reading (dl_load.c): the stored configuration of `job` (malloc'd); the
 * kept commits into j->commits (none stored: none); a lane's snapshot
 * (malloc'd). STK_ENOENT when the key is absent. */
int dl_store_get_config(struct dl *dl, const char *job, void **ret_val, size_t *ret_len);
int dl_store_get_commits(struct dl *dl, struct dl_job *j);
int dl_store_get_snap(struct dl *dl, const char *job, uint32_t lane, uint64_t ver_id, uint64_t k,
                      void **ret_val, size_t *ret_len);
/* Calls fn(dl, name) for each job of the catalog until one fails. */
int dl_store_each_job(struct dl *dl, int (*fn)(struct dl *dl, const char *name));

/* ---- dl_job.c: a job's life ---- */
int dl_validate_name(const char *what, const char *name);
/* A job from its creation spec: validated, datasets opened, version 0. */
int dl_job_new(struct dl *dl, const Stoker__V1__LoaderSpec *spec, struct dl_job **ret_job);
/* A job from its stored configuration (dl_config_encode): datasets reopened. */
int dl_config_decode(struct dl *dl, const uint8_t *p, size_t len, struct dl_job **ret_job);
void dl_job_free(struct dl_job *j); /* accepts NULL */
/* What CreateLoader and UpdateMixture both check of a list of datasets
 * before anything is opened: 1 to 256 of them, valid unique names, bounded
 * strings, finite weights in [0, 1e12] summing to more than 0. */
int dl_check_datasets(Stoker__V1__DatasetSpec *const *ds, size_t n);
int dl_ds_add(struct dl *dl, struct dl_job *j, const Stoker__V1__DatasetSpec *spec);
int dl_ds_find(const struct dl_job *j, const char *name);
/* A known dataset named again (UpdateMixture): every field a version cannot
 * change (source, format, block sizes) must be unset or as stored. */
int dl_ds_check_same(const struct dl_job *j, uint32_t d, const Stoker__V1__DatasetSpec *spec);
/* The index of tokenizer `name` of dataset d, opening the dataset with it
 * when new (text datasets only; the same checks and errors as CreateLoader's
 * open). dl_ds_drop_tokenizers takes back those at or past n_tok. */
int dl_ds_tokenizer(struct dl *dl, struct dl_job *j, uint32_t d, const char *name,
                    uint32_t *ret_tok);
void dl_ds_drop_tokenizers(struct dl_ds *ds, uint32_t n_tok);
/* A tokenizer spec as stored and compared: "" and NULL are "bytes". */
static inline const char *dl_tok_norm(const char *name) {
  return name && *name ? name : "bytes";
}
void dl_ds_clear(struct dl_ds *ds); /* frees the reader, its fault group and the spec */
/* STK_ECORRUPT with a detail naming the dataset and file when a read
 * through one of the job's dataset maps faulted (the file shrank under it):
 * whatever was read since is zeros, so every call that read data checks this
 * after reading and throws its result away; the job stays broken. */
int dl_job_check_data(const struct dl_job *j);
void dl_commit_clear(struct dl_commit *c);

/* ---- dl_seek.c: snapshots and random access ---- */
/* Moves g (the lane's live generator when g == &lane->live) to (vi, k).
 * Caller holds the lane's mutex. budget_tokens (NULL: none; the live
 * generator only) bounds the tokens replayed and is decreased by them: when
 * it runs out first, g stays where it stopped and DL_YIELDED is returned
 * (calling again goes on from there). */
int dl_seek(struct dl_job *j, uint32_t c, struct dl_gen *g, bool is_live, uint32_t vi, uint64_t k,
            uint64_t *budget_tokens);
int dl_snap_add(struct dl_job *j, uint32_t c, uint32_t vi, uint64_t k, bool pinned,
                const uint8_t *blob, size_t len);
void dl_snaps_reindex(struct dl_job *j); /* after versions changed */
void dl_lane_clear(struct dl_lane *l);

/* ---- dl_lane_codec.c: a generator as a snapshot blob ---- */
int dl_gen_encode(const struct dl_job *j, const struct dl_gen *g, uint8_t **ret, size_t *ret_len);
int dl_gen_decode(struct dl_job *j, uint32_t c, const uint8_t *p, size_t len, struct dl_gen *g);

/* ---- dl_lane.c: the generator ---- */
struct dl_line_out {
  uint32_t *tokens; /* [T] or NULL (skip) */
  uint32_t *starts; /* doc starts within the line, appended; may be NULL */
  size_t n_starts;
  bool explain;                  /* collect runs */
  Stoker__V1__LineSource **runs; /* [n_runs] appended when explain */
  size_t n_runs, cap_runs;
  uint32_t line; /* line number recorded in runs */
  uint32_t lane;
};
void dl_gen_reset(struct dl_gen *g); /* back to the initial state (version 0, line 0) */
void dl_gen_free(struct dl_gen *g);  /* frees buffers; g becomes empty */
int dl_gen_fit(struct dl_job *j, uint32_t c, struct dl_gen *g); /* sizes arrays to job */
int dl_gen_line(struct dl_job *j, uint32_t c, struct dl_gen *g, struct dl_line_out *out);
int dl_gen_load_unit(struct dl_job *j, struct dl_gen *g, uint32_t d, uint64_t unit);
int dl_gen_next_version(struct dl_job *j, struct dl_gen *g);

/* ---- dl_lane_take.c: delimited units (read while lines fill) ---- */
bool dl_gen_delimited(const struct dl_gen *g);
/* Whether the current delimited unit has no token left (skips delimiters). */
bool dl_gen_take_done(struct dl_gen *g);
/* Takes up to `want` tokens of the current delimited unit into the line at
 * `fill` (out NULL: skips them); returns how many. */
size_t dl_gen_take(struct dl_gen *g, struct dl_line_out *out, uint32_t fill, size_t want);
/* Tokens of the current delimited unit not yet charged to its dataset's
 * mixing counter (0 for other units, which are charged when loaded). */
uint64_t dl_gen_charge_due(const struct dl_job *j, const struct dl_gen *g);
/* A delimited unit used up: charges it. */
void dl_gen_charge_used_up(const struct dl_job *j, struct dl_gen *g);
/* After a snapshot was decoded and its unit loaded: places a delimited
 * unit at served offset g->off and takes what is still due off the
 * snapshot's counter (snapshots hold units charged in full). */
int dl_gen_resume_unit(const struct dl_job *j, struct dl_gen *g);

/* ---- dl_helper.c: a second thread for batch generation ---- */
struct dl_helper;
int dl_helper_new(struct dl_helper **ret_helper);
void dl_helper_free(struct dl_helper *h); /* accepts NULL; no work may be pending */
/* Runs fn(arg) on the helper and returns true, or returns false when h is
 * NULL or serving another call. After true, call dl_helper_wait. */
bool dl_helper_start(struct dl_helper *h, void (*fn)(void *), void *arg);
void dl_helper_wait(struct dl_helper *h); /* until fn returned */

/* ---- dl_open_source.c ---- */
int dl_default_open_source(void *arg, const Stoker__V1__DatasetSpec *spec,
                           struct dl_source **ret_source);

/* ---- dl_config.c: the configuration as bytes (DLC3 when a version changed
 * a tokenizer, else DLC2; DLC1 read) ---- */
/* A stored configuration as read: what dl_config_decode builds a job from. */
struct dl_config {
  Stoker__V1__LoaderSpec *spec;
  Stoker__V1__DatasetSpec **ds; /* [n_ds] */
  uint32_t n_ds;
  char ***alt;            /* [n_ds][n_alt[d]] each dataset's tokenizers past its spec's (DLC3) */
  uint32_t *n_alt;        /* [n_ds] */
  struct dl_version *ver; /* [n_ver] */
  uint32_t n_ver;
  uint64_t next_ver_id;
};
/* The creation spec, the dataset table's specs and the versions. */
int dl_config_encode(const struct dl_job *j, uint8_t **ret, size_t *ret_len);
/* Reads and checks every field (shapes against dl's bounds); opens nothing.
 * STK_ECORRUPT with a detail when the bytes are not a configuration. */
int dl_config_read(const struct dl *dl, const uint8_t *p, size_t len, struct dl_config *ret);
void dl_config_clear(struct dl_config *c);

/* ---- dl_version.c: configuration versions ---- */
void dl_version_clear(struct dl_version *v);
int dl_version_copy(const struct dl_version *src, struct dl_version *dst);
void dl_version_sort_blocked(struct dl_version *v);
bool dl_version_blocked(const struct dl_version *v, uint32_t ds, uint64_t unit);
bool dl_version_doc_blocked(const struct dl_version *v, uint32_t ds, uint32_t file, uint64_t doc);
/* Whether the version blocks any document of dataset ds. */
bool dl_version_blocks_docs(const struct dl_version *v, uint32_t ds);
void dl_version_sort_doc_blocked(struct dl_version *v);
double dl_version_weight(const struct dl_version *v, uint32_t ds);
uint32_t dl_version_tok(const struct dl_version *v, uint32_t ds);
int dl_check_shape(const struct dl *dl, uint32_t seq_len, uint32_t global_batch);

/* The reader of dataset d under version vi's tokenizer. */
static inline struct dl_source *dl_ds_src(const struct dl_job *j, uint32_t vi, uint32_t d) {
  return j->ds[d].tok_src[dl_version_tok(&j->ver[vi], d)];
}

/* ---- dl_steps.c: step / line arithmetic ---- */
uint32_t dl_version_of_step(const struct dl_job *j, int64_t step);
/* Lines lane c takes in version vi from its start up to (not incl.) step. */
uint64_t dl_lane_lines(const struct dl_job *j, uint32_t vi, uint32_t c, int64_t step);
/* Lines lane c takes in the whole of version vi; UINT64_MAX for the last. */
uint64_t dl_lane_version_end(const struct dl_job *j, uint32_t vi, uint32_t c);
uint32_t dl_lane_shards(const struct dl_job *j, uint32_t ds, uint32_t c);
void dl_shard_range(const struct dl_job *j, uint32_t ds, uint32_t shard, uint64_t *ret_begin,
                    uint64_t *ret_end);
int dl_version_index(const struct dl_job *j, uint64_t ver_id, uint32_t *ret_vi);

/* Exported state blobs (dl_commit.c writes them, dl_import.c reads them).
 * DLX3: every lane, in order; DLX4: a part's lanes, each named; both end in
 * the CRC32C of every byte before it. DLX1/DLX2 are the same bodies without
 * the checksum, written before it existed, still read. */
#define DL_BLOB_FULL_V1 0x31584C44u /* "DLX1" */
#define DL_BLOB_PART_V1 0x32584C44u /* "DLX2" */
#define DL_BLOB_FULL    0x33584C44u /* "DLX3" */
#define DL_BLOB_PART    0x34584C44u /* "DLX4" */

#endif
