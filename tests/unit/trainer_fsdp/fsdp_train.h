/*
 * fsdp_train.h: what the trainer_fsdp tests share: the small model, a
 * deterministic global batch per step, test options, and "train W ranks for
 * n steps" which returns the losses, the gathered parameters and the
 * counters, so that tests compare runs instead of repeating the loop.
 */
#ifndef FSDP_TRAIN_H
#define FSDP_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp.h"
#include "fsdp_ranks.h"

#define TRAIN_MAX_STEPS 8
#define TRAIN_MAX_UNITS 16
#define TRAIN_GB        12 /* Global batch: divisible by W = 1, 2, 3, 4. */
#define TRAIN_T         8

/* V=64, maxT=8, C=16, L=2, NH=2. */
extern const struct model_config train_small;

/* Tokens and targets of the whole global batch (TRAIN_GB, TRAIN_T) at `step`. */
void train_batch(int step, int V, int32_t *ret_tokens, int32_t *ret_targets);

/* Default options with a warmup + cosine schedule, clipping and a fixed seed. */
void train_opts(struct fsdp_opts *ret_opts);

/* AdamW and clipping hide a wrong gradient scale (both normalise it); with
 * eps = 1, no clipping and lr 1 an update is about lr * gradient, so a
 * gradient summed instead of averaged over ranks shows. */
void train_opts_scale_visible(struct fsdp_opts *ret_opts);

struct train_run {
  const struct model_config *cfg;
  struct fsdp_opts opts;
  int steps;
  float loss[TRAIN_MAX_STEPS];        /* Rank 0's (the mean over ranks). */
  float *params[TRAIN_MAX_UNITS];     /* Every unit after training, gathered. */
  struct fsdp_stats stats[RANKS_MAX]; /* Per rank. */
  int rc[RANKS_MAX];
};

/* Trains W ranks (W = 1: no group) from cfg/opts for steps steps, each rank
 * on its slice of the global batch; fills run. 0 when every rank succeeded. */
int train_ranks(int W, struct train_run *run);
void train_run_close(struct train_run *run);

/* The largest |a - b| over every parameter of two runs. */
double train_max_param_diff(const struct train_run *a, const struct train_run *b);

/* Trains one rank's fsdp (vocabulary V) for `steps` steps from `first_step`,
 * on rank's slice of each global batch; ret_losses[steps]. */
int train_steps(struct fsdp *f, int V, int rank, int W, int first_step, int steps,
                float *ret_losses);

#endif
