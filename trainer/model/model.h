/*
 * model: the reference GPT (GPT-2 shaped) on the CPU in f32, built for
 * FSDP. Its parameters are cut into units, each one contiguous flat f32
 * buffer that FSDP can pad, shard and all-gather:
 *
 *   unit 0        embeddings: wte (V,C), wpe (maxT,C)
 *   unit 1 .. L   transformer block l = unit - 1 (12 tensors, see model_layout.c)
 *   unit L + 1    final layernorm: lnfw (C), lnfb (C)  -- the "head" unit
 *
 * The LM head is tied to wte, so the head unit's forward and backward also
 * read unit 0 (and its backward adds into unit 0's gradient): FSDP gathers
 * unit 0 again for the head. model_unit_needs() says which units a step reads.
 *
 * Dimension letters (B, T, C, L, NH, V) are as in layer.h's legend.
 *
 * Running the model: the caller owns parameters and gradients as arrays of
 * model_unit_count() pointers, one flat buffer per unit; pointers of units a
 * step does not need may be NULL (FSDP frees them). A pass is:
 *
 *   model_set_batch(m, inputs, targets);
 *   for k = 0 .. U-1:    model_forward_unit(m, k, params)
 *   for k = U-1 .. 0:    model_backward_unit(m, k, params, grads)
 *
 * or model_forward()/model_backward(), which are exactly those loops.
 * Backward ADDS into the gradient buffers (zero them first: model_units_zero);
 * that accumulates the tied embedding and gradient-accumulation micro-steps.
 * The model object holds activations for one (B,T) batch; it is not thread
 * safe (one thread drives it; the kernels inside use OpenMP).
 */
#ifndef STK_MODEL_H
#define STK_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct model_config {
  int vocab_size;  /* V */
  int max_seq_len; /* maxT: rows of wpe */
  int channels;    /* C */
  int n_layer;     /* L */
  int n_head;      /* NH; must divide C */
};

enum model_unit_kind {
  MODEL_UNIT_EMBED = 0, /* wte, wpe */
  MODEL_UNIT_BLOCK = 1, /* one transformer block */
  MODEL_UNIT_HEAD = 2,  /* final layernorm (+ tied LM head and loss) */
};

/* Most tensors in one unit (a block has 12). */
#define MODEL_MAX_UNIT_TENSORS 12

/* One tensor inside a unit's flat buffer. */
struct model_tensor {
  const char *name; /* Name within its unit: "wte", "qkvw", "lnfb", ... (static string). */
  size_t offset;    /* In elements from the start of the unit's buffer. */
  size_t numel;
  int ndim;     /* 1 or 2 */
  int shape[2]; /* shape[1] is 1 when ndim == 1 */
  bool decay;   /* AdamW weight decay applies (the matrices). */
};

/* 0, or STK_EINVAL when a dimension is not positive or NH does not divide C. */
int model_config_check(const struct model_config *cfg);

/* L + 2. */
int model_unit_count(const struct model_config *cfg);
enum model_unit_kind model_unit_kind(const struct model_config *cfg, int unit);
/* Elements in the unit's flat buffer (no padding: FSDP pads). 0 for a bad unit. */
size_t model_unit_numel(const struct model_config *cfg, int unit);
/* Sum over units. */
size_t model_param_count(const struct model_config *cfg);

/*
 * Fills ret_tensors (room for MODEL_MAX_UNIT_TENSORS) with the unit's tensors
 * in buffer order and sets *ret_count. STK_EINVAL for a bad unit.
 */
int model_unit_tensors(const struct model_config *cfg, int unit, struct model_tensor *ret_tensors,
                       int *ret_count);

/*
 * Per-element AdamW decay mask of the unit (1 where weight decay applies), so
 * that a shard of the unit takes the matching slice. ret_mask holds
 * model_unit_numel() bytes.
 */
int model_unit_decay_mask(const struct model_config *cfg, int unit, uint8_t *ret_mask);

/*
 * The units a step of `unit` reads: the unit itself, and unit 0 too for the
 * head unit. ret_units has room for 2; returns how many were written.
 */
int model_unit_needs(const struct model_config *cfg, int unit, int ret_units[2]);

/* Allocates one zeroed buffer per unit into ret_units (model_unit_count() slots). */
int model_units_alloc(const struct model_config *cfg, float **ret_units);
/* Frees what model_units_alloc gave and sets the pointers to NULL; NULL entries are skipped. */
void model_units_free(const struct model_config *cfg, float **units);
void model_units_zero(const struct model_config *cfg, float *const *units);

/*
 * GPT-2 style initialisation of one unit from a seed: matrices normal(0, 0.02),
 * the residual projections (attprojw, fcprojw) scaled by 1/sqrt(2L), biases
 * 0, layernorm scales 1. Each unit draws from its own stream derived from
 * (seed, unit), so any rank can initialise any unit alone and get the same
 * bits.
 */
int model_init_unit(const struct model_config *cfg, uint64_t seed, int unit, float *flat);
/* model_init_unit for every unit. */
int model_init_params(const struct model_config *cfg, uint64_t seed, float *const *units);

struct model;

/* A model with activations for batches of B sequences of T tokens (T <= maxT). */
int model_new(const struct model_config *cfg, int B, int T, struct model **ret_model);
void model_free(struct model *m);

/*
 * Copies the next batch: inputs (B,T) and targets (B,T), tokens in [0,V).
 * targets may be NULL for forward only (no loss, no backward). Starts a new
 * pass: the next forward step must be unit 0. STK_EINVAL for a bad token.
 */
int model_set_batch(struct model *m, const int32_t *inputs, const int32_t *targets);

/*
 * Runs unit `unit`'s forward. Units go in order 0 .. U-1 after
 * model_set_batch (STK_ESTATE otherwise). params[k] must be non-NULL for
 * every k in model_unit_needs(unit) (STK_EINVAL otherwise).
 */
int model_forward_unit(struct model *m, int unit, float *const *params);

/*
 * Runs unit `unit`'s backward, adding into grads[k] for the units it needs.
 * Units go in order U-1 .. 0 after a complete forward with targets
 * (STK_ESTATE otherwise).
 */
int model_backward_unit(struct model *m, int unit, float *const *params, float *const *grads);

/* Every unit's forward; *ret_loss (may be NULL) is the mean loss, NAN without targets. */
int model_forward(struct model *m, float *const *params, float *ret_loss);
/* Every unit's backward. */
int model_backward(struct model *m, float *const *params, float *const *grads);

/* Mean cross-entropy of the last complete forward (NAN before one, or without targets). */
float model_loss(const struct model *m);
/* probs (B,T,V) of the last complete forward; logits (B,T,V) likewise. */
const float *model_probs(const struct model *m);
const float *model_logits(const struct model *m);

#endif
