/*
 * dl_version: configuration versions (mixture weights, seq_len,
 * global_batch, blocked units and documents, each in force from a step on) and the
 * serialized configuration of a job.
 */
#include <stdlib.h>
#include <string.h>

#include "dl_codec.h"
#include "dl_internal.h"
#include "stk_error.h"

#define CONFIG_MAGIC_V1 0x31434C44u /* "DLC1": versions without blocked documents */
#define CONFIG_MAGIC    0x32434C44u /* "DLC2": each version lists blocked documents */

void dl_version_clear(struct dl_version *v) {
  free(v->weights);
  free(v->blocked);
  free(v->doc_blocked);
  memset(v, 0, sizeof *v);
}

int dl_version_copy(const struct dl_version *src, struct dl_version *dst) {
  *dst = *src;
  dst->weights = malloc((src->n_weights + 1) * sizeof *dst->weights);
  dst->blocked = malloc((src->n_blocked + 1) * sizeof *dst->blocked);
  dst->doc_blocked = malloc((src->n_doc_blocked + 1) * sizeof *dst->doc_blocked);
  if (!dst->weights || !dst->blocked || !dst->doc_blocked) {
    free(dst->weights);
    free(dst->blocked);
    free(dst->doc_blocked);
    return STK_ENOMEM;
  }
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

/* Sorts and removes duplicates (after appending new blocked units). */
void dl_version_sort_blocked(struct dl_version *v) {
  if (v->n_blocked < 2) return;
  qsort(v->blocked, v->n_blocked, sizeof *v->blocked, block_cmp);
  size_t w = 1;
  for (size_t i = 1; i < v->n_blocked; i++)
    if (block_cmp(&v->blocked[i], &v->blocked[w - 1]) != 0) v->blocked[w++] = v->blocked[i];
  v->n_blocked = w;
}

static void put_packed(struct dl_wbuf *w, const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) {
    w->failed = true;
    return;
  }
  protobuf_c_message_pack(m, buf);
  dl_w_blob(w, buf, n);
  free(buf);
}

static void put_version(struct dl_wbuf *w, const struct dl_version *v) {
  dl_w_u64(w, v->id);
  dl_w_u64(w, (uint64_t)v->from_step);
  dl_w_u32(w, v->seq_len);
  dl_w_u32(w, v->global_batch);
  dl_w_u32(w, v->n_weights);
  for (uint32_t i = 0; i < v->n_weights; i++) dl_w_f64(w, v->weights[i]);
  dl_w_u64(w, v->n_blocked);
  for (size_t i = 0; i < v->n_blocked; i++) {
    dl_w_u32(w, v->blocked[i].ds);
    dl_w_u64(w, v->blocked[i].unit);
  }
  dl_w_u64(w, v->n_doc_blocked);
  for (size_t i = 0; i < v->n_doc_blocked; i++) {
    dl_w_u32(w, v->doc_blocked[i].ds);
    dl_w_u32(w, v->doc_blocked[i].file);
    dl_w_u64(w, v->doc_blocked[i].doc);
  }
}

int dl_config_encode(const struct dl_job *j, uint8_t **ret, size_t *ret_len) {
  struct dl_wbuf w = {0};
  dl_w_u32(&w, CONFIG_MAGIC);
  put_packed(&w, &j->spec->base);
  dl_w_u32(&w, j->n_ds);
  for (uint32_t d = 0; d < j->n_ds; d++) put_packed(&w, &j->ds[d].spec->base);
  dl_w_u64(&w, j->next_ver_id);
  dl_w_u32(&w, j->n_ver);
  for (uint32_t v = 0; v < j->n_ver; v++) put_version(&w, &j->ver[v]);
  if (w.failed) {
    free(w.data);
    return STK_ENOMEM;
  }
  *ret = w.data;
  *ret_len = w.len;
  return 0;
}

/* DLC2's blocked documents, each naming a dataset of the table. */
static int get_doc_blocks(struct dl_rbuf *r, const struct dl_job *j, struct dl_version *v) {
  uint64_t nb = dl_r_u64(r);
  if (r->failed || nb > r->left / 16) return STK_ECORRUPT;
  v->doc_blocked = calloc(nb + 1, sizeof *v->doc_blocked);
  if (!v->doc_blocked) return STK_ENOMEM;
  for (uint64_t i = 0; i < nb; i++) {
    v->doc_blocked[i].ds = dl_r_u32(r);
    v->doc_blocked[i].file = dl_r_u32(r);
    v->doc_blocked[i].doc = dl_r_u64(r);
    if (v->doc_blocked[i].ds >= j->n_ds) return STK_ECORRUPT;
  }
  v->n_doc_blocked = nb;
  return r->failed ? STK_ECORRUPT : 0;
}

static int get_version(struct dl_rbuf *r, const struct dl_job *j, struct dl_version *v,
                       bool with_docs) {
  v->id = dl_r_u64(r);
  v->from_step = (int64_t)dl_r_u64(r);
  v->seq_len = dl_r_u32(r);
  v->global_batch = dl_r_u32(r);
  v->n_weights = dl_r_u32(r);
  if (r->failed || v->n_weights > j->n_ds || v->from_step < 0 ||
      dl_check_shape(j->dl, v->seq_len, v->global_batch) < 0)
    return STK_ECORRUPT;
  v->weights = calloc(v->n_weights + 1, sizeof *v->weights);
  if (!v->weights) return STK_ENOMEM;
  for (uint32_t i = 0; i < v->n_weights; i++) v->weights[i] = dl_r_f64(r);
  uint64_t nb = dl_r_u64(r);
  if (r->failed || nb > r->left / 12) return STK_ECORRUPT;
  v->blocked = calloc(nb + 1, sizeof *v->blocked);
  if (!v->blocked) return STK_ENOMEM;
  for (uint64_t i = 0; i < nb; i++) {
    v->blocked[i].ds = dl_r_u32(r);
    v->blocked[i].unit = dl_r_u64(r);
  }
  v->n_blocked = nb;
  if (r->failed) return STK_ECORRUPT;
  if (!with_docs) return (v->doc_blocked = calloc(1, sizeof *v->doc_blocked)) ? 0 : STK_ENOMEM;
  return get_doc_blocks(r, j, v);
}

static int decode_tables(struct dl *dl, struct dl_rbuf *r, struct dl_job *j, bool with_docs) {
  uint32_t n_ds = dl_r_u32(r);
  if (r->failed || n_ds == 0) return STK_ECORRUPT;
  for (uint32_t d = 0; d < n_ds; d++) {
    size_t len;
    const uint8_t *p = dl_r_blob(r, &len);
    Stoker__V1__DatasetSpec *ds = p ? stoker__v1__dataset_spec__unpack(NULL, len, p) : NULL;
    if (!ds) return STK_ECORRUPT;
    int rc = dl_ds_add(dl, j, ds);
    stoker__v1__dataset_spec__free_unpacked(ds, NULL);
    if (rc < 0) return rc;
  }
  j->next_ver_id = dl_r_u64(r);
  uint32_t n_ver = dl_r_u32(r);
  if (r->failed || n_ver == 0 || n_ver > r->left / 32) return STK_ECORRUPT;
  if (!(j->ver = calloc(n_ver, sizeof *j->ver))) return STK_ENOMEM;
  for (uint32_t v = 0; v < n_ver; v++) {
    int rc = get_version(r, j, &j->ver[v], with_docs);
    j->n_ver = v + 1;
    if (rc < 0) return rc;
    if (j->ver[v].id >= j->next_ver_id || (v > 0 && j->ver[v].from_step <= j->ver[v - 1].from_step))
      return STK_ECORRUPT;
  }
  return j->ver[0].from_step == 0 ? 0 : STK_ECORRUPT;
}

int dl_config_decode(struct dl *dl, const uint8_t *p, size_t len, struct dl_job **ret_job) {
  struct dl_rbuf r = {.p = p, .left = len};
  size_t slen;
  const uint8_t *sp = NULL;
  uint32_t magic = dl_r_u32(&r);
  if (magic == CONFIG_MAGIC || magic == CONFIG_MAGIC_V1) sp = dl_r_blob(&r, &slen);
  Stoker__V1__LoaderSpec *spec = sp ? stoker__v1__loader_spec__unpack(NULL, slen, sp) : NULL;
  if (!spec) {
    stk_set_detail("corrupt dataloader configuration");
    return STK_ECORRUPT;
  }
  struct dl_job *j = NULL;
  int rc = dl_job_alloc(dl, spec, &j);
  stoker__v1__loader_spec__free_unpacked(spec, NULL);
  if (rc == 0) rc = decode_tables(dl, &r, j, magic == CONFIG_MAGIC);
  if (rc == STK_ECORRUPT) stk_set_detail("corrupt dataloader configuration");
  if (rc < 0) {
    dl_job_free(j);
    return rc;
  }
  *ret_job = j;
  return 0;
}
