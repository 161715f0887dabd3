/*
 * Deterministic GPT-2 style initialisation. Each unit draws from its own
 * random stream keyed by (seed, unit), so a rank holding only some units (or
 * a shard being rebuilt) gets exactly the bits a full initialisation gives.
 */
#include "model_internal.h"

#include <math.h>
#include <string.h>

#include "stk_error.h"

#define INIT_STD 0.02

/* splitmix64: small, fast, and good enough to drive Box-Muller. */
static uint64_t next_u64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/* Uniform in (0, 1): never 0, so log() below is finite. */
static double next_uniform(uint64_t *state) {
  return ((double)(next_u64(state) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* Fills n values with normal(0, std) draws, Box-Muller, two at a time. */
static void fill_normal(float *out, size_t n, double std, uint64_t *state) {
  for (size_t i = 0; i < n; i += 2) {
    double r = sqrt(-2.0 * log(next_uniform(state)));
    double a = 2.0 * M_PI * next_uniform(state);
    out[i] = (float)(std * r * cos(a));
    if (i + 1 < n) out[i + 1] = (float)(std * r * sin(a));
  }
}

static bool is_residual_projection(const char *name) {
  return strcmp(name, "attprojw") == 0 || strcmp(name, "fcprojw") == 0;
}

/* Layernorm scales ("ln1w", "ln2w", "lnfw") start at 1, other vectors at 0. */
static float vector_init(const char *name) {
  size_t len = strlen(name);
  return strncmp(name, "ln", 2) == 0 && name[len - 1] == 'w' ? 1.0f : 0.0f;
}

int model_init_unit(const struct model_config *cfg, uint64_t seed, int unit, float *flat) {
  struct model_tensor t[MODEL_MAX_UNIT_TENSORS];
  int n;
  int rc = model_config_check(cfg);
  if (rc < 0) return rc;
  if ((rc = model_unit_tensors(cfg, unit, t, &n)) < 0) return rc;
  uint64_t state = seed ^ (0xd1b54a32d192ed03ULL * (uint64_t)(unit + 1));
  next_u64(&state);
  double proj_scale = 1.0 / sqrt(2.0 * cfg->n_layer);
  for (int i = 0; i < n; i++) {
    float *p = flat + t[i].offset;
    if (t[i].ndim == 2) {
      double std = INIT_STD * (is_residual_projection(t[i].name) ? proj_scale : 1.0);
      fill_normal(p, t[i].numel, std, &state);
    } else {
      float v = vector_init(t[i].name);
      for (size_t j = 0; j < t[i].numel; j++) p[j] = v;
    }
  }
  return 0;
}

int model_init_params(const struct model_config *cfg, uint64_t seed, float *const *units) {
  int rc = model_config_check(cfg);
  if (rc < 0) return rc;
  for (int k = 0; k < model_unit_count(cfg); k++) {
    if ((rc = model_init_unit(cfg, seed, k, units[k])) < 0) return rc;
  }
  return 0;
}
