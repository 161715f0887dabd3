/*
 * optim: the optimizer pieces FSDP applies to its local shards, all over
 * flat f32 buffers: AdamW, global-norm gradient clipping (split so the
 * squared norms of shards can be summed across ranks first), and the cosine
 * learning-rate schedule with linear warmup.
 */
#ifndef STK_MODEL_OPTIM_H
#define STK_MODEL_OPTIM_H

#include <stddef.h>
#include <stdint.h>

struct optim_adamw {
  float lr;
  float beta1;        /* 0.9 typically */
  float beta2;        /* 0.95 or 0.999 */
  float eps;          /* 1e-8 */
  float weight_decay; /* decoupled; applied only where the decay mask says */
};

/*
 * One AdamW step, t = 1 for the first step (bias correction), over n values:
 *   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
 *   p -= lr * (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd * p)   [wd where mask]
 * decay_mask (n bytes, nonzero = decay) may be NULL: decay everything.
 * m and v start zeroed and belong to the caller. STK_EINVAL for t < 1.
 */
int optim_adamw_step(const struct optim_adamw *h, int64_t t, float *param, const float *grad,
                     float *m, float *v, const uint8_t *decay_mask, size_t n);

/* Sum of squares of n gradient values, summed in double in index order. */
double optim_sq_norm(const float *grad, size_t n);

/*
 * The factor to multiply gradients by so that a global norm sqrt(total_sq)
 * becomes at most max_norm: 1 when already within (or max_norm <= 0).
 */
float optim_clip_factor(double total_sq, float max_norm);

/* grad[i] *= factor. */
void optim_scale(float *grad, size_t n, float factor);

/*
 * Clips `count` buffers together by their global norm; *ret_norm (may be
 * NULL) gets the norm before clipping. The single-process convenience; FSDP
 * sums optim_sq_norm over its shards, all-reduces, then scales.
 */
void optim_clip_grad_norm(float *const *bufs, const size_t *lens, int count, float max_norm,
                          float *ret_norm);

/*
 * Learning rate at `step` (0-based): linear warmup from lr_max/warmup to
 * lr_max over the first `warmup` steps, then cosine decay to lr_min at
 * step `total`, lr_min after that.
 */
float optim_lr_cosine(int64_t step, int64_t warmup, int64_t total, float lr_max, float lr_min);

#endif
