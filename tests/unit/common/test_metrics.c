/*
 * Tests for metrics: the Prometheus text a scraper reads (HELP and TYPE
 * once per name, label placement, cumulative buckets, _sum and _count),
 * and exact totals when four threads update the same series at once.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "metrics.h"
#include "strbuf.h"

static char *render(struct metrics *m) {
  size_t len = 0;
  char *text = metrics_render(m, &len);
  assert_non_null(text);
  assert_int_equal(strlen(text), len);
  return text;
}

static void assert_has_line(const char *text, const char *line) {
  size_t n = strlen(line);
  for (const char *p = text; (p = strstr(p, line)); p++)
    if ((p == text || p[-1] == '\n') && p[n] == '\n') return;
  fail_msg("line '%s' missing from:\n%s", line, text);
}

static int count(const char *text, const char *needle) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, needle)); p++) n++;
  return n;
}

static void test_counter_and_gauge(void **state) {
  struct metrics *m = metrics_new();
  struct metric_counter *a = metrics_counter(m, "rpc_total", "Calls served.", "code=\"OK\"");
  struct metric_counter *b = metrics_counter(m, "rpc_total", "ignored", "code=\"NOT_FOUND\"");
  assert_ptr_equal(metrics_counter(m, "rpc_total", NULL, "code=\"OK\""), a);
  metric_counter_add(a, 3);
  metric_counter_add(a, 4);
  metric_counter_add(b, 1);
  struct metric_gauge *g = metrics_gauge(m, "queue_depth", "Queued items.", NULL);
  metric_gauge_set(g, 2.5);
  metric_gauge_add(g, -1);
  metric_counter_add(metrics_counter(m, "plain_total", "No labels.", ""), 9);
  char *text = render(m);
  assert_has_line(text, "# HELP rpc_total Calls served.");
  assert_has_line(text, "# TYPE rpc_total counter");
  assert_int_equal(count(text, "# TYPE rpc_total"), 1);
  assert_has_line(text, "rpc_total{code=\"OK\"} 7");
  assert_has_line(text, "rpc_total{code=\"NOT_FOUND\"} 1");
  assert_has_line(text, "# TYPE queue_depth gauge");
  assert_has_line(text, "queue_depth 1.5");
  assert_has_line(text, "plain_total 9");
  /* A series' HELP/TYPE come before its samples. */
  assert_true(strstr(text, "# TYPE rpc_total") < strstr(text, "rpc_total{"));
  free(text);
  metrics_free(m);
}

static void test_histogram_cumulative(void **state) {
  struct metrics *m = metrics_new();
  struct metric_histogram *h = metrics_histogram(m, "lat_seconds", "Latency.", "op=\"get\"");
  metric_histogram_observe(h, 0.00003); /* <= 50us */
  metric_histogram_observe(h, 0.00005); /* on a bound: counts as <= */
  metric_histogram_observe(h, 0.003);   /* <= 5ms */
  metric_histogram_observe(h, 2);       /* <= 2.5s */
  metric_histogram_observe(h, 100);     /* +Inf only */
  char *text = render(m);
  assert_has_line(text, "# TYPE lat_seconds histogram");
  assert_has_line(text, "lat_seconds_bucket{op=\"get\",le=\"5e-05\"} 2");
  assert_has_line(text, "lat_seconds_bucket{op=\"get\",le=\"0.0025\"} 2");
  assert_has_line(text, "lat_seconds_bucket{op=\"get\",le=\"0.005\"} 3");
  assert_has_line(text, "lat_seconds_bucket{op=\"get\",le=\"1\"} 3");
  assert_has_line(text, "lat_seconds_bucket{op=\"get\",le=\"2.5\"} 4");
  assert_has_line(text, "lat_seconds_bucket{op=\"get\",le=\"60\"} 4");
  assert_has_line(text, "lat_seconds_bucket{op=\"get\",le=\"+Inf\"} 5");
  assert_has_line(text, "lat_seconds_sum{op=\"get\"} 102.00308");
  assert_has_line(text, "lat_seconds_count{op=\"get\"} 5");
  assert_int_equal(count(text, "lat_seconds_bucket{"), 20);
  free(text);
  struct metric_histogram *bare = metrics_histogram(m, "bare_seconds", "No labels.", NULL);
  metric_histogram_observe(bare, 0.5);
  text = render(m);
  assert_has_line(text, "bare_seconds_bucket{le=\"0.5\"} 1");
  assert_has_line(text, "bare_seconds_bucket{le=\"0.25\"} 0");
  assert_has_line(text, "bare_seconds_count 1");
  free(text);
  metrics_free(m);
}

static void test_help_escaping_and_type_clash(void **state) {
  struct metrics *m = metrics_new();
  metrics_gauge(m, "g", "line one\nback\\slash", NULL);
  assert_null(metrics_counter(m, "g", "", NULL)); /* Same name, other type. */
  metric_counter_add(NULL, 1);                    /* Harmless. */
  char *text = render(m);
  assert_has_line(text, "# HELP g line one\\nback\\\\slash");
  free(text);
  metrics_free(m);
}

/* Four threads hammer one counter, gauge and histogram. */
#define ITER 100000

static void *hammer(void *arg) {
  struct metrics *m = arg;
  struct metric_counter *c = metrics_counter(m, "c_total", "", NULL);
  struct metric_gauge *g = metrics_gauge(m, "g", "", NULL);
  struct metric_histogram *h = metrics_histogram(m, "h_seconds", "", NULL);
  for (int i = 0; i < ITER; i++) {
    metric_counter_add(c, 1);
    metric_gauge_add(g, 0.5);
    metric_histogram_observe(h, (i % 2) ? 0.25 : 1.0);
  }
  return NULL;
}

static void test_concurrent_exact(void **state) {
  struct metrics *m = metrics_new();
  pthread_t t[4];
  for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, hammer, m);
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  char *text = render(m);
  assert_has_line(text, "c_total 400000");
  assert_has_line(text, "g 200000");
  assert_has_line(text, "h_seconds_bucket{le=\"0.25\"} 200000");
  assert_has_line(text, "h_seconds_bucket{le=\"1\"} 400000");
  assert_has_line(text, "h_seconds_count 400000");
  assert_has_line(text, "h_seconds_sum 250000");
  free(text);
  metrics_free(m);
}

/* The value on the sample line "NAME VALUE"; -1 when absent. */
static double sample(const char *text, const char *name) {
  char key[128];
  snprintf(key, sizeof(key), "\n%s ", name);
  const char *at = strstr(text, key);
  return at ? strtod(at + strlen(key), NULL) : -1;
}

static void add_two(struct strbuf *sb, void *arg) {
  strbuf_printf(sb, "# HELP extra_total Extra.\n# TYPE extra_total counter\nextra_total %d\n",
                *(int *)arg);
}

/* Collectors append after the registry's series, on every render. */
static void test_collector(void **state) {
  struct metrics *m = metrics_new();
  metric_counter_add(metrics_counter(m, "a_total", "A.", NULL), 1);
  int two = 2;
  assert_int_equal(metrics_add_collector(m, add_two, &two), 0);
  char *text = metrics_render(m, NULL);
  assert_non_null(strstr(text, "a_total 1\n# HELP extra_total Extra.\n"));
  assert_non_null(strstr(text, "\nextra_total 2\n"));
  free(text);
  metrics_free(m);
}

/* The process_* series with figures that make sense for this process. */
static void test_process_metrics(void **state) {
  struct metrics *m = metrics_new();
  assert_int_equal(metrics_add_collector(m, metrics_process_collect, NULL), 0);
  char *text = metrics_render(m, NULL);
  assert_non_null(strstr(text, "# TYPE process_cpu_seconds_total counter\n"));
  assert_non_null(strstr(text, "# TYPE process_start_time_seconds gauge\n"));
  assert_true(sample(text, "process_cpu_seconds_total") >= 0);
  assert_true(sample(text, "process_resident_memory_bytes") > 1e5);
  assert_true(sample(text, "process_virtual_memory_bytes") >=
              sample(text, "process_resident_memory_bytes"));
  double open_fds = sample(text, "process_open_fds");
  assert_true(open_fds >= 3); /* stdin, stdout, stderr. */
  assert_true(sample(text, "process_max_fds") >= open_fds);
  double start = sample(text, "process_start_time_seconds"), now = (double)time(NULL);
  assert_true(start > now - 600 && start <= now + 1);
  free(text);
  metrics_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_counter_and_gauge),
      cmocka_unit_test(test_histogram_cumulative),
      cmocka_unit_test(test_help_escaping_and_type_clash),
      cmocka_unit_test(test_concurrent_exact),
      cmocka_unit_test(test_collector),
      cmocka_unit_test(test_process_metrics),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
