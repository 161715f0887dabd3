/*
 * The real daemon's Prometheus endpoint: with --metrics-listen on a port
 * the harness picks (the daemon only logs the port it bound), GET /metrics
 * counts the calls made, by method and code, and carries per-job gauges
 * (gone with the job).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "ranks.h"
#include "stk_config.h"

#include <sys/time.h>

/* Polls GET /metrics until it holds every line of want; fails with the
 * last body otherwise (a call is counted as it is freed, just after the
 * client has its reply). */
static void expect_metrics(int port, const char *const *want, size_t n) {
  char *body = NULL;
  for (int64_t deadline = harness_now_ms() + 5000;; harness_sleep_ms(20)) {
    free(body);
    body = harness_http_get(port, "/metrics");
    assert_non_null(body);
    assert_non_null(strstr(body, " 200 "));
    size_t found = 0;
    while (found < n && strstr(body, want[found])) found++;
    if (found == n) break;
    if (harness_now_ms() > deadline) fail_msg("no \"%s\" in:\n%s", want[found], body);
  }
  free(body);
}

static int setup(void **state) {
  int port;
  struct harness_daemon *d = harness_daemon_start_metrics(NULL, &port);
  *state = d;
  return d ? 0 : -1;
}

static int teardown(void **state) {
  harness_daemon_free(*state);
  return 0;
}

static void test_requests_counted(void **state) {
  struct harness_daemon *d = *state;
  int port = atoi(strrchr(d->args[1], ':') + 1); /* args: --metrics-listen HOST:PORT */
  struct stk_client *c = harness_client(d);
  Stoker__V1__ListJobsResponse *l = NULL;
  for (int i = 0; i < 3; i++) {
    assert_int_equal(stk_job_list(c, NULL, NULL, 0, 3000, &l), 0);
    protobuf_c_message_free_unpacked(&l->base, NULL);
  }
  Stoker__V1__Job *job = NULL;
  assert_int_equal(stk_job_get(c, "nope", 3000, &job), STK_ENOENT);
  stk_client_free(c);
  const char *want[] = {
      "grpc_server_handled_total{grpc_type=\"unary\",grpc_service=\"stoker.v1.Coordinator\","
      "grpc_method=\"ListJobs\",grpc_code=\"OK\"} 3\n",
      "grpc_server_handled_total{grpc_type=\"unary\",grpc_service=\"stoker.v1.Coordinator\","
      "grpc_method=\"GetJob\",grpc_code=\"NOT_FOUND\"} 1\n",
  };
  expect_metrics(port, want, 2);
}

/* Every scrape names the build: the version and the service. */
static void test_build_info(void **state) {
  struct harness_daemon *d = *state;
  int port = atoi(strrchr(d->args[1], ':') + 1);
  const char *want[] = {
      "# TYPE stoker_build_info gauge\n",
      "stoker_build_info{version=\"" STK_VERSION "\",service=\"coordinator\"} 1\n",
  };
  expect_metrics(port, want, 2);
}

/* The value of a counter line "NAME VALUE" in body; -1 when absent. */
static double metric_value(const char *body, const char *name) {
  char key[200];
  snprintf(key, sizeof(key), "\n%s ", name);
  const char *at = strstr(body, key);
  return at ? strtod(at + strlen(key), NULL) : -1;
}

/* A rank heartbeats once per interval, not in a loop (its wait once used
 * a CLOCK_MONOTONIC deadline on a CLOCK_REALTIME condition variable, so it
 * returned at once: thousands of heartbeats a second). Counted where they
 * land, at the coordinator. */
static void test_heartbeats_keep_their_interval(void **state) {
  struct harness_daemon *d = *state;
  int port = atoi(strrchr(d->args[1], ':') + 1);
  struct stk_client *c = harness_client(d);
  assert_int_equal(harness_create_job(c, "hb", 1, 1, 200, 50), 0);
  stk_client_free(c);
  struct rank r[1];
  ranks_form(r, 1, d, "hb", "hb", 10000);
  char *body = harness_http_get(port, "/metrics");
  assert_non_null(body);
  double before = metric_value(body, "stoker_coordinator_heartbeats_total");
  free(body);
  harness_sleep_ms(2000); /* 10 intervals of 200 ms */
  body = harness_http_get(port, "/metrics");
  assert_non_null(body);
  double after = metric_value(body, "stoker_coordinator_heartbeats_total");
  free(body);
  ranks_free(r, 1);
  assert_true(before >= 0 && after >= 0);
  double beats = after - before;
  print_message("%.0f heartbeats in 2 s at a 200 ms interval\n", beats);
  /* 10 expected; allow a slow start and the scrape's own lag. */
  assert_true(beats >= 5 && beats <= 14);
}

/* Per-job gauges follow the job: world, generation, the step a member
 * reports; a deleted job leaves no series. */
static void test_job_series(void **state) {
  struct harness_daemon *d = *state;
  int port = atoi(strrchr(d->args[1], ':') + 1);
  struct stk_client *c = harness_client(d);
  assert_int_equal(harness_create_job(c, "series", 1, 1, 200, 50), 0);
  struct rank r[1];
  ranks_form(r, 1, d, "series", "m", 10000);
  stk_report(r[0].client, 77, 1234.5, 2.5, STK_RANK_HEALTH_OK);
  const char *want[] = {
      "# TYPE stoker_job_world_size gauge\n",
      "stoker_job_world_size{job=\"series\"} 1\n",
      "stoker_job_generation{job=\"series\"} 1\n",
      "stoker_job_step{job=\"series\"} 77\n",
      "stoker_job_tokens_per_second{job=\"series\"} 1234.5\n",
      "stoker_coordinator_jobs_unlabelled 0\n",
  };
  expect_metrics(port, want, 6);
  ranks_free(r, 1);
  assert_int_equal(stk_job_delete(c, "series", true, 5000), 0);
  stk_client_free(c);
  char *body = NULL;
  for (int64_t deadline = harness_now_ms() + 5000;; harness_sleep_ms(50)) {
    free(body);
    body = harness_http_get(port, "/metrics");
    assert_non_null(body);
    if (!strstr(body, "job=\"series\"") || harness_now_ms() > deadline) break;
  }
  assert_null(strstr(body, "job=\"series\""));
  free(body);
}

/* Every job's events by type: each type's series there from the start, a
 * preemption counted under PREEMPTED (the dashboard's events panel). */
static void test_events_by_type(void **state) {
  struct harness_daemon *d = *state;
  int port = atoi(strrchr(d->args[1], ':') + 1);
  const char *before[] = {
      "# TYPE stoker_job_events_total counter\n",
      "stoker_job_events_total{type=\"PREEMPTED\"} 0\n",
      "stoker_job_events_total{type=\"GROWN\"} 0\n",
  };
  expect_metrics(port, before, 3);
  struct stk_client *c = harness_client(d);
  assert_int_equal(harness_create_job(c, "ev", 1, 1, 200, 50), 0);
  Stoker__V1__Job *job = NULL;
  assert_int_equal(stk_job_preempt(c, "ev", "kueue: evicted", 3000, &job), 0);
  protobuf_c_message_free_unpacked(&job->base, NULL);
  stk_client_free(c);
  const char *after[] = {
      "stoker_job_events_total{type=\"CREATED\"} 1\n",
      "stoker_job_events_total{type=\"PREEMPTED\"} 1\n",
      "stoker_job_events_total{type=\"PAUSED\"} 1\n",
  };
  expect_metrics(port, after, 3);
}

int main(int argc, char **argv) {
  if (harness_init(argc, argv)) return 2;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_requests_counted, setup, teardown),
      cmocka_unit_test_setup_teardown(test_build_info, setup, teardown),
      cmocka_unit_test_setup_teardown(test_job_series, setup, teardown),
      cmocka_unit_test_setup_teardown(test_heartbeats_keep_their_interval, setup, teardown),
      cmocka_unit_test_setup_teardown(test_events_by_type, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
