/*
 * The model object: its activation buffers, carved out of one allocation
 * sized for (B, T), and the accessors for what a forward pass leaves behind.
 */
#include "model_internal.h"

#include <math.h>
#include <stdlib.h>

#include "stk_error.h"

/* Hands out the next n floats of the arena; with base NULL it only counts. */
static float *carve(float *base, size_t *used, size_t n) {
  float *p = base ? base + *used : NULL;
  *used += n;
  return p;
}

static void layout_block(struct block_acts *a, float *base, size_t *used, size_t BT, size_t C,
                         size_t NH, size_t T) {
  a->ln1 = carve(base, used, BT * C);
  a->ln1_mean = carve(base, used, BT);
  a->ln1_rstd = carve(base, used, BT);
  a->qkv = carve(base, used, BT * 3 * C);
  a->att = carve(base, used, BT / T * NH * T * T);
  a->atty = carve(base, used, BT * C);
  a->attproj = carve(base, used, BT * C);
  a->res2 = carve(base, used, BT * C);
  a->ln2 = carve(base, used, BT * C);
  a->ln2_mean = carve(base, used, BT);
  a->ln2_rstd = carve(base, used, BT);
  a->fch = carve(base, used, BT * 4 * C);
  a->fch_gelu = carve(base, used, BT * 4 * C);
  a->fcproj = carve(base, used, BT * C);
}

static void layout_grads(struct grad_acts *g, float *base, size_t *used, size_t BT, size_t C,
                         size_t NH, size_t T, size_t V) {
  g->dres = carve(base, used, BT * C);
  g->dres2 = carve(base, used, BT * C);
  g->dln = carve(base, used, BT * C);
  g->dqkv = carve(base, used, BT * 3 * C);
  g->datt = carve(base, used, BT / T * NH * T * T);
  g->datty = carve(base, used, BT * C);
  g->dfch = carve(base, used, BT * 4 * C);
  g->dfch_gelu = carve(base, used, BT * 4 * C);
  g->dlogits = carve(base, used, BT * V);
}

/* Points every activation buffer into base; returns the floats needed. */
static size_t layout(struct model *m, float *base) {
  size_t used = 0, BT = (size_t)m->B * m->T, C = m->cfg.channels, V = m->cfg.vocab_size;
  size_t NH = m->cfg.n_head, T = m->T;
  m->resid = carve(base, &used, (size_t)(m->cfg.n_layer + 1) * BT * C);
  for (int l = 0; l < m->cfg.n_layer; l++) layout_block(&m->blocks[l], base, &used, BT, C, NH, T);
  m->lnf = carve(base, &used, BT * C);
  m->lnf_mean = carve(base, &used, BT);
  m->lnf_rstd = carve(base, &used, BT);
  m->logits = carve(base, &used, BT * V);
  m->probs = carve(base, &used, BT * V);
  m->losses = carve(base, &used, BT);
  layout_grads(&m->g, base, &used, BT, C, NH, T, V);
  return used;
}

int model_new(const struct model_config *cfg, int B, int T, struct model **ret_model) {
  int rc = model_config_check(cfg);
  if (rc < 0) return rc;
  if (B <= 0 || T <= 0 || T > cfg->max_seq_len) return STK_EINVAL;
  struct model *m = calloc(1, sizeof(*m));
  if (!m) return STK_ENOMEM;
  m->cfg = *cfg;
  m->B = B;
  m->T = T;
  m->loss = NAN;
  m->bwd_next = -1;
  m->blocks = calloc((size_t)cfg->n_layer, sizeof(*m->blocks));
  m->inputs = calloc((size_t)B * T, sizeof(int32_t));
  m->targets = calloc((size_t)B * T, sizeof(int32_t));
  if (m->blocks && m->inputs && m->targets) {
    m->arena = calloc(layout(m, NULL), sizeof(float));
    if (m->arena) {
      layout(m, m->arena);
      *ret_model = m;
      return 0;
    }
  }
  model_free(m);
  return STK_ENOMEM;
}

void model_free(struct model *m) {
  if (!m) return;
  free(m->arena);
  free(m->blocks);
  free(m->inputs);
  free(m->targets);
  free(m);
}

float model_loss(const struct model *m) {
  return m->loss;
}

const float *model_probs(const struct model *m) {
  return m->probs;
}

const float *model_logits(const struct model *m) {
  return m->logits;
}
