/*
 * AdamW, gradient clipping and the learning-rate schedule, written for
 * flat buffers so that the same code updates a whole model or one rank's
 * shard of a unit (the decay mask is sliced with the shard).
 */
#include "optim.h"

#include <math.h>

#include "stk_error.h"

int optim_adamw_step(const struct optim_adamw *h, int64_t t, float *param, const float *grad,
                     float *m, float *v, const uint8_t *decay_mask, size_t n) {
  if (t < 1) return STK_EINVAL;
  float c1 = 1.0f - powf(h->beta1, (float)t); /* bias corrections */
  float c2 = 1.0f - powf(h->beta2, (float)t);
  for (size_t i = 0; i < n; i++) {
    float g = grad[i];
    m[i] = h->beta1 * m[i] + (1.0f - h->beta1) * g;
    v[i] = h->beta2 * v[i] + (1.0f - h->beta2) * g * g;
    float mhat = m[i] / c1;
    float vhat = v[i] / c2;
    float wd = !decay_mask || decay_mask[i] ? h->weight_decay : 0.0f;
    param[i] -= h->lr * (mhat / (sqrtf(vhat) + h->eps) + wd * param[i]);
  }
  return 0;
}

double optim_sq_norm(const float *grad, size_t n) {
  double sum = 0.0;
  for (size_t i = 0; i < n; i++) sum += (double)grad[i] * grad[i];
  return sum;
}

float optim_clip_factor(double total_sq, float max_norm) {
  double norm = sqrt(total_sq);
  if (max_norm <= 0.0f || norm <= max_norm) return 1.0f;
  return (float)(max_norm / (norm + 1e-6));
}

void optim_scale(float *grad, size_t n, float factor) {
  for (size_t i = 0; i < n; i++) grad[i] *= factor;
}

void optim_clip_grad_norm(float *const *bufs, const size_t *lens, int count, float max_norm,
                          float *ret_norm) {
  double sq = 0.0;
  for (int i = 0; i < count; i++) sq += optim_sq_norm(bufs[i], lens[i]);
  float factor = optim_clip_factor(sq, max_norm);
  if (factor != 1.0f)
    for (int i = 0; i < count; i++) optim_scale(bufs[i], lens[i], factor);
  if (ret_norm) *ret_norm = (float)sqrt(sq);
}

float optim_lr_cosine(int64_t step, int64_t warmup, int64_t total, float lr_max, float lr_min) {
  if (step < warmup) return lr_max * (float)(step + 1) / (float)warmup;
  if (step >= total || total <= warmup) return lr_min;
  double progress = (double)(step - warmup) / (double)(total - warmup);
  double coeff = 0.5 * (1.0 + cos(M_PI * progress));
  return lr_min + (float)(coeff * (lr_max - lr_min));
}
