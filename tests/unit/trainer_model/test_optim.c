/*
 * The optimizer pieces: AdamW against a step worked out by hand (bias
 * correction, decoupled decay only where the mask says), global-norm
 * clipping whole and as shards, and the warmup + cosine schedule.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <math.h>

#include "optim.h"
#include "stk_error.h"

static void test_adamw_hand_step(void **state) {
  struct optim_adamw h = {
      .lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f};
  float p[2] = {1.0f, -2.0f}, m[2] = {0}, v[2] = {0};
  uint8_t mask[2] = {1, 0}; /* decay the first value only */
  float g1[2] = {0.5f, -0.1f};
  /* Step 1: mhat = g, vhat = g^2, so the update is lr * sign(g) (+ decay on p[0]). */
  assert_int_equal(optim_adamw_step(&h, 1, p, g1, m, v, mask, 2), 0);
  assert_float_equal(m[0], 0.05f, 1e-7f);
  assert_float_equal(v[1], 1e-5f, 1e-9f);
  assert_float_equal(p[0], 1.0f - 0.1f * (1.0f + 0.1f * 1.0f), 1e-6f); /* 0.89 */
  assert_float_equal(p[1], -2.0f + 0.1f, 1e-6f);                       /* -1.9, no decay */
  /* Step 2, computed by hand: m = 0.015, v = 0.00033975 for p[0]; m = 0.011, v = 4.999e-5. */
  float g2[2] = {-0.3f, 0.2f};
  assert_int_equal(optim_adamw_step(&h, 2, p, g2, m, v, mask, 2), 0);
  assert_float_equal(m[0], 0.015f, 1e-7f);
  assert_float_equal(v[0], 0.00033975f, 1e-8f);
  assert_float_equal(p[0], 0.861950199f, 1e-6f);
  assert_float_equal(p[1], -1.936610360f, 1e-6f);
  assert_int_equal(optim_adamw_step(&h, 0, p, g2, m, v, mask, 2), STK_EINVAL);
}

/* A NULL mask decays everything: with a zero gradient only the decay moves p. */
static void test_adamw_decay_all(void **state) {
  struct optim_adamw h = {
      .lr = 0.5f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.2f};
  float p[3] = {1.0f, -4.0f, 0.0f}, g[3] = {0}, m[3] = {0}, v[3] = {0};
  assert_int_equal(optim_adamw_step(&h, 1, p, g, m, v, NULL, 3), 0);
  assert_float_equal(p[0], 0.9f, 1e-7f);
  assert_float_equal(p[1], -3.6f, 1e-6f);
  assert_float_equal(p[2], 0.0f, 0.0f); /* FSDP padding stays zero */
}

static void test_clip(void **state) {
  float a[2] = {3.0f, 4.0f}, b[1] = {12.0f}; /* global norm 13 */
  float *bufs[2] = {a, b};
  size_t lens[2] = {2, 1};
  float norm = 0.0f;
  optim_clip_grad_norm(bufs, lens, 2, 20.0f, &norm); /* within: unchanged */
  assert_float_equal(norm, 13.0f, 1e-6f);
  assert_float_equal(a[0], 3.0f, 0.0f);
  optim_clip_grad_norm(bufs, lens, 2, 6.5f, &norm); /* halved */
  assert_float_equal(norm, 13.0f, 1e-6f);
  assert_float_equal(a[0], 1.5f, 1e-5f);
  assert_float_equal(a[1], 2.0f, 1e-5f);
  assert_float_equal(b[0], 6.0f, 1e-5f);
  double after = optim_sq_norm(a, 2) + optim_sq_norm(b, 1);
  assert_true(fabs(sqrt(after) - 6.5) < 1e-4);
  /* Shards: the squared norms of the pieces add up to the whole. */
  float whole[4] = {1.0f, -2.0f, 2.0f, 4.0f};
  assert_true(optim_sq_norm(whole, 2) + optim_sq_norm(whole + 2, 2) == optim_sq_norm(whole, 4));
  assert_float_equal(optim_clip_factor(25.0, 10.0f), 1.0f, 0.0f);
  assert_float_equal(optim_clip_factor(400.0, 10.0f), 0.5f, 1e-6f);
  assert_float_equal(optim_clip_factor(400.0, 0.0f), 1.0f, 0.0f); /* 0 = off */
}

static void test_lr_cosine(void **state) {
  float lo = 0.1f, hi = 1.0f;
  assert_float_equal(optim_lr_cosine(0, 10, 110, hi, lo), 0.1f, 1e-7f); /* warmup 1/10 */
  assert_float_equal(optim_lr_cosine(4, 10, 110, hi, lo), 0.5f, 1e-7f);
  assert_float_equal(optim_lr_cosine(9, 10, 110, hi, lo), 1.0f, 1e-7f);
  assert_float_equal(optim_lr_cosine(10, 10, 110, hi, lo), 1.0f, 1e-7f);  /* peak */
  assert_float_equal(optim_lr_cosine(60, 10, 110, hi, lo), 0.55f, 1e-6f); /* halfway */
  assert_float_equal(optim_lr_cosine(110, 10, 110, hi, lo), lo, 1e-7f);
  assert_float_equal(optim_lr_cosine(500, 10, 110, hi, lo), lo, 1e-7f);
  for (int s = 10; s < 110; s++)
    assert_true(optim_lr_cosine(s + 1, 10, 110, hi, lo) <= optim_lr_cosine(s, 10, 110, hi, lo));
  assert_float_equal(optim_lr_cosine(0, 0, 100, hi, lo), hi, 1e-7f); /* no warmup */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_adamw_hand_step),
      cmocka_unit_test(test_adamw_decay_all),
      cmocka_unit_test(test_clip),
      cmocka_unit_test(test_lr_cosine),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
