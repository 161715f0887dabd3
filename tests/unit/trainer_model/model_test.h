/*
 * Helpers the trainer_model tests share: a seeded random source for test
 * data, the small model configuration of the task, and a finite-difference
 * comparison that reports the worst element.
 */
#ifndef STK_MODEL_TEST_H
#define STK_MODEL_TEST_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "model.h"

/* C=16, T=8, NH=2, L=2, V=64 (batch B=2 is chosen by the tests). */
static const struct model_config SMALL = {
    .vocab_size = 64, .max_seq_len = 8, .channels = 16, .n_layer = 2, .n_head = 2};

static inline uint64_t test_next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* Uniform in [lo, hi). */
static inline float test_uniform(uint64_t *s, float lo, float hi) {
  return lo + (hi - lo) * (float)((test_next(s) >> 11) * (1.0 / 9007199254740992.0));
}

static inline void test_fill(float *p, size_t n, uint64_t *s, float lo, float hi) {
  for (size_t i = 0; i < n; i++) p[i] = test_uniform(s, lo, hi);
}

static inline void test_tokens(int32_t *p, size_t n, uint64_t *s, int V) {
  for (size_t i = 0; i < n; i++) p[i] = (int32_t)(test_next(s) % (uint64_t)V);
}

/*
 * The worst |analytic - numeric| / (atol + rtol * |numeric|) over n values;
 * <= 1 means every element is within tolerance.
 */
static inline double test_worst(const float *analytic, const double *numeric, size_t n, double atol,
                                double rtol, const char *what) {
  double worst = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    double r = fabs(analytic[i] - numeric[i]) / (atol + rtol * fabs(numeric[i]));
    if (r > worst) worst = r, at = i;
  }
  if (worst > 1.0)
    fprintf(stderr, "%s: element %zu analytic %.8g numeric %.8g\n", what, at, analytic[at],
            numeric[at]);
  return worst;
}

#endif
