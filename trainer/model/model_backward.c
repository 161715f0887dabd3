/*
 * The backward pass, one unit at a time in reverse: the head (loss, tied LM
 * head, final layernorm), each block from its output back to its input, and
 * the embeddings. g.dres carries the gradient of the residual stream from
 * one unit to the next; every parameter gradient is added into the caller's
 * per-unit buffers.
 */
#include "model_internal.h"

#include <string.h>

#include "layer.h"
#include "stk_error.h"

static void zero(float *p, size_t n) {
  memset(p, 0, n * sizeof(float));
}

/* Loss -> dlogits -> dlnf (and dwte) -> dres = gradient of resid[L]. */
static void head_backward(struct model *m, const struct head_view *p, const struct embed_view *e,
                          const struct head_view *dp, const struct embed_view *de) {
  int N = m->B * m->T, C = m->cfg.channels, V = m->cfg.vocab_size;
  struct grad_acts *g = &m->g;
  float *x = m->resid + (size_t)m->cfg.n_layer * N * C; /* (B, T, C) */

  zero(g->dlogits, (size_t)N * V);
  layer_softmax_xent_backward(g->dlogits, m->probs, m->targets, 1.0f / (float)N, N, V);
  zero(g->dln, (size_t)N * C);
  layer_matmul_backward(g->dln, de->wte, NULL, g->dlogits, m->lnf, e->wte, N, C, V);
  zero(g->dres, (size_t)N * C);
  layer_layernorm_backward(g->dres, dp->lnfw, dp->lnfb, g->dln, x, p->lnfw, m->lnf_mean,
                           m->lnf_rstd, N, C);
}

/* The MLP half of block l: dres (gradient of the block output) -> dres2. */
static void mlp_backward(struct model *m, int l, const struct block_view *p,
                         const struct block_view *dp) {
  int N = m->B * m->T, C = m->cfg.channels;
  struct block_acts *a = &m->blocks[l];
  struct grad_acts *g = &m->g;

  memcpy(g->dres2, g->dres, (size_t)N * C * sizeof(float)); /* out = res2 + fcproj */
  zero(g->dfch_gelu, (size_t)N * 4 * C);
  layer_matmul_backward(g->dfch_gelu, dp->fcprojw, dp->fcprojb, g->dres, a->fch_gelu, p->fcprojw, N,
                        4 * C, C);
  zero(g->dfch, (size_t)N * 4 * C);
  layer_gelu_backward(g->dfch, a->fch, g->dfch_gelu, N * 4 * C);
  zero(g->dln, (size_t)N * C);
  layer_matmul_backward(g->dln, dp->fcw, dp->fcb, g->dfch, a->ln2, p->fcw, N, C, 4 * C);
  layer_layernorm_backward(g->dres2, dp->ln2w, dp->ln2b, g->dln, a->res2, p->ln2w, a->ln2_mean,
                           a->ln2_rstd, N, C);
}

/* The attention half of block l: dres2 -> dres (gradient of the block input). */
static void attention_backward(struct model *m, int l, const struct block_view *p,
                               const struct block_view *dp) {
  int B = m->B, T = m->T, C = m->cfg.channels, NH = m->cfg.n_head, N = B * T;
  struct block_acts *a = &m->blocks[l];
  struct grad_acts *g = &m->g;
  float *x = m->resid + (size_t)l * N * C; /* (B, T, C) block input */

  zero(g->datty, (size_t)N * C);
  layer_matmul_backward(g->datty, dp->attprojw, dp->attprojb, g->dres2, a->atty, p->attprojw, N, C,
                        C);
  zero(g->dqkv, (size_t)N * 3 * C);
  layer_attention_backward(g->dqkv, g->datt, g->datty, a->qkv, a->att, B, T, C, NH);
  zero(g->dln, (size_t)N * C);
  layer_matmul_backward(g->dln, dp->qkvw, dp->qkvb, g->dqkv, a->ln1, p->qkvw, N, C, 3 * C);
  memcpy(g->dres, g->dres2, (size_t)N * C * sizeof(float)); /* res2 = x + attproj */
  layer_layernorm_backward(g->dres, dp->ln1w, dp->ln1b, g->dln, x, p->ln1w, a->ln1_mean,
                           a->ln1_rstd, N, C);
}

/* 0 when every unit `unit` reads has a parameter and a gradient buffer. */
static int check_needs(const struct model *m, int unit, float *const *params, float *const *grads) {
  int needs[2];
  int n = model_unit_needs(&m->cfg, unit, needs);
  if (!params || !grads) return STK_EINVAL;
  for (int i = 0; i < n; i++)
    if (!params[needs[i]] || !grads[needs[i]]) return STK_EINVAL;
  return 0;
}

int model_backward_unit(struct model *m, int unit, float *const *params, float *const *grads) {
  const struct model_config *cfg = &m->cfg;
  if (unit < 0 || unit >= model_unit_count(cfg)) return STK_EINVAL;
  if (unit != m->bwd_next) return STK_ESTATE;
  int rc = check_needs(m, unit, params, grads);
  if (rc < 0) return rc;
  struct embed_view e, de;
  struct block_view p, dp;
  struct head_view h, dh;
  switch (model_unit_kind(cfg, unit)) {
  case MODEL_UNIT_HEAD:
    h = model_head_view(cfg, params[unit]), dh = model_head_view(cfg, grads[unit]);
    e = model_embed_view(cfg, params[0]), de = model_embed_view(cfg, grads[0]);
    head_backward(m, &h, &e, &dh, &de);
    break;
  case MODEL_UNIT_BLOCK:
    p = model_block_view(cfg, params[unit]), dp = model_block_view(cfg, grads[unit]);
    mlp_backward(m, unit - 1, &p, &dp);
    attention_backward(m, unit - 1, &p, &dp);
    break;
  case MODEL_UNIT_EMBED:
    de = model_embed_view(cfg, grads[0]);
    layer_encoder_backward(de.wte, de.wpe, m->g.dres, m->inputs, m->B, m->T, cfg->channels);
    break;
  }
  m->bwd_next = unit - 1;
  return 0;
}

int model_backward(struct model *m, float *const *params, float *const *grads) {
  for (int k = model_unit_count(&m->cfg) - 1; k >= 0; k--) {
    int rc = model_backward_unit(m, k, params, grads);
    if (rc < 0) return rc;
  }
  return 0;
}
