/*
 * model_internal: what the model's own files share and nobody else needs:
 * typed views of a unit's flat buffer, the activation buffers and the model
 * object.
 */
#ifndef STK_MODEL_INTERNAL_H
#define STK_MODEL_INTERNAL_H

#include "model.h"

/* Tensor indices in a block unit, in buffer order (see model_layout.c). */
enum block_tensor {
  BLK_LN1W,
  BLK_LN1B,
  BLK_QKVW,
  BLK_QKVB,
  BLK_ATTPROJW,
  BLK_ATTPROJB,
  BLK_LN2W,
  BLK_LN2B,
  BLK_FCW,
  BLK_FCB,
  BLK_FCPROJW,
  BLK_FCPROJB,
  BLK_COUNT
};

struct embed_view {
  float *wte; /* (V, C) */
  float *wpe; /* (maxT, C) */
};

struct block_view {
  float *ln1w, *ln1b; /* (C) */
  float *qkvw;        /* (3C, C) */
  float *qkvb;        /* (3C) */
  float *attprojw;    /* (C, C) */
  float *attprojb;    /* (C) */
  float *ln2w, *ln2b; /* (C) */
  float *fcw;         /* (4C, C) */
  float *fcb;         /* (4C) */
  float *fcprojw;     /* (C, 4C) */
  float *fcprojb;     /* (C) */
};

struct head_view {
  float *lnfw, *lnfb; /* (C) */
};

struct embed_view model_embed_view(const struct model_config *cfg, float *flat);
struct block_view model_block_view(const struct model_config *cfg, float *flat);
struct head_view model_head_view(const struct model_config *cfg, float *flat);

/* Forward activations of one block (all of them kept for the backward). */
struct block_acts {
  float *ln1;      /* (B, T, C) */
  float *ln1_mean; /* (B, T) */
  float *ln1_rstd; /* (B, T) */
  float *qkv;      /* (B, T, 3C) */
  float *att;      /* (B, NH, T, T) softmax probabilities */
  float *atty;     /* (B, T, C) attention output before the projection */
  float *attproj;  /* (B, T, C) */
  float *res2;     /* (B, T, C) residual after attention */
  float *ln2;      /* (B, T, C) */
  float *ln2_mean; /* (B, T) */
  float *ln2_rstd; /* (B, T) */
  float *fch;      /* (B, T, 4C) */
  float *fch_gelu; /* (B, T, 4C) */
  float *fcproj;   /* (B, T, C) */
};

/* Gradient scratch, reused by every block and by the head in turn. */
struct grad_acts {
  float *dres;      /* (B, T, C) gradient of the residual stream being walked back */
  float *dres2;     /* (B, T, C) */
  float *dln;       /* (B, T, C) gradient of a layernorm output */
  float *dqkv;      /* (B, T, 3C) */
  float *datt;      /* (B, NH, T, T) attention scratch */
  float *datty;     /* (B, T, C) */
  float *dfch;      /* (B, T, 4C) */
  float *dfch_gelu; /* (B, T, 4C) */
  float *dlogits;   /* (B, T, V) */
};

struct model {
  struct model_config cfg;
  int B, T;
  int32_t *inputs;  /* (B, T) */
  int32_t *targets; /* (B, T) */
  bool has_targets;
  float *resid; /* (L + 1, B, T, C): resid[0] the embeddings, resid[l + 1] block l's output */
  struct block_acts *blocks; /* (L) */
  float *lnf;                /* (B, T, C) */
  float *lnf_mean;           /* (B, T) */
  float *lnf_rstd;           /* (B, T) */
  float *logits;             /* (B, T, V) */
  float *probs;              /* (B, T, V) */
  float *losses;             /* (B, T) */
  float loss;                /* mean of losses; NAN when unknown */
  struct grad_acts g;
  float *arena; /* One allocation behind every float buffer above. */
  int fwd_next; /* Next unit to run forward; U when the forward is complete. */
  int bwd_next; /* Next unit to run backward; -1 when none may run. */
};

#endif
