/*
 * test_dl_budget: what one job's spec may cost is bounded where a spec
 * enters (dl_opts.max_job_state_bytes). A lane keeps one counter per shard
 * of each dataset in its generator, in each in-memory snapshot and in each
 * kept commit: 2^20 shards of one dataset once grew the daemon by 512 MiB
 * at step 2000 for a 17-token batch. Such a spec is now refused with
 * STK_ETOOBIG naming the budget, at create, at a mixture that adds
 * datasets, at an import and at a reload, and changes nothing; ordinary
 * specs are served as before, their heap growth measured under the budget.
 */
#include <malloc.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dl_test.h"
#include "stk_error.h"

#define DEFAULT_BUDGET_BYTES (UINT64_C(256) << 20)

static void rm(char *dir) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
  free(dir);
}

static struct dl *open_budget(const char *dir, uint64_t budget_bytes) {
  struct dl_opts o = {.dir = dir, .max_job_state_bytes = budget_bytes};
  struct dl *dl = NULL;
  assert_int_equal(dl_open(&o, &dl), 0);
  return dl;
}

static void expect_budget_refusal(int rc) {
  if (rc != STK_ETOOBIG) fail_msg("expected STK_ETOOBIG, got %d: %s", rc, stk_detail());
  assert_non_null(strstr(stk_detail(), "max-job-state-bytes"));
}

static void expect_no_job(struct dl *dl, const char *job) {
  Stoker__V1__LoaderInfo *info;
  assert_int_equal(dl_get_info(dl, job, &info), STK_ENOENT);
}

/* The spec: one synthetic dataset cut into 2^20 shards; and four
 * datasets of 2^16 shards each. Both refused with the default budget. */
static void test_huge_specs_refused_at_create(void **state) {
  char *dir = t_tmpdir();
  struct dl *dl = open_budget(dir, 0);
  struct tspec t = {.job = "wide",
                    .seq_len = 16,
                    .global_batch = 8,
                    .shards = 1u << 20,
                    .lanes = 8,
                    .seed = 1,
                    .n_ds = 1,
                    .names = {"web"},
                    .uris = {"synthetic:1048575:8:16:7"},
                    .weights = {1}};
  expect_budget_refusal(t_create(dl, &t));
  printf("refused: %s\n", stk_detail());
  expect_no_job(dl, "wide");
  t.shards = 1u << 16;
  t.n_ds = 4;
  for (size_t i = 0; i < 4; i++) {
    t.names[i] = (const char *[]){"a", "b", "c", "d"}[i];
    t.uris[i] = "synthetic:70000:8:16:7";
    t.weights[i] = 1;
  }
  expect_budget_refusal(t_create(dl, &t));
  expect_no_job(dl, "wide");
  dl_close(dl);
  dl = open_budget(dir, 0); /* nothing was stored */
  expect_no_job(dl, "wide");
  dl_close(dl);
  rm(dir);
}

/* Heap in use (glibc; 0 under a sanitizer's allocator, where the measure
 * is then vacuous and only the refusals are checked). */
static size_t heap_bytes(void) {
  struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

/* Legal specs still work: the default shape with four datasets, and the
 * widest single dataset the default budget admits, served at step 2000,
 * the daemon's growth measured below the budget. */
static void test_legal_specs_served_within_budget(void **state) {
  char *dir = t_tmpdir();
  struct dl *dl = open_budget(dir, 0);
  struct tspec t = {.job = "mix",
                    .seq_len = 16,
                    .global_batch = 8,
                    .lanes = 8,
                    .seed = 1,
                    .n_ds = 4,
                    .names = {"a", "b", "c", "d"},
                    .uris = {"synthetic:4000:8:16:1", "synthetic:4000:8:16:2",
                             "synthetic:4000:8:16:3", "synthetic:4000:8:16:4"},
                    .weights = {1, 2, 3, 4}};
  assert_int_equal(t_create(dl, &t), 0); /* logical_shards 0: the default 256 */
  struct tspec w = {.job = "wide",
                    .seq_len = 16,
                    .global_batch = 8,
                    .shards = 1u << 16,
                    .lanes = 8,
                    .seed = 1,
                    .n_ds = 1,
                    .names = {"web"},
                    .uris = {"synthetic:70000:8:16:7"},
                    .weights = {1}};
  assert_int_equal(t_create(dl, &w), 0);
  size_t before = heap_bytes(), n;
  free(t_global(dl, "mix", 2000, 1, &n));
  assert_int_equal(n, 8 * 17);
  free(t_global(dl, "wide", 2000, 1, &n));
  assert_int_equal(n, 8 * 17);
  size_t after = heap_bytes();
  size_t grew = after > before ? after - before : 0;
  printf("two jobs at step 2000 grew the heap by %zu KiB (budget %llu MiB per job)\n", grew >> 10,
         (unsigned long long)(DEFAULT_BUDGET_BYTES >> 20));
  assert_true(grew <= 2 * DEFAULT_BUDGET_BYTES);
  dl_close(dl);
  rm(dir);
}

/* With a budget that fits one dataset of 4096 shards but not two: a
 * mixture adding the second is refused and changes nothing, an import of a
 * two-dataset job is refused and stores nothing, and a stored two-dataset
 * job reopened under the smaller budget loads as failed, naming it. */
static void test_refused_at_mixture_import_and_reload(void **state) {
  const uint64_t small = 12u << 20;
  struct tspec one = {.job = "j",
                      .seq_len = 16,
                      .global_batch = 8,
                      .shards = 4096,
                      .lanes = 8,
                      .seed = 1,
                      .n_ds = 1,
                      .names = {"a"},
                      .uris = {"synthetic:8000:8:16:1"},
                      .weights = {1}};
  struct tspec two = one;
  two.n_ds = 2;
  two.names[1] = "b";
  two.uris[1] = "synthetic:8000:8:16:2";
  two.weights[1] = 1;

  char *dir = t_tmpdir();
  struct dl *dl = open_budget(dir, small);
  assert_int_equal(t_create(dl, &one), 0);
  size_t n, m;
  uint32_t *before = t_global(dl, "j", 20, 1, &n);
  expect_budget_refusal(t_update(dl, "j", 10, &two, 0, 0));
  uint32_t *after = t_global(dl, "j", 20, 1, &m);
  assert_int_equal(n, m);
  assert_memory_equal(before, after, n * sizeof *after);
  Stoker__V1__LoaderInfo *info;
  assert_int_equal(dl_get_info(dl, "j", &info), 0);
  assert_int_equal(info->spec->n_datasets, 1);
  dl_info_free(info);

  char *dir2 = t_tmpdir();
  struct dl *big = open_budget(dir2, 0);
  struct tspec t = two;
  t.job = "k";
  assert_int_equal(t_create(big, &t), 0);
  assert_int_equal(dl_commit(big, "k", 3), 0);
  uint8_t *blob;
  size_t len;
  assert_int_equal(dl_export_state(big, "k", 3, &blob, &len), 0);
  expect_budget_refusal(dl_import_state(dl, blob, len, NULL));
  expect_no_job(dl, "k");
  free(blob);
  dl_close(big);

  big = open_budget(dir2, small); /* the stored job no longer fits */
  struct dl_batch b;
  assert_int_equal(dl_get_batch(big, "k", 4, 0, 1, &b), STK_ESTATE);
  assert_non_null(strstr(stk_detail(), "max-job-state-bytes"));
  dl_close(big);
  big = open_budget(dir2, 0); /* and loads again under the default */
  free(t_global(big, "k", 4, 1, &n));
  dl_close(big);

  free(before);
  free(after);
  dl_close(dl);
  rm(dir);
  rm(dir2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_huge_specs_refused_at_create),
      cmocka_unit_test(test_legal_specs_served_within_budget),
      cmocka_unit_test(test_refused_at_mixture_import_and_reload),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
