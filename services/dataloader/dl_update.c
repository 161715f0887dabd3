/*
 * dl_update: UpdateMixture — a new configuration version from a step on.
 * The new version starts from the one in force at from_step and changes
 * what the request names: mixture (new datasets opened and appended to the
 * job's table; a known dataset keeps its position, so nothing repeats, and
 * may be read with another tokenizer: text datasets, opened once more with
 * it), seq_len, global_batch, blocked units and documents. The datasets are
 * checked by the function CreateLoader's are (dl_check_datasets). Versions at or after from_step
 * are replaced. Everything is validated and built aside, stored with a synced write, and only then
 * swapped in; a failure changes nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "dl_internal.h"
#include "stk_error.h"

/* Weights of the new mixture; opens datasets not yet in the table. */
/* The new mixture: checked as CreateLoader checks its datasets; a known
 * dataset may change its weight and its tokenizer (empty: the one in
 * force), nothing else; a new one is opened and appended to the table. */
static int set_mixture(struct dl *dl, struct dl_job *j, const Stoker__V1__UpdateMixtureRequest *req,
                       struct dl_version *v) {
  int rc = dl_check_datasets(req->datasets, req->n_datasets);
  for (size_t i = 0; rc == 0 && i < req->n_datasets; i++) {
    int d = dl_ds_find(j, req->datasets[i]->name);
    if (d >= 0) rc = dl_ds_check_same(j, (uint32_t)d, req->datasets[i]);
  }
  for (size_t i = 0; rc == 0 && i < req->n_datasets; i++)
    if (dl_ds_find(j, req->datasets[i]->name) < 0) rc = dl_ds_add(dl, j, req->datasets[i]);
  if (rc < 0) return rc;
  double *w = calloc(j->n_ds, sizeof *w);
  uint32_t *tok = calloc(j->n_ds, sizeof *tok);
  if (!w || !tok) {
    free(w);
    free(tok);
    return STK_ENOMEM;
  }
  for (uint32_t d = 0; d < j->n_ds; d++) tok[d] = dl_version_tok(v, d);
  free(v->weights);
  free(v->tok);
  v->weights = w;
  v->n_weights = j->n_ds;
  v->tok = tok;
  v->n_tok = j->n_ds;
  for (size_t i = 0; rc == 0 && i < req->n_datasets; i++) {
    const Stoker__V1__DatasetSpec *spec = req->datasets[i];
    uint32_t d = (uint32_t)dl_ds_find(j, spec->name);
    w[d] = spec->weight;
    if (spec->tokenizer && *spec->tokenizer)
      rc = dl_ds_tokenizer(dl, j, d, spec->tokenizer, &tok[d]);
  }
  return rc;
}

static int add_blocks(struct dl_job *j, const Stoker__V1__UpdateMixtureRequest *req,
                      struct dl_version *v) {
  if (req->n_block == 0) return 0;
  if (req->n_block > (1u << 20) || v->n_blocked + req->n_block > (1u << 24)) {
    stk_set_detail("too many blocked units");
    return STK_EINVAL;
  }
  struct dl_block *b = realloc(v->blocked, (v->n_blocked + req->n_block) * sizeof *b);
  if (!b) return STK_ENOMEM;
  v->blocked = b;
  for (size_t i = 0; i < req->n_block; i++) {
    const Stoker__V1__UnitRef *u = req->block[i];
    int d = u->dataset ? dl_ds_find(j, u->dataset) : -1;
    if (d < 0 || u->unit >= j->ds[d].units) {
      stk_set_detail("block: no unit %llu in dataset '%s'", (unsigned long long)u->unit,
                     u->dataset ? u->dataset : "");
      return STK_EINVAL;
    }
    b[v->n_blocked++] = (struct dl_block){.ds = (uint32_t)d, .unit = u->unit};
  }
  dl_version_sort_blocked(v);
  return 0;
}

/* Blocked documents: each names a dataset of the job, one of its files (as
 * Explain names it) and a document of that file (counting the file's
 * documents may build its index: one pass over the file). */
static int add_doc_blocks(struct dl_job *j, const Stoker__V1__UpdateMixtureRequest *req,
                          struct dl_version *v) {
  if (req->n_block_documents == 0) return 0;
  if (req->n_block_documents > (1u << 20) ||
      v->n_doc_blocked + req->n_block_documents > (1u << 24)) {
    stk_set_detail("too many blocked documents");
    return STK_EINVAL;
  }
  struct dl_doc_block *b =
      realloc(v->doc_blocked, (v->n_doc_blocked + req->n_block_documents) * sizeof *b);
  if (!b) return STK_ENOMEM;
  v->doc_blocked = b;
  const Stoker__V1__DocumentRef *prev = NULL; /* refs usually come grouped by file */
  int d = -1;
  uint32_t file = 0;
  uint64_t docs = 0;
  for (size_t i = 0; i < req->n_block_documents; i++) {
    const Stoker__V1__DocumentRef *r = req->block_documents[i];
    int rc = 0;
    if (!prev || !r->dataset || !r->file || strcmp(r->dataset, prev->dataset) != 0 ||
        strcmp(r->file, prev->file) != 0) {
      prev = NULL;
      d = r->dataset ? dl_ds_find(j, r->dataset) : -1;
      rc = d < 0 ? STK_EINVAL : dl_source_find_file(j->ds[d].src, r->file, &file);
      if (rc == 0) rc = dl_source_file_docs(j->ds[d].src, file, &docs);
      if (rc == 0) prev = r;
    }
    if (rc == STK_ENOMEM) return rc;
    if (rc < 0 || r->document >= docs) {
      stk_set_detail("block_documents: no document %llu in file '%s' of dataset '%s'",
                     (unsigned long long)r->document, r->file ? r->file : "",
                     r->dataset ? r->dataset : "");
      return STK_EINVAL;
    }
    b[v->n_doc_blocked++] =
        (struct dl_doc_block){.ds = (uint32_t)d, .file = file, .doc = r->document};
  }
  dl_version_sort_doc_blocked(v);
  return 0;
}

static int check_step(struct dl *dl, struct dl_job *j, int64_t from) {
  int64_t committed = -1;
  for (uint32_t i = 0; i < j->n_commits; i++)
    if (j->commits[i].step > committed) committed = j->commits[i].step;
  if (from < 0 || from > dl->opts.max_step || from <= committed) {
    stk_set_detail("from_step %lld must be after the committed step %lld and <= %lld",
                   (long long)from, (long long)committed, (long long)dl->opts.max_step);
    return STK_EINVAL;
  }
  return 0;
}

/* Builds the version list with v appended after the versions before from. */
static int build(struct dl_job *j, struct dl_version *v, struct dl_version **ret, uint32_t *ret_n) {
  uint32_t keep = 0;
  while (keep < j->n_ver && j->ver[keep].from_step < v->from_step) keep++;
  struct dl_version *list = calloc(keep + 1, sizeof *list);
  if (!list) return STK_ENOMEM;
  for (uint32_t i = 0; i < keep; i++)
    if (dl_version_copy(&j->ver[i], &list[i]) < 0) {
      for (uint32_t k = 0; k < i; k++) dl_version_clear(&list[k]);
      free(list);
      return STK_ENOMEM;
    }
  list[keep] = *v;
  *ret = list;
  *ret_n = keep + 1;
  return 0;
}

static int make_version(struct dl *dl, struct dl_job *j,
                        const Stoker__V1__UpdateMixtureRequest *req, struct dl_version *v) {
  int rc = check_step(dl, j, req->from_step);
  if (rc < 0) return rc;
  if ((rc = dl_version_copy(&j->ver[dl_version_of_step(j, req->from_step)], v)) < 0) return rc;
  v->from_step = req->from_step;
  v->id = j->next_ver_id;
  if (req->seq_len) v->seq_len = req->seq_len;
  if (req->global_batch) v->global_batch = req->global_batch;
  rc = dl_check_shape(dl, v->seq_len, v->global_batch);
  if (rc == 0 && req->n_datasets) rc = set_mixture(dl, j, req, v);
  if (rc == 0) rc = add_blocks(j, req, v);
  if (rc == 0) rc = add_doc_blocks(j, req, v);
  return rc;
}

/* Takes back the datasets and tokenizers a failed update opened (n_tok:
 * each older dataset's tokenizer count before). */
static void drop_datasets(struct dl_job *j, uint32_t n_ds, const uint32_t *n_tok) {
  while (j->n_ds > n_ds) {
    dl_ds_clear(&j->ds[--j->n_ds]);
  }
  for (uint32_t d = 0; n_tok && d < n_ds; d++) dl_ds_drop_tokenizers(&j->ds[d], n_tok[d]);
}

static int apply(struct dl *dl, struct dl_job *j, const Stoker__V1__UpdateMixtureRequest *req) {
  struct dl_version v = {0}, *list = NULL, *old = j->ver;
  uint32_t n_ds = j->n_ds, n = 0, old_n = j->n_ver;
  uint32_t *n_tok = malloc((n_ds + 1) * sizeof *n_tok);
  if (!n_tok) return STK_ENOMEM;
  for (uint32_t d = 0; d < n_ds; d++) n_tok[d] = j->ds[d].n_tok;
  int rc = make_version(dl, j, req, &v);
  if (rc == 0) rc = build(j, &v, &list, &n);
  if (rc == 0) {
    j->ver = list;
    j->n_ver = n;
    j->next_ver_id++;
    if ((rc = dl_store_put_config(dl, j, false)) < 0) {
      j->ver = old;
      j->n_ver = old_n;
      j->next_ver_id--;
      old = list;
      old_n = n;
    }
  } else {
    dl_version_clear(&v);
  }
  if (rc < 0) drop_datasets(j, n_ds, n_tok);
  free(n_tok);
  if (list) {
    for (uint32_t i = 0; i < old_n; i++) dl_version_clear(&old[i]);
    free(old);
  }
  if (rc == 0) dl_snaps_reindex(j);
  return rc;
}

int dl_update_mixture(struct dl *dl, const Stoker__V1__UpdateMixtureRequest *req) {
  if (!req) return STK_EINVAL;
  struct dl_job *j = NULL;
  int rc = dl_job_get(dl, req->job, &j);
  if (rc < 0) return rc;
  pthread_rwlock_wrlock(&j->lock);
  if (j->deleted) { /* DeleteLoader won: writing now would bring keys back */
    stk_set_detail("no dataloader job '%s'", j->name);
    rc = STK_ENOENT;
  }
  if (rc == 0) rc = apply(dl, j, req);
  pthread_rwlock_unlock(&j->lock);
  dl_job_put(dl, j);
  return rc;
}
