/*
 * dl_job: a job's life — created from a spec (dl_job_new: every field
 * validated, every dataset opened, before anything is stored) or from its
 * stored configuration (dl_config_decode), and freed (dl_job_free: by the
 * job table when the last reference goes, or by whoever built a job that
 * never reached the table). Here too its append-only dataset table (each
 * dataset's maps in a fault group of its own, and each dataset's
 * append-only table of tokenizers versions chose), the checks of a list of
 * datasets that CreateLoader and UpdateMixture share, the check that none
 * of them was truncated under the job, and a commit record's clear. This file sits above
 * the job's parts (versions, lanes, snapshots, the configuration's bytes)
 * and below everything that looks jobs up (dl_jobs.c and the entry points):
 * it calls none of its users.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dl_internal.h"
#include "dl_perm.h"
#include "map_guard.h"
#include "stk_error.h"

#define MAX_LANES    4096u
#define MAX_SHARDS   (1u << 20)
#define MAX_DATASETS 256u
/* Longest dataset source.uri and tokenizer a spec may carry: a path (at
 * most PATH_MAX) with its scheme, and two paths with "gpt2:" and ",". */
#define MAX_URI_BYTES       4096u
#define MAX_TOKENIZER_BYTES 8200u
/* Tokenizers one dataset may be read with over a job's life (each an open reader). */
#define MAX_TOKENIZERS 16u

int dl_validate_name(const char *what, const char *name) {
  size_t n = name ? strlen(name) : 0;
  if (n == 0 || n > 128) {
    stk_set_detail("%s name must have 1 to 128 characters", what);
    return STK_EINVAL;
  }
  for (size_t i = 0; i < n; i++) {
    char ch = name[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
          ch == '-' || ch == '_' || ch == '.')) {
      stk_set_detail("%s name '%s': only letters, digits, '-', '_' and '.' allowed", what, name);
      return STK_EINVAL;
    }
  }
  return 0;
}

/* A deep copy of a message through its own packing. */
static void *copy_msg(const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) return NULL;
  protobuf_c_message_pack(m, buf);
  void *out = protobuf_c_message_unpack(m->descriptor, NULL, n, buf);
  free(buf);
  return out;
}

int dl_ds_find(const struct dl_job *j, const char *name) {
  for (uint32_t d = 0; d < j->n_ds; d++)
    if (strcmp(j->ds[d].spec->name, name) == 0) return (int)d;
  return -1;
}

void dl_ds_drop_tokenizers(struct dl_ds *ds, uint32_t n_tok) {
  while (ds->n_tok > n_tok && ds->n_tok > 1) {
    ds->n_tok--;
    dl_source_free(ds->tok_src[ds->n_tok]);
    free(ds->tok_name[ds->n_tok]);
  }
}

void dl_ds_clear(struct dl_ds *ds) {
  dl_ds_drop_tokenizers(ds, 1);
  if (ds->n_tok) free(ds->tok_name[0]);
  free(ds->tok_name);
  free(ds->tok_src);
  dl_source_free(ds->src); /* its maps first: they name the fault group */
  map_guard_group_free(ds->faults);
  if (ds->spec) stoker__v1__dataset_spec__free_unpacked(ds->spec, NULL);
  memset(ds, 0, sizeof *ds);
}

/* Opens the dataset as `spec` says (its own spec, or that spec with
 * another tokenizer) with its maps in the dataset's own fault group, so a
 * file truncated later breaks this dataset's job only (dl_job_check_data). */
static int open_in_group(struct dl *dl, struct dl_ds *ds, const Stoker__V1__DatasetSpec *spec,
                         struct dl_source **ret) {
  map_guard_scope_enter(ds->faults);
  int rc = dl->opts.open_source(dl->opts.open_source_arg, spec, ret);
  map_guard_scope_leave();
  const char *path;
  if (rc == 0 && map_guard_group_broken(ds->faults, &path)) {
    stk_set_detail("dataset %s: %s shrank while it was opened", ds->spec->name, path);
    dl_source_free(*ret);
    *ret = NULL;
    rc = STK_ECORRUPT;
  }
  return rc;
}

static int open_ds(struct dl *dl, struct dl_ds *ds) {
  if (!(ds->faults = map_guard_group_new())) return STK_ENOMEM;
  int rc = open_in_group(dl, ds, ds->spec, &ds->src);
  if (rc < 0) return rc;
  ds->tok_name = malloc(sizeof *ds->tok_name);
  ds->tok_src = malloc(sizeof *ds->tok_src);
  if (!ds->tok_name || !ds->tok_src ||
      !(ds->tok_name[0] = strdup(dl_tok_norm(ds->spec->tokenizer))))
    return STK_ENOMEM;
  ds->tok_src[0] = ds->src;
  ds->n_tok = 1;
  return 0;
}

int dl_ds_tokenizer(struct dl *dl, struct dl_job *j, uint32_t d, const char *name,
                    uint32_t *ret_tok) {
  struct dl_ds *ds = &j->ds[d];
  name = dl_tok_norm(name);
  for (uint32_t t = 0; t < ds->n_tok; t++)
    if (strcmp(ds->tok_name[t], name) == 0) {
      *ret_tok = t;
      return 0;
    }
  if (!dl_source_tokenizes(ds->src)) {
    stk_set_detail("dataset %s: only text datasets are tokenized; its tokenizer stays '%s'",
                   ds->spec->name, ds->tok_name[0]);
    return STK_EINVAL;
  }
  if (ds->n_tok >= MAX_TOKENIZERS) {
    stk_set_detail("dataset %s: at most %u tokenizers over a job's life", ds->spec->name,
                   MAX_TOKENIZERS);
    return STK_EINVAL;
  }
  char **names = realloc(ds->tok_name, (ds->n_tok + 1) * sizeof *names);
  if (names) ds->tok_name = names;
  struct dl_source **srcs = names ? realloc(ds->tok_src, (ds->n_tok + 1) * sizeof *srcs) : NULL;
  if (srcs) ds->tok_src = srcs;
  char *copy = srcs ? strdup(name) : NULL;
  if (!copy) return STK_ENOMEM;
  Stoker__V1__DatasetSpec spec = *ds->spec; /* shallow: only the tokenizer differs */
  spec.tokenizer = copy;
  struct dl_source *src = NULL;
  int rc = open_in_group(dl, ds, &spec, &src);
  if (rc == 0 && dl_source_units(src) != ds->units) { /* text units are byte blocks */
    stk_set_detail("dataset %s: %llu units with tokenizer '%s', %llu with '%s'", ds->spec->name,
                   (unsigned long long)dl_source_units(src), name, (unsigned long long)ds->units,
                   ds->tok_name[0]);
    dl_source_free(src);
    rc = STK_ECORRUPT;
  }
  if (rc < 0) {
    free(copy);
    return rc;
  }
  ds->tok_name[ds->n_tok] = copy;
  ds->tok_src[ds->n_tok] = src;
  *ret_tok = ds->n_tok++;
  return 0;
}

int dl_ds_check_same(const struct dl_job *j, uint32_t d, const Stoker__V1__DatasetSpec *spec) {
  const Stoker__V1__DatasetSpec *was = j->ds[d].spec;
  const char *uri = spec->source && spec->source->uri ? spec->source->uri : "";
  const char *what = NULL;
  if (*uri && strcmp(uri, was->source && was->source->uri ? was->source->uri : "") != 0)
    what = "source";
  else if (spec->format && spec->format != was->format)
    what = "format";
  else if (spec->block_tokens && spec->block_tokens != was->block_tokens)
    what = "block_tokens";
  else if (spec->block_bytes && spec->block_bytes != was->block_bytes)
    what = "block_bytes";
  if (!what) return 0;
  stk_set_detail("dataset %s: a new version may change its weight and tokenizer only, not its "
                 "%s (add the data under a new name)",
                 spec->name, what);
  return STK_EINVAL;
}

/* Bytes one copy of every lane's state takes with datasets [0, n_ds) of
 * `shards` shards in all: a header per lane, per (lane, dataset) its
 * progress record, and one 8-byte counter per shard (dl_lds.pos). */
static uint64_t lane_state_bytes(uint32_t lanes, uint32_t n_ds, uint64_t shards) {
  return (uint64_t)lanes * (64 + (uint64_t)n_ds * sizeof(struct dl_lds)) + 8 * shards;
}

/* Whether the job with one more dataset of `shards` shards stays within the
 * per-job state budget (dl_opts.max_job_state_bytes): every lane state is
 * held by the live generator, a scratch generator, each in-memory snapshot
 * and each kept commit. STK_ETOOBIG naming the budget when it does not. */
static int check_state_budget(const struct dl *dl, const struct dl_job *j, const char *ds_name,
                              uint32_t shards) {
  uint64_t all_shards = shards;
  for (uint32_t d = 0; d < j->n_ds; d++) all_shards += j->ds[d].shards;
  uint64_t copies = (uint64_t)dl->opts.max_snapshots_per_lane + dl->opts.keep_commits + 2;
  uint64_t bytes = copies * lane_state_bytes(j->C, j->n_ds + 1, all_shards);
  if (bytes <= dl->opts.max_job_state_bytes) return 0;
  stk_set_detail("job %s: with dataset %s its lane state would take up to %llu MiB (%u lanes, "
                 "%u datasets, %llu shards in all, %llu copies: snapshots per lane + kept commits "
                 "+ 2), over the per-job state budget of %llu MiB (max-job-state-bytes); use "
                 "fewer logical_shards, lanes or datasets",
                 j->name, ds_name, (unsigned long long)(bytes >> 20), j->C, j->n_ds + 1,
                 (unsigned long long)all_shards, (unsigned long long)copies,
                 (unsigned long long)(dl->opts.max_job_state_bytes >> 20));
  return STK_ETOOBIG;
}

/* The dataset's strings beside its name are bounded: a spec, its copies
 * and every listing that shows it stay small. */
static int check_ds_strings(const Stoker__V1__DatasetSpec *spec) {
  const char *uri = spec->source && spec->source->uri ? spec->source->uri : "";
  if (strlen(uri) > MAX_URI_BYTES) {
    stk_set_detail("dataset %s: source.uri over %u bytes", spec->name, MAX_URI_BYTES);
    return STK_EINVAL;
  }
  if (spec->tokenizer && strlen(spec->tokenizer) > MAX_TOKENIZER_BYTES) {
    stk_set_detail("dataset %s: tokenizer over %u bytes", spec->name, MAX_TOKENIZER_BYTES);
    return STK_EINVAL;
  }
  return 0;
}

static int check_weight(const Stoker__V1__DatasetSpec *d) {
  if (!isfinite(d->weight) || d->weight < 0 || d->weight > 1e12) {
    stk_set_detail("dataset %s: weight must be finite, >= 0 and <= 1e12", d->name);
    return STK_EINVAL;
  }
  return 0;
}

int dl_check_datasets(Stoker__V1__DatasetSpec *const *ds, size_t n) {
  if (n < 1 || n > MAX_DATASETS) {
    stk_set_detail("a job needs 1 to %u datasets", MAX_DATASETS);
    return STK_EINVAL;
  }
  double sum = 0;
  for (size_t i = 0; i < n; i++) {
    int rc = dl_validate_name("dataset", ds[i]->name);
    if (rc == 0) rc = check_ds_strings(ds[i]);
    if (rc == 0) rc = check_weight(ds[i]);
    if (rc < 0) return rc;
    for (size_t k = 0; k < i; k++)
      if (strcmp(ds[k]->name, ds[i]->name) == 0) {
        stk_set_detail("dataset %s listed twice", ds[i]->name);
        return STK_EINVAL;
      }
    sum += ds[i]->weight;
  }
  if (!(sum > 0)) {
    stk_set_detail("the weights of the datasets sum to 0");
    return STK_EINVAL;
  }
  return 0;
}

int dl_ds_add(struct dl *dl, struct dl_job *j, const Stoker__V1__DatasetSpec *spec) {
  int rc = dl_validate_name("dataset", spec->name);
  if (rc == 0) rc = check_ds_strings(spec);
  if (rc < 0) return rc;
  if (j->n_ds >= MAX_DATASETS) {
    stk_set_detail("a job has at most %u datasets", MAX_DATASETS);
    return STK_EINVAL;
  }
  struct dl_ds ds = {0};
  if (!(ds.spec = copy_msg(&spec->base))) return STK_ENOMEM;
  /* The job keeps the unit size it was created with, whatever later
   * versions take as their default. */
  if (ds.spec->format == STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_LLMC && !ds.spec->block_tokens)
    ds.spec->block_tokens = DL_LLMC_BLOCK_TOKENS;
  if ((rc = open_ds(dl, &ds)) < 0) {
    dl_ds_clear(&ds);
    return rc;
  }
  ds.units = dl_source_units(ds.src);
  if (ds.units < j->C) {
    stk_set_detail("dataset %s has %llu units, fewer than the %u lanes", spec->name,
                   (unsigned long long)ds.units, j->C);
    dl_ds_clear(&ds);
    return STK_EINVAL;
  }
  ds.shards = ds.units < j->L ? (uint32_t)ds.units : j->L;
  if ((rc = check_state_budget(dl, j, spec->name, ds.shards)) < 0) {
    dl_ds_clear(&ds);
    return rc;
  }
  struct dl_ds *arr = realloc(j->ds, (j->n_ds + 1) * sizeof *arr);
  if (!arr) {
    dl_ds_clear(&ds);
    return STK_ENOMEM;
  }
  ds.key = dl_hash_str(spec->name);
  j->ds = arr;
  j->ds[j->n_ds++] = ds;
  return 0;
}

int dl_job_check_data(const struct dl_job *j) {
  for (uint32_t d = 0; d < j->n_ds; d++) {
    const char *path;
    if (!map_guard_group_broken(j->ds[d].faults, &path)) continue;
    stk_set_detail("job %s: dataset %s: %s was truncated or shrank while the job read it; the "
                   "job's data is lost (restore the file and restart, or delete the job)",
                   j->name, j->ds[d].spec->name, path);
    return STK_ECORRUPT;
  }
  return 0;
}

/* Validates the scalar fields and allocates a job with no dataset. */
static int job_alloc(struct dl *dl, const Stoker__V1__LoaderSpec *spec, struct dl_job **ret) {
  int rc = dl_validate_name("job", spec->job);
  if (rc == 0) rc = dl_check_shape(dl, spec->seq_len, spec->global_batch);
  if (rc < 0) return rc;
  uint32_t c = spec->lanes ? spec->lanes : 8, l = spec->logical_shards ? spec->logical_shards : 256;
  if (c > MAX_LANES || l > MAX_SHARDS || c > l) {
    stk_set_detail("need 1 <= lanes (%u) <= logical_shards (%u), lanes <= %u, shards <= %u", c, l,
                   MAX_LANES, MAX_SHARDS);
    return STK_EINVAL;
  }
  struct dl_job *j = calloc(1, sizeof *j);
  if (!j) return STK_ENOMEM;
  j->dl = dl;
  j->name = strdup(spec->job);
  j->spec = copy_msg(&spec->base);
  j->lanes = calloc(c, sizeof *j->lanes);
  if (!j->name || !j->spec || !j->lanes) {
    dl_job_free(j);
    return STK_ENOMEM;
  }
  j->seed = spec->seed;
  j->C = c;
  j->L = l;
  j->add_bos = spec->add_bos;
  j->add_eos = spec->add_eos;
  j->bos_id = spec->bos_id;
  j->eos_id = spec->eos_id;
  pthread_rwlock_init(&j->lock, NULL);
  pthread_mutex_init(&j->commit_mu, NULL);
  for (uint32_t i = 0; i < c; i++) {
    pthread_mutex_init(&j->lanes[i].mu, NULL);
    dl_gen_reset(&j->lanes[i].live);
  }
  *ret = j;
  return 0;
}

void dl_job_free(struct dl_job *j) {
  if (!j) return;
  for (uint32_t d = 0; d < j->n_ds; d++) dl_ds_clear(&j->ds[d]);
  free(j->ds);
  for (uint32_t v = 0; v < j->n_ver; v++) dl_version_clear(&j->ver[v]);
  free(j->ver);
  for (uint32_t i = 0; i < j->n_commits; i++) dl_commit_clear(&j->commits[i]);
  free(j->commits);
  if (j->lanes) {
    for (uint32_t c = 0; c < j->C; c++) {
      dl_lane_clear(&j->lanes[c]);
      pthread_mutex_destroy(&j->lanes[c].mu);
    }
    pthread_rwlock_destroy(&j->lock);
    pthread_mutex_destroy(&j->commit_mu);
  }
  free(j->lanes);
  if (j->spec) stoker__v1__loader_spec__free_unpacked(j->spec, NULL);
  free(j->name);
  free(j);
}

int dl_job_new(struct dl *dl, const Stoker__V1__LoaderSpec *spec, struct dl_job **ret_job) {
  struct dl_job *j = NULL;
  int rc = dl_check_datasets(spec->datasets, spec->n_datasets);
  if (rc == 0) rc = job_alloc(dl, spec, &j);
  for (size_t i = 0; rc == 0 && i < spec->n_datasets; i++) rc = dl_ds_add(dl, j, spec->datasets[i]);
  struct dl_version v = {.id = 0, .seq_len = spec->seq_len, .global_batch = spec->global_batch};
  if (rc == 0 && !(j->ver = calloc(1, sizeof *j->ver))) rc = STK_ENOMEM;
  if (rc == 0 && !(v.weights = malloc(j->n_ds * sizeof *v.weights))) rc = STK_ENOMEM;
  if (rc < 0) {
    if (j) dl_job_free(j);
    return rc;
  }
  for (uint32_t d = 0; d < j->n_ds; d++) v.weights[d] = spec->datasets[d]->weight;
  v.n_weights = j->n_ds;
  j->ver[0] = v;
  j->n_ver = 1;
  j->next_ver_id = 1;
  *ret_job = j;
  return 0;
}

/* The job a stored configuration describes (read by dl_config.c), its
 * datasets reopened, so a job reloaded after a restart or imported
 * elsewhere sees exactly the units it was created with. */
int dl_config_decode(struct dl *dl, const uint8_t *p, size_t len, struct dl_job **ret_job) {
  struct dl_config c;
  int rc = dl_config_read(dl, p, len, &c);
  if (rc < 0) return rc;
  struct dl_job *j = NULL;
  rc = job_alloc(dl, c.spec, &j);
  for (uint32_t d = 0; rc == 0 && d < c.n_ds; d++) rc = dl_ds_add(dl, j, c.ds[d]);
  for (uint32_t d = 0; rc == 0 && d < c.n_ds; d++) /* the tokenizers later versions chose */
    for (uint32_t t = 0; rc == 0 && c.n_alt && t < c.n_alt[d]; t++) {
      uint32_t got;
      rc = dl_ds_tokenizer(dl, j, d, c.alt[d][t], &got);
      if (rc == 0 && got != t + 1) rc = STK_ECORRUPT;
    }
  for (uint32_t v = 0; rc == 0 && v < c.n_ver; v++)
    for (uint32_t d = 0; d < c.ver[v].n_tok && rc == 0; d++)
      if (c.ver[v].tok[d] >= j->ds[d].n_tok) rc = STK_ECORRUPT;
  if (rc == 0) { /* the versions move into the job */
    j->ver = c.ver;
    j->n_ver = c.n_ver;
    j->next_ver_id = c.next_ver_id;
    c.ver = NULL;
    c.n_ver = 0;
  }
  dl_config_clear(&c);
  if (rc == STK_ECORRUPT) stk_set_detail("corrupt dataloader configuration");
  if (rc < 0) {
    dl_job_free(j);
    return rc;
  }
  *ret_job = j;
  return 0;
}

void dl_commit_clear(struct dl_commit *c) {
  free(c->ver_id);
  free(c->k);
  c->ver_id = c->k = NULL;
}
