/*
 * dl_lane_codec: a lane generator's state as a blob (a snapshot). The blob
 * holds the pointer state only (version id, line, unit, offset, per-shard
 * counts): O(shards of the lane), never tokens. Restoring re-reads the
 * current unit, so a restored generator continues with identical bytes.
 * A lane whose unit was read from a place (a version changed its dataset's
 * tokenizer in the middle of it, dl_lane.c) writes DLG2, which adds that
 * place after the offset; every other lane writes DLG1 as before.
 */
#include <stdlib.h>

#include "dl_codec.h"
#include "dl_internal.h"
#include "stk_error.h"

#define GEN_MAGIC    0x31474C44u /* "DLG1" */
#define GEN_MAGIC_V2 0x32474C44u /* "DLG2": DLG1 with the place a unit was read from */

int dl_gen_encode(const struct dl_job *j, const struct dl_gen *g, uint8_t **ret, size_t *ret_len) {
  struct dl_wbuf w = {0};
  bool placed = g->cur_ds >= 0 && g->res_rel;
  dl_w_u32(&w, placed ? GEN_MAGIC_V2 : GEN_MAGIC);
  dl_w_u64(&w, j->ver[g->vi].id);
  dl_w_u64(&w, g->k);
  dl_w_u32(&w, (uint32_t)g->cur_ds);
  dl_w_u32(&w, g->cur_epoch);
  dl_w_u64(&w, g->cur_unit);
  dl_w_u64(&w, g->off);
  if (placed) {
    dl_w_u32(&w, g->res_rel);
    dl_w_u64(&w, g->res_byte);
    dl_w_u8(&w, g->res_lead);
  }
  dl_w_u32(&w, g->n_ds);
  for (uint32_t d = 0; d < g->n_ds; d++) {
    const struct dl_lds *s = &g->ds[d];
    dl_w_u32(&w, s->epoch);
    dl_w_u32(&w, s->rr);
    dl_w_u64(&w, s->left);
    dl_w_u64(&w, s->taken + ((int32_t)d == g->cur_ds ? dl_gen_charge_due(j, g) : 0));
    dl_w_u8(&w, s->flags);
    dl_w_u32(&w, s->n_pos);
    for (uint32_t i = 0; i < s->n_pos; i++) dl_w_u64(&w, s->pos[i]);
  }
  if (w.failed) {
    free(w.data);
    return STK_ENOMEM;
  }
  *ret = w.data;
  *ret_len = w.len;
  return 0;
}

static int decode_lds(struct dl_rbuf *r, struct dl_lds *s) {
  s->epoch = dl_r_u32(r);
  s->rr = dl_r_u32(r);
  s->left = dl_r_u64(r);
  s->taken = dl_r_u64(r);
  s->flags = dl_r_u8(r);
  uint32_t n_pos = dl_r_u32(r);
  if (r->failed || n_pos != s->n_pos || (n_pos && s->rr >= n_pos)) return STK_ECORRUPT;
  for (uint32_t i = 0; i < n_pos; i++) s->pos[i] = dl_r_u64(r);
  return r->failed ? STK_ECORRUPT : 0;
}

static int decode_body(struct dl_job *j, uint32_t c, struct dl_rbuf *r, struct dl_gen *g) {
  uint32_t magic = dl_r_u32(r);
  if (magic != GEN_MAGIC && magic != GEN_MAGIC_V2) return STK_ECORRUPT;
  if (dl_version_index(j, dl_r_u64(r), &g->vi) < 0) return STK_ECORRUPT;
  g->k = dl_r_u64(r);
  uint32_t cur = dl_r_u32(r);
  g->cur_epoch = dl_r_u32(r);
  g->cur_unit = dl_r_u64(r);
  g->off = dl_r_u64(r);
  if (magic == GEN_MAGIC_V2) {
    g->res_rel = dl_r_u32(r);
    g->res_byte = dl_r_u64(r);
    uint8_t lead = dl_r_u8(r);
    if (g->res_rel == 0 || lead > 1) return STK_ECORRUPT;
    g->res_lead = lead;
  }
  uint32_t n_ds = dl_r_u32(r);
  if (r->failed || n_ds > j->n_ds) return STK_ECORRUPT;
  int rc = dl_gen_fit(j, c, g);
  for (uint32_t d = 0; rc == 0 && d < n_ds; d++) rc = decode_lds(r, &g->ds[d]);
  if (rc < 0) return rc;
  g->cur_ds = (int32_t)cur;
  if (g->cur_ds < 0) return 0;
  if ((uint32_t)g->cur_ds >= j->n_ds || g->cur_unit >= j->ds[cur].units) return STK_ECORRUPT;
  if ((rc = dl_gen_load_unit(j, g, cur, g->cur_unit)) < 0) return rc;
  return dl_gen_resume_unit(j, g);
}

int dl_gen_decode(struct dl_job *j, uint32_t c, const uint8_t *p, size_t len, struct dl_gen *g) {
  dl_gen_reset(g);
  struct dl_rbuf r = {.p = p, .left = len};
  int rc = decode_body(j, c, &r, g);
  if (rc == STK_ECORRUPT) stk_set_detail("job %s lane %u: corrupt lane snapshot", j->name, c);
  if (rc < 0) dl_gen_reset(g);
  return rc;
}
