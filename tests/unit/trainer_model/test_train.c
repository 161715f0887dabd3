/*
 * End to end on the small model: AdamW with clipping and the cosine
 * schedule over ~50 steps on one repeated batch must drive the loss well
 * down (the model memorises it). Also checks that the per-unit decay masks
 * plug into AdamW the way FSDP will use them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include "model.h"
#include "model_test.h"
#include "optim.h"

#define B     2
#define T     8
#define STEPS 50
#define MAXU  8

struct trainer {
  float *p[MAXU], *g[MAXU], *m[MAXU], *v[MAXU];
  uint8_t *mask[MAXU];
  size_t len[MAXU];
  int U;
};

static void trainer_init(struct trainer *tr) {
  tr->U = model_unit_count(&SMALL);
  assert_int_equal(model_units_alloc(&SMALL, tr->p), 0);
  assert_int_equal(model_units_alloc(&SMALL, tr->g), 0);
  assert_int_equal(model_units_alloc(&SMALL, tr->m), 0);
  assert_int_equal(model_units_alloc(&SMALL, tr->v), 0);
  for (int k = 0; k < tr->U; k++) {
    tr->len[k] = model_unit_numel(&SMALL, k);
    tr->mask[k] = malloc(tr->len[k]);
    assert_int_equal(model_unit_decay_mask(&SMALL, k, tr->mask[k]), 0);
  }
  assert_int_equal(model_init_params(&SMALL, 1234, tr->p), 0);
}

static void trainer_close(struct trainer *tr) {
  model_units_free(&SMALL, tr->p), model_units_free(&SMALL, tr->g);
  model_units_free(&SMALL, tr->m), model_units_free(&SMALL, tr->v);
  for (int k = 0; k < tr->U; k++) free(tr->mask[k]);
}

/* One step: forward, backward, clip, AdamW per unit. Returns the loss before the update. */
static float train_step(struct trainer *tr, struct model *model, int step) {
  float loss;
  assert_int_equal(model_forward(model, tr->p, &loss), 0);
  model_units_zero(&SMALL, tr->g);
  assert_int_equal(model_backward(model, tr->p, tr->g), 0);
  optim_clip_grad_norm(tr->g, tr->len, tr->U, 1.0f, NULL);
  struct optim_adamw h = {.lr = optim_lr_cosine(step, 5, STEPS, 1e-2f, 1e-3f),
                          .beta1 = 0.9f,
                          .beta2 = 0.95f,
                          .eps = 1e-8f,
                          .weight_decay = 0.1f};
  for (int k = 0; k < tr->U; k++)
    assert_int_equal(optim_adamw_step(&h, step + 1, tr->p[k], tr->g[k], tr->m[k], tr->v[k],
                                      tr->mask[k], tr->len[k]),
                     0);
  return loss;
}

static void test_loss_decreases(void **state) {
  struct trainer tr;
  trainer_init(&tr);
  uint64_t s = 77;
  int32_t inputs[B * T], targets[B * T];
  test_tokens(inputs, B * T, &s, SMALL.vocab_size);
  test_tokens(targets, B * T, &s, SMALL.vocab_size);
  struct model *model = NULL;
  assert_int_equal(model_new(&SMALL, B, T, &model), 0);
  assert_int_equal(model_set_batch(model, inputs, targets), 0);
  float first = 0.0f, last = 0.0f;
  for (int step = 0; step < STEPS; step++) {
    float loss = train_step(&tr, model, step);
    assert_true(isfinite(loss));
    if (step == 0) first = loss;
    last = loss;
  }
  float final;
  assert_int_equal(model_forward(model, tr.p, &final), 0);
  fprintf(stderr, "loss %.4f -> %.4f (after the last step %.4f)\n", first, last, final);
  assert_true(fabsf(first - logf(64.0f)) < 0.1f);
  assert_true(final < 0.5f * first);
  model_free(model);
  trainer_close(&tr);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_loss_decreases),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
