/*
 * The whole model: parameter layout and initialisation, the whole-model
 * gradient against finite differences on random parameters, unit-by-unit
 * passes (as FSDP runs them) against whole-model passes bit for bit,
 * determinism, and the pass-order contract.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "model.h"
#include "model_test.h"
#include "stk_error.h"

#define B    2
#define T    8
#define MAXU 8

struct batch {
  int32_t inputs[B * T], targets[B * T];
};

static struct batch make_batch(uint64_t seed) {
  struct batch b;
  test_tokens(b.inputs, B * T, &seed, SMALL.vocab_size);
  test_tokens(b.targets, B * T, &seed, SMALL.vocab_size);
  return b;
}

static struct model *new_model(const struct batch *b) {
  struct model *m = NULL;
  assert_int_equal(model_new(&SMALL, B, T, &m), 0);
  assert_int_equal(model_set_batch(m, b->inputs, b->targets), 0);
  return m;
}

static void alloc_units(float **units) {
  assert_int_equal(model_units_alloc(&SMALL, units), 0);
}

static void test_layout(void **state) {
  assert_int_equal(model_config_check(&SMALL), 0);
  struct model_config bad = SMALL;
  bad.n_head = 3; /* does not divide 16 */
  assert_int_equal(model_config_check(&bad), STK_EINVAL);
  assert_int_equal(model_unit_count(&SMALL), 4);
  assert_int_equal(model_unit_kind(&SMALL, 0), MODEL_UNIT_EMBED);
  assert_int_equal(model_unit_kind(&SMALL, 2), MODEL_UNIT_BLOCK);
  assert_int_equal(model_unit_kind(&SMALL, 3), MODEL_UNIT_HEAD);
  int C = 16;
  assert_int_equal(model_unit_numel(&SMALL, 0), 64 * C + 8 * C);
  assert_int_equal(model_unit_numel(&SMALL, 1), 12 * C * C + 13 * C);
  assert_int_equal(model_unit_numel(&SMALL, 3), 2 * C);
  assert_int_equal(model_unit_numel(&SMALL, 4), 0);
  assert_int_equal(model_param_count(&SMALL), 1152 + 2 * 3280 + 32);

  struct model_tensor t[MODEL_MAX_UNIT_TENSORS];
  int n;
  assert_int_equal(model_unit_tensors(&SMALL, 2, t, &n), 0);
  assert_int_equal(n, 12);
  size_t off = 0, decayed = 0;
  for (int i = 0; i < n; i++) { /* contiguous, in order */
    assert_int_equal(t[i].offset, off);
    off += t[i].numel;
    decayed += t[i].decay ? t[i].numel : 0;
  }
  assert_int_equal(off, model_unit_numel(&SMALL, 2));
  assert_string_equal(t[2].name, "qkvw");
  assert_int_equal(t[2].shape[0], 3 * C);
  assert_int_equal(t[2].shape[1], C);
  assert_int_equal(decayed, 12 * C * C); /* the four matrices */
  uint8_t mask[4096];
  assert_int_equal(model_unit_decay_mask(&SMALL, 2, mask), 0);
  size_t ones = 0;
  for (size_t i = 0; i < off; i++) ones += mask[i];
  assert_int_equal(ones, decayed);
  assert_int_equal(mask[0], 0);     /* ln1w */
  assert_int_equal(mask[2 * C], 1); /* qkvw */

  int needs[2];
  assert_int_equal(model_unit_needs(&SMALL, 1, needs), 1);
  assert_int_equal(model_unit_needs(&SMALL, 3, needs), 2);
  assert_int_equal(needs[1], 0); /* the head reads the tied wte */
  assert_int_equal(model_unit_tensors(&SMALL, -1, t, &n), STK_EINVAL);
}

static double stddev(const float *p, size_t n) {
  double s = 0.0, s2 = 0.0;
  for (size_t i = 0; i < n; i++) s += p[i], s2 += (double)p[i] * p[i];
  return sqrt(s2 / n - (s / n) * (s / n));
}

static void test_init(void **state) {
  struct model_config big = {
      .vocab_size = 512, .max_seq_len = 64, .channels = 64, .n_layer = 4, .n_head = 4};
  float *u[MAXU];
  assert_int_equal(model_units_alloc(&big, u), 0);
  assert_int_equal(model_init_params(&big, 7, u), 0);
  struct model_tensor t[MODEL_MAX_UNIT_TENSORS];
  int n;
  model_unit_tensors(&big, 0, t, &n);
  assert_true(fabs(stddev(u[0], t[0].numel) - 0.02) < 0.001); /* wte */
  model_unit_tensors(&big, 1, t, &n);
  double proj = 0.02 / sqrt(2.0 * big.n_layer);
  assert_true(fabs(stddev(u[1] + t[2].offset, t[2].numel) - 0.02) < 0.001);    /* qkvw */
  assert_true(fabs(stddev(u[1] + t[4].offset, t[4].numel) - proj) < 0.0007);   /* attprojw */
  assert_true(fabs(stddev(u[1] + t[10].offset, t[10].numel) - proj) < 0.0005); /* fcprojw */
  assert_true(u[1][0] == 1.0f && u[1][t[1].offset] == 0.0f);  /* ln1w = 1, ln1b = 0 */
  assert_true(u[1][t[3].offset] == 0.0f);                     /* qkvb = 0 */
  assert_true(u[5][0] == 1.0f && u[5][big.channels] == 0.0f); /* lnfw, lnfb */

  /* One unit alone gives the same bits; another seed gives others. */
  float *one = malloc(model_unit_numel(&big, 2) * sizeof(float));
  assert_int_equal(model_init_unit(&big, 7, 2, one), 0);
  assert_memory_equal(one, u[2], model_unit_numel(&big, 2) * sizeof(float));
  assert_int_equal(model_init_unit(&big, 8, 2, one), 0);
  assert_memory_not_equal(one, u[2], model_unit_numel(&big, 2) * sizeof(float));
  /* Units draw from different streams: block 1 and block 2 differ. */
  assert_memory_not_equal(u[1], u[2], model_unit_numel(&big, 1) * sizeof(float));
  free(one);
  model_units_free(&big, u);
  assert_null(u[0]);
}

/* Random parameters, larger than the init so that every gradient is sizeable. */
static void random_params(float **p, uint64_t seed) {
  for (int k = 0; k < model_unit_count(&SMALL); k++)
    test_fill(p[k], model_unit_numel(&SMALL, k), &seed, -0.5f, 0.5f);
}

static double loss_at(struct model *m, float **p) {
  float loss;
  assert_int_equal(model_forward(m, p, &loss), 0);
  return loss;
}

static void test_grad_check(void **state) {
  struct batch b = make_batch(3);
  struct model *m = new_model(&b);
  float *p[MAXU], *g[MAXU];
  alloc_units(p), alloc_units(g);
  random_params(p, 99);
  loss_at(m, p);
  assert_int_equal(model_backward(m, p, g), 0);
  const double h = 1e-2;
  for (int k = 0; k < model_unit_count(&SMALL); k++) {
    size_t n = model_unit_numel(&SMALL, k);
    double *num = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
      float x0 = p[k][i];
      p[k][i] = x0 + (float)h;
      float xp = p[k][i];
      double fp = loss_at(m, p);
      p[k][i] = x0 - (float)h;
      float xm = p[k][i];
      double fm = loss_at(m, p);
      p[k][i] = x0;
      num[i] = (fp - fm) / ((double)xp - xm);
    }
    char what[32];
    snprintf(what, sizeof(what), "unit %d", k);
    assert_true(test_worst(g[k], num, n, 1e-4, 1e-2, what) <= 1.0);
    free(num);
  }
  model_units_free(&SMALL, p), model_units_free(&SMALL, g);
  model_free(m);
}

/* A copy of unit k in a fresh buffer, as an FSDP all-gather would give. */
static float *gather(float *const *full, int k) {
  size_t bytes = model_unit_numel(&SMALL, k) * sizeof(float);
  float *p = malloc(bytes);
  memcpy(p, full[k], bytes);
  return p;
}

static void test_unit_by_unit(void **state) {
  struct batch b = make_batch(4);
  float *p[MAXU], *g_whole[MAXU], *g_units[MAXU];
  alloc_units(p), alloc_units(g_whole), alloc_units(g_units);
  assert_int_equal(model_init_params(&SMALL, 5, p), 0);
  struct model *whole = new_model(&b), *units = new_model(&b);
  float loss_whole;
  assert_int_equal(model_forward(whole, p, &loss_whole), 0);
  assert_int_equal(model_backward(whole, p, g_whole), 0);

  int U = model_unit_count(&SMALL);
  for (int k = 0; k < U; k++) { /* gather what unit k needs, run it, free it */
    float *view[MAXU] = {0};
    int needs[2], n = model_unit_needs(&SMALL, k, needs);
    for (int i = 0; i < n; i++) view[needs[i]] = gather(p, needs[i]);
    assert_int_equal(model_forward_unit(units, k, view), 0);
    for (int i = 0; i < n; i++) free(view[needs[i]]);
  }
  float loss_units = model_loss(units);
  assert_memory_equal(&loss_units, &loss_whole, sizeof(float));
  size_t nlogits = (size_t)B * T * SMALL.vocab_size * sizeof(float);
  assert_memory_equal(model_logits(units), model_logits(whole), nlogits);

  /* Backward: fresh gradient buffers per unit; unit 0's (tied wte) lives from the head to the end.
   */
  float *grads[MAXU] = {0};
  grads[0] = calloc(model_unit_numel(&SMALL, 0), sizeof(float));
  for (int k = U - 1; k >= 0; k--) {
    float *view[MAXU] = {0};
    int needs[2], n = model_unit_needs(&SMALL, k, needs);
    for (int i = 0; i < n; i++) view[needs[i]] = gather(p, needs[i]);
    if (k > 0) grads[k] = calloc(model_unit_numel(&SMALL, k), sizeof(float));
    assert_int_equal(model_backward_unit(units, k, view, grads), 0);
    memcpy(g_units[k], grads[k], model_unit_numel(&SMALL, k) * sizeof(float));
    for (int i = 0; i < n; i++) free(view[needs[i]]);
    if (k > 0) free(grads[k]), grads[k] = NULL;
  }
  free(grads[0]);
  for (int k = 0; k < U; k++)
    assert_memory_equal(g_units[k], g_whole[k], model_unit_numel(&SMALL, k) * sizeof(float));
  model_free(whole), model_free(units);
  model_units_free(&SMALL, p), model_units_free(&SMALL, g_whole), model_units_free(&SMALL, g_units);
}

/* Big enough that the matmuls, attention and loss all pass LAYER_PAR_MIN_WORK. */
static const struct model_config MID = {
    .vocab_size = 256, .max_seq_len = 32, .channels = 64, .n_layer = 2, .n_head = 4};

/* Loss and every gradient bit after one pass from `seed` on a fresh (B, T) model. */
static float run_once(const struct model_config *cfg, int b_, int t_, uint64_t seed, float **g) {
  uint64_t s = 6;
  size_t n = (size_t)b_ * t_;
  int32_t *tokens = malloc(2 * n * sizeof(int32_t));
  test_tokens(tokens, 2 * n, &s, cfg->vocab_size);
  float *p[MAXU];
  assert_int_equal(model_units_alloc(cfg, p), 0);
  assert_int_equal(model_init_params(cfg, seed, p), 0);
  struct model *m = NULL;
  assert_int_equal(model_new(cfg, b_, t_, &m), 0);
  assert_int_equal(model_set_batch(m, tokens, tokens + n), 0);
  float loss;
  assert_int_equal(model_forward(m, p, &loss), 0);
  model_units_zero(cfg, g);
  assert_int_equal(model_backward(m, p, g), 0);
  model_free(m);
  model_units_free(cfg, p);
  free(tokens);
  return loss;
}

static void assert_same_grads(const struct model_config *cfg, float **a, float **b) {
  for (int k = 0; k < model_unit_count(cfg); k++)
    assert_memory_equal(a[k], b[k], model_unit_numel(cfg, k) * sizeof(float));
}

static void test_determinism(void **state) {
  float *g1[MAXU], *g2[MAXU];
  alloc_units(g1), alloc_units(g2);
  float l1 = run_once(&SMALL, B, T, 42, g1), l2 = run_once(&SMALL, B, T, 42, g2);
  assert_memory_equal(&l1, &l2, sizeof(float));
  assert_same_grads(&SMALL, g1, g2);
  float l3 = run_once(&SMALL, B, T, 43, g2);
  assert_true(l1 != l3);
  assert_true(fabsf(l1 - logf(64.0f)) < 0.1f); /* near-uniform predictions at init */
  model_units_free(&SMALL, g1), model_units_free(&SMALL, g2);
}

/* The same bits on one thread as on four (trivially true without OpenMP). */
static void test_thread_count(void **state) {
  float *g1[MAXU], *g2[MAXU];
  assert_int_equal(model_units_alloc(&MID, g1), 0);
  assert_int_equal(model_units_alloc(&MID, g2), 0);
#ifdef _OPENMP
  int saved = omp_get_max_threads();
  omp_set_num_threads(1);
#endif
  float one = run_once(&MID, 4, 32, 42, g1);
#ifdef _OPENMP
  omp_set_num_threads(4);
#endif
  float four = run_once(&MID, 4, 32, 42, g2);
#ifdef _OPENMP
  omp_set_num_threads(saved);
#endif
  assert_memory_equal(&one, &four, sizeof(float));
  assert_same_grads(&MID, g1, g2);
  model_units_free(&MID, g1), model_units_free(&MID, g2);
}

static void test_pass_order(void **state) {
  struct batch b = make_batch(8);
  float *p[MAXU], *g[MAXU];
  alloc_units(p), alloc_units(g);
  model_init_params(&SMALL, 1, p);
  struct model *m = new_model(&b);
  assert_int_equal(model_backward_unit(m, 3, p, g), STK_ESTATE); /* no forward yet */
  assert_int_equal(model_forward_unit(m, 1, p), STK_ESTATE);     /* unit 0 first */
  assert_int_equal(model_forward_unit(m, 0, p), 0);
  assert_int_equal(model_forward_unit(m, 2, p), STK_ESTATE); /* skipped unit 1 */
  assert_int_equal(model_forward_unit(m, 1, p), 0);
  assert_int_equal(model_forward_unit(m, 2, p), 0);
  float *no_wte[MAXU] = {NULL, NULL, NULL, p[3]};
  assert_int_equal(model_forward_unit(m, 3, no_wte), STK_EINVAL); /* the head needs unit 0 */
  assert_int_equal(model_forward_unit(m, 4, p), STK_EINVAL);
  assert_true(isnan(model_loss(m)));
  assert_int_equal(model_forward_unit(m, 3, p), 0);
  assert_false(isnan(model_loss(m)));
  assert_int_equal(model_backward_unit(m, 2, p, g), STK_ESTATE); /* head first */
  assert_int_equal(model_backward(m, p, g), 0);
  assert_int_equal(model_backward_unit(m, 0, p, g), STK_ESTATE); /* pass finished */

  /* Bad tokens are refused and change nothing. */
  struct batch bad = b;
  bad.targets[3] = SMALL.vocab_size;
  assert_int_equal(model_set_batch(m, bad.inputs, bad.targets), STK_EINVAL);
  bad = b;
  bad.inputs[0] = -1;
  assert_int_equal(model_set_batch(m, bad.inputs, bad.targets), STK_EINVAL);
  struct model *none = NULL;
  assert_int_equal(model_new(&SMALL, B, SMALL.max_seq_len + 1, &none), STK_EINVAL);
  assert_null(none);

  /* Forward without targets: probabilities, no loss, no backward. */
  assert_int_equal(model_set_batch(m, b.inputs, NULL), 0);
  float loss = 0.0f;
  assert_int_equal(model_forward(m, p, &loss), 0);
  assert_true(isnan(loss));
  double sum = 0.0;
  for (int v = 0; v < SMALL.vocab_size; v++) sum += model_probs(m)[v];
  assert_true(fabs(sum - 1.0) < 1e-5);
  assert_int_equal(model_backward(m, p, g), STK_ESTATE);
  model_free(m);
  model_units_free(&SMALL, p), model_units_free(&SMALL, g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layout),      cmocka_unit_test(test_init),
      cmocka_unit_test(test_grad_check),  cmocka_unit_test(test_unit_by_unit),
      cmocka_unit_test(test_determinism), cmocka_unit_test(test_thread_count),
      cmocka_unit_test(test_pass_order),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
