/*
 * List against a store that counts its requests (the loopback fake S3 of
 * ../checkpoint_storage): a job the journal knows no checkpoint of is
 * looked for in storage once; later Lists, also after a restart, answer
 * from the journal without listing the bucket again. With shared storage
 * (replicas over one prefix, issue 26) storage is the catalogue instead:
 * two services with their own journals over one store see each other's
 * commits and deletions, and neither begins a step the other committed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ckpt_svc_fixture.h"
#include "fake_s3_svc_fixture.h"
#include "s3_config.h"
#include "stk_error.h"
#include "storage.h"

/* Enough of S3 for the probe and an empty bucket. */
static void handler(void *arg, const char *method, const char *path, const char *query,
                    struct fake_s3_reply *r) {
  (void)arg;
  (void)path;
  char v[64];
  if (strcmp(method, "GET") == 0 && fake_s3_query(query, "list-type", v, sizeof(v)))
    r->body = strdup("<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>");
  else if (!fake_s3_answer_probe(method, query, r))
    r->status = 404;
}

/* Whether a listing's prefix is a job's directory ("store/JOB/"), not the
 * store's root, which the periodic orphan-attempt sweep lists whenever its
 * timer first fires after an open (a machine under load: before the test's
 * List is done). */
static bool job_dir(const char *prefix) {
  const char *slash = strchr(prefix, '/');
  return slash && slash[1] && strchr(slash + 1, '/');
}

/* ListObjectsV2 requests of a job's directory served so far. */
static int listings(struct fake_s3 *srv) {
  int n = 0;
  char line[2048], prefix[256];
  for (size_t i = 0; i < fake_s3_requests(srv); i++) {
    fake_s3_request(srv, i, line, sizeof(line));
    const char *q = strchr(line, '?');
    n += strncmp(line, "GET ", 4) == 0 && strstr(line, "list-type=2") != NULL && q &&
         fake_s3_query(q + 1, "prefix", prefix, sizeof(prefix)) && job_dir(prefix);
  }
  return n;
}

static void test_list_unknown_job_lists_once(void **state) {
  (void)state;
  struct fx f;
  struct fx_fake_s3 s;
  fx_fake_s3_init(&f, &s, handler, 2);
  assert_int_equal(fx_open(&f), 0);
  int64_t steps[4];
  size_t n = 9;
  int before = listings(s.srv);
  assert_int_equal(fx_list(&f, "fresh", steps, 4, &n), 0);
  assert_int_equal(n, 0);
  assert_int_equal(listings(s.srv), before + 1); /* Looked for in storage once. */
  for (int i = 0; i < 3; i++) {
    assert_int_equal(fx_list(&f, "fresh", steps, 4, &n), 0);
    assert_int_equal(n, 0);
  }
  assert_int_equal(listings(s.srv), before + 1); /* Not again. */
  assert_int_equal(fx_list(&f, "other", steps, 4, &n), 0);
  assert_int_equal(listings(s.srv), before + 2); /* Another job: once too. */
  /* After a restart the journal still knows. */
  fx_close(&f);
  storage_free(s.st);
  before = listings(s.srv);
  fx_fake_s3_use(&f, &s, 2);
  assert_int_equal(fx_open(&f), 0);
  assert_int_equal(fx_list(&f, "fresh", steps, 4, &n), 0);
  assert_int_equal(listings(s.srv), before);
  fx_fake_s3_fini(&f, &s);
}

/* Commits step of job on f (one rank of m). */
static void commit_on(struct fx *f, const struct model *m, const char *job, int64_t step) {
  char att[65];
  assert_int_equal(fx_begin(f, job, step, 1, att), 0);
  struct write_opts wo = {.world = 1, .skip_last_rank = -1};
  assert_int_equal(fx_write_model(f, att, m, &wo, NULL), 0);
  assert_int_equal(fx_commit(f, att, NULL, 0), 0);
}

static void lists(struct fx *f, const char *job, const int64_t *want, size_t n_want) {
  int64_t steps[8];
  size_t n = 99;
  assert_int_equal(fx_list(f, job, steps, 8, &n), 0);
  assert_int_equal(n, n_want);
  for (size_t i = 0; i < n; i++) assert_int_equal(steps[i], want[i]);
}

static void test_shared_storage_is_the_catalogue(void **state) {
  (void)state;
  struct fx a, b;
  fx_init(&a);
  fx_init(&b);
  a.opts.shared_storage = b.opts.shared_storage = true;
  b.opts.storage_url = a.url; /* One store, two journals. */
  assert_int_equal(fx_open(&a), 0);
  assert_int_equal(fx_open(&b), 0);
  struct model *m = model_new(1, 4096, 3);
  commit_on(&a, m, "rep", 1);
  commit_on(&a, m, "rep", 2);
  /* b never saw them: it begins neither step again, reads and lists both. */
  char att[65];
  assert_int_equal(fx_begin(&b, "rep", 2, 1, att), STK_EEXIST);
  assert_int_equal(fx_read_all(&b, "rep", 1, m, 1), 0);
  lists(&b, "rep", (const int64_t[]){1, 2}, 2);
  /* A deletion by a is gone from b's answer too (b's journal still has it). */
  assert_int_equal(fx_delete(&a, "rep", 1), 0);
  lists(&b, "rep", (const int64_t[]){2}, 1);
  /* And b's commit from a's. */
  commit_on(&b, m, "rep", 3);
  lists(&a, "rep", (const int64_t[]){2, 3}, 2);
  assert_int_equal(fx_read_all(&a, "rep", 3, m, 1), 0);
  model_free(m);
  fx_fini(&b);
  fx_fini(&a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_list_unknown_job_lists_once),
      cmocka_unit_test(test_shared_storage_is_the_catalogue),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
