/*
 * The evaluation loss: every --eval-every steps (and after the last), all
 * ranks compute the model's mean loss on a fixed held-out set, so the curve
 * shows learning rather than how hard each step's batch happened to be.
 *
 * The held-out set is the dataloader's next --eval-batches steps after the
 * last one the run trains (loader steps steps .. steps + K - 1): a batch is
 * a pure function of (job, step, rank, world), an epoch serves every token
 * once, so no trained step holds these lines, and the global set is the same
 * at every world size (each rank takes its slice). A run that later trains
 * past `steps` would train on them: they are held out of this run only.
 *
 * The forward pass needs whole units: each is all-gathered (every rank, the
 * same order, as --dump-params does), the rank's slice runs through a model
 * of its own, and the per-rank means are averaged with one all-reduce
 * (slices are the same size). Fetched once per generation (the slice
 * depends on the world size). A restored generation evaluates at the
 * restored step first: the same loss as before the restore, at any world
 * size, is what test_train_elastic checks.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "train.h"

void train_eval_free(struct train *t) {
  free(t->eval_inputs);
  free(t->eval_targets);
  t->eval_inputs = t->eval_targets = NULL;
  t->eval_lines = 0;
}

/* This rank's slice of the held-out loader steps, as inputs and targets. */
static int fetch_heldout(struct train *t) {
  int T = t->o.seq_len, B = t->o.global_batch / (int)t->m.world_size;
  int lines = B * t->o.eval_batches;
  t->eval_inputs = malloc((size_t)lines * (size_t)T * sizeof(int32_t));
  t->eval_targets = malloc((size_t)lines * (size_t)T * sizeof(int32_t));
  if (!t->eval_inputs || !t->eval_targets) return STK_ENOMEM;
  for (int k = 0; k < t->o.eval_batches; k++) {
    int64_t step = t->o.steps + k;
    struct stk_batch b;
    int err =
        stk_loader_batch_all(t->loader, t->o.data_job, step, t->m.rank, t->m.world_size, 60000, &b);
    if (err)
      return train_why(t, err, "held-out batch (loader step %" PRId64 "): %s", step,
                       train_client_why(err));
    if ((int)b.lines != B || b.line_tokens != (uint32_t)T + 1) err = STK_ECORRUPT;
    size_t at = (size_t)k * (size_t)B * (size_t)T;
    if (!err) train_split_lines(&b, t->eval_inputs + at, t->eval_targets + at);
    stk_batch_free(&b);
    if (err)
      return train_why(t, err, "held-out batch (loader step %" PRId64 ") has the wrong shape",
                       step);
  }
  t->eval_lines = lines;
  return 0;
}

/* Whole units gathered, the slice's mean loss, averaged over the ranks. */
static int heldout_loss(struct train *t, float *ret_loss) {
  int U = fsdp_unit_count(t->fsdp), err = 0;
  float **params = calloc((size_t)U, sizeof(float *));
  struct model *m = NULL;
  if (!params) return STK_ENOMEM;
  for (int u = 0; !err && u < U; u++) {
    params[u] = malloc(model_unit_numel(&t->o.cfg, u) * sizeof(float));
    err = params[u] ? fsdp_gather_unit(t->fsdp, u, params[u]) : STK_ENOMEM;
  }
  if (!err) err = model_new(&t->o.cfg, t->eval_lines, t->o.seq_len, &m);
  if (!err) err = model_set_batch(m, t->eval_inputs, t->eval_targets);
  float sum = 0;
  if (!err) err = model_forward(m, params, &sum);
  if (!err && t->group && t->m.world_size > 1) err = coll_all_reduce(t->group, &sum, 1, COLL_F32);
  if (err && err != STK_ENOMEM && t->group) { /* A gather or the all-reduce failed. */
    const char *why = coll_why(t->group);
    train_why(t, err, "the held-out loss at step %" PRId64 "'s collectives: %s%s", t->step,
              why[0] ? why : stk_strerror(err),
              err == STK_EIO || err == STK_ETIMEDOUT ? " (a peer died or left?)" : "");
  }
  model_free(m);
  for (int u = 0; u < U; u++) free(params[u]);
  free(params);
  *ret_loss = sum / (float)t->m.world_size;
  return err;
}

int train_eval_maybe(struct train *t) {
  int every = t->o.eval_every;
  if (every <= 0 || (t->step % every != 0 && t->step != t->o.steps)) return 0;
  int err = t->eval_lines ? 0 : fetch_heldout(t);
  float loss = NAN;
  if (!err) err = heldout_loss(t, &loss);
  if (err)
    return train_why(t, err, "held-out loss at step %" PRId64 ": %s", t->step, stk_strerror(err));
  if (t->m.rank == 0)
    printf("[%s] eval step %" PRId64
           " loss %.6f world %u (held-out: %d lines of loader steps %" PRId64 "..%" PRId64 ")\n",
           t->o.member, t->step, (double)loss, t->m.world_size,
           t->eval_lines * (int)t->m.world_size, t->o.steps, t->o.steps + t->o.eval_batches - 1);
  return 0;
}
