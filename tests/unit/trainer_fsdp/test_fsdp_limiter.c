/*
 * The rate limiter: the primitive blocks and wakes as it should (units,
 * bytes, abort); in a step, K = 2 keeps at most two unsharded units alive
 * while no limit lets the communication thread run ahead and hold many;
 * the counters add up; K = 1 keeps the root unit (unit 0) all step beside
 * one other unit, and root_unit does so at K = 2; and the limit never changes a single bit of the
 * results.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>
#include <unistd.h>

#include "fsdp_internal.h"
#include "fsdp_train.h"
#include "stk_error.h"

struct waiter {
  struct fsdp_limiter *lim;
  size_t bytes;
  int rc;
  volatile int done;
};

static void *waiter_main(void *p) {
  struct waiter *w = p;
  w->rc = fsdp_limiter_acquire(w->lim, w->bytes);
  __atomic_store_n(&w->done, 1, __ATOMIC_SEQ_CST);
  return NULL;
}

static int waiter_done(struct waiter *w) {
  return __atomic_load_n(&w->done, __ATOMIC_SEQ_CST);
}

static void test_limiter_blocks_on_units(void **state) {
  (void)state;
  struct fsdp_limiter lim;
  assert_int_equal(fsdp_limiter_init(&lim, 2, 0), 0);
  assert_int_equal(fsdp_limiter_acquire(&lim, 10), 0);
  assert_int_equal(fsdp_limiter_acquire(&lim, 10), 0);
  struct waiter w = {.lim = &lim, .bytes = 10};
  pthread_t th;
  pthread_create(&th, NULL, waiter_main, &w);
  usleep(50000);
  assert_false(waiter_done(&w)); /* The third unit waits... */
  fsdp_limiter_release(&lim, 10);
  pthread_join(th, NULL); /* ...until one is freed. */
  assert_int_equal(w.rc, 0);
  assert_int_equal(lim.peak_units, 2);
  assert_int_equal(lim.peak_bytes, 20);
  assert_true(lim.wait_ns > 0); /* How long depends on when the thread ran. */
  fsdp_limiter_close(&lim);
}

static void test_limiter_byte_budget_and_abort(void **state) {
  (void)state;
  struct fsdp_limiter lim;
  assert_int_equal(fsdp_limiter_init(&lim, 0, 100), 0);
  assert_int_equal(fsdp_limiter_acquire(&lim, 60), 0);
  struct waiter w = {.lim = &lim, .bytes = 50};
  pthread_t th;
  pthread_create(&th, NULL, waiter_main, &w);
  usleep(30000);
  assert_false(waiter_done(&w)); /* 110 > 100 bytes. */
  fsdp_limiter_release(&lim, 60);
  pthread_join(th, NULL);
  assert_int_equal(w.rc, 0);
  /* Now 50 held: 60 more would exceed; abort wakes the waiter with an error. */
  w = (struct waiter){.lim = &lim, .bytes = 60};
  pthread_create(&th, NULL, waiter_main, &w);
  usleep(30000);
  assert_false(waiter_done(&w));
  fsdp_limiter_abort(&lim);
  pthread_join(th, NULL);
  assert_int_equal(w.rc, STK_ECANCELED);
  fsdp_limiter_rearm(&lim);
  assert_int_equal(fsdp_limiter_acquire(&lim, 100), 0);
  fsdp_limiter_close(&lim);
}

static void test_rejects_bad_limits(void **state) {
  (void)state;
  struct fsdp_opts o;
  train_opts(&o);
  struct fsdp *f = NULL;
  o.max_inflight_units = -1;
  assert_int_equal(fsdp_new(&train_small, NULL, &o, &f), STK_EINVAL);
  o.max_inflight_units = 2;
  o.max_inflight_bytes = 64; /* Smaller than one unit. */
  assert_int_equal(fsdp_new(&train_small, NULL, &o, &f), STK_EINVAL);
  /* Exactly the largest step (a block, or the head with unit 0) is enough. */
  size_t block = model_unit_numel(&train_small, 1);
  size_t head = model_unit_numel(&train_small, 0) + model_unit_numel(&train_small, 3);
  o.max_inflight_bytes = (block > head ? block : head) * sizeof(float);
  assert_int_equal(fsdp_new(&train_small, NULL, &o, &f), 0);
  fsdp_free(f);
  o.max_inflight_bytes -= sizeof(float);
  assert_int_equal(fsdp_new(&train_small, NULL, &o, &f), STK_EINVAL);
  /* K = 1: the root unit 0 stays beside the largest other unit. */
  o.max_inflight_units = 1;
  size_t most = 0;
  for (int k = 1; k < model_unit_count(&train_small); k++)
    if (model_unit_numel(&train_small, k) > most) most = model_unit_numel(&train_small, k);
  o.max_inflight_bytes = (model_unit_numel(&train_small, 0) + most) * sizeof(float);
  assert_int_equal(fsdp_new(&train_small, NULL, &o, &f), 0);
  fsdp_free(f);
  o.max_inflight_bytes -= sizeof(float);
  assert_int_equal(fsdp_new(&train_small, NULL, &o, &f), STK_EINVAL);
}

/* The two largest padded units of cfg at world size W, in bytes. */
static size_t two_largest_bytes(const struct model_config *cfg, int W) {
  size_t a = 0, b = 0;
  for (int k = 0; k < model_unit_count(cfg); k++) {
    size_t n = (model_unit_numel(cfg, k) + (size_t)W - 1) / (size_t)W * (size_t)W * sizeof(float);
    if (n > a)
      b = a, a = n;
    else if (n > b)
      b = n;
  }
  return a + b;
}

/* Bytes one step moves per rank: 2U all-gathers (every unit twice, unit 0
 * three times, the head's two shared by forward and backward), U
 * reduce-scatters and the 2-value all-reduce. */
static uint64_t step_bytes(const struct model_config *cfg, int W) {
  uint64_t total = 0;
  int U = model_unit_count(cfg);
  for (int k = 0; k < U; k++) {
    uint64_t chunk = (model_unit_numel(cfg, k) + (size_t)W - 1) / (size_t)W * sizeof(float);
    int gathers = k == 0 ? 3 : k == U - 1 ? 1 : 2;
    total += (uint64_t)(W - 1) * chunk * (uint64_t)(gathers + 1);
  }
  return total + 2 * (uint64_t)(W - 1) * sizeof(float);
}

/* The same with K = 1: unit 0 (the root) is gathered once, not three times. */
static uint64_t step_bytes_root(const struct model_config *cfg, int W) {
  uint64_t chunk0 = (model_unit_numel(cfg, 0) + (size_t)W - 1) / (size_t)W * sizeof(float);
  return step_bytes(cfg, W) - 2 * (uint64_t)(W - 1) * chunk0;
}

static const struct model_config deep = {
    .vocab_size = 64, .max_seq_len = 8, .channels = 32, .n_layer = 6, .n_head = 2};

static void test_k2_bounds_unsharded_memory(void **state) {
  (void)state;
  const int W = 2, STEPS = 3;
  struct train_run run = {.cfg = &deep, .steps = STEPS};
  train_opts(&run.opts);
  assert_int_equal(train_ranks(W, &run), 0);
  for (int r = 0; r < W; r++) {
    const struct fsdp_stats *s = &run.stats[r];
    assert_int_equal(s->peak_unsharded_units, 2); /* The head step holds two. */
    assert_true(s->peak_unsharded_bytes <= two_largest_bytes(&deep, W));
    assert_int_equal(s->bytes_moved, STEPS * step_bytes(&deep, W));
    assert_int_equal(s->steps, STEPS);
    assert_true(s->coll_wait_ns > 0);
  }
  train_run_close(&run);
}

/* The padded bytes of unit 0 and of the largest other unit of cfg at W. */
static size_t root_and_largest_bytes(const struct model_config *cfg, int W) {
  size_t most = 0;
  for (int k = 1; k < model_unit_count(cfg); k++)
    if (model_unit_numel(cfg, k) > most) most = model_unit_numel(cfg, k);
  size_t root = model_unit_numel(cfg, 0);
  return ((root + (size_t)W - 1) / (size_t)W + (most + (size_t)W - 1) / (size_t)W) * (size_t)W *
         sizeof(float);
}

static void assert_bit_identical(const struct train_run *a, const struct train_run *b);

static void test_k1_root_unit(void **state) {
  (void)state;
  /* K = 1: unit 0 is the root, gathered once per step and kept; one other
   * unit at a time beside it. Two buffers at most, fewer bytes than K = 2
   * would need for the head step plus a prefetch, and the same bits as
   * no limit at all. */
  const int W = 2, STEPS = 3;
  struct train_run k1 = {.cfg = &deep, .steps = STEPS};
  struct train_run none = {.cfg = &deep, .steps = STEPS};
  train_opts(&k1.opts);
  none.opts = k1.opts;
  k1.opts.max_inflight_units = 1;
  none.opts.max_inflight_units = 0;
  assert_int_equal(train_ranks(W, &k1), 0);
  assert_int_equal(train_ranks(W, &none), 0);
  assert_bit_identical(&k1, &none);
  for (int r = 0; r < W; r++) {
    const struct fsdp_stats *s = &k1.stats[r];
    assert_int_equal(s->peak_unsharded_units, 2); /* The root and one unit. */
    assert_true(s->peak_unsharded_bytes <= root_and_largest_bytes(&deep, W));
    assert_int_equal(s->bytes_moved, STEPS * step_bytes_root(&deep, W));
    assert_true(s->coll_busy_ns > 0);
  }
  /* One rank: gathers are copies that would run ahead; K = 1 holds them. */
  struct train_run one = {.cfg = &deep, .steps = 2};
  one.opts = k1.opts;
  assert_int_equal(train_ranks(1, &one), 0);
  assert_int_equal(one.stats[0].peak_unsharded_units, 2);
  assert_true(one.stats[0].limiter_wait_ns > 0);
  train_run_close(&one);
  train_run_close(&k1);
  train_run_close(&none);
}

static void test_k2_with_root_unit(void **state) {
  (void)state;
  /* root_unit at K = 2: the root beside at most two units (three buffers),
   * unit 0 gathered once per step, the same bits as K = 2 without it. */
  const int W = 2, STEPS = 3;
  struct train_run root = {.cfg = &deep, .steps = STEPS};
  struct train_run plain = {.cfg = &deep, .steps = STEPS};
  train_opts(&plain.opts);
  root.opts = plain.opts;
  root.opts.root_unit = true;
  assert_int_equal(train_ranks(W, &root), 0);
  assert_int_equal(train_ranks(W, &plain), 0);
  assert_bit_identical(&root, &plain);
  for (int r = 0; r < W; r++) {
    assert_true(root.stats[r].peak_unsharded_units <= 3);
    assert_int_equal(root.stats[r].bytes_moved, STEPS * step_bytes_root(&deep, W));
  }
  train_run_close(&root);
  train_run_close(&plain);
}

static void test_no_limit_runs_ahead(void **state) {
  (void)state;
  /* One rank: a gather is a memcpy, far faster than a block's compute, so
   * without a limit the communication thread gathers most units ahead. */
  struct train_run limited = {.cfg = &deep, .steps = 4};
  struct train_run unlimited = {.cfg = &deep, .steps = 4};
  train_opts(&limited.opts);
  unlimited.opts = limited.opts;
  unlimited.opts.max_inflight_units = 0;
  assert_int_equal(train_ranks(1, &limited), 0);
  assert_int_equal(train_ranks(1, &unlimited), 0);
  assert_true(limited.stats[0].peak_unsharded_units <= 2);
  assert_true(limited.stats[0].limiter_wait_ns > 0);
  assert_true(unlimited.stats[0].peak_unsharded_units >= 4);
  assert_true(unlimited.stats[0].peak_unsharded_bytes > two_largest_bytes(&deep, 1));
  assert_int_equal(unlimited.stats[0].limiter_wait_ns, 0);
  train_run_close(&limited);
  train_run_close(&unlimited);
}

static void assert_bit_identical(const struct train_run *a, const struct train_run *b) {
  assert_memory_equal(a->loss, b->loss, sizeof(float) * (size_t)a->steps);
  for (int k = 0; k < model_unit_count(a->cfg); k++)
    assert_memory_equal(a->params[k], b->params[k], model_unit_numel(a->cfg, k) * sizeof(float));
}

static void test_limit_changes_no_bits(void **state) {
  (void)state;
  const int W = 3;
  struct train_run k2 = {.cfg = &deep, .steps = 3};
  struct train_run none = {.cfg = &deep, .steps = 3};
  struct train_run bytes = {.cfg = &deep, .steps = 3};
  train_opts(&k2.opts);
  none.opts = k2.opts, bytes.opts = k2.opts;
  none.opts.max_inflight_units = 0;
  bytes.opts.max_inflight_units = 0;
  bytes.opts.max_inflight_bytes = two_largest_bytes(&deep, W);
  assert_int_equal(train_ranks(W, &k2), 0);
  assert_int_equal(train_ranks(W, &none), 0);
  assert_int_equal(train_ranks(W, &bytes), 0);
  assert_bit_identical(&k2, &none);
  assert_bit_identical(&k2, &bytes);
  for (int r = 0; r < W; r++)
    assert_true(bytes.stats[r].peak_unsharded_bytes <= bytes.opts.max_inflight_bytes);
  train_run_close(&k2);
  train_run_close(&none);
  train_run_close(&bytes);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_limiter_blocks_on_units),
      cmocka_unit_test(test_limiter_byte_budget_and_abort),
      cmocka_unit_test(test_rejects_bad_limits),
      cmocka_unit_test(test_k2_bounds_unsharded_memory),
      cmocka_unit_test(test_k1_root_unit),
      cmocka_unit_test(test_k2_with_root_unit),
      cmocka_unit_test(test_no_limit_runs_ahead),
      cmocka_unit_test(test_limit_changes_no_bits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
