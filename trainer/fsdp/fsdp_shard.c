/*
 * fsdp_shard: this rank's shards. Each unit is padded to a multiple of W and
 * rank r keeps elements [r*S, (r+1)*S) of it: the fp32 master parameters,
 * the AdamW moments and the decay mask slice. Every rank initialises the
 * whole unit from the shared seed (model_init_unit gives the same bits
 * everywhere) and keeps its slice, so no broadcast is needed. Also the
 * checkpoint view of the shards and their restore.
 */
#include <stdlib.h>
#include <string.h>

#include "fsdp_internal.h"
#include "stk_error.h"

/* Copies the slice [offset, offset+count) of a numel-long unit, zero past its end. */
static void slice(void *dst, const void *src, size_t elem, size_t numel, size_t offset,
                  size_t count) {
  memset(dst, 0, count * elem);
  if (offset >= numel) return;
  size_t n = numel - offset < count ? numel - offset : count;
  memcpy(dst, (const char *)src + offset * elem, n * elem);
}

static int unit_init(struct fsdp *f, int k, float *full, uint8_t *mask) {
  struct fsdp_unit *u = &f->units[k];
  u->numel = model_unit_numel(&f->cfg, k);
  u->count = (u->numel + (size_t)f->world - 1) / (size_t)f->world;
  u->padded = u->count * (size_t)f->world;
  u->param = malloc(u->count * sizeof(float));
  u->m = calloc(u->count, sizeof(float));
  u->v = calloc(u->count, sizeof(float));
  u->gshard = calloc(u->count, sizeof(float));
  u->mask = malloc(u->count);
  if (!u->param || !u->m || !u->v || !u->gshard || !u->mask) return STK_ENOMEM;
  int rc = model_init_unit(&f->cfg, f->opts.seed, k, full);
  if (!rc) rc = model_unit_decay_mask(&f->cfg, k, mask);
  if (rc) return rc;
  size_t offset = (size_t)f->rank * u->count;
  slice(u->param, full, sizeof(float), u->numel, offset, u->count);
  slice(u->mask, mask, 1, u->numel, offset, u->count);
  return 0;
}

int fsdp_units_init(struct fsdp *f) {
  f->units = calloc((size_t)f->U, sizeof(struct fsdp_unit));
  if (!f->units) return STK_ENOMEM;
  size_t most = 0;
  for (int k = 0; k < f->U; k++)
    if (model_unit_numel(&f->cfg, k) > most) most = model_unit_numel(&f->cfg, k);
  float *full = malloc(most * sizeof(float));
  uint8_t *mask = malloc(most);
  int rc = full && mask ? 0 : STK_ENOMEM;
  for (int k = 0; k < f->U && !rc; k++) rc = unit_init(f, k, full, mask);
  free(full);
  free(mask);
  return rc;
}

void fsdp_units_free(struct fsdp *f) {
  for (int k = 0; f->units && k < f->U; k++) {
    struct fsdp_unit *u = &f->units[k];
    free(u->param), free(u->m), free(u->v), free(u->gshard), free(u->mask);
  }
  free(f->units);
  f->units = NULL;
}

int fsdp_unit_count(const struct fsdp *f) {
  return f->U;
}

int64_t fsdp_steps_done(const struct fsdp *f) {
  return f->steps_done;
}

int fsdp_shard(struct fsdp *f, int unit, struct fsdp_shard *ret_shard) {
  if (unit < 0 || unit >= f->U) return STK_EINVAL;
  const struct fsdp_unit *u = &f->units[unit];
  *ret_shard = (struct fsdp_shard){.unit = unit,
                                   .unit_numel = u->numel,
                                   .padded_numel = u->padded,
                                   .offset = (size_t)f->rank * u->count,
                                   .count = u->count,
                                   .param = u->param,
                                   .adam_m = u->m,
                                   .adam_v = u->v};
  return 0;
}

static int shard_matches(struct fsdp *f, const struct fsdp_shard *s, int unit) {
  struct fsdp_shard mine;
  fsdp_shard(f, unit, &mine);
  return s->unit == unit && s->unit_numel == mine.unit_numel &&
         s->padded_numel == mine.padded_numel && s->offset == mine.offset &&
         s->count == mine.count && s->param && s->adam_m && s->adam_v;
}

int fsdp_load_shards(struct fsdp *f, const struct fsdp_shard *shards, int count,
                     int64_t steps_done) {
  if (!shards || count != f->U || steps_done < 0) return STK_EINVAL;
  for (int k = 0; k < f->U; k++)
    if (!shard_matches(f, &shards[k], k)) return STK_EINVAL;
  for (int k = 0; k < f->U; k++) {
    struct fsdp_unit *u = &f->units[k];
    memmove(u->param, shards[k].param, u->count * sizeof(float));
    memmove(u->m, shards[k].adam_m, u->count * sizeof(float));
    memmove(u->v, shards[k].adam_v, u->count * sizeof(float));
  }
  f->steps_done = steps_done;
  return 0;
}

int fsdp_gather_unit(struct fsdp *f, int unit, float *ret_params) {
  if (unit < 0 || unit >= f->U || !ret_params) return STK_EINVAL;
  float *full = malloc(f->units[unit].padded * sizeof(float));
  if (!full) return STK_ENOMEM;
  int rc = fsdp_coll_gather(f, unit, full);
  if (!rc) memcpy(ret_params, full, f->units[unit].numel * sizeof(float));
  free(full);
  return rc;
}
