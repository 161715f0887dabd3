/*
 * test_dl_mix: versioned, token-accurate mixing. A mixture change at a step
 * (reweighting, adding a dataset, removing one) holds the new shares to 1%
 * of tokens from that step on with no catch-up burst, and no token of any
 * dataset is served twice within its epoch. Blocked units are never served
 * from their step on.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dl_test.h"
#include "stk_error.h"

#define DOCS 600
#define LO   8
#define HI   32

static const char *const NAMES[3] = {"a", "b", "c"};

static const struct tspec START = {.job = "m",
                                   .seq_len = 31,
                                   .global_batch = 24,
                                   .shards = 32,
                                   .lanes = 4,
                                   .seed = 5,
                                   .n_ds = 2,
                                   .names = {"a", "b"},
                                   .uris = {"synthetic:600:8:32:1", "synthetic:600:8:32:2"},
                                   .weights = {1, 1}};

static const struct tspec CHANGE = {.n_ds = 2,
                                    .names = {"a", "c"},
                                    .uris = {"synthetic:600:8:32:1", "synthetic:600:8:32:3"},
                                    .weights = {3, 1}};

static void rm(char *dir) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
  free(dir);
}

static double share(const uint64_t *t, int i) {
  return (double)t[i] / (double)(t[0] + t[1] + t[2]);
}

static void test_mixture_change(void **state) {
  char *dir = t_tmpdir();
  struct dl *dl = t_open(dir, 0);
  assert_int_equal(t_create(dl, &START), 0);
  struct cover cv[3], *covers[3] = {&cv[0], &cv[1], &cv[2]};
  for (int i = 0; i < 3; i++) cover_init(&cv[i], DOCS, LO, HI, (uint64_t)i + 1, 32);
  uint64_t before[3] = {0}, window[3] = {0}, after[3] = {0};
  for (int s = 0; s < 20; s++) t_trace_step(dl, "m", s, NAMES, 3, covers, before);
  assert_true(fabs(share(before, 0) - 0.5) < 0.02);
  assert_int_equal(before[2], 0);
  assert_int_equal(dl_commit(dl, "m", 15), 0);
  assert_int_equal(t_update(dl, "m", 20, &CHANGE, 0, 0), 0);
  dl_close(dl); /* the new version survives a restart */
  dl = t_open(dir, 0);
  for (int s = 20; s < 40; s++) t_trace_step(dl, "m", s, NAMES, 3, covers, window);
  memcpy(after, window, sizeof after);
  for (int s = 40; s < 220; s++) t_trace_step(dl, "m", s, NAMES, 3, covers, after);
  /* No catch-up burst: the first 20 steps already hold the new shares. */
  assert_true(fabs(share(window, 0) - 0.75) < 0.02);
  assert_true(fabs(share(after, 0) - 0.75) < 0.01);
  assert_true(fabs(share(after, 2) - 0.25) < 0.01);
  assert_true(share(after, 1) < 0.01); /* removed: only units already begun */
  Stoker__V1__LoaderInfo *info;
  assert_int_equal(dl_get_info(dl, "m", &info), 0);
  assert_int_equal(info->spec->n_datasets, 3);
  assert_true(info->spec->datasets[1]->weight == 0);
  dl_info_free(info);
  for (int i = 0; i < 3; i++) cover_free(&cv[i]);
  dl_close(dl);
  rm(dir);
}

static void test_blocklist(void **state) {
  char *dir = t_tmpdir();
  struct dl *dl = t_open(dir, 0);
  assert_int_equal(t_create(dl, &START), 0);
  Stoker__V1__UnitRef refs[40], *ptrs[40];
  for (int i = 0; i < 40; i++) {
    stoker__v1__unit_ref__init(&refs[i]);
    refs[i].dataset = "a";
    refs[i].unit = (uint64_t)i * 15;
    ptrs[i] = &refs[i];
  }
  Stoker__V1__UpdateMixtureRequest r = STOKER__V1__UPDATE_MIXTURE_REQUEST__INIT;
  r.job = "m";
  r.from_step = 10;
  r.block = ptrs;
  r.n_block = 40;
  assert_int_equal(dl_update_mixture(dl, &r), 0);
  refs[3].unit = 600; /* out of range: refused, nothing changes */
  r.from_step = 11;
  assert_int_equal(dl_update_mixture(dl, &r), STK_EINVAL);
  for (int s = 10; s < 120; s++) {
    Stoker__V1__ExplainResponse *e;
    assert_int_equal(dl_explain(dl, "m", s, 0, 1, &e), 0);
    for (size_t i = 0; i < e->n_sources; i++)
      if (strcmp(e->sources[i]->dataset, "a") == 0 && e->sources[i]->token_begin == 0)
        assert_true(e->sources[i]->unit % 15 != 0 || e->sources[i]->unit >= 600);
    dl_explain_free(e);
  }
  dl_close(dl);
  rm(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mixture_change),
      cmocka_unit_test(test_blocklist),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
