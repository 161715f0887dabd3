/*
 * FSDP must compute what plain training computes. One rank (no group)
 * against a straightforward model + AdamW loop written here, then W = 2, 3,
 * 4 ranks on the ring, each on its slice of the global batch, against one
 * rank on the whole batch: losses and every parameter after several steps
 * within a tight tolerance (only the summation order of the gradient mean
 * differs).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "fsdp_train.h"

#define STEPS 5

/* The reference: the whole model in one process, no sharding. */
static void plain_train(const struct fsdp_opts *o, struct train_run *ret) {
  const struct model_config *cfg = &train_small;
  int U = model_unit_count(cfg);
  float *p[TRAIN_MAX_UNITS], *g[TRAIN_MAX_UNITS], *m[TRAIN_MAX_UNITS], *v[TRAIN_MAX_UNITS];
  uint8_t *mask[TRAIN_MAX_UNITS];
  size_t len[TRAIN_MAX_UNITS];
  assert_int_equal(model_units_alloc(cfg, p), 0);
  assert_int_equal(model_units_alloc(cfg, g), 0);
  assert_int_equal(model_units_alloc(cfg, m), 0);
  assert_int_equal(model_units_alloc(cfg, v), 0);
  assert_int_equal(model_init_params(cfg, o->seed, p), 0);
  for (int k = 0; k < U; k++) {
    len[k] = model_unit_numel(cfg, k);
    mask[k] = malloc(len[k]);
    assert_int_equal(model_unit_decay_mask(cfg, k, mask[k]), 0);
  }
  struct model *model = NULL;
  assert_int_equal(model_new(cfg, TRAIN_GB, TRAIN_T, &model), 0);
  int32_t tokens[TRAIN_GB * TRAIN_T], targets[TRAIN_GB * TRAIN_T];
  for (int s = 0; s < STEPS; s++) {
    train_batch(s, cfg->vocab_size, tokens, targets);
    assert_int_equal(model_set_batch(model, tokens, targets), 0);
    assert_int_equal(model_forward(model, p, &ret->loss[s]), 0);
    model_units_zero(cfg, g);
    assert_int_equal(model_backward(model, p, g), 0);
    optim_clip_grad_norm(g, len, U, o->clip_norm, NULL);
    struct optim_adamw h = o->adamw;
    h.lr = optim_lr_cosine(s, o->warmup_steps, o->total_steps, o->lr_max, o->lr_min);
    for (int k = 0; k < U; k++)
      assert_int_equal(optim_adamw_step(&h, s + 1, p[k], g[k], m[k], v[k], mask[k], len[k]), 0);
  }
  model_free(model);
  for (int k = 0; k < U; k++) ret->params[k] = p[k], p[k] = NULL, free(mask[k]);
  model_units_free(cfg, g), model_units_free(cfg, m), model_units_free(cfg, v);
}

static void assert_runs_close(const struct train_run *a, const struct train_run *b, double tol) {
  for (int s = 0; s < STEPS; s++) {
    double d = fabs((double)a->loss[s] - (double)b->loss[s]);
    if (d > tol) fail_msg("step %d: loss %.9g vs %.9g", s, a->loss[s], b->loss[s]);
  }
  double worst = train_max_param_diff(a, b);
  if (getenv("FSDP_TEST_VERBOSE")) fprintf(stderr, "max parameter difference %g\n", worst);
  if (worst > tol) fail_msg("parameters differ by %g (tolerance %g)", worst, tol);
}

static void test_one_rank_matches_plain(void **state) {
  (void)state;
  struct train_run ref = {.cfg = &train_small, .steps = STEPS};
  struct train_run one = {.cfg = &train_small, .steps = STEPS};
  train_opts(&ref.opts);
  one.opts = ref.opts;
  plain_train(&ref.opts, &ref);
  assert_int_equal(train_ranks(1, &one), 0);
  assert_runs_close(&ref, &one, 1e-6);
  /* Training did something: the parameters left their initial values. */
  size_t n = model_unit_numel(&train_small, 1);
  float *init = malloc(n * sizeof(float));
  assert_int_equal(model_init_unit(&train_small, one.opts.seed, 1, init), 0);
  double moved = 0.0;
  for (size_t i = 0; i < n; i++) moved = fmax(moved, fabs(init[i] - one.params[1][i]));
  assert_true(moved > 1e-3);
  free(init);
  assert_int_equal(one.stats[0].steps, STEPS);
  train_run_close(&ref);
  train_run_close(&one);
}

static void check_world_opts(int W, const struct fsdp_opts *o) {
  struct train_run one = {.cfg = &train_small, .steps = STEPS, .opts = *o};
  struct train_run many = {.cfg = &train_small, .steps = STEPS, .opts = *o};
  assert_int_equal(train_ranks(1, &one), 0);
  assert_int_equal(train_ranks(W, &many), 0);
  assert_runs_close(&one, &many, 2e-5);
  /* Every rank moved data; one rank moves none. */
  assert_int_equal(one.stats[0].bytes_moved, 0);
  for (int r = 0; r < W; r++) assert_true(many.stats[r].bytes_moved > 0);
  train_run_close(&one);
  train_run_close(&many);
}

static void check_world(int W) {
  struct fsdp_opts o;
  train_opts(&o);
  check_world_opts(W, &o);
}

/* Options under which a gradient summed instead of averaged over ranks shows. */
static void test_two_ranks_gradient_scale(void **state) {
  (void)state;
  struct fsdp_opts o;
  train_opts_scale_visible(&o);
  check_world_opts(2, &o);
}

static void test_two_ranks(void **state) {
  (void)state;
  check_world(2);
}
static void test_three_ranks(void **state) {
  (void)state;
  check_world(3);
}
static void test_four_ranks(void **state) {
  (void)state;
  check_world(4);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_rank_matches_plain),
      cmocka_unit_test(test_two_ranks),
      cmocka_unit_test(test_two_ranks_gradient_scale),
      cmocka_unit_test(test_three_ranks),
      cmocka_unit_test(test_four_ranks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
