/*
 * The forward pass, one unit at a time: embeddings, then each transformer
 * block over the residual stream, then the head (final layernorm, logits
 * through the tied token embedding, softmax and loss). Reads top-down like
 * the architecture diagram.
 */
#include "model_internal.h"

#include <math.h>
#include <string.h>

#include "layer.h"
#include "stk_error.h"

int model_set_batch(struct model *m, const int32_t *inputs, const int32_t *targets) {
  size_t BT = (size_t)m->B * m->T;
  for (size_t i = 0; i < BT; i++) {
    if (inputs[i] < 0 || inputs[i] >= m->cfg.vocab_size) return STK_EINVAL;
    if (targets && (targets[i] < 0 || targets[i] >= m->cfg.vocab_size)) return STK_EINVAL;
  }
  memcpy(m->inputs, inputs, BT * sizeof(int32_t));
  if (targets) memcpy(m->targets, targets, BT * sizeof(int32_t));
  m->has_targets = targets != NULL;
  m->fwd_next = 0;
  m->bwd_next = -1;
  m->loss = NAN;
  return 0;
}

/* 0 when every unit `unit` reads has a buffer in `units`. */
static int check_needs(const struct model *m, int unit, float *const *units) {
  int needs[2];
  int n = model_unit_needs(&m->cfg, unit, needs);
  for (int i = 0; i < n; i++)
    if (!units || !units[needs[i]]) return STK_EINVAL;
  return 0;
}

/* Block l: resid[l] -> resid[l + 1]. */
static void block_forward(struct model *m, int l, const struct block_view *p) {
  int B = m->B, T = m->T, C = m->cfg.channels, NH = m->cfg.n_head, N = B * T;
  struct block_acts *a = &m->blocks[l];
  float *x = m->resid + (size_t)l * N * C;         /* (B, T, C) block input */
  float *out = m->resid + (size_t)(l + 1) * N * C; /* (B, T, C) block output */

  layer_layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, p->ln1w, p->ln1b, N, C);
  layer_matmul_forward(a->qkv, a->ln1, p->qkvw, p->qkvb, N, C, 3 * C);
  layer_attention_forward(a->atty, a->att, a->qkv, B, T, C, NH);
  layer_matmul_forward(a->attproj, a->atty, p->attprojw, p->attprojb, N, C, C);
  layer_residual_forward(a->res2, x, a->attproj, N * C);
  layer_layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, p->ln2w, p->ln2b, N, C);
  layer_matmul_forward(a->fch, a->ln2, p->fcw, p->fcb, N, C, 4 * C);
  layer_gelu_forward(a->fch_gelu, a->fch, N * 4 * C);
  layer_matmul_forward(a->fcproj, a->fch_gelu, p->fcprojw, p->fcprojb, N, 4 * C, C);
  layer_residual_forward(out, a->res2, a->fcproj, N * C);
}

/* resid[L] -> lnf -> logits (tied to wte) -> probs, losses, mean loss. */
static void head_forward(struct model *m, const struct head_view *p, const struct embed_view *e) {
  int N = m->B * m->T, C = m->cfg.channels, V = m->cfg.vocab_size;
  float *x = m->resid + (size_t)m->cfg.n_layer * N * C; /* (B, T, C) */

  layer_layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, x, p->lnfw, p->lnfb, N, C);
  layer_matmul_forward(m->logits, m->lnf, e->wte, NULL, N, C, V);
  const int32_t *targets = m->has_targets ? m->targets : NULL;
  layer_softmax_xent_forward(m->probs, targets ? m->losses : NULL, m->logits, targets, N, V);
  if (!targets) return;
  double sum = 0.0;
  for (int i = 0; i < N; i++) sum += m->losses[i];
  m->loss = (float)(sum / N);
}

int model_forward_unit(struct model *m, int unit, float *const *params) {
  int U = model_unit_count(&m->cfg);
  if (unit < 0 || unit >= U) return STK_EINVAL;
  /* Unit 0 (re)starts a pass over the current batch; the others go in order. */
  if (unit != 0 && unit != m->fwd_next) return STK_ESTATE;
  int rc = check_needs(m, unit, params);
  if (rc < 0) return rc;
  if (unit == 0) {
    m->bwd_next = -1;
    m->loss = NAN;
  }
  struct embed_view e;
  struct block_view blk;
  struct head_view h;
  switch (model_unit_kind(&m->cfg, unit)) {
  case MODEL_UNIT_EMBED:
    e = model_embed_view(&m->cfg, params[0]);
    layer_encoder_forward(m->resid, m->inputs, e.wte, e.wpe, m->B, m->T, m->cfg.channels);
    break;
  case MODEL_UNIT_BLOCK:
    blk = model_block_view(&m->cfg, params[unit]);
    block_forward(m, unit - 1, &blk);
    break;
  case MODEL_UNIT_HEAD:
    h = model_head_view(&m->cfg, params[unit]);
    e = model_embed_view(&m->cfg, params[0]);
    head_forward(m, &h, &e);
    break;
  }
  m->fwd_next = unit + 1;
  if (m->fwd_next == U && m->has_targets) m->bwd_next = U - 1;
  return 0;
}

int model_forward(struct model *m, float *const *params, float *ret_loss) {
  for (int k = 0; k < model_unit_count(&m->cfg); k++) {
    int rc = model_forward_unit(m, k, params);
    if (rc < 0) return rc;
  }
  if (ret_loss) *ret_loss = m->loss;
  return 0;
}
