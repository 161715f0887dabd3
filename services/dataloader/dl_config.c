/*
 * dl_config: a job's configuration as bytes — the creation spec, the
 * dataset table's specs and the configuration versions — stored in RocksDB
 * (dl_store.c) and carried in exported state (dl_commit.c). Written as DLC2
 * (each version lists its blocked documents); DLC1, written before blocked
 * documents existed, is still read. Reading checks every field and opens
 * nothing: dl_config_decode (dl_job.c) builds the job from what is read.
 */
#include <stdlib.h>
#include <string.h>

#include "dl_codec.h"
#include "dl_internal.h"
#include "stk_error.h"

#define CONFIG_MAGIC_V1 0x31434C44u /* "DLC1": versions without blocked documents */
#define CONFIG_MAGIC    0x32434C44u /* "DLC2": each version lists blocked documents */

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

static int get_versions(struct dl_rbuf *r, const struct dl *dl, struct dl_config *c,
                        bool with_docs) {
  c->next_ver_id = dl_r_u64(r);
  uint32_t n_ver = dl_r_u32(r);
  if (r->failed || n_ver == 0 || n_ver > r->left / 32) return STK_ECORRUPT;
  if (!(c->ver = calloc(n_ver, sizeof *c->ver))) return STK_ENOMEM;
  for (uint32_t v = 0; v < n_ver; v++) {
    int rc = get_version(r, dl, c->n_ds, &c->ver[v], with_docs);
    c->n_ver = v + 1;
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
  if (magic == CONFIG_MAGIC || magic == CONFIG_MAGIC_V1) sp = dl_r_blob(&r, &slen);
  c.spec = sp ? stoker__v1__loader_spec__unpack(NULL, slen, sp) : NULL;
  int rc = c.spec ? get_datasets(&r, &c) : STK_ECORRUPT;
  if (rc == 0) rc = get_versions(&r, dl, &c, magic == CONFIG_MAGIC);
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
  for (uint32_t d = 0; d < c->n_ds; d++) stoker__v1__dataset_spec__free_unpacked(c->ds[d], NULL);
  free(c->ds);
  for (uint32_t v = 0; v < c->n_ver; v++) dl_version_clear(&c->ver[v]);
  free(c->ver);
  memset(c, 0, sizeof *c);
}
