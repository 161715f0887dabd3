/*
 * Tests for ckpt_names: what names are accepted and refused (".." and
 * absolute paths, control characters, empty segments, lengths), and the
 * exact keys built under a job's prefix, which no name can escape.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ckpt_names.h"
#include "stk_error.h"

static void test_job_names(void **state) {
  assert_int_equal(ckpt_name_check_job("llama-7b_run.3"), 0);
  const char *bad[] = {"",          "..",   ".",      "a/b",         "/abs", "a..b",
                       "tab\tname", "nl\n", "sp ace", "caf\xc3\xa9", "\x7f"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    assert_int_equal(ckpt_name_check_job(bad[i]), STK_EINVAL);
  assert_int_equal(ckpt_name_check_job(NULL), STK_EINVAL);
  char long_name[CKPT_JOB_MAX_BYTES + 2];
  memset(long_name, 'a', sizeof(long_name) - 1);
  long_name[CKPT_JOB_MAX_BYTES + 1] = '\0';
  assert_int_equal(ckpt_name_check_job(long_name), STK_EINVAL);
  long_name[CKPT_JOB_MAX_BYTES] = '\0';
  assert_int_equal(ckpt_name_check_job(long_name), 0);
}

static void test_tensor_names(void **state) {
  const char *good[] = {"model.layers.0.attn.wq", "optim/adam/exp_avg/layers.3", "a-b_c.d/e"};
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
    assert_int_equal(ckpt_name_check_tensor(good[i]), 0);
  const char *bad[] = {"",     "/etc/passwd", "a/../b",   "..",    "../x",   "a//b",
                       "a/",   "a/./b",       "x\001y",   "x\ny",  "x\x7fy", "x y",
                       "x\\y", "x:y",         "\xff\xfe", "a/b/.."};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    assert_int_equal(ckpt_name_check_tensor(bad[i]), STK_EINVAL);
    assert_true(strlen(stk_detail()) > 0);
  }
  char long_name[CKPT_TENSOR_MAX_BYTES + 2];
  memset(long_name, 'w', sizeof(long_name) - 1);
  long_name[CKPT_TENSOR_MAX_BYTES + 1] = '\0';
  assert_int_equal(ckpt_name_check_tensor(long_name), STK_EINVAL);
}

static void test_steps_and_attempts(void **state) {
  assert_int_equal(ckpt_name_check_step(0), 0);
  assert_int_equal(ckpt_name_check_step(CKPT_STEP_MAX), 0);
  assert_int_equal(ckpt_name_check_step(-1), STK_EINVAL);
  assert_int_equal(ckpt_name_check_step(CKPT_STEP_MAX + 1), STK_EINVAL);
  assert_int_equal(ckpt_name_check_attempt("0f3a-9"), 0);
  assert_int_equal(ckpt_name_check_attempt("a.b"), STK_EINVAL);
  assert_int_equal(ckpt_name_check_attempt("a/b"), STK_EINVAL);
  assert_int_equal(ckpt_name_check_attempt(""), STK_EINVAL);
  char a[CKPT_ATTEMPT_MAX_BYTES + 1], b[CKPT_ATTEMPT_MAX_BYTES + 1];
  assert_int_equal(ckpt_attempt_generate(a), 0);
  assert_int_equal(ckpt_attempt_generate(b), 0);
  assert_int_equal(strlen(a), 32);
  assert_int_equal(ckpt_name_check_attempt(a), 0);
  assert_string_not_equal(a, b);
}

static void test_keys(void **state) {
  char *key;
  char obj[CKPT_OBJECT_MAX_BYTES + 1];
  ckpt_object_name(3, 0, obj);
  assert_string_equal(obj, "rank-00003-0000.bin");
  assert_int_equal(ckpt_key_object("ckpt/prod", "job1", 1234, "abc", obj, &key), 0);
  assert_string_equal(key, "ckpt/prod/job1/step-000000001234/attempt-abc/rank-00003-0000.bin");
  free(key);
  assert_int_equal(ckpt_key_manifest("", "job1", 7, "abc", &key), 0);
  assert_string_equal(key, "job1/step-000000000007/attempt-abc/manifest.pb");
  free(key);
  assert_int_equal(ckpt_key_step_dir("p", "job1", 7, &key), 0);
  assert_string_equal(key, "p/job1/step-000000000007/");
  free(key);
  assert_int_equal(ckpt_key_attempt_dir("p", "job1", 7, "z9", &key), 0);
  assert_string_equal(key, "p/job1/step-000000000007/attempt-z9/");
  free(key);
  assert_int_equal(ckpt_key_job_dir("p", "job1", &key), 0);
  assert_string_equal(key, "p/job1/");
  free(key);
  /* No part can climb out of the job's prefix. */
  key = NULL;
  assert_int_equal(ckpt_key_object("p", "..", 1, "a", "x.bin", &key), STK_EINVAL);
  assert_int_equal(ckpt_key_object("p", "j", 1, "a", "../../other/x.bin", &key), STK_EINVAL);
  assert_int_equal(ckpt_key_object("p", "j", 1, "a", "/x.bin", &key), STK_EINVAL);
  assert_int_equal(ckpt_key_object("p", "j", 1, "../a", "x.bin", &key), STK_EINVAL);
  assert_int_equal(ckpt_key_object("/p", "j", 1, "a", "x.bin", &key), STK_EINVAL);
  assert_int_equal(ckpt_key_object("p", "j", -5, "a", "x.bin", &key), STK_EINVAL);
  assert_null(key);
}

static void test_parse_step(void **state) {
  int64_t step = -1;
  assert_int_equal(ckpt_key_parse_step("step-000000001234/", &step), 0);
  assert_int_equal(step, 1234);
  assert_int_equal(ckpt_key_parse_step("step-999999999999", &step), 0);
  assert_int_equal(step, CKPT_STEP_MAX);
  assert_int_equal(ckpt_key_parse_step("step-00000000123", &step), STK_EINVAL);
  assert_int_equal(ckpt_key_parse_step("step-00000000123x", &step), STK_EINVAL);
  assert_int_equal(ckpt_key_parse_step("stop-000000001234", &step), STK_EINVAL);
  assert_int_equal(step, CKPT_STEP_MAX); /* Untouched on failure. */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_job_names),          cmocka_unit_test(test_tensor_names),
      cmocka_unit_test(test_steps_and_attempts), cmocka_unit_test(test_keys),
      cmocka_unit_test(test_parse_step),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
