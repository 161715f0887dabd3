/*
 * dl_version: configuration versions (mixture weights, seq_len,
 * global_batch, blocked units and documents, each dataset's tokenizer, each
 * in force from a step on):
 * copies, lookups, the bounds of a shape. Records only: calls nothing of the
 * dataloader.
 */
#include <stdlib.h>
#include <string.h>

#include "dl_internal.h"
#include "stk_error.h"

#define MAX_SEQ_LEN      (1u << 20)
#define MAX_GLOBAL_BATCH (1u << 20)

int dl_check_shape(const struct dl *dl, uint32_t seq_len, uint32_t global_batch) {
  if (seq_len < 1 || seq_len > MAX_SEQ_LEN || global_batch < 1 || global_batch > MAX_GLOBAL_BATCH) {
    stk_set_detail("seq_len must be in [1, %u] and global_batch in [1, %u]", MAX_SEQ_LEN,
                   MAX_GLOBAL_BATCH);
    return STK_EINVAL;
  }
  if ((uint64_t)(seq_len + 1) * 4 > dl->opts.max_batch_bytes) {
    stk_set_detail("one line of seq_len %u exceeds max_batch_bytes", seq_len);
    return STK_EINVAL;
  }
  return 0;
}

void dl_version_clear(struct dl_version *v) {
  free(v->weights);
  free(v->blocked);
  free(v->doc_blocked);
  free(v->tok);
  memset(v, 0, sizeof *v);
}

int dl_version_copy(const struct dl_version *src, struct dl_version *dst) {
  *dst = *src;
  dst->weights = malloc((src->n_weights + 1) * sizeof *dst->weights);
  dst->blocked = malloc((src->n_blocked + 1) * sizeof *dst->blocked);
  dst->doc_blocked = malloc((src->n_doc_blocked + 1) * sizeof *dst->doc_blocked);
  dst->tok = malloc((src->n_tok + 1) * sizeof *dst->tok);
  if (!dst->weights || !dst->blocked || !dst->doc_blocked || !dst->tok) {
    free(dst->weights);
    free(dst->blocked);
    free(dst->doc_blocked);
    free(dst->tok);
    return STK_ENOMEM;
  }
  if (src->n_tok) memcpy(dst->tok, src->tok, src->n_tok * sizeof *dst->tok);
  if (src->n_weights) memcpy(dst->weights, src->weights, src->n_weights * sizeof *dst->weights);
  if (src->n_blocked) memcpy(dst->blocked, src->blocked, src->n_blocked * sizeof *dst->blocked);
  if (src->n_doc_blocked)
    memcpy(dst->doc_blocked, src->doc_blocked, src->n_doc_blocked * sizeof *dst->doc_blocked);
  return 0;
}

static int block_cmp(const void *a, const void *b) {
  const struct dl_block *x = a, *y = b;
  if (x->ds != y->ds) return x->ds < y->ds ? -1 : 1;
  return (x->unit > y->unit) - (x->unit < y->unit);
}

bool dl_version_blocked(const struct dl_version *v, uint32_t ds, uint64_t unit) {
  if (v->n_blocked == 0) return false;
  struct dl_block key = {ds, unit};
  return bsearch(&key, v->blocked, v->n_blocked, sizeof key, block_cmp) != NULL;
}

static int doc_block_cmp(const void *a, const void *b) {
  const struct dl_doc_block *x = a, *y = b;
  if (x->ds != y->ds) return x->ds < y->ds ? -1 : 1;
  if (x->file != y->file) return x->file < y->file ? -1 : 1;
  return (x->doc > y->doc) - (x->doc < y->doc);
}

bool dl_version_doc_blocked(const struct dl_version *v, uint32_t ds, uint32_t file, uint64_t doc) {
  if (v->n_doc_blocked == 0) return false;
  struct dl_doc_block key = {ds, file, doc};
  return bsearch(&key, v->doc_blocked, v->n_doc_blocked, sizeof key, doc_block_cmp) != NULL;
}

bool dl_version_blocks_docs(const struct dl_version *v, uint32_t ds) {
  size_t lo = 0, hi = v->n_doc_blocked; /* first entry with ds >= the dataset */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (v->doc_blocked[mid].ds < ds)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < v->n_doc_blocked && v->doc_blocked[lo].ds == ds;
}

void dl_version_sort_doc_blocked(struct dl_version *v) {
  if (v->n_doc_blocked < 2) return;
  qsort(v->doc_blocked, v->n_doc_blocked, sizeof *v->doc_blocked, doc_block_cmp);
  size_t w = 1;
  for (size_t i = 1; i < v->n_doc_blocked; i++)
    if (doc_block_cmp(&v->doc_blocked[i], &v->doc_blocked[w - 1]) != 0)
      v->doc_blocked[w++] = v->doc_blocked[i];
  v->n_doc_blocked = w;
}

double dl_version_weight(const struct dl_version *v, uint32_t ds) {
  return ds < v->n_weights ? v->weights[ds] : 0;
}

uint32_t dl_version_tok(const struct dl_version *v, uint32_t ds) {
  return ds < v->n_tok ? v->tok[ds] : 0;
}

/* Sorts and removes duplicates (after appending new blocked units). */
void dl_version_sort_blocked(struct dl_version *v) {
  if (v->n_blocked < 2) return;
  qsort(v->blocked, v->n_blocked, sizeof *v->blocked, block_cmp);
  size_t w = 1;
  for (size_t i = 1; i < v->n_blocked; i++)
    if (block_cmp(&v->blocked[i], &v->blocked[w - 1]) != 0) v->blocked[w++] = v->blocked[i];
  v->n_blocked = w;
}
