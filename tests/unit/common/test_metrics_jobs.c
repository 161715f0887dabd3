/*
 * Tests for metrics_jobs: rows of the same job folded into one (values
 * summed, jobs sorted by name), label values escaped, and the bound: past
 * METRICS_JOBS_MAX jobs the rest get no series and are counted in
 * stoker_<service>_jobs_unlabelled.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "metrics_jobs.h"
#include "strbuf.h"

static const struct metrics_job_family fams[] = {
    {"stoker_test_job_streams", "Streams."},
    {"stoker_test_job_queued", "Queued."},
};

static char *write_rows(struct metrics_job_row *rows, size_t n, size_t jobs) {
  struct strbuf sb = STRBUF_INIT;
  metrics_jobs_write(&sb, "test", fams, 2, rows, n, jobs);
  char *text = strbuf_take(&sb, NULL);
  assert_non_null(text);
  return text;
}

static int count(const char *text, const char *needle) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, needle)); p++) n++;
  return n;
}

static void test_merge_and_order(void **state) {
  struct metrics_job_row rows[] = {
      {.job = "b", .value = {1, 3}},
      {.job = "a", .value = {1, 0.5}},
      {.job = "b", .value = {1, 4}},
  };
  size_t n = metrics_jobs_merge(rows, 3);
  assert_int_equal(n, 2);
  char *text = write_rows(rows, n, n);
  const char *want = "# HELP stoker_test_job_streams Streams.\n"
                     "# TYPE stoker_test_job_streams gauge\n"
                     "stoker_test_job_streams{job=\"a\"} 1\n"
                     "stoker_test_job_streams{job=\"b\"} 2\n"
                     "# HELP stoker_test_job_queued Queued.\n"
                     "# TYPE stoker_test_job_queued gauge\n"
                     "stoker_test_job_queued{job=\"a\"} 0.5\n"
                     "stoker_test_job_queued{job=\"b\"} 7\n"
                     "# HELP stoker_test_jobs_unlabelled Jobs beyond the 500 given per-job "
                     "series.\n"
                     "# TYPE stoker_test_jobs_unlabelled gauge\n"
                     "stoker_test_jobs_unlabelled 0\n";
  assert_string_equal(text, want);
  free(text);
  assert_int_equal(metrics_jobs_merge(rows, 0), 0);
}

static void test_label_escaping(void **state) {
  struct metrics_job_row rows[] = {{.job = "q\"b\\s\nn", .value = {1, 2}}};
  char *text = write_rows(rows, 1, 1);
  assert_non_null(strstr(text, "stoker_test_job_streams{job=\"q\\\"b\\\\s\\nn\"} 1\n"));
  free(text);
}

/* 600 jobs: the first 500 by name get series, 100 are counted. */
static void test_bound(void **state) {
  enum { JOBS = 600 };
  static char names[JOBS][16];
  static struct metrics_job_row rows[JOBS];
  for (int i = 0; i < JOBS; i++) {
    snprintf(names[i], sizeof(names[i]), "job-%03d", JOBS - 1 - i); /* Reverse order. */
    rows[i] = (struct metrics_job_row){.job = names[i], .value = {1, i}};
  }
  size_t n = metrics_jobs_merge(rows, JOBS);
  assert_int_equal(n, JOBS);
  char *text = write_rows(rows, n, n);
  assert_int_equal(count(text, "stoker_test_job_streams{"), METRICS_JOBS_MAX);
  assert_int_equal(count(text, "stoker_test_job_queued{"), METRICS_JOBS_MAX);
  assert_non_null(strstr(text, "stoker_test_job_streams{job=\"job-499\"} 1\n"));
  assert_null(strstr(text, "job=\"job-500\""));
  assert_non_null(strstr(text, "\nstoker_test_jobs_unlabelled 100\n"));
  free(text);
  /* Rows for only the first jobs, more jobs in all (the coordinator's
   * figures come that way). */
  text = write_rows(rows, METRICS_JOBS_MAX, 700);
  assert_non_null(strstr(text, "\nstoker_test_jobs_unlabelled 200\n"));
  free(text);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_merge_and_order),
      cmocka_unit_test(test_label_escaping),
      cmocka_unit_test(test_bound),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
