/*
 * Each daemon's /metrics as Prometheus and its ecosystem expect it: the
 * build info, the process_* series of the client libraries, the gRPC
 * server series under go-grpc-prometheus's names (grpc_server_started_total,
 * grpc_server_handled_total, grpc_server_handling_seconds), and a text
 * that `promtool check metrics` accepts without a single complaint.
 * Arguments: the coordinator, dataloader and checkpoint binaries. Exit 77
 * (skipped) when promtool is not on PATH.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "grpc/health/v1/health.pb-c.h"
#include "harness.h"
#include "stk_config.h"

static int test_argc;
static char **test_argv;

/* The body of the daemon's /metrics once a health check was counted. */
static char *scrape_after_health_check(struct harness_daemon *d, int port) {
  struct rpc_client *rc = harness_rpc(d);
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  assert_int_equal(harness_call(rc, "/grpc.health.v1.Health/Check", &req.base,
                                &grpc__health__v1__health_check_response__descriptor, NULL, NULL,
                                0),
                   RPC_OK);
  rpc_client_free(rc);
  const char *want = "grpc_server_handled_total{grpc_type=\"unary\",grpc_service=\"grpc.health.v1."
                     "Health\",grpc_method=\"Check\",grpc_code=\"OK\"} 1\n";
  for (int64_t deadline = harness_now_ms() + 5000;; harness_sleep_ms(20)) {
    char *resp = harness_http_get(port, "/metrics");
    assert_non_null(resp);
    char *body = strstr(resp, "\r\n\r\n");
    if (body && strstr(body, want)) {
      char *copy = strdup(body + 4);
      free(resp);
      return copy;
    }
    if (harness_now_ms() > deadline) fail_msg("no \"%s\" in:\n%s", want, resp);
    free(resp);
  }
}

static void expect_in(const char *body, const char *want, const char *service) {
  if (!strstr(body, want)) fail_msg("%s: no \"%s\" in:\n%s", service, want, body);
}

/* promtool check metrics reads the text on stdin and prints one line per
 * problem; any line, or a non-zero exit, fails. */
static void promtool_check(const char *body, const char *service) {
  char out[4096];
  int rc = harness_promtool_check(body, out, sizeof(out));
  if (rc != 0) fail_msg("%s: promtool check metrics (%d):\n%s", service, rc, out);
}

static void test_each_daemon(void **state) {
  for (int i = 1; i < test_argc; i++) {
    const char *service = strrchr(test_argv[i], '-') + 1; /* stoker-NAME */
    char *alt[] = {test_argv[0], test_argv[i], NULL};
    assert_int_equal(harness_init(2, alt), 0);
    int port;
    struct harness_daemon *d = harness_daemon_start_metrics(NULL, &port);
    assert_non_null(d);
    char *body = scrape_after_health_check(d, port);
    char build[256];
    snprintf(build, sizeof(build), "stoker_build_info{version=\"%s\",service=\"%s\"} 1\n",
             STK_VERSION, service);
    expect_in(body, build, service);
    const char *names[] = {
        "\ngrpc_server_started_total{grpc_type=\"unary\",grpc_service=\"grpc.health.v1.Health\","
        "grpc_method=\"Check\"} 1\n",
        "\ngrpc_server_handling_seconds_bucket{grpc_type=\"unary\",grpc_service=\"grpc.health.v1."
        "Health\",grpc_method=\"Check\",le=\"+Inf\"} 1\n",
        "\ngrpc_server_handling_seconds_count{grpc_type=\"unary\",grpc_service=\"grpc.health.v1."
        "Health\",grpc_method=\"Check\"} 1\n",
        "\n# TYPE grpc_server_handling_seconds histogram\n",
        "\n# TYPE process_cpu_seconds_total counter\n",
        "\nprocess_resident_memory_bytes ",
        "\nprocess_virtual_memory_bytes ",
        "\nprocess_open_fds ",
        "\nprocess_max_fds ",
        "\nprocess_start_time_seconds ",
    };
    for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++)
      expect_in(body, names[k], service);
    promtool_check(body, service);
    free(body);
    harness_daemon_free(d);
  }
}

int main(int argc, char **argv) {
  if (system("command -v promtool > /dev/null 2>&1") != 0) {
    fprintf(stderr, "promtool not found: skipped\n");
    return 77;
  }
  if (harness_init(argc, argv)) return 2;
  test_argc = argc;
  test_argv = argv;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_each_daemon),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
