/*
 * ListJobs answers in pages (services/common/page.h): paging through many
 * jobs, with and without a label selector, lists each exactly once in name
 * order at any page size; fat jobs (64 labels of 256-byte values) stop a
 * page before its byte bound, where one reply of them all would pass a
 * client's 4 MiB limit; a token that is not one is STK_EINVAL. Members
 * come in pages too: every Job holds the first, ListMembers the rest, each
 * rank once, no message over 4 MiB even at 60,000 ranks, and a token of an
 * ended generation is STK_EABORTED.
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

/* ---- Members in pages (GetJob's first page, then ListMembers) ---- */

/* ListMembers of job after `token` (NULL: the first page). */
static struct res *members_page(struct fx *f, const char *job, uint32_t size, const char *token) {
  Stoker__V1__ListMembersRequest req = STOKER__V1__LIST_MEMBERS_REQUEST__INIT;
  req.job = (char *)job;
  req.page_size = size;
  if (token) req.page_token = (char *)token;
  struct res *r = res_new();
  coord_list_members(f->c, &req, on_done, r);
  return wait_res(f, r);
}

/* Follows a job's member pages from GetJob on (ListMembers pages of at most
 * `size`); checks that every rank 0..n-1 is there exactly once, in order,
 * every page within `per_page` members (0: any) and under 4 MiB. Returns
 * the pages read. */
static size_t follow_members(struct fx *f, const char *job, uint32_t n, uint32_t size,
                             uint32_t per_page) {
  struct res *g = get_job(f, job);
  assert_int_equal(g->err, 0);
  assert_int_equal(JOB(g)->member_count, n);
  assert_true(protobuf_c_message_get_packed_size(&JOB(g)->base) < (4u << 20));
  uint32_t next = 0;
  size_t pages = 1;
  for (size_t i = 0; i < JOB(g)->n_members; i++) assert_int_equal(JOB(g)->members[i]->rank, next++);
  if (per_page) assert_true(JOB(g)->n_members <= per_page);
  char *token = *JOB(g)->next_members_page_token ? strdup(JOB(g)->next_members_page_token) : NULL;
  uint64_t gen = JOB(g)->generation;
  res_free(g);
  while (token) {
    struct res *r = members_page(f, job, size, token);
    assert_int_equal(r->err, 0);
    Stoker__V1__ListMembersResponse *l = (Stoker__V1__ListMembersResponse *)r->resp;
    assert_int_equal(l->generation, gen);
    assert_true(l->n_members >= 1);
    if (per_page) assert_true(l->n_members <= per_page);
    assert_true(protobuf_c_message_get_packed_size(&l->base) < (4u << 20));
    for (size_t i = 0; i < l->n_members; i++) assert_int_equal(l->members[i]->rank, next++);
    free(token);
    token = *l->next_page_token ? strdup(l->next_page_token) : NULL;
    res_free(r);
    pages++;
  }
  assert_int_equal(next, n);
  return pages;
}

/* With --members-per-page 7, a job of 50 ranks: GetJob holds ranks 0..6 and
 * a token, ListMembers the rest (at most 7 a page, fewer when asked), each
 * rank once; ListJobs holds the same first page. A token of an ended
 * generation is ABORTED, a string that is no token INVALID_ARGUMENT. */
static void test_members_in_pages(void **state) {
  struct fx *f = *state;
  fx_close(f);
  f->opts.members_per_page = 7;
  fx_open(f);
  enum { N = 50 };
  create(f, "wide", N, N);
  struct res *r[N];
  join_all(f, "wide", N, r);
  for (int i = 0; i < N; i++) res_free(r[i]);
  assert_int_equal(follow_members(f, "wide", N, 0, 7), (N + 6) / 7);
  assert_int_equal(follow_members(f, "wide", N, 3, 7), 1 + (N - 7 + 2) / 3);
  assert_int_equal(follow_members(f, "wide", N, 1000, 7), (N + 6) / 7);
  struct res *l = list_page(f, 0, NULL, false);
  Stoker__V1__Job *listed = ((Stoker__V1__ListJobsResponse *)l->resp)->jobs[0];
  assert_int_equal(listed->n_members, 7);
  assert_int_equal(listed->member_count, N);
  assert_true(*listed->next_members_page_token);
  res_free(l);
  /* A first ListMembers page without a token is GetJob's. */
  struct res *p = members_page(f, "wide", 0, NULL);
  assert_int_equal(((Stoker__V1__ListMembersResponse *)p->resp)->n_members, 7);
  assert_int_equal(((Stoker__V1__ListMembersResponse *)p->resp)->members[6]->rank, 6);
  res_free(p);
  /* A token of generation 1, then a member leaves: a new round opens. */
  struct res *g = get_job(f, "wide");
  char *token = strdup(JOB(g)->next_members_page_token);
  res_free(g);
  assert_int_equal(leave_as(f, "wide", "m3", 1, false), 0);
  p = members_page(f, "wide", 0, token);
  assert_int_equal(p->err, STK_EABORTED);
  assert_non_null(strstr(p->msg, "read it again"));
  res_free(p);
  free(token);
  const char *bad[] = {"x", "p1.zz", "p1.6d2e31", "p1.77696465"}; /* "m.1", "wide" */
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    p = members_page(f, "wide", 0, bad[i]);
    assert_int_equal(p->err, STK_EINVAL);
    assert_non_null(strstr(p->msg, "page_token"));
    res_free(p);
  }
  p = members_page(f, "nope", 0, NULL);
  assert_int_equal(p->err, STK_ENOENT);
  res_free(p);
}

/* 60,000 ranks with 120-byte addresses and 60-byte host names (about 15 MB
 * of members, where one GetJob passed 4 MiB before members were paged):
 * every message stays under 4 MiB and every rank comes once. */
static void test_60000_members(void **state) {
  struct fx *f = *state;
  enum { N = 60000 };
  create(f, "huge", N, N);
  static struct res *r[N];
  char id[32], address[128], host[64];
  memset(address, 'a', 120), address[120] = 0;
  memset(host, 'h', 60), host[60] = 0;
  for (int i = 0; i < N; i++) {
    snprintf(id, sizeof(id), "m%d", i);
    Stoker__V1__JoinRequest req = STOKER__V1__JOIN_REQUEST__INIT;
    req.job = "huge";
    req.member_id = id;
    req.address = address;
    req.host = host;
    r[i] = res_new();
    assert_non_null(coord_join(f->c, &req, on_done, r[i]));
  }
  for (int i = 0; i < N; i++) run_until(f, &r[i]->done);
  for (int i = 0; i < N; i++) res_free(r[i]);
  size_t pages = follow_members(f, "huge", N, 0, 0);
  printf("60000 members in %zu pages\n", pages);
  assert_true(pages >= 4);
  struct res *l = list_page(f, 0, NULL, false);
  assert_int_equal(l->err, 0);
  assert_true(protobuf_c_message_get_packed_size(l->resp) < (4u << 20));
  res_free(l);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_pages_list_each_job_once, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_fat_jobs_split_by_bytes, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_bad_token, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_members_in_pages, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_60000_members, fx_setup, fx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
