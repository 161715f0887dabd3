/*
 * List against a store that counts its requests (the loopback fake S3 of
 * ../checkpoint_storage): a job the journal knows no checkpoint of is
 * looked for in storage once; later Lists, also after a restart, answer
 * from the journal without listing the bucket again.
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

/* ListObjectsV2 requests served so far. */
static int listings(struct fake_s3 *srv) {
  int n = 0;
  char line[2048];
  for (size_t i = 0; i < fake_s3_requests(srv); i++) {
    fake_s3_request(srv, i, line, sizeof(line));
    n += strncmp(line, "GET ", 4) == 0 && strstr(line, "list-type=2") != NULL;
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_list_unknown_job_lists_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
