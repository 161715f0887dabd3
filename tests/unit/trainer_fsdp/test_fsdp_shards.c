/*
 * Shards for checkpointing and failure: the shard layout (padding, offsets,
 * the shards of all ranks concatenate to the unit), a save/load round trip
 * into a fresh fsdp at the same world size that then continues bit for
 * bit like the original, load validation, and a dead peer: when one rank's
 * group is killed, fsdp_step fails on every rank instead of hanging, and the
 * shards are left untouched. The before-update hook (where a background
 * checkpoint fences) runs once per step on shards the step has not written
 * yet, and its error fails the step with the shards untouched.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fsdp_train.h"
#include "stk_error.h"

#define W3 3

/* Rank r's shards of every unit, stored by the test (rank-major). */
struct layout_arg {
  float *shard[W3][TRAIN_MAX_UNITS];
  float *full[W3][TRAIN_MAX_UNITS];
  struct fsdp_shard meta[W3][TRAIN_MAX_UNITS];
};

static int layout_body(int rank, struct coll_group *g, void *p) {
  struct layout_arg *a = p;
  struct fsdp_opts o;
  train_opts(&o);
  struct fsdp *f = NULL;
  int rc = fsdp_new(&train_small, g, &o, &f);
  float losses[2];
  if (!rc) rc = train_steps(f, train_small.vocab_size, rank, W3, 0, 2, losses);
  for (int k = 0; k < fsdp_unit_count(f) && !rc; k++) {
    struct fsdp_shard s;
    rc = fsdp_shard(f, k, &s);
    a->meta[rank][k] = s;
    a->shard[rank][k] = malloc(s.count * sizeof(float));
    memcpy(a->shard[rank][k], s.param, s.count * sizeof(float));
    a->full[rank][k] = malloc(s.unit_numel * sizeof(float));
    if (!rc) rc = fsdp_gather_unit(f, k, a->full[rank][k]);
  }
  fsdp_free(f);
  return rc;
}

static void test_shard_layout(void **state) {
  (void)state;
  struct layout_arg a = {0};
  int rc[RANKS_MAX];
  ranks_run(W3, 20000, layout_body, &a, rc);
  for (int r = 0; r < W3; r++) assert_int_equal(rc[r], 0);
  for (int k = 0; k < model_unit_count(&train_small); k++) {
    size_t numel = model_unit_numel(&train_small, k);
    for (int r = 0; r < W3; r++) {
      const struct fsdp_shard *s = &a.meta[r][k];
      assert_int_equal(s->unit, k);
      assert_int_equal(s->unit_numel, numel);
      assert_int_equal(s->padded_numel % W3, 0);
      assert_true(s->padded_numel >= numel && s->padded_numel < numel + W3);
      assert_int_equal(s->count * W3, s->padded_numel);
      assert_int_equal(s->offset, (size_t)r * s->count);
      /* Every rank's gathered unit is the concatenation of the shards. */
      for (size_t i = 0; i < numel; i++) {
        size_t owner = i / s->count;
        assert_true(a.full[r][k][i] == a.shard[owner][k][i - owner * s->count]);
      }
    }
    for (int r = 0; r < W3; r++) free(a.shard[r][k]), free(a.full[r][k]);
  }
}

/* Copies of one rank's shards: the checkpoint. */
struct saved {
  struct fsdp_shard s[TRAIN_MAX_UNITS];
  int U;
  int64_t steps;
};

static int save(struct fsdp *f, struct saved *ret) {
  ret->U = fsdp_unit_count(f);
  ret->steps = fsdp_steps_done(f);
  for (int k = 0; k < ret->U; k++) {
    struct fsdp_shard s;
    int rc = fsdp_shard(f, k, &s);
    if (rc) return rc;
    ret->s[k] = s;
    size_t bytes = s.count * sizeof(float);
    ret->s[k].param = malloc(bytes), ret->s[k].adam_m = malloc(bytes);
    ret->s[k].adam_v = malloc(bytes);
    memcpy(ret->s[k].param, s.param, bytes);
    memcpy(ret->s[k].adam_m, s.adam_m, bytes);
    memcpy(ret->s[k].adam_v, s.adam_v, bytes);
  }
  return 0;
}

static void saved_free(struct saved *sv) {
  for (int k = 0; k < sv->U; k++)
    free(sv->s[k].param), free(sv->s[k].adam_m), free(sv->s[k].adam_v);
}

/* 0 when two fsdp objects hold the same bits in every shard. */
static int shards_differ(struct fsdp *a, struct fsdp *b) {
  for (int k = 0; k < fsdp_unit_count(a); k++) {
    struct fsdp_shard x, y;
    fsdp_shard(a, k, &x), fsdp_shard(b, k, &y);
    size_t bytes = x.count * sizeof(float);
    if (memcmp(x.param, y.param, bytes) || memcmp(x.adam_m, y.adam_m, bytes) ||
        memcmp(x.adam_v, y.adam_v, bytes))
      return 1;
  }
  return 0;
}

static int bad_loads(struct fsdp *f, struct saved *sv) {
  if (fsdp_load_shards(f, sv->s, sv->U - 1, sv->steps) != STK_EINVAL) return -1;
  sv->s[1].offset += 1;
  int rc = fsdp_load_shards(f, sv->s, sv->U, sv->steps);
  sv->s[1].offset -= 1;
  return rc == STK_EINVAL ? 0 : -1;
}

/* Trains 3 steps, saves, loads into a fresh fsdp (other seed), then both
 * continue for 2 steps on the same batches: same losses, same shards. */
static int roundtrip_body(int rank, struct coll_group *g, void *p) {
  (void)p;
  int W = g->size, V = train_small.vocab_size;
  struct fsdp_opts o;
  train_opts(&o);
  struct fsdp *a = NULL, *b = NULL;
  struct saved sv = {0};
  float la[2], lb[2], skip[3];
  int rc = fsdp_new(&train_small, g, &o, &a);
  if (!rc) rc = train_steps(a, V, rank, W, 0, 3, skip);
  if (!rc) rc = save(a, &sv);
  o.seed = 999;
  if (!rc) rc = fsdp_new(&train_small, g, &o, &b);
  if (!rc && !shards_differ(a, b)) rc = -100; /* The load below must matter. */
  if (!rc) rc = bad_loads(b, &sv);
  if (!rc) rc = fsdp_load_shards(b, sv.s, sv.U, sv.steps);
  if (!rc && fsdp_steps_done(b) != 3) rc = -101;
  if (!rc) rc = train_steps(a, V, rank, W, 3, 2, la);
  if (!rc) rc = train_steps(b, V, rank, W, 3, 2, lb);
  if (!rc && (memcmp(la, lb, sizeof(la)) || shards_differ(a, b))) rc = -102;
  saved_free(&sv);
  fsdp_free(a);
  fsdp_free(b);
  return rc;
}

static void test_save_load_roundtrip(void **state) {
  (void)state;
  int rc[RANKS_MAX];
  ranks_run(2, 20000, roundtrip_body, NULL, rc);
  assert_int_equal(rc[0], 0);
  assert_int_equal(rc[1], 0);
}

struct failure_arg {
  int step_rc[W3];
  int unchanged[W3];
};

/* One good step, then rank 1 kills its group: the next step fails everywhere. */
static int failure_body(int rank, struct coll_group *g, void *p) {
  struct failure_arg *a = p;
  struct fsdp_opts o;
  train_opts(&o);
  struct fsdp *f = NULL;
  float loss[1];
  int rc = fsdp_new(&train_small, g, &o, &f);
  if (!rc) rc = train_steps(f, train_small.vocab_size, rank, W3, 0, 1, loss);
  struct saved before = {0};
  if (!rc) rc = save(f, &before);
  if (rc) return rc;
  if (rank == 1) coll_abort(g);
  a->step_rc[rank] = train_steps(f, train_small.vocab_size, rank, W3, 1, 1, loss);
  a->unchanged[rank] = fsdp_steps_done(f) == 1;
  for (int k = 0; k < before.U; k++) {
    struct fsdp_shard s;
    fsdp_shard(f, k, &s);
    if (memcmp(s.param, before.s[k].param, s.count * sizeof(float))) a->unchanged[rank] = 0;
  }
  saved_free(&before);
  fsdp_free(f);
  return 0;
}

static void test_dead_peer_fails_step(void **state) {
  (void)state;
  struct failure_arg a = {0};
  int rc[RANKS_MAX];
  ranks_run(W3, 2000, failure_body, &a, rc);
  for (int r = 0; r < W3; r++) {
    assert_int_equal(rc[r], 0);
    assert_true(a.step_rc[r] < 0);
    assert_true(a.unchanged[r]);
  }
  assert_int_equal(a.step_rc[1], STK_ECANCELED);
}

/* The before-update hook: it runs once per step, after forward and
 * backward left the shards as the last update made them (a checkpoint
 * staged from them in the background reads exactly that state until it
 * lets go), and its error fails the step with the shards untouched. */
struct hook_arg {
  struct fsdp *f;
  struct saved before; /* The shards after the last update. */
  int calls, intact, fail_with;
};

static int hook(void *p) {
  struct hook_arg *h = p;
  h->calls++;
  for (int k = 0; k < h->before.U; k++) {
    struct fsdp_shard s;
    fsdp_shard(h->f, k, &s);
    size_t n = s.count * sizeof(float);
    if (memcmp(s.param, h->before.s[k].param, n) || memcmp(s.adam_m, h->before.s[k].adam_m, n) ||
        memcmp(s.adam_v, h->before.s[k].adam_v, n))
      h->intact = 0;
  }
  return h->fail_with;
}

static int hook_body(int rank, struct coll_group *g, void *p) {
  struct hook_arg *h = (struct hook_arg *)p + rank;
  struct fsdp_opts o;
  train_opts(&o);
  float loss[1];
  int rc = fsdp_new(&train_small, g, &o, &h->f);
  if (rc) return rc;
  fsdp_set_before_update(h->f, hook, h);
  h->intact = 1;
  for (int step = 0; step < 3 && !rc; step++) {
    rc = save(h->f, &h->before);
    if (!rc) rc = train_steps(h->f, train_small.vocab_size, rank, W3, step, 1, loss);
    if (!rc && fsdp_steps_done(h->f) == step + 1 && !h->intact) rc = -102;
    saved_free(&h->before);
  }
  h->fail_with = STK_EIO; /* Every rank's hook fails the fourth step. */
  if (!rc) rc = save(h->f, &h->before);
  if (!rc && train_steps(h->f, train_small.vocab_size, rank, W3, 3, 1, loss) != STK_EIO) rc = -103;
  if (!rc && fsdp_steps_done(h->f) != 3) rc = -104;
  if (!rc) hook(h); /* The shards as before the failed step. */
  saved_free(&h->before);
  fsdp_set_before_update(h->f, NULL, NULL);
  if (!rc) rc = train_steps(h->f, train_small.vocab_size, rank, W3, 3, 1, loss);
  if (!rc && fsdp_steps_done(h->f) != 4) rc = -105;
  fsdp_free(h->f);
  return rc;
}

static void test_before_update_hook(void **state) {
  (void)state;
  struct hook_arg h[W3];
  memset(h, 0, sizeof(h));
  int rc[RANKS_MAX];
  ranks_run(W3, 20000, hook_body, h, rc);
  for (int r = 0; r < W3; r++) {
    assert_int_equal(rc[r], 0);
    assert_int_equal(h[r].calls, 5); /* Three steps, the failed one, the check after it. */
    assert_true(h[r].intact);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shard_layout),
      cmocka_unit_test(test_save_load_roundtrip),
      cmocka_unit_test(test_dead_peer_fails_step),
      cmocka_unit_test(test_before_update_hook),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
