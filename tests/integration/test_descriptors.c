/*
 * File descriptors (issue 12, item 2; the shared daemon layer, so the
 * coordinator stands in for all three daemons): a daemon started with a low
 * soft RLIMIT_NOFILE raises it to the hard limit, and idle connections to
 * the metrics port cannot pile up descriptors (at most 32 stay open, a new
 * one closing the oldest) nor lock a scraper out. Health follows the
 * descriptors: NOT_SERVING when few are left, SERVING again once idle
 * connections close. Running out of them altogether, and the gRPC
 * connection cap, are tested in test_connections.c.
 */
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "grpc/health/v1/health.pb-c.h"
#include "harness.h"

/* The soft "Max open files" of a process. */
static unsigned long long soft_nofile(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/limits", (int)pid);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  unsigned long long soft = 0;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "Max open files", 14) == 0) soft = strtoull(line + 14, NULL, 10);
  fclose(f);
  return soft;
}

static void test_soft_limit_raised(void **state) {
  struct rlimit mine;
  assert_int_equal(getrlimit(RLIMIT_NOFILE, &mine), 0);
  if (mine.rlim_max <= 256) skip(); /* nothing to raise to */
  struct rlimit low = {256, mine.rlim_max};
  assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0); /* inherited by the daemon */
  struct harness_daemon *d = harness_daemon_start(NULL);
  assert_int_equal(setrlimit(RLIMIT_NOFILE, &mine), 0);
  assert_non_null(d);
  assert_int_equal(soft_nofile(d->pid), (unsigned long long)mine.rlim_max);
  harness_daemon_free(d);
}

static int connect_to(int port) {
  int fd = harness_connect_idle(port);
  assert_true(fd >= 0);
  return fd;
}

static void test_idle_metrics_connections_capped(void **state) {
  int port = 0;
  struct harness_daemon *d = harness_daemon_start_metrics(NULL, &port);
  assert_non_null(d);
  char *body = harness_http_get(port, "/metrics"); /* settles the daemon's descriptors */
  assert_non_null(body);
  free(body);
  int before = harness_open_fds(d->pid);
  enum { N = 200 };
  int fds[N];
  for (int i = 0; i < N; i++) fds[i] = connect_to(port);
  harness_sleep_ms(300);
  int during = harness_open_fds(d->pid);
  assert_true(during <= before + 32 + 2);
  body = harness_http_get(port, "/metrics"); /* a scrape still gets through */
  assert_non_null(body);
  assert_non_null(strstr(body, "stoker_build_info"));
  free(body);
  for (int i = 0; i < N; i++) close(fds[i]);
  assert_true(harness_daemon_alive(d));
  harness_daemon_free(d);
}

/* Few descriptors left, none lacking yet: NOT_SERVING, and SERVING again
 * once the idle connections are gone. */
static void test_health_recovers(void **state) {
  struct harness_daemon *d = harness_daemon_start(NULL);
  assert_non_null(d);
  struct stk_client *c = harness_client(d);
  assert_int_equal(harness_health(c),
                   GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
  int base = harness_open_fds(d->pid);
  struct rlimit lim = {(rlim_t)base + 96, (rlim_t)base + 96};
  assert_int_equal(prlimit(d->pid, RLIMIT_NOFILE, &lim, NULL), 0);
  int port = atoi(strrchr(d->addr, ':') + 1);
  int fds[72];
  for (int i = 0; i < 72; i++) fds[i] = connect_to(port); /* fewer than 32 left */
  assert_int_equal(
      harness_health_becomes(
          c, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING, 5000),
      GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING);
  for (int i = 0; i < 72; i++) close(fds[i]);
  assert_int_equal(harness_health_becomes(
                       c, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING, 5000),
                   GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
  stk_client_free(c);
  harness_daemon_free(d);
}

/* A connection that never speaks is closed after the 10 s handshake timeout
 * (gRPC's default would hold it two minutes). */
static void test_silent_connection_closed(void **state) {
  struct harness_daemon *d = harness_daemon_start(NULL);
  assert_non_null(d);
  int fd = connect_to(atoi(strrchr(d->addr, ':') + 1));
  int64_t end = harness_now_ms() + 15000;
  ssize_t got = 1;
  while (got > 0 && harness_now_ms() < end) { /* the server's SETTINGS, then the close */
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char buf[256];
    if (poll(&p, 1, 500) == 1) got = recv(fd, buf, sizeof buf, 0);
  }
  assert_true(got <= 0); /* closed by the daemon */
  close(fd);
  harness_daemon_free(d);
}

int main(int argc, char **argv) {
  if (harness_init(argc, argv) != 0) return 2;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_soft_limit_raised),
      cmocka_unit_test(test_idle_metrics_connections_capped),
      cmocka_unit_test(test_silent_connection_closed),
      cmocka_unit_test(test_health_recovers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
