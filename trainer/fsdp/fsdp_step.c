/*
 * fsdp_step: one training step, read top-down like the architecture:
 * start the communication thread on the plan, walk the compute steps
 * (wait for the unit's gathers, run it, free what it no longer needs),
 * hand over the squared gradient norm, the loss and this rank's vote, then
 * clip and apply AdamW to this rank's shards once every collective has
 * succeeded.
 */
#include <stdlib.h>
#include <string.h>

#include "fsdp_internal.h"
#include "stk_error.h"

static int ensure_model(struct fsdp *f, int B, int T) {
  if (B < 1 || T < 1 || T > f->cfg.max_seq_len) return STK_EINVAL;
  if (f->model && f->B == B && f->T == T) return 0;
  model_free(f->model);
  f->model = NULL;
  int rc = model_new(&f->cfg, B, T, &f->model);
  if (rc) return rc;
  f->B = B, f->T = T;
  return 0;
}

static void step_reset(struct fsdp *f) {
  f->done_steps = 0, f->error = 0, f->rs_done = 0, f->ar_done = 0;
  memset(f->bufs, 0, (size_t)f->plan.ngathers * sizeof(float *));
  memset(f->ready, 0, (size_t)f->plan.ngathers);
  memset(f->grads, 0, (size_t)f->U * sizeof(float *));
  memset(f->params, 0, (size_t)f->U * sizeof(float *));
  fsdp_limiter_rearm(&f->lim);
}

/* Frees what a failed step left behind (nothing after a successful one). */
static void step_cleanup(struct fsdp *f) {
  for (int g = 0; g < f->plan.ngathers; g++) free(f->bufs[g]), f->bufs[g] = NULL;
  for (int k = 0; k < f->U; k++) free(f->grads[k]), f->grads[k] = NULL;
}

/* Waits until *flag (under f->mu) reaches want or the step fails. */
static int wait_for(struct fsdp *f, const int *flag, int want) {
  pthread_mutex_lock(&f->mu);
  int64_t t0 = fsdp_now_ns();
  while (!f->error && *flag < want) pthread_cond_wait(&f->cv, &f->mu);
  f->coll_wait_ns += fsdp_now_ns() - t0;
  int rc = f->error;
  pthread_mutex_unlock(&f->mu);
  return rc;
}

static int wait_gathered(struct fsdp *f, int g) {
  pthread_mutex_lock(&f->mu);
  int64_t t0 = fsdp_now_ns();
  while (!f->error && !f->ready[g]) pthread_cond_wait(&f->cv, &f->mu);
  f->coll_wait_ns += fsdp_now_ns() - t0;
  int rc = f->error;
  if (!rc) f->params[f->plan.gathers[g].unit] = f->bufs[g];
  pthread_mutex_unlock(&f->mu);
  return rc;
}

/* Gathers in, gradient buffers allocated. */
static int step_begin(struct fsdp *f, int s) {
  for (int i = 0; i < f->plan.step_ngathers[s]; i++) {
    int rc = wait_gathered(f, f->plan.step_gathers[s][i]);
    if (rc) return rc;
  }
  if (!fsdp_plan_step_backward(&f->plan, s)) return 0;
  for (int i = 0; i < f->plan.step_ngathers[s]; i++) {
    int unit = f->plan.gathers[f->plan.step_gathers[s][i]].unit;
    if (!f->grads[unit]) f->grads[unit] = calloc(f->units[unit].padded, sizeof(float));
    if (!f->grads[unit]) return STK_ENOMEM;
  }
  return 0;
}

/* Frees the gathers step s was the last to need, and tells the comm thread. */
static void step_end(struct fsdp *f, int s) {
  pthread_mutex_lock(&f->mu);
  for (int i = 0; i < f->plan.step_ngathers[s]; i++) {
    int g = f->plan.step_gathers[s][i];
    if (f->plan.gathers[g].last_step != s) continue;
    int unit = f->plan.gathers[g].unit;
    free(f->bufs[g]);
    f->bufs[g] = NULL;
    f->params[unit] = NULL;
    size_t bytes = f->units[unit].padded * sizeof(float);
    if (f->plan.gathers[g].root)
      fsdp_limiter_release_root(&f->lim, bytes);
    else
      fsdp_limiter_release(&f->lim, bytes);
  }
  f->done_steps = s + 1;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
}

/* After every reduce-scatter: the local squared norm and loss, all-reduced. */
static int norm_and_loss(struct fsdp *f) {
  int rc = wait_for(f, &f->rs_done, f->U);
  if (rc) return rc;
  double sq = 0.0;
  for (int k = 0; k < f->U; k++) sq += optim_sq_norm(f->units[k].gshard, f->units[k].count);
  pthread_mutex_lock(&f->mu);
  f->red[0] = (float)sq;
  f->red[1] = model_loss(f->model);
  f->red[2] = f->vote;
  f->done_steps = f->plan.nsteps + 1;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
  return wait_for(f, &f->ar_done, 1);
}

static int compute(struct fsdp *f) {
  for (int s = 0; s < f->plan.nsteps; s++) {
    int rc = step_begin(f, s);
    if (rc) return rc;
    int unit = fsdp_plan_step_unit(&f->plan, s);
    if (fsdp_plan_step_backward(&f->plan, s))
      rc = model_backward_unit(f->model, unit, f->params, f->grads);
    else
      rc = model_forward_unit(f->model, unit, f->params);
    if (rc) return rc;
    step_end(f, s);
  }
  return norm_and_loss(f);
}

static int apply_optimizer(struct fsdp *f) {
  const struct fsdp_opts *o = &f->opts;
  float factor = optim_clip_factor(f->red[0], o->clip_norm);
  struct optim_adamw h = o->adamw;
  h.lr = optim_lr_cosine(f->steps_done, o->warmup_steps, o->total_steps, o->lr_max, o->lr_min);
  for (int k = 0; k < f->U; k++) {
    struct fsdp_unit *u = &f->units[k];
    if (factor != 1.0f) optim_scale(u->gshard, u->count, factor);
    int rc =
        optim_adamw_step(&h, f->steps_done + 1, u->param, u->gshard, u->m, u->v, u->mask, u->count);
    if (rc) return rc;
  }
  f->steps_done++;
  f->nsteps_stat++;
  return 0;
}

int fsdp_step(struct fsdp *f, const int32_t *tokens, const int32_t *targets, int B, int T,
              float *ret_loss) {
  if (!f || !tokens || !targets) return STK_EINVAL;
  int rc = ensure_model(f, B, T);
  if (!rc) rc = model_set_batch(f->model, tokens, targets);
  if (rc) return rc;
  step_reset(f);
  pthread_t comm;
  if (pthread_create(&comm, NULL, fsdp_comm_main, f)) return STK_ENOMEM;
  rc = compute(f);
  if (rc) fsdp_fail(f, rc);
  pthread_join(comm, NULL);
  rc = f->error;
  step_cleanup(f);
  f->votes = 0;
  if (rc) return rc;
  float loss = f->red[1] / (float)f->world;
  rc = f->before_update ? f->before_update(f->before_update_arg) : 0;
  if (!rc) rc = apply_optimizer(f);
  if (rc) return rc;
  f->votes = (int)(f->red[2] + 0.5f); /* A small integer sum: exact in f32. */
  f->vote = 0.0f;
  if (ret_loss) *ret_loss = loss;
  return 0;
}

void fsdp_set_before_update(struct fsdp *f, int (*fn)(void *arg), void *arg) {
  f->before_update = fn;
  f->before_update_arg = arg;
}

void fsdp_set_vote(struct fsdp *f, int vote) {
  f->vote = (float)vote;
}

int fsdp_votes(const struct fsdp *f) {
  return f->votes;
}
