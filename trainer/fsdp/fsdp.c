/*
 * fsdp: the object's life: options, construction (validation, shards, the
 * plan, the limiter), destruction and the counters. The step itself is in
 * fsdp_step.c, the communication thread in fsdp_comm.c.
 */
#include <stdlib.h>

#include "fsdp_internal.h"
#include "stk_error.h"

void fsdp_opts_default(struct fsdp_opts *ret_opts) {
  *ret_opts = (struct fsdp_opts){
      .max_inflight_units = 2,
      .lr_max = 3e-4f,
      .lr_min = 3e-4f,
      .adamw = {.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f},
      .clip_norm = 1.0f,
  };
}

/* The most bytes gathered at once during one compute step: the gathers whose
 * span covers it (its own, and the root unit's when there is one). */
static size_t largest_step_bytes(const struct fsdp *f) {
  size_t most = 0;
  for (int s = 0; s < f->plan.nsteps; s++) {
    size_t bytes = 0;
    for (int g = 0; g < f->plan.ngathers; g++) {
      const struct fsdp_gather *e = &f->plan.gathers[g];
      if (e->first_step <= s && s <= e->last_step)
        bytes += f->units[e->unit].padded * sizeof(float);
    }
    if (bytes > most) most = bytes;
  }
  return most;
}

static int check_args(const struct model_config *cfg, struct coll_group *group,
                      const struct fsdp_opts *opts) {
  if (!cfg || !opts || model_config_check(cfg)) return STK_EINVAL;
  if (opts->max_inflight_units < 0) return STK_EINVAL;
  if (opts->precision != FSDP_PRECISION_FP32 && opts->precision != FSDP_PRECISION_BF16)
    return STK_EINVAL;
  if (group && (group->size < 1 || group->rank < 0 || group->rank >= group->size))
    return STK_EINVAL;
  return 0;
}

static int fsdp_init(struct fsdp *f) {
  int rc = fsdp_units_init(f);
  /* K = 1: the tied head needs unit 0 beside itself, so unit 0 is the root
   * unit, held all step outside the limit. */
  int root = f->opts.root_unit || f->opts.max_inflight_units == 1;
  if (!rc) rc = fsdp_plan_build(&f->cfg, root, &f->plan);
  if (rc) return rc;
  size_t budget = f->opts.max_inflight_bytes;
  if (budget && budget < largest_step_bytes(f)) return STK_EINVAL;
  f->bufs = calloc((size_t)f->plan.ngathers, sizeof(float *));
  f->ready = calloc((size_t)f->plan.ngathers, 1);
  f->grads = calloc((size_t)f->U, sizeof(float *));
  f->params = calloc((size_t)f->U, sizeof(float *));
  if (!f->bufs || !f->ready || !f->grads || !f->params) return STK_ENOMEM;
  return 0;
}

int fsdp_new(const struct model_config *cfg, struct coll_group *group, const struct fsdp_opts *opts,
             struct fsdp **ret_fsdp) {
  int rc = check_args(cfg, group, opts);
  if (rc) return rc;
  struct fsdp *f = calloc(1, sizeof(*f));
  if (!f) return STK_ENOMEM;
  f->cfg = *cfg;
  f->group = group;
  f->rank = group ? group->rank : 0;
  f->world = group ? group->size : 1;
  f->opts = *opts;
  f->U = model_unit_count(cfg);
  pthread_mutex_init(&f->mu, NULL);
  pthread_cond_init(&f->cv, NULL);
  rc = fsdp_limiter_init(&f->lim, opts->max_inflight_units, opts->max_inflight_bytes);
  if (rc) {
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
    free(f);
    return rc;
  }
  rc = fsdp_init(f);
  if (rc) {
    fsdp_free(f);
    return rc;
  }
  *ret_fsdp = f;
  return 0;
}

void fsdp_free(struct fsdp *f) {
  if (!f) return;
  model_free(f->model);
  fsdp_units_free(f);
  fsdp_plan_close(&f->plan);
  free(f->bufs);
  free(f->ready);
  free(f->grads);
  free(f->params);
  fsdp_limiter_close(&f->lim);
  pthread_cond_destroy(&f->cv);
  pthread_mutex_destroy(&f->mu);
  free(f);
}

void fsdp_get_stats(const struct fsdp *f, struct fsdp_stats *ret_stats) {
  struct fsdp_limiter *l = (struct fsdp_limiter *)&f->lim;
  pthread_mutex_lock(&l->mu);
  *ret_stats = (struct fsdp_stats){.peak_unsharded_bytes = l->peak_bytes,
                                   .peak_unsharded_units = l->peak_units,
                                   .limiter_wait_ns = l->wait_ns,
                                   .coll_wait_ns = f->coll_wait_ns,
                                   .coll_busy_ns = f->coll_busy_ns,
                                   .bytes_moved = f->bytes_moved,
                                   .gather_bytes = f->gather_bytes,
                                   .steps = f->nsteps_stat};
  pthread_mutex_unlock(&l->mu);
}

void fsdp_reset_stats(struct fsdp *f) {
  pthread_mutex_lock(&f->lim.mu);
  f->lim.peak_bytes = 0;
  f->lim.peak_units = 0;
  f->lim.wait_ns = 0;
  pthread_mutex_unlock(&f->lim.mu);
  f->coll_wait_ns = 0;
  f->coll_busy_ns = 0;
  f->bytes_moved = 0;
  f->gather_bytes = 0;
  f->nsteps_stat = 0;
}
