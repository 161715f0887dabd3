/*
 * ListJobs answers in pages (services/common/page.h): paging through many
 * jobs, with and without a label selector, lists each exactly once in name
 * order at any page size; fat jobs (64 labels of 256-byte values) stop a
 * page before its byte bound, where one reply of them all would pass a
 * client's 4 MiB limit; a token that is not one is STK_EINVAL.
 */
#include "coord_test.h"
#include "page.h"

/* One page after `token` (NULL: the first); the response stays in r. */
static struct res *list_page(struct fx *f, uint32_t size, const char *token, bool team_only) {
  Stoker__V1__ListJobsRequest lr = STOKER__V1__LIST_JOBS_REQUEST__INIT;
  Stoker__V1__ListJobsRequest__LabelSelectorEntry sel =
      STOKER__V1__LIST_JOBS_REQUEST__LABEL_SELECTOR_ENTRY__INIT;
  sel.key = "team";
  sel.value = "odd";
  Stoker__V1__ListJobsRequest__LabelSelectorEntry *sels[] = {&sel};
  if (team_only) {
    lr.n_label_selector = 1;
    lr.label_selector = sels;
  }
  lr.page_size = size;
  if (token) lr.page_token = (char *)token;
  struct res *r = res_new();
  coord_list_jobs(f->c, &lr, on_done, r);
  return wait_res(f, r);
}

/* Every page's names in order; checks each page's size and bytes. */
static size_t page_all(struct fx *f, uint32_t size, bool team_only, char names[][64],
                       size_t *ret_pages) {
  size_t n = 0, pages = 0;
  char *token = NULL;
  do {
    struct res *r = list_page(f, size, token, team_only);
    assert_int_equal(r->err, 0);
    Stoker__V1__ListJobsResponse *l = (Stoker__V1__ListJobsResponse *)r->resp;
    assert_true(l->n_jobs <= page_size(size));
    size_t bytes = 0;
    for (size_t i = 0; i < l->n_jobs; i++) {
      snprintf(names[n++], 64, "%s", l->jobs[i]->spec->name);
      bytes += protobuf_c_message_get_packed_size(&l->jobs[i]->base);
    }
    assert_true(l->n_jobs <= 1 || bytes <= PAGE_MAX_BYTES);
    free(token);
    token = *l->next_page_token ? strdup(l->next_page_token) : NULL;
    res_free(r);
    pages++;
  } while (token);
  *ret_pages = pages;
  return n;
}

static void create_labeled(struct fx *f, const char *name, const char *team) {
  Stoker__V1__JobSpec s = spec_of(name, 1, 4);
  Stoker__V1__JobSpec__LabelsEntry lab = STOKER__V1__JOB_SPEC__LABELS_ENTRY__INIT;
  lab.key = "team";
  lab.value = (char *)team;
  Stoker__V1__JobSpec__LabelsEntry *labs[] = {&lab};
  s.n_labels = 1;
  s.labels = labs;
  assert_int_equal(create_spec(f, &s), 0);
}

static void test_pages_list_each_job_once(void **state) {
  struct fx *f = *state;
  char name[64];
  for (int i = 0; i < 300; i++) {
    int k = (i * 7) % 300; /* created out of order */
    snprintf(name, sizeof name, "job-%03d", k);
    create_labeled(f, name, k % 2 ? "odd" : "even");
  }
  static char seen[400][64];
  const uint32_t sizes[] = {0, 1, 7, 100, 300, 5000};
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    size_t pages, n = page_all(f, sizes[s], false, seen, &pages);
    assert_int_equal(n, 300);
    assert_int_equal(pages, (300 + page_size(sizes[s]) - 1) / page_size(sizes[s]));
    for (size_t i = 0; i < n; i++) {
      snprintf(name, sizeof name, "job-%03zu", i);
      assert_string_equal(seen[i], name);
    }
    n = page_all(f, sizes[s], true, seen, &pages);
    assert_int_equal(n, 150);
    for (size_t i = 0; i < n; i++) {
      snprintf(name, sizeof name, "job-%03zu", 2 * i + 1);
      assert_string_equal(seen[i], name);
    }
  }
}

/* 200 jobs of 64 labels with 256-byte values: about 21 KiB each, 4 MiB in
 * all, listed whole in pages below the byte bound. */
static void test_fat_jobs_split_by_bytes(void **state) {
  struct fx *f = *state;
  static char keys[64][16], value[257];
  memset(value, 'v', 256);
  Stoker__V1__JobSpec__LabelsEntry labs[64], *ptrs[64];
  for (int i = 0; i < 64; i++) {
    snprintf(keys[i], sizeof keys[i], "label-%02d", i);
    stoker__v1__job_spec__labels_entry__init(&labs[i]);
    labs[i].key = keys[i];
    labs[i].value = value;
    ptrs[i] = &labs[i];
  }
  char name[64];
  for (int i = 0; i < 200; i++) {
    snprintf(name, sizeof name, "fat-%03d", i);
    Stoker__V1__JobSpec s = spec_of(name, 1, 4);
    s.n_labels = 64;
    s.labels = ptrs;
    assert_int_equal(create_spec(f, &s), 0);
  }
  static char seen[200][64];
  size_t pages, n = page_all(f, 1000, false, seen, &pages);
  assert_int_equal(n, 200);
  printf("200 fat jobs in %zu pages\n", pages);
  assert_true(pages >= 2);
}

static void test_bad_token(void **state) {
  struct fx *f = *state;
  create(f, "a", 1, 1);
  const char *bad[] = {"x", "p1.zz", "p1.6", "a"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    struct res *r = list_page(f, 0, bad[i], false);
    assert_int_equal(r->err, STK_EINVAL);
    assert_non_null(strstr(r->msg, "page_token"));
    res_free(r);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_pages_list_each_job_once, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_fat_jobs_split_by_bytes, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_bad_token, fx_setup, fx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
