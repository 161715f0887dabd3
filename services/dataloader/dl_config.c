/*
 * dl_config: a job's configuration as bytes — the creation spec, the
 * dataset table's specs and the configuration versions — stored in RocksDB
 * (dl_store.c) and carried in exported state (dl_commit.c). Written as DLC2
 * (each version lists its blocked documents), or DLC3 once a version chose
 * another tokenizer for a dataset (DLC2 plus each dataset's later
 * tokenizers and each version's choice among them), so a job that never
 * changes one is stored as before; DLC1, written before blocked documents
 * existed, is still read. Reading checks every field and opens
 * nothing: dl_config_decode (dl_job.c) builds the job from what is read.
 */
#include <stdlib.h>
#include <string.h>

#include "dl_codec.h"
#include "dl_internal.h"
#include "stk_error.h"

#define CONFIG_MAGIC_V1 0x31434C44u /* "DLC1": versions without blocked documents */
#define CONFIG_MAGIC    0x32434C44u /* "DLC2": each version lists blocked documents */
#define CONFIG_MAGIC_V3 0x33434C44u /* "DLC3": DLC2 with tokenizers per dataset and version */

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

static void put_version(struct dl_wbuf *w, const struct dl_version *v, bool toks) {
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
  if (!toks) return;
  dl_w_u32(w, v->n_tok);
  for (uint32_t i = 0; i < v->n_tok; i++) dl_w_u32(w, v->tok[i]);
}

int dl_config_encode(const struct dl_job *j, uint8_t **ret, size_t *ret_len) {
  struct dl_wbuf w = {0};
  bool toks = false;
  for (uint32_t d = 0; d < j->n_ds; d++) toks |= j->ds[d].n_tok > 1;
  dl_w_u32(&w, toks ? CONFIG_MAGIC_V3 : CONFIG_MAGIC);
  put_packed(&w, &j->spec->base);
  dl_w_u32(&w, j->n_ds);
  for (uint32_t d = 0; d < j->n_ds; d++) put_packed(&w, &j->ds[d].spec->base);
  for (uint32_t d = 0; toks && d < j->n_ds; d++) {
    dl_w_u32(&w, j->ds[d].n_tok - 1);
    for (uint32_t t = 1; t < j->ds[d].n_tok; t++)
      dl_w_blob(&w, j->ds[d].tok_name[t], strlen(j->ds[d].tok_name[t]));
  }
  dl_w_u64(&w, j->next_ver_id);
  dl_w_u32(&w, j->n_ver);
  for (uint32_t v = 0; v < j->n_ver; v++) put_version(&w, &j->ver[v], toks);
  if (w.failed) {
    free(w.data);
    return STK_ENOMEM;
  }
  *ret = w.data;
  *ret_len = w.len;
  return 0;
}

/* DLC2's blocked documents, each naming a dataset of the table. */
static int get_doc_blocks(struct dl_rbuf *r, uint32_t n_ds, struct dl_version *v) {
  uint64_t nb = dl_r_u64(r);
  if (r->failed || nb > r->left / 16) return STK_ECORRUPT;
  v->doc_blocked = calloc(nb + 1, sizeof *v->doc_blocked);
  if (!v->doc_blocked) return STK_ENOMEM;
  for (uint64_t i = 0; i < nb; i++) {
    v->doc_blocked[i].ds = dl_r_u32(r);
    v->doc_blocked[i].file = dl_r_u32(r);
    v->doc_blocked[i].doc = dl_r_u64(r);
    if (v->doc_blocked[i].ds >= n_ds) return STK_ECORRUPT;
  }
  v->n_doc_blocked = nb;
  return r->failed ? STK_ECORRUPT : 0;
}

/* DLC3's tokenizer choice per dataset, each naming one of its tokenizers. */
static int get_toks(struct dl_rbuf *r, const struct dl_config *c, struct dl_version *v) {
  uint32_t n = dl_r_u32(r);
  if (r->failed || n > c->n_ds) return STK_ECORRUPT;
  if (!(v->tok = calloc(n + 1, sizeof *v->tok))) return STK_ENOMEM;
  for (uint32_t d = 0; d < n; d++) {
    v->tok[d] = dl_r_u32(r);
    if (v->tok[d] > c->n_alt[d]) return STK_ECORRUPT;
  }
  v->n_tok = n;
  return r->failed ? STK_ECORRUPT : 0;
}

static int get_version(struct dl_rbuf *r, const struct dl *dl, uint32_t n_ds, struct dl_version *v,
                       bool with_docs) {
  v->id = dl_r_u64(r);
  v->from_step = (int64_t)dl_r_u64(r);
  v->seq_len = dl_r_u32(r);
  v->global_batch = dl_r_u32(r);
  v->n_weights = dl_r_u32(r);
  if (r->failed || v->n_weights > n_ds || v->from_step < 0 ||
      dl_check_shape(dl, v->seq_len, v->global_batch) < 0)
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
  return get_doc_blocks(r, n_ds, v);
}

/* DLC3: each dataset's tokenizers past its spec's, as names. */
static int get_alt(struct dl_rbuf *r, struct dl_config *c) {
  if (!(c->alt = calloc(c->n_ds, sizeof *c->alt)) ||
      !(c->n_alt = calloc(c->n_ds, sizeof *c->n_alt)))
    return STK_ENOMEM;
  for (uint32_t d = 0; d < c->n_ds; d++) {
    uint32_t n = dl_r_u32(r);
    if (r->failed || n > r->left) return STK_ECORRUPT;
    if (!(c->alt[d] = calloc(n + 1, sizeof *c->alt[d]))) return STK_ENOMEM;
    for (uint32_t t = 0; t < n; t++) {
      size_t len;
      const uint8_t *p = dl_r_blob(r, &len);
      if (!p || len == 0 || memchr(p, 0, len)) return STK_ECORRUPT;
      if (!(c->alt[d][t] = strndup((const char *)p, len))) return STK_ENOMEM;
      c->n_alt[d] = t + 1;
    }
  }
  return 0;
}

/* The dataset table: at least one spec. */
static int get_datasets(struct dl_rbuf *r, struct dl_config *c) {
  uint32_t n_ds = dl_r_u32(r);
  if (r->failed || n_ds == 0 || n_ds > r->left) return STK_ECORRUPT;
  if (!(c->ds = calloc(n_ds, sizeof *c->ds))) return STK_ENOMEM;
  for (uint32_t d = 0; d < n_ds; d++) {
    size_t len;
    const uint8_t *p = dl_r_blob(r, &len);
    if (!p || !(c->ds[d] = stoker__v1__dataset_spec__unpack(NULL, len, p))) return STK_ECORRUPT;
    c->n_ds = d + 1;
  }
  return 0;
}

static int get_versions(struct dl_rbuf *r, const struct dl *dl, struct dl_config *c, bool with_docs,
                        bool with_toks) {
  c->next_ver_id = dl_r_u64(r);
  uint32_t n_ver = dl_r_u32(r);
  if (r->failed || n_ver == 0 || n_ver > r->left / 32) return STK_ECORRUPT;
  if (!(c->ver = calloc(n_ver, sizeof *c->ver))) return STK_ENOMEM;
  for (uint32_t v = 0; v < n_ver; v++) {
    int rc = get_version(r, dl, c->n_ds, &c->ver[v], with_docs);
    c->n_ver = v + 1;
    if (rc == 0 && with_toks) rc = get_toks(r, c, &c->ver[v]);
    if (rc < 0) return rc;
    if (c->ver[v].id >= c->next_ver_id || (v > 0 && c->ver[v].from_step <= c->ver[v - 1].from_step))
      return STK_ECORRUPT;
  }
  return c->ver[0].from_step == 0 ? 0 : STK_ECORRUPT;
}

int dl_config_read(const struct dl *dl, const uint8_t *p, size_t len, struct dl_config *ret) {
  struct dl_rbuf r = {.p = p, .left = len};
  struct dl_config c = {0};
  size_t slen;
  const uint8_t *sp = NULL;
  uint32_t magic = dl_r_u32(&r);
  if (magic == CONFIG_MAGIC_V3 || magic == CONFIG_MAGIC || magic == CONFIG_MAGIC_V1)
    sp = dl_r_blob(&r, &slen);
  c.spec = sp ? stoker__v1__loader_spec__unpack(NULL, slen, sp) : NULL;
  int rc = c.spec ? get_datasets(&r, &c) : STK_ECORRUPT;
  bool v3 = magic == CONFIG_MAGIC_V3;
  if (rc == 0 && v3) rc = get_alt(&r, &c);
  if (rc == 0) rc = get_versions(&r, dl, &c, magic != CONFIG_MAGIC_V1, v3);
  if (rc == STK_ECORRUPT) stk_set_detail("corrupt dataloader configuration");
  if (rc < 0) {
    dl_config_clear(&c);
    return rc;
  }
  *ret = c;
  return 0;
}

void dl_config_clear(struct dl_config *c) {
  if (c->spec) stoker__v1__loader_spec__free_unpacked(c->spec, NULL);
  for (uint32_t d = 0; d < c->n_ds; d++) {
    stoker__v1__dataset_spec__free_unpacked(c->ds[d], NULL);
    for (uint32_t t = 0; c->alt && c->alt[d] && t < c->n_alt[d]; t++) free(c->alt[d][t]);
    if (c->alt) free(c->alt[d]);
  }
  free(c->ds);
  free(c->alt);
  free(c->n_alt);
  for (uint32_t v = 0; v < c->n_ver; v++) dl_version_clear(&c->ver[v]);
  free(c->ver);
  memset(c, 0, sizeof *c);
}
