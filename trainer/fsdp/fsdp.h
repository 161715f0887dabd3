/*
 * fsdp: fully sharded (ZeRO-3) training of the reference GPT over a coll
 * group. Every model unit's flat f32 buffer is padded to a multiple of the
 * world size W and cut into W equal shards; rank r keeps shard r of every
 * unit as the fp32 master copy, with the AdamW state (m, v) of that shard
 * only. A step all-gathers each unit just before it computes and frees it
 * right after (forward in order, backward in reverse, gathering again),
 * reduce-scatters each unit's gradient (the mean over ranks), clips by the
 * global norm (one all-reduce of squared norms) and updates the shards.
 *
 * Collectives run on a communication thread that executes one fixed list of
 * collectives per step in the same order on every rank, so the all-gather
 * of the next unit overlaps the current unit's compute. A rate limiter
 * bounds the unsharded units alive at once (K, default 2: the current unit
 * and the prefetched one, like PyTorch FSDP's limit_all_gathers) and
 * optionally their bytes; the communication thread waits before issuing an
 * all-gather until the compute side frees a buffer. K = 1 makes unit 0 (the
 * embeddings, which the tied head reads beside itself) the root unit, as
 * PyTorch FSDP's root module: gathered once per step, kept until its
 * backward and not counted against K (so at most 2 buffers are alive);
 * opts.root_unit does the same at any K (K + 1 buffers at most). The
 * limiter changes only timing and memory: results are bit-identical with
 * any K.
 *
 * Batches: each rank passes its own slice of the global batch (equal B on
 * every rank); gradients are averaged over ranks and the loss fsdp_step
 * reports is the mean over ranks, so W ranks match 1 rank on the whole
 * batch up to floating-point rounding.
 *
 * Mixed precision (opts.precision = FSDP_PRECISION_BF16): the master
 * shards, gradients shards and AdamW state stay f32; each rank narrows its
 * parameter shard to bf16 for the all-gather (half the bytes), the model
 * computes on the gathered bf16 values widened to f32 (the CPU model stays
 * f32 inside), and gradients are narrowed to bf16 for the reduce-scatter
 * (summed by the ring in f32, rounded to bf16 per hop) and widened into the
 * f32 gradient shard AdamW reads. One rank (no group) rounds the same way.
 *
 * Votes: a rank may set a vote before a step; the step's all-reduce (the
 * one that already carries the gradient norm and the loss) also sums the
 * votes, so after the step every rank knows how many ranks voted, at the
 * same step, with no extra collective (stoker-train uses it to agree on
 * the step of a checkpoint an operator asked some rank for).
 *
 * Threading: one thread drives an fsdp object; fsdp_step starts and joins
 * its communication thread inside the call.
 */
#ifndef STK_FSDP_H
#define STK_FSDP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coll.h"
#include "model.h"
#include "optim.h"

enum fsdp_precision {
  FSDP_PRECISION_FP32 = 0, /* Everything f32 (the default). */
  FSDP_PRECISION_BF16 = 1, /* bf16 all-gather and reduce-scatter, f32 master state. */
};

struct fsdp_opts {
  int max_inflight_units;    /* K: unsharded units alive at once; 0 = no limit. */
  size_t max_inflight_bytes; /* Optional byte budget for them; 0 = none. */
  uint64_t seed;             /* model_init_unit seed (every rank the same). */
  float lr_max, lr_min;      /* Cosine schedule with linear warmup (optim_lr_cosine). */
  int64_t warmup_steps, total_steps;
  struct optim_adamw adamw; /* lr is taken from the schedule. */
  float clip_norm;          /* Global gradient-norm clip; 0 = none. */
  enum fsdp_precision precision;
  /* Unit 0 (the embeddings the tied head reads) as the root unit: gathered
   * once per step, held until its backward, outside K (PyTorch FSDP's root
   * module is not resharded after forward either). Fewer bytes on the wire
   * (unit 0 gathered once, not three times) and the limiter can prefetch
   * through the head's step, for one more buffer alive. Always on at K = 1. */
  bool root_unit;
};

/* K = 2, no byte budget, seed 0, lr 3e-4 constant, AdamW (0.9, 0.95, 1e-8, 0.1), clip 1,
 * fp32, no root unit. */
void fsdp_opts_default(struct fsdp_opts *ret_opts);

struct fsdp;

/*
 * Builds the sharded model: initialises every unit from opts->seed and
 * keeps this rank's shards. group may be NULL for one rank (no
 * collectives); otherwise the fsdp borrows it (the caller frees it after
 * fsdp_free). STK_EINVAL for a bad configuration, K < 0, or a byte budget
 * below the largest step's needs (with K = 1, the root unit beside the
 * largest other unit); STK_ENOMEM.
 */
int fsdp_new(const struct model_config *cfg, struct coll_group *group, const struct fsdp_opts *opts,
             struct fsdp **ret_fsdp);
void fsdp_free(struct fsdp *f);

/*
 * One training step on this rank's slice (B, T) of the global batch:
 * forward, backward, gradient mean over ranks, clipping, AdamW. Every rank
 * must call it with the same B and T. *ret_loss (may be NULL) is the mean
 * loss over ranks before the update. A failed collective (a dead peer, a
 * timeout, an aborted group) is returned as its error (STK_ETIMEDOUT,
 * STK_EIO, STK_ECANCELED, ...); the shards are then left as they were
 * before the step, and the group must be rebuilt. STK_EINVAL for bad tokens.
 */
int fsdp_step(struct fsdp *f, const int32_t *tokens, const int32_t *targets, int B, int T,
              float *ret_loss);

/* This rank's vote for the next fsdp_step (cleared by a successful step):
 * a whole number >= 0 (0: none, 1: a plain vote). The step sums the votes
 * in f32, exact while the sum stays below 2^24, so a caller may weigh
 * kinds of votes (stoker-train: 1 for a checkpoint, 4096 for a checkpoint
 * then stop, below 4096 ranks). */
void fsdp_set_vote(struct fsdp *f, int vote);
/* Runs fn(arg) in every later fsdp_step after every collective succeeded
 * and right before the optimizer writes this rank's shards (parameters,
 * m, v): nothing else in a step writes them, so a checkpoint staged from
 * the shards in the background (stk_ckpt_stage_start) fences here while
 * the forward and backward ran beside it. A nonzero return fails the step
 * with it and leaves the shards untouched. fn NULL: none. */
void fsdp_set_before_update(struct fsdp *f, int (*fn)(void *arg), void *arg);

/* The sum of the votes of the last successful step (with plain votes, how
 * many ranks voted; the same on every rank); 0 after a failed step. */
int fsdp_votes(const struct fsdp *f);

/* One unit's shard on this rank, for checkpointing. */
struct fsdp_shard {
  int unit;
  size_t unit_numel;   /* Real elements of the unit (no padding). */
  size_t padded_numel; /* The unit padded to W * count: its global sharded size. */
  size_t offset;       /* This rank's first element: rank * count. */
  size_t count;        /* Elements in this shard. */
  float *param;        /* count values each, owned by the fsdp object; */
  float *adam_m;       /* valid until fsdp_free; writing them changes */
  float *adam_v;       /* the model. */
};

int fsdp_unit_count(const struct fsdp *f);
/* STK_EINVAL for a bad unit. */
int fsdp_shard(struct fsdp *f, int unit, struct fsdp_shard *ret_shard);
/* Optimizer steps taken (AdamW's t - 1 for the next step; the schedule's step). */
int64_t fsdp_steps_done(const struct fsdp *f);

/*
 * Restores shards saved from an fsdp of the same model and world size:
 * shards[u] for every unit u (count = fsdp_unit_count), each with the
 * same unit, padded_numel, offset and count as this rank's, and the number
 * of steps done. Copies; the caller keeps the buffers. STK_EINVAL on any
 * mismatch (nothing is changed then).
 */
int fsdp_load_shards(struct fsdp *f, const struct fsdp_shard *shards, int count,
                     int64_t steps_done);

/*
 * Reads the whole unit's parameters (unit_numel values) into ret_params,
 * by an all-gather: every rank must call it for the same unit. For tests
 * and export.
 */
int fsdp_gather_unit(struct fsdp *f, int unit, float *ret_params);

struct fsdp_stats {
  size_t peak_unsharded_bytes; /* Most bytes of gathered parameters alive at once. */
  int peak_unsharded_units;    /* Most gathered unit buffers alive at once. */
  int64_t limiter_wait_ns;     /* The communication thread waiting on the limiter. */
  int64_t coll_wait_ns;        /* The compute side waiting on collectives. */
  int64_t coll_busy_ns;        /* The communication thread inside collectives. */
  uint64_t bytes_moved;        /* Bytes this rank sends in ring schedules: (W-1) * chunk. */
  uint64_t gather_bytes;       /* The all-gathers' part of bytes_moved. */
  int64_t steps;
};

/* Counters since fsdp_new or the last reset. */
void fsdp_get_stats(const struct fsdp *f, struct fsdp_stats *ret_stats);
void fsdp_reset_stats(struct fsdp *f);

#endif
