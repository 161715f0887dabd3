/*
 * gRPC connections and descriptors (issue 12, item 2; the shared daemon
 * layer, so the coordinator stands in for all three daemons). Idle
 * connections to the gRPC port that use up every descriptor make the
 * daemon NOT_SERVING, and once they close it recovers: a new client
 * connects and calls, health is SERVING again (gRPC 1.51 alone stops
 * accepting for good after one failed accept), in plaintext and with TLS
 * and a bearer token. --max-connections holds: connections beyond it are
 * closed by the daemon as soon as they arrive and counted. The PKI comes
 * from tests/unit/rpc/gen_certs.sh (the test's second argument).
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

#define SERVING     GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
#define NOT_SERVING GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING

static char pki[256]; /* gen_certs.sh's output */

static int setup_pki(void **state) {
  const char *script = harness_arg(1);
  if (!script || harness_tmpdir_new(pki, sizeof(pki))) return -1;
  char cmd[1024];
  snprintf(cmd, sizeof(cmd), "sh '%s' '%s'", script, pki);
  return system(cmd) == 0 ? 0 : -1;
}

static int teardown_pki(void **state) {
  harness_tmpdir_remove(pki);
  return 0;
}

static const char *pki_file(const char *name, char *path, size_t len) {
  snprintf(path, len, "%s/%s", pki, name);
  return path;
}

/* An idle connection to d's gRPC port. */
static int connect_to(const struct harness_daemon *d) {
  int fd = harness_connect_idle(atoi(strrchr(d->addr, ':') + 1));
  assert_true(fd >= 0);
  return fd;
}

/* A client of d: plaintext, or TLS with the test CA and the token. */
static struct stk_client *client(const struct harness_daemon *d, bool secure) {
  char ca[300];
  struct stk_client_opts o = {.address = d->addr, .default_timeout_ms = 3000};
  if (secure) {
    o.tls_ca_file = pki_file("server-ca.pem", ca, sizeof(ca));
    o.token = "s3cret-token";
  }
  struct stk_client *c = NULL;
  assert_int_equal(stk_client_new(&o, &c), 0);
  return c;
}

/* A real call (ListJobs, token checked) through a client made now, so over
 * a connection the daemon must accept now; retried for up to 5 s. */
static int new_client_call(const struct harness_daemon *d, bool secure) {
  int64_t end = harness_now_ms() + 5000;
  int rc;
  do {
    struct stk_client *c = client(d, secure);
    Stoker__V1__ListJobsResponse *resp = NULL;
    rc = stk_job_list(c, NULL, NULL, 0, 2000, &resp);
    if (resp) protobuf_c_message_free_unpacked(&resp->base, NULL);
    stk_client_free(c);
  } while (rc != 0 && harness_now_ms() < end && (harness_sleep_ms(200), true));
  return rc;
}

static struct harness_daemon *start(bool secure, const char *max_connections, int *ret_port) {
  char cert[300], key[300], tok[300];
  const char *args[10] = {"--max-connections", max_connections, NULL};
  if (secure) {
    FILE *f = fopen(pki_file("token", tok, sizeof(tok)), "w");
    assert_non_null(f);
    fputs("s3cret-token\n", f);
    fclose(f);
    const char *more[] = {"--tls-cert",   pki_file("server.pem", cert, sizeof(cert)),
                          "--tls-key",    pki_file("server.key", key, sizeof(key)),
                          "--token-file", tok};
    memcpy(args + 2, more, sizeof(more));
  }
  struct harness_daemon *d = harness_daemon_start_metrics(args, ret_port);
  assert_non_null(d);
  return d;
}

/* The daemon's descriptors are limited (prlimit, soft and hard: raising
 * cannot help) to 96 more than it holds, below its connection cap; idle
 * connections to its gRPC port use them all up, and more wait in the
 * backlog. Once they close, the daemon must take new clients again. */
static void exhaust_and_recover(bool secure) {
  int mport = 0;
  struct harness_daemon *d = start(secure, "0", &mport);
  struct stk_client *c = client(d, secure); /* connected before the flood */
  assert_int_equal(harness_health(c), SERVING);
  int base = harness_open_fds(d->pid);
  struct rlimit lim = {(rlim_t)base + 96, (rlim_t)base + 96};
  assert_int_equal(prlimit(d->pid, RLIMIT_NOFILE, &lim, NULL), 0);

  enum { N = 160 };
  int fds[N];
  for (int i = 0; i < N; i++) fds[i] = connect_to(d);
  assert_int_equal(harness_health_becomes(c, NOT_SERVING, 5000), NOT_SERVING);
  /* gRPC clients of one process share a connection to the same target and
   * credentials: without c, the next client needs a connection of its own. */
  stk_client_free(c);
  harness_sleep_ms(300);
  for (int i = 0; i < N; i++) close(fds[i]);
  int64_t end = harness_now_ms() + 5000;
  while (harness_open_fds(d->pid) > base + 4 && harness_now_ms() < end) harness_sleep_ms(100);

  assert_int_equal(new_client_call(d, secure), 0); /* accepted again */
  c = client(d, secure);
  assert_int_equal(harness_health_becomes(c, SERVING, 5000), SERVING);
  assert_true(
      harness_metric(mport, "stoker_rpc_connections_refused_total{reason=\"descriptors\"}") > 0);
  stk_client_free(c);
  assert_true(harness_daemon_alive(d));
  harness_daemon_free(d);
}

static void test_exhausted_plaintext_recovers(void **state) {
  exhaust_and_recover(false);
}

static void test_exhausted_tls_token_recovers(void **state) {
  exhaust_and_recover(true);
}

/* Whether the daemon closes fd within ms (bytes it sends are read). */
static bool closed_within(int fd, int64_t ms) {
  int64_t end = harness_now_ms() + ms;
  for (int64_t left; (left = end - harness_now_ms()) > 0;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char buf[256];
    if (poll(&p, 1, (int)left) == 1 && recv(fd, buf, sizeof buf, 0) <= 0) return true;
  }
  return false;
}

/* --max-connections 8 with one client connected: of 20 more connections 7
 * are held and 13 closed at once and counted; health says the daemon is
 * full, and a new client gets in once they are gone. */
static void test_connection_cap_holds(void **state) {
  int mport = 0;
  struct harness_daemon *d = start(false, "8", &mport);
  struct stk_client *c = client(d, false);
  assert_int_equal(harness_health(c), SERVING);
  assert_int_equal(harness_metric(mport, "stoker_rpc_connections_max"), 8);

  enum { N = 20 };
  int fds[N], closed = 0;
  for (int i = 0; i < N; i++) fds[i] = connect_to(d);
  for (int i = 0; i < N; i++) closed += closed_within(fds[i], 300);
  assert_int_equal(closed, N - 7);
  assert_int_equal(harness_metric(mport, "stoker_rpc_connections_refused_total{reason=\"limit\"}"),
                   N - 7);
  assert_int_equal(harness_metric(mport, "stoker_rpc_connections"), 8);
  assert_int_equal(harness_health_becomes(c, NOT_SERVING, 5000), NOT_SERVING);

  for (int i = 0; i < N; i++) close(fds[i]);
  assert_int_equal(harness_health_becomes(c, SERVING, 5000), SERVING);
  stk_client_free(c); /* the next client's connection is its own */
  assert_int_equal(new_client_call(d, false), 0);
  harness_daemon_free(d);
}

int main(int argc, char **argv) {
  if (harness_init(argc, argv) != 0) return 2;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exhausted_plaintext_recovers),
      cmocka_unit_test(test_exhausted_tls_token_recovers),
      cmocka_unit_test(test_connection_cap_holds),
  };
  return cmocka_run_group_tests(tests, setup_pki, teardown_pki);
}
