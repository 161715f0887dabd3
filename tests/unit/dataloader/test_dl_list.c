/*
 * test_dl_list: ListLoaders answers in pages (services/common/page.h).
 * Paging through many jobs lists each exactly once, in name order, at any
 * page size, also while jobs are created and deleted between pages; fat
 * jobs (256 datasets with long names) stop a page before its byte bound
 * instead of making one reply larger than a client can receive; a token
 * that is not one is STK_EINVAL.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dl_test.h"
#include "page.h"
#include "stk_error.h"

static void rm(char *dir) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
  free(dir);
}

static void create_small(struct dl *dl, const char *job) {
  struct tspec t = {.job = job,
                    .seq_len = 8,
                    .global_batch = 4,
                    .shards = 4,
                    .lanes = 2,
                    .seed = 1,
                    .n_ds = 1,
                    .names = {"web"},
                    .uris = {"synthetic:64:8:16:7"},
                    .weights = {1}};
  assert_int_equal(t_create(dl, &t), 0);
}

/* Pages through every job with page_size `size`, calling between(i) after
 * page i; returns the names seen in order (malloc'd) and their count. */
static char **page_all(struct dl *dl, uint32_t size, size_t *ret_n, size_t *ret_pages,
                       void (*between)(struct dl *dl, size_t page)) {
  char **seen = NULL, *token = NULL;
  size_t n = 0, pages = 0;
  do {
    Stoker__V1__ListLoadersRequest req = STOKER__V1__LIST_LOADERS_REQUEST__INIT;
    req.page_size = size;
    if (token) req.page_token = token;
    Stoker__V1__ListLoadersResponse *r;
    assert_int_equal(dl_list_jobs(dl, &req, &r), 0);
    assert_true(r->n_loaders >= 1 || !*r->next_page_token);
    assert_true(r->n_loaders <= page_size(size));
    size_t bytes = 0;
    for (size_t i = 0; i < r->n_loaders; i++) {
      seen = realloc(seen, (n + 1) * sizeof *seen);
      seen[n++] = strdup(r->loaders[i]->spec->job);
      bytes += protobuf_c_message_get_packed_size(&r->loaders[i]->base);
    }
    assert_true(r->n_loaders <= 1 || bytes <= PAGE_MAX_BYTES);
    free(token);
    token = *r->next_page_token ? strdup(r->next_page_token) : NULL;
    dl_list_free(r);
    if (between) between(dl, pages);
    pages++;
  } while (token);
  *ret_n = n;
  *ret_pages = pages;
  return seen;
}

static void free_names(char **v, size_t n) {
  for (size_t i = 0; i < n; i++) free(v[i]);
  free(v);
}

static void test_pages_list_each_job_once(void **state) {
  char *dir = t_tmpdir();
  struct dl *dl = t_open(dir, 0);
  char name[32];
  for (int i = 0; i < 250; i++) {
    snprintf(name, sizeof name, "job-%03d", (i * 97) % 250); /* created out of order */
    create_small(dl, name);
  }
  const uint32_t sizes[] = {0, 1, 7, 100, 250, 5000};
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    size_t n, pages;
    char **v = page_all(dl, sizes[s], &n, &pages, NULL);
    assert_int_equal(n, 250);
    for (size_t i = 0; i < n; i++) {
      snprintf(name, sizeof name, "job-%03zu", i);
      assert_string_equal(v[i], name);
    }
    uint32_t per = page_size(sizes[s]);
    assert_int_equal(pages, (250 + per - 1) / per);
    free_names(v, n);
  }
  dl_close(dl);
  rm(dir);
}

/* Between pages of 10: the first job and one ahead are deleted, one is
 * created behind the cursor and one ahead of it. */
static void churn(struct dl *dl, size_t page) {
  char name[32];
  if (page != 2) return;
  assert_int_equal(dl_delete_job(dl, "job-000"), 0);
  assert_int_equal(dl_delete_job(dl, "job-050"), 0);
  create_small(dl, "job-000a");
  create_small(dl, "job-050a");
  snprintf(name, sizeof name, "job-%03d", 99);
  assert_int_equal(dl_delete_job(dl, name), 0);
}

static void test_pages_under_churn(void **state) {
  char *dir = t_tmpdir();
  struct dl *dl = t_open(dir, 0);
  char name[32];
  for (int i = 0; i < 100; i++) {
    snprintf(name, sizeof name, "job-%03d", i);
    create_small(dl, name);
  }
  size_t n, pages;
  char **v = page_all(dl, 10, &n, &pages, churn);
  /* 100 listed before the churn or untouched, minus job-050 and job-099
   * (deleted ahead), plus job-050a (created ahead); job-000a fell behind. */
  assert_int_equal(n, 99);
  for (size_t i = 1; i < n; i++) assert_true(strcmp(v[i - 1], v[i]) < 0);
  bool saw_050a = false;
  for (size_t i = 0; i < n; i++) {
    assert_string_not_equal(v[i], "job-050");
    assert_string_not_equal(v[i], "job-099");
    saw_050a |= strcmp(v[i], "job-050a") == 0;
  }
  assert_true(saw_050a);
  free_names(v, n);
  dl_close(dl);
  rm(dir);
}

/* 80 jobs of 256 datasets with 128-character names: about 45 KiB each,
 * 3.5 MiB in all. One reply would pass a client's 4 MiB limit with the
 * rest of the message; the pages stop before PAGE_MAX_BYTES. */
static void test_fat_jobs_split_by_bytes(void **state) {
  char *dir = t_tmpdir();
  struct dl *dl = t_open(dir, 0);
  enum { N_DS = 256, N_JOBS = 80 };
  static char names[N_DS][129];
  static Stoker__V1__DatasetSpec ds[N_DS];
  static Stoker__V1__StorageRef src[N_DS];
  Stoker__V1__DatasetSpec *ptrs[N_DS];
  for (int d = 0; d < N_DS; d++) {
    memset(names[d], 'a' + d % 26, 128);
    snprintf(names[d], 9, "ds%05d-", d);
    names[d][8] = 'x';
    stoker__v1__dataset_spec__init(&ds[d]);
    stoker__v1__storage_ref__init(&src[d]);
    src[d].uri = "synthetic:16:8:16:7";
    ds[d].name = names[d];
    ds[d].source = &src[d];
    ds[d].weight = 1;
    ptrs[d] = &ds[d];
  }
  char job[32];
  for (int i = 0; i < N_JOBS; i++) {
    Stoker__V1__LoaderSpec s = STOKER__V1__LOADER_SPEC__INIT;
    snprintf(job, sizeof job, "fat-%02d", i);
    s.job = job;
    s.datasets = ptrs;
    s.n_datasets = N_DS;
    s.seq_len = 8;
    s.global_batch = 4;
    s.logical_shards = 4;
    s.lanes = 2;
    int rc = dl_create_job(dl, &s);
    if (rc) fail_msg("create %s: %d %s", job, rc, stk_detail());
  }
  size_t n, pages;
  char **v = page_all(dl, 0, &n, &pages, NULL);
  assert_int_equal(n, N_JOBS);
  printf("%d fat jobs in %zu pages\n", N_JOBS, pages);
  assert_true(pages >= 2);
  free_names(v, n);
  dl_close(dl);
  rm(dir);
}

static void test_bad_token(void **state) {
  char *dir = t_tmpdir();
  struct dl *dl = t_open(dir, 0);
  create_small(dl, "a");
  const char *bad[] = {"x", "p1.zz", "p1.6", "p1.00", "job-001"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    Stoker__V1__ListLoadersRequest req = STOKER__V1__LIST_LOADERS_REQUEST__INIT;
    req.page_token = (char *)bad[i];
    Stoker__V1__ListLoadersResponse *r;
    assert_int_equal(dl_list_jobs(dl, &req, &r), STK_EINVAL);
    assert_non_null(strstr(stk_detail(), "page_token"));
  }
  Stoker__V1__ListLoadersResponse *r;
  assert_int_equal(dl_list_jobs(dl, NULL, &r), 0); /* NULL: the first page */
  assert_int_equal(r->n_loaders, 1);
  assert_string_equal(r->next_page_token, "");
  dl_list_free(r);
  dl_close(dl);
  rm(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pages_list_each_job_once),
      cmocka_unit_test(test_pages_under_churn),
      cmocka_unit_test(test_fat_jobs_split_by_bytes),
      cmocka_unit_test(test_bad_token),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
