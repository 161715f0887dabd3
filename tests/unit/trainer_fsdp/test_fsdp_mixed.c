/*
 * bf16 mixed precision and the step's votes. Mixed precision must train
 * like fp32 within what bf16 rounding allows (about 3 significant digits
 * per communicated value), at one rank and on the ring, while moving half
 * the all-gather bytes, and the model must really compute on the rounded
 * parameters. Votes folded into the step's all-reduce must reach every
 * rank at the same step.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "fsdp_train.h"
#include "stk_error.h"

#define STEPS 6

/* bf16 keeps 8 significant bits (relative rounding 2^-9). Losses stay
 * within a few 1e-4 of fp32. Parameters are compared by how far training
 * moved them: AdamW turns a near-zero gradient into a full +-lr step of
 * either sign, so single elements may differ by a few lr, but the
 * root-mean-square difference must stay a small part of the movement. */
#define LOSS_TOL 5e-3
#define MOVE_TOL 0.15

static void run_world_opts(int W, const struct fsdp_opts *o, enum fsdp_precision p,
                           struct train_run *ret) {
  *ret = (struct train_run){.cfg = &train_small, .steps = STEPS, .opts = *o};
  ret->opts.precision = p;
  assert_int_equal(train_ranks(W, ret), 0);
}

static void run_world(int W, enum fsdp_precision p, struct train_run *ret) {
  struct fsdp_opts o;
  train_opts(&o);
  run_world_opts(W, &o, p, ret);
}

/* RMS of (a - b) over RMS of (a - init), over every parameter. */
static double relative_rms(const struct train_run *a, const struct train_run *b) {
  const struct model_config *cfg = a->cfg;
  float *init[TRAIN_MAX_UNITS];
  assert_int_equal(model_units_alloc(cfg, init), 0);
  assert_int_equal(model_init_params(cfg, a->opts.seed, init), 0);
  double diff = 0, moved = 0;
  for (int k = 0; k < model_unit_count(cfg); k++)
    for (size_t i = 0; i < model_unit_numel(cfg, k); i++) {
      double d = (double)a->params[k][i] - (double)b->params[k][i];
      double m = (double)a->params[k][i] - (double)init[k][i];
      diff += d * d, moved += m * m;
    }
  model_units_free(cfg, init);
  return sqrt(diff / moved);
}

static void assert_close_not_equal(const struct train_run *fp, const struct train_run *bf) {
  double worst_loss = 0;
  for (int s = 0; s < STEPS; s++)
    worst_loss = fmax(worst_loss, fabs((double)fp->loss[s] - (double)bf->loss[s]));
  double rel = relative_rms(fp, bf);
  if (getenv("FSDP_TEST_VERBOSE"))
    fprintf(stderr, "bf16 vs fp32: loss %g, parameters %g of the movement (max %g)\n", worst_loss,
            rel, train_max_param_diff(fp, bf));
  if (worst_loss > LOSS_TOL) fail_msg("losses differ by %g", worst_loss);
  if (rel > MOVE_TOL) fail_msg("parameters differ by %g of their movement", rel);
  assert_true(train_max_param_diff(fp, bf) > 1e-6); /* bf16 really rounded something. */
}

static void check_world_opts(int W, const struct fsdp_opts *o) {
  struct train_run fp, bf;
  run_world_opts(1, o, FSDP_PRECISION_FP32, &fp);
  run_world_opts(W, o, FSDP_PRECISION_BF16, &bf);
  assert_close_not_equal(&fp, &bf);
  train_run_close(&fp);
  train_run_close(&bf);
}

static void check_world(int W) {
  struct fsdp_opts o;
  train_opts(&o);
  check_world_opts(W, &o);
}

/* Options under which a bf16 gradient summed instead of averaged over ranks shows. */
static void test_bf16_gradient_scale(void **state) {
  (void)state;
  struct fsdp_opts o;
  train_opts_scale_visible(&o);
  check_world_opts(2, &o);
}

static void test_bf16_one_rank(void **state) {
  (void)state;
  check_world(1);
}
static void test_bf16_two_ranks(void **state) {
  (void)state;
  check_world(2);
}
static void test_bf16_three_ranks(void **state) {
  (void)state;
  check_world(3);
}

/* The all-gathers move 2 bytes per element instead of 4; the fp32 path
 * is what it was (same bytes, bit-identical to itself). */
static void test_bf16_gathers_half_the_bytes(void **state) {
  (void)state;
  struct train_run fp, bf;
  run_world(2, FSDP_PRECISION_FP32, &fp);
  run_world(2, FSDP_PRECISION_BF16, &bf);
  for (int r = 0; r < 2; r++) {
    assert_true(bf.stats[r].gather_bytes > 0);
    assert_int_equal(fp.stats[r].gather_bytes, 2 * bf.stats[r].gather_bytes);
    assert_true(bf.stats[r].bytes_moved < fp.stats[r].bytes_moved);
  }
  train_run_close(&fp);
  train_run_close(&bf);
}

/* The first step's loss is the plain model's on bf16-rounded parameters. */
static void test_bf16_computes_on_rounded_params(void **state) {
  (void)state;
  const struct model_config *cfg = &train_small;
  struct train_run bf;
  run_world(1, FSDP_PRECISION_BF16, &bf);
  float *p[TRAIN_MAX_UNITS];
  assert_int_equal(model_units_alloc(cfg, p), 0);
  assert_int_equal(model_init_params(cfg, bf.opts.seed, p), 0);
  struct model *m = NULL;
  assert_int_equal(model_new(cfg, TRAIN_GB, TRAIN_T, &m), 0);
  int32_t tokens[TRAIN_GB * TRAIN_T], targets[TRAIN_GB * TRAIN_T];
  train_batch(0, cfg->vocab_size, tokens, targets);
  assert_int_equal(model_set_batch(m, tokens, targets), 0);
  float exact = 0, rounded = 0;
  assert_int_equal(model_forward(m, p, &exact), 0);
  for (int k = 0; k < model_unit_count(cfg); k++) {
    size_t n = model_unit_numel(cfg, k);
    uint16_t *h = malloc(n * sizeof(uint16_t));
    coll_bf16_from_f32(h, p[k], n);
    coll_f32_from_bf16(p[k], h, n);
    free(h);
  }
  assert_int_equal(model_forward(m, p, &rounded), 0);
  assert_true(fabs((double)bf.loss[0] - (double)rounded) < 1e-6);
  assert_true(exact != rounded);
  model_free(m);
  model_units_free(cfg, p);
  train_run_close(&bf);
}

static void test_bad_precision_refused(void **state) {
  (void)state;
  struct fsdp_opts o;
  train_opts(&o);
  o.precision = (enum fsdp_precision)7;
  struct fsdp *f = NULL;
  assert_int_equal(fsdp_new(&train_small, NULL, &o, &f), STK_EINVAL);
}

/* ---- votes --------------------------------------------------------------- */

struct votes {
  int voter, at_step;
  int seen[RANKS_MAX][STEPS];
};

static int vote_body(int rank, struct coll_group *g, void *arg) {
  struct votes *v = arg;
  int W = g ? g->size : 1;
  struct fsdp_opts o;
  train_opts(&o);
  struct fsdp *f = NULL;
  int rc = fsdp_new(&train_small, g, &o, &f);
  for (int s = 0; !rc && s < STEPS; s++) {
    if (rank == v->voter && s == v->at_step) fsdp_set_vote(f, true);
    float loss;
    rc = train_steps(f, train_small.vocab_size, rank, W, s, 1, &loss);
    v->seen[rank][s] = fsdp_votes(f);
  }
  fsdp_free(f);
  return rc;
}

static void check_votes(int W, int voter, int at_step) {
  struct votes v = {.voter = voter, .at_step = at_step};
  int rc[RANKS_MAX] = {0};
  if (W == 1)
    rc[0] = vote_body(0, NULL, &v);
  else
    ranks_run(W, 20000, vote_body, &v, rc);
  for (int r = 0; r < W; r++) {
    assert_int_equal(rc[r], 0);
    for (int s = 0; s < STEPS; s++) assert_int_equal(v.seen[r][s], s == at_step ? 1 : 0);
  }
}

static void test_votes_reach_every_rank(void **state) {
  (void)state;
  check_votes(1, 0, 2);
  check_votes(3, 1, 2);
  check_votes(3, 2, STEPS - 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bf16_one_rank),
      cmocka_unit_test(test_bf16_two_ranks),
      cmocka_unit_test(test_bf16_three_ranks),
      cmocka_unit_test(test_bf16_gradient_scale),
      cmocka_unit_test(test_bf16_gathers_half_the_bytes),
      cmocka_unit_test(test_bf16_computes_on_rounded_params),
      cmocka_unit_test(test_bad_precision_refused),
      cmocka_unit_test(test_votes_reach_every_rank),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
