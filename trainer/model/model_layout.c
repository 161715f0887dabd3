/*
 * The parameter layout: which tensors live in which unit, at which offset
 * of the unit's flat buffer, and whether AdamW decays them. Everything else
 * (init, views, FSDP sharding, checkpoint names) is derived from this table.
 */
#include "model_internal.h"

#include <stdlib.h>
#include <string.h>

#include "stk_error.h"

struct tensor_spec {
  const char *name;
  int rows, cols; /* cols 0 means a vector of `rows` */
};

int model_config_check(const struct model_config *cfg) {
  if (!cfg || cfg->vocab_size <= 0 || cfg->max_seq_len <= 0 || cfg->channels <= 0 ||
      cfg->n_layer <= 0 || cfg->n_head <= 0 || cfg->channels % cfg->n_head != 0)
    return STK_EINVAL;
  return 0;
}

int model_unit_count(const struct model_config *cfg) {
  return cfg->n_layer + 2;
}

enum model_unit_kind model_unit_kind(const struct model_config *cfg, int unit) {
  if (unit == 0) return MODEL_UNIT_EMBED;
  return unit <= cfg->n_layer ? MODEL_UNIT_BLOCK : MODEL_UNIT_HEAD;
}

/* The unit's tensor specs in buffer order; returns their count (0 for a bad unit). */
static int unit_specs(const struct model_config *cfg, int unit, struct tensor_spec *s) {
  int C = cfg->channels;
  if (unit < 0 || unit >= model_unit_count(cfg)) return 0;
  switch (model_unit_kind(cfg, unit)) {
  case MODEL_UNIT_EMBED:
    s[0] = (struct tensor_spec){"wte", cfg->vocab_size, C};
    s[1] = (struct tensor_spec){"wpe", cfg->max_seq_len, C};
    return 2;
  case MODEL_UNIT_BLOCK:
    s[BLK_LN1W] = (struct tensor_spec){"ln1w", C, 0};
    s[BLK_LN1B] = (struct tensor_spec){"ln1b", C, 0};
    s[BLK_QKVW] = (struct tensor_spec){"qkvw", 3 * C, C};
    s[BLK_QKVB] = (struct tensor_spec){"qkvb", 3 * C, 0};
    s[BLK_ATTPROJW] = (struct tensor_spec){"attprojw", C, C};
    s[BLK_ATTPROJB] = (struct tensor_spec){"attprojb", C, 0};
    s[BLK_LN2W] = (struct tensor_spec){"ln2w", C, 0};
    s[BLK_LN2B] = (struct tensor_spec){"ln2b", C, 0};
    s[BLK_FCW] = (struct tensor_spec){"fcw", 4 * C, C};
    s[BLK_FCB] = (struct tensor_spec){"fcb", 4 * C, 0};
    s[BLK_FCPROJW] = (struct tensor_spec){"fcprojw", C, 4 * C};
    s[BLK_FCPROJB] = (struct tensor_spec){"fcprojb", C, 0};
    return BLK_COUNT;
  case MODEL_UNIT_HEAD:
    s[0] = (struct tensor_spec){"lnfw", C, 0};
    s[1] = (struct tensor_spec){"lnfb", C, 0};
    return 2;
  }
  return 0;
}

int model_unit_tensors(const struct model_config *cfg, int unit, struct model_tensor *ret_tensors,
                       int *ret_count) {
  struct tensor_spec s[MODEL_MAX_UNIT_TENSORS];
  int n = unit_specs(cfg, unit, s);
  if (n == 0) return STK_EINVAL;
  size_t offset = 0;
  for (int i = 0; i < n; i++) {
    struct model_tensor *t = &ret_tensors[i];
    t->name = s[i].name;
    t->offset = offset;
    t->ndim = s[i].cols ? 2 : 1;
    t->shape[0] = s[i].rows;
    t->shape[1] = s[i].cols ? s[i].cols : 1;
    t->numel = (size_t)t->shape[0] * (size_t)t->shape[1];
    t->decay = t->ndim == 2;
    offset += t->numel;
  }
  *ret_count = n;
  return 0;
}

size_t model_unit_numel(const struct model_config *cfg, int unit) {
  struct model_tensor t[MODEL_MAX_UNIT_TENSORS];
  int n;
  if (model_unit_tensors(cfg, unit, t, &n) < 0) return 0;
  return t[n - 1].offset + t[n - 1].numel;
}

size_t model_param_count(const struct model_config *cfg) {
  size_t total = 0;
  for (int k = 0; k < model_unit_count(cfg); k++) total += model_unit_numel(cfg, k);
  return total;
}

int model_unit_decay_mask(const struct model_config *cfg, int unit, uint8_t *ret_mask) {
  struct model_tensor t[MODEL_MAX_UNIT_TENSORS];
  int n;
  int rc = model_unit_tensors(cfg, unit, t, &n);
  if (rc < 0) return rc;
  for (int i = 0; i < n; i++) memset(ret_mask + t[i].offset, t[i].decay ? 1 : 0, t[i].numel);
  return 0;
}

int model_unit_needs(const struct model_config *cfg, int unit, int ret_units[2]) {
  ret_units[0] = unit;
  if (model_unit_kind(cfg, unit) != MODEL_UNIT_HEAD) return 1;
  ret_units[1] = 0;
  return 2;
}

int model_units_alloc(const struct model_config *cfg, float **ret_units) {
  int U = model_unit_count(cfg);
  for (int k = 0; k < U; k++) {
    ret_units[k] = calloc(model_unit_numel(cfg, k), sizeof(float));
    if (!ret_units[k]) {
      model_units_free(cfg, ret_units);
      return STK_ENOMEM;
    }
  }
  return 0;
}

void model_units_free(const struct model_config *cfg, float **units) {
  if (!units) return;
  for (int k = 0; k < model_unit_count(cfg); k++) {
    free(units[k]);
    units[k] = NULL;
  }
}

void model_units_zero(const struct model_config *cfg, float *const *units) {
  for (int k = 0; k < model_unit_count(cfg); k++)
    if (units[k]) memset(units[k], 0, model_unit_numel(cfg, k) * sizeof(float));
}

/* Pointer to tensor i of a unit's flat buffer. */
static float *tensor_at(const struct model_config *cfg, int unit, float *flat, int i) {
  struct model_tensor t[MODEL_MAX_UNIT_TENSORS];
  int n;
  model_unit_tensors(cfg, unit, t, &n);
  return flat + t[i].offset;
}

struct embed_view model_embed_view(const struct model_config *cfg, float *flat) {
  return (struct embed_view){tensor_at(cfg, 0, flat, 0), tensor_at(cfg, 0, flat, 1)};
}

struct block_view model_block_view(const struct model_config *cfg, float *flat) {
  float *p[BLK_COUNT];
  for (int i = 0; i < BLK_COUNT; i++) p[i] = tensor_at(cfg, 1, flat, i);
  return (struct block_view){p[BLK_LN1W],     p[BLK_LN1B],     p[BLK_QKVW],    p[BLK_QKVB],
                             p[BLK_ATTPROJW], p[BLK_ATTPROJB], p[BLK_LN2W],    p[BLK_LN2B],
                             p[BLK_FCW],      p[BLK_FCB],      p[BLK_FCPROJW], p[BLK_FCPROJB]};
}

struct head_view model_head_view(const struct model_config *cfg, float *flat) {
  int head = cfg->n_layer + 1;
  return (struct head_view){tensor_at(cfg, head, flat, 0), tensor_at(cfg, head, flat, 1)};
}
