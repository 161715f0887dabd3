/*
 * The checkpoint service's reports to a coordinator that serves TLS and
 * wants a bearer token: with --coordinator-tls-ca and the token file, a
 * commit reaches the coordinator's GetJob; without the CA (plaintext
 * against TLS) the report never lands and its failed tries are counted in
 * stoker_checkpoint_coordinator_report_failures_total. SIGHUP re-reads the
 * CA and the token file into a new client: a report retried against a CA
 * that did not sign the coordinator's certificate lands once the right CA
 * is in the file; a CA file that does not parse is refused (counted in
 * stoker_reloads_total{result="failure"}) and the client in use stays; a
 * new token is sent from then on. The PKI is made at test time by
 * tests/unit/rpc/gen_certs.sh (server cert for 127.0.0.1).
 * argv: stoker-checkpoint, stoker-coordinator, gen_certs.sh.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <signal.h>

#include "test_ckpt_helpers.h"

static char **test_argv;
static char pki[256];

static const char *pki_path(const char *name) {
  static char paths[8][320];
  static int next;
  char *p = paths[next++ % 8];
  snprintf(p, sizeof(paths[0]), "%s/%s", pki, name);
  return p;
}

/* The coordinator with TLS and a token: harness_init switched to its
 * binary, then back to the checkpoint service's. */
static struct harness_daemon *start_tls_coordinator(void) {
  char *alt[] = {test_argv[0], test_argv[2], NULL};
  harness_init(2, alt);
  const char *args[] = {"--tls-cert",   pki_path("server.pem"), "--tls-key", pki_path("server.key"),
                        "--token-file", pki_path("token"),      NULL};
  struct harness_daemon *co = harness_daemon_start(args);
  char *back[] = {test_argv[0], test_argv[1], test_argv[2], test_argv[3], NULL};
  harness_init(4, back);
  return co;
}

static struct stk_client *tls_client(const struct harness_daemon *co) {
  struct stk_client_opts o = {.address = co->addr,
                              .tls_ca_file = pki_path("server-ca.pem"),
                              .token_file = pki_path("token"),
                              .default_timeout_ms = 5000};
  struct stk_client *c = NULL;
  assert_int_equal(stk_client_new(&o, &c), 0);
  return c;
}

/* Begins, writes and commits step at 2 ranks on the checkpoint daemon d. */
static void commit_step(struct harness_daemon *d, const char *job, int64_t step) {
  struct rpc_client *rc = harness_rpc(d);
  tck_save_ok(rc, d->addr, job, step, 2);
  rpc_client_free(rc);
}

/* The latest checkpoint step the coordinator knows for job after up to
 * wait_ms of polling for want. */
static int64_t latest_step(struct stk_client *cc, const char *job, int64_t want, int64_t wait_ms) {
  int64_t seen = 0, deadline = harness_now_ms() + wait_ms;
  for (;;) {
    Stoker__V1__Job *j = harness_get_job(cc, job);
    if (j && j->latest_checkpoint) seen = j->latest_checkpoint->step;
    if (j) protobuf_c_message_free_unpacked(&j->base, NULL);
    if (seen == want || harness_now_ms() >= deadline) return seen;
    harness_sleep_ms(50);
  }
}

/* Each test: a TLS coordinator holding job "gpt", a client of it, and the
 * --coordinator flag naming it. */
struct fixture {
  struct harness_daemon *co;
  struct stk_client *cc;
  char target[160];
};

static int setup_coordinator(void **state) {
  struct fixture *f = calloc(1, sizeof *f);
  *state = f;
  if (!f || !(f->co = start_tls_coordinator())) return -1;
  f->cc = tls_client(f->co);
  snprintf(f->target, sizeof(f->target), "--coordinator=%s", f->co->addr);
  return harness_create_job(f->cc, "gpt", 1, 4, 1000, 100) == 0 ? 0 : -1;
}

static int teardown_coordinator(void **state) {
  struct fixture *f = *state;
  if (f) {
    stk_client_free(f->cc);
    harness_daemon_free(f->co);
    free(f);
  }
  return 0;
}

static void test_report_over_tls_with_token(void **state) {
  struct fixture *f = *state;
  const char *args[] = {"--part-size",
                        "5MiB",
                        f->target,
                        "--coordinator-tls-ca",
                        pki_path("server-ca.pem"),
                        "--coordinator-token-file",
                        pki_path("token"),
                        NULL};
  struct harness_daemon *d = harness_daemon_start(args);
  assert_non_null(d);
  commit_step(d, "gpt", 42);
  assert_int_equal(latest_step(f->cc, "gpt", 42, 10000), 42);
  harness_daemon_free(d);
}

static void test_plaintext_against_tls_is_counted(void **state) {
  struct fixture *f = *state;
  const char *args[] = {"--part-size", "5MiB", f->target, NULL};
  int port = 0;
  struct harness_daemon *d = harness_daemon_start_metrics(args, &port);
  assert_non_null(d);
  commit_step(d, "gpt", 7);
  uint64_t failures = 0;
  for (int64_t deadline = harness_now_ms() + 10000; harness_now_ms() < deadline && !failures;) {
    char cmd[256], line[256] = "";
    snprintf(cmd, sizeof(cmd),
             "curl -sf http://127.0.0.1:%d/metrics | "
             "grep '^stoker_checkpoint_coordinator_report_failures_total '",
             port);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    if (fgets(line, sizeof(line), p)) failures = strtoull(strchr(line, ' ') + 1, NULL, 10);
    pclose(p);
    if (!failures) harness_sleep_ms(100);
  }
  assert_true(failures >= 1);
  assert_int_equal(latest_step(f->cc, "gpt", 7, 500), 0); /* Never reached the coordinator. */
  harness_daemon_free(d);
}

/* Copies file from to to. */
static void put_file(const char *to, const char *from) {
  char cmd[1024];
  snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", from, to);
  assert_int_equal(system(cmd), 0);
}

/* SIGHUP to d, then waits until its metrics count `reloads` reloads with
 * `result` ("success", "failure"): the reload is done then. */
static void hup(struct harness_daemon *d, int port, const char *result, int reloads) {
  char want[128];
  snprintf(want, sizeof(want), "stoker_reloads_total{result=\"%s\"} %d\n", result, reloads);
  assert_int_equal(kill(d->pid, SIGHUP), 0);
  bool seen = false;
  for (int64_t deadline = harness_now_ms() + 10000; !seen && harness_now_ms() < deadline;) {
    char *page = harness_http_get(port, "/metrics");
    seen = page && strstr(page, want);
    free(page);
    if (!seen) harness_sleep_ms(50);
  }
  assert_true(seen);
}

static void test_sighup_reloads_the_coordinator_ca_and_token(void **state) {
  struct fixture *f = *state;
  char ca[320], token[320];
  snprintf(ca, sizeof(ca), "%s", pki_path("live-ca.pem"));
  snprintf(token, sizeof(token), "%s", pki_path("live-token"));
  put_file(ca, pki_path("other-ca.pem")); /* Did not sign the coordinator's certificate. */
  put_file(token, pki_path("token"));
  const char *args[] = {
      "--part-size", "5MiB", f->target, "--coordinator-tls-ca", ca, "--coordinator-token-file",
      token,         NULL};
  int port = 0;
  struct harness_daemon *d = harness_daemon_start_metrics(args, &port);
  assert_non_null(d);
  commit_step(d, "gpt", 42);
  assert_int_equal(latest_step(f->cc, "gpt", 42, 500), 0); /* Retried, refused by TLS. */
  put_file(ca, pki_path("server-ca.pem"));
  hup(d, port, "success", 1);
  assert_int_equal(latest_step(f->cc, "gpt", 42, 10000), 42); /* The retry used the new CA. */

  FILE *junk = fopen(ca, "w");
  assert_non_null(junk);
  fputs("not a certificate\n", junk);
  fclose(junk);
  hup(d, port, "failure", 1);
  commit_step(d, "gpt", 43);
  assert_int_equal(latest_step(f->cc, "gpt", 43, 10000), 43); /* The client in use stayed. */

  put_file(ca, pki_path("server-ca.pem"));
  junk = fopen(token, "w");
  assert_non_null(junk);
  fputs("not-the-token\n", junk);
  fclose(junk);
  hup(d, port, "success", 2);
  commit_step(d, "gpt", 44); /* Refused by the coordinator (UNAUTHENTICATED): dropped. */
  assert_int_equal(latest_step(f->cc, "gpt", 44, 500), 43);
  put_file(token, pki_path("token"));
  hup(d, port, "success", 3);
  commit_step(d, "gpt", 45);
  assert_int_equal(latest_step(f->cc, "gpt", 45, 10000), 45);
  harness_daemon_free(d);
}

static int setup_pki(void **state) {
  (void)state;
  if (harness_tmpdir_new(pki, sizeof(pki))) return -1;
  char cmd[1024];
  snprintf(cmd, sizeof(cmd), "sh '%s' '%s' && echo report-token-123 > '%s/token'", test_argv[3],
           pki, pki);
  return system(cmd) == 0 ? 0 : -1;
}

static int teardown_pki(void **state) {
  (void)state;
  harness_tmpdir_remove(pki);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 4 || harness_init(argc, argv) != 0) {
    fprintf(stderr, "usage: %s STOKER_CHECKPOINT STOKER_COORDINATOR GEN_CERTS_SH\n", argv[0]);
    return 1;
  }
  test_argv = argv;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_report_over_tls_with_token, setup_coordinator,
                                      teardown_coordinator),
      cmocka_unit_test_setup_teardown(test_plaintext_against_tls_is_counted, setup_coordinator,
                                      teardown_coordinator),
      cmocka_unit_test_setup_teardown(test_sighup_reloads_the_coordinator_ca_and_token,
                                      setup_coordinator, teardown_coordinator),
  };
  return cmocka_run_group_tests(tests, setup_pki, teardown_pki);
}
