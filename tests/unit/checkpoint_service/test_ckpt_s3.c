/*
 * The checkpoint service's main path against a real S3-protocol server
 * (npm s3rver, which verifies SigV4 signatures; it has no conditional PUT,
 * so the manifest is written with HEAD + PUT): write 4 ranks with multipart
 * objects -> commit -> list -> read back at 4 and 3 ranks -> verify ->
 * delete. Exit 77 (skipped) when s3rver cannot be installed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ckpt_svc_fixture.h"
#include "s3_config.h"
#include "s3rver_config.h"
#include "s3rver_fixture.h"
#include "stk_error.h"
#include "storage.h"

static struct s3rver server;

static void test_s3_write_commit_read(void **state) {
  (void)state;
  struct s3_config cfg = s3rver_config(server.endpoint);
  struct storage *st;
  assert_int_equal(storage_open_s3(&cfg, "ck3/", &st), 0);
  assert_false(storage_caps(st)->conditional_put);
  struct fx f;
  fx_init(&f);
  f.opts.storage = st;
  f.opts.storage_url = "s3://" S3RVER_BUCKET "/ck3";
  assert_int_equal(fx_open(&f), 0);
  struct model *m = model_new(4, 6000000, 31); /* 9 MB a rank: multipart. */
  char att[65], msg[256];
  assert_int_equal(fx_begin(&f, "s3job", 40, 4, att), 0);
  struct write_opts wo = {.world = 4, .skip_last_rank = -1};
  assert_int_equal(fx_write_model(&f, att, m, &wo, NULL), 0);
  int rc = fx_commit(&f, att, msg, sizeof(msg));
  if (rc) fail_msg("commit: %s", msg);
  int64_t steps[4];
  size_t n;
  assert_int_equal(fx_list(&f, "s3job", steps, 4, &n), 0);
  assert_int_equal(n, 1);
  assert_int_equal(steps[0], 40);
  assert_int_equal(fx_read_all(&f, "s3job", 40, m, 4), 0);
  assert_int_equal(fx_read_all(&f, "s3job", 40, m, 3), 0);
  uint64_t problems = 1;
  assert_int_equal(fx_verify(&f, "s3job", 40, &problems), 0);
  assert_int_equal(problems, 0);
  struct ckpt_service_stats sst;
  ckpt_service_get_stats(f.svc, &sst);
  assert_true(sst.parts_uploaded >= 8);
  assert_int_equal(fx_delete(&f, "s3job", 40), 0);
  assert_int_equal(fx_list(&f, "s3job", steps, 4, &n), 0);
  assert_int_equal(n, 0);
  fx_close(&f);
  fx_fini(&f);
  storage_free(st);
  model_free(m);
}

int main(void) {
  if (s3rver_start(&server) != 0) return 77;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_s3_write_commit_read),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  s3rver_stop(&server);
  return rc;
}
