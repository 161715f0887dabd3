/*
 * fsdp_train.c: see fsdp_train.h.
 */
#include "fsdp_train.h"

#include <math.h>
#include <stdlib.h>

#include "stk_error.h"

const struct model_config train_small = {
    .vocab_size = 64, .max_seq_len = 8, .channels = 16, .n_layer = 2, .n_head = 2};

void train_batch(int step, int V, int32_t *ret_tokens, int32_t *ret_targets) {
  uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(step + 1);
  for (int i = 0; i < TRAIN_GB * TRAIN_T; i++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    ret_tokens[i] = (int32_t)(s % (uint64_t)V);
    ret_targets[i] = (int32_t)((s >> 32) % (uint64_t)V);
  }
}

void train_opts(struct fsdp_opts *ret_opts) {
  fsdp_opts_default(ret_opts);
  ret_opts->seed = 1234;
  ret_opts->lr_max = 1e-2f;
  ret_opts->lr_min = 1e-3f;
  ret_opts->warmup_steps = 2;
  ret_opts->total_steps = 10;
  ret_opts->clip_norm = 1.0f;
}

void train_opts_scale_visible(struct fsdp_opts *ret_opts) {
  train_opts(ret_opts);
  ret_opts->adamw.eps = 1.0f;
  ret_opts->clip_norm = 0.0f;
  ret_opts->lr_max = ret_opts->lr_min = 1.0f;
}

int train_steps(struct fsdp *f, int V, int rank, int W, int first_step, int steps,
                float *ret_losses) {
  int32_t tokens[TRAIN_GB * TRAIN_T], targets[TRAIN_GB * TRAIN_T];
  int B = TRAIN_GB / W;
  size_t at = (size_t)rank * B * TRAIN_T;
  for (int i = 0; i < steps; i++) {
    train_batch(first_step + i, V, tokens, targets);
    int rc = fsdp_step(f, tokens + at, targets + at, B, TRAIN_T, &ret_losses[i]);
    if (rc) return rc;
  }
  return 0;
}

static int rank_body(int rank, struct coll_group *g, void *arg) {
  struct train_run *run = arg;
  int W = g ? g->size : 1;
  struct fsdp *f = NULL;
  int rc = fsdp_new(run->cfg, g, &run->opts, &f);
  if (rc) return rc;
  float losses[TRAIN_MAX_STEPS] = {0};
  rc = train_steps(f, run->cfg->vocab_size, rank, W, 0, run->steps, losses);
  fsdp_get_stats(f, &run->stats[rank]); /* Before the gathers below. */
  for (int k = 0; k < fsdp_unit_count(f) && !rc; k++) {
    float *full = malloc(model_unit_numel(run->cfg, k) * sizeof(float));
    rc = fsdp_gather_unit(f, k, full);
    if (rank == 0)
      run->params[k] = full;
    else
      free(full);
  }
  if (rank == 0)
    for (int i = 0; i < run->steps; i++) run->loss[i] = losses[i];
  fsdp_free(f);
  return rc;
}

int train_ranks(int W, struct train_run *run) {
  if (!run->cfg) run->cfg = &train_small;
  if (W == 1) {
    run->rc[0] = rank_body(0, NULL, run);
    return run->rc[0];
  }
  ranks_run(W, 20000, rank_body, run, run->rc);
  for (int r = 0; r < W; r++)
    if (run->rc[r]) return run->rc[r];
  return 0;
}

void train_run_close(struct train_run *run) {
  for (int k = 0; k < TRAIN_MAX_UNITS; k++) free(run->params[k]), run->params[k] = NULL;
}

double train_max_param_diff(const struct train_run *a, const struct train_run *b) {
  double worst = 0.0;
  for (int k = 0; k < model_unit_count(a->cfg); k++)
    for (size_t i = 0; i < model_unit_numel(a->cfg, k); i++) {
      double d = fabs((double)a->params[k][i] - (double)b->params[k][i]);
      if (d > worst) worst = d;
    }
  return worst;
}
