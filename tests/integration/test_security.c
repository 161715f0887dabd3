/*
 * TLS, mutual TLS and bearer-token auth of the real daemon. A throwaway
 * PKI is made at test time by tests/unit/rpc/gen_certs.sh (its path is the
 * test's second argument): a server cert for 127.0.0.1 signed by
 * server-ca, a client cert signed by client-ca, and a stranger signed by
 * an unrelated CA.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"

struct fixture {
  char pki[256];
  struct harness_daemon *d;
};

/* Fills path with pki/name. */
static const char *pki_file(struct fixture *f, const char *name, char *path, size_t len) {
  snprintf(path, len, "%s/%s", f->pki, name);
  return path;
}

static int setup_pki(void **state) {
  struct fixture *f = calloc(1, sizeof(*f));
  *state = f;
  const char *script = harness_arg(1);
  if (!script || harness_tmpdir_new(f->pki, sizeof(f->pki))) return -1;
  char cmd[1024];
  snprintf(cmd, sizeof(cmd), "sh '%s' '%s'", script, f->pki);
  return system(cmd) == 0 ? 0 : -1;
}

static int teardown_pki(void **state) {
  struct fixture *f = *state;
  harness_tmpdir_remove(f->pki);
  free(f);
  return 0;
}

static int teardown(void **state) {
  struct fixture *f = *state;
  harness_daemon_free(f->d);
  f->d = NULL;
  return 0;
}

/* ListJobs through a client with opts (address filled in); returns the
 * error and the gRPC code of a failure in *ret_code. */
static int list_jobs(struct fixture *f, struct stk_client_opts o, int *ret_code) {
  o.address = f->d->addr;
  o.default_timeout_ms = 3000;
  struct stk_client *c = NULL;
  int rc = stk_client_new(&o, &c);
  if (rc) return rc;
  Stoker__V1__ListJobsResponse *resp = NULL;
  rc = stk_job_list(c, NULL, NULL, 0, 3000, &resp);
  if (resp) protobuf_c_message_free_unpacked(&resp->base, NULL);
  stk_client_last_error(ret_code);
  stk_client_free(c);
  return rc;
}

static void start_tls(struct fixture *f, bool mutual) {
  char cert[300], key[300], ca[300];
  const char *args[] = {"--tls-cert",
                        pki_file(f, "server.pem", cert, sizeof(cert)),
                        "--tls-key",
                        pki_file(f, "server.key", key, sizeof(key)),
                        mutual ? "--tls-client-ca" : NULL,
                        pki_file(f, "client-ca.pem", ca, sizeof(ca)),
                        NULL};
  f->d = harness_daemon_start(args);
  assert_non_null(f->d);
}

static void test_tls(void **state) {
  struct fixture *f = *state;
  start_tls(f, false);
  char ca[300];
  int code = 0;
  struct stk_client_opts tls = {.tls_ca_file = pki_file(f, "server-ca.pem", ca, sizeof(ca))};
  assert_int_equal(list_jobs(f, tls, &code), 0);
  struct stk_client_opts plain = {0};
  assert_int_not_equal(list_jobs(f, plain, &code), 0);
  assert_int_equal(code, RPC_UNAVAILABLE);
  /* A client trusting another CA does not accept the server. */
  struct stk_client_opts wrong_ca = {.tls_ca_file = pki_file(f, "other-ca.pem", ca, sizeof(ca))};
  assert_int_not_equal(list_jobs(f, wrong_ca, &code), 0);
}

static void test_mutual_tls(void **state) {
  struct fixture *f = *state;
  start_tls(f, true);
  char ca[300], cert[300], key[300];
  int code = 0;
  struct stk_client_opts o = {.tls_ca_file = pki_file(f, "server-ca.pem", ca, sizeof(ca))};
  assert_int_not_equal(list_jobs(f, o, &code), 0); /* No client certificate. */
  o.tls_cert_file = pki_file(f, "stranger.pem", cert, sizeof(cert));
  o.tls_key_file = pki_file(f, "stranger.key", key, sizeof(key));
  assert_int_not_equal(list_jobs(f, o, &code), 0); /* Signed by the wrong CA. */
  o.tls_cert_file = pki_file(f, "client.pem", cert, sizeof(cert));
  o.tls_key_file = pki_file(f, "client.key", key, sizeof(key));
  assert_int_equal(list_jobs(f, o, &code), 0);
}

static void test_token(void **state) {
  struct fixture *f = *state;
  char tok[300];
  FILE *fp = fopen(pki_file(f, "token", tok, sizeof(tok)), "w");
  assert_non_null(fp);
  fputs("s3cret-token\n", fp);
  fclose(fp);
  const char *args[] = {"--token-file", tok, NULL};
  f->d = harness_daemon_start(args);
  assert_non_null(f->d);
  int code = 0;
  struct stk_client_opts right = {.token = "s3cret-token"};
  assert_int_equal(list_jobs(f, right, &code), 0);
  struct stk_client_opts from_file = {.token_file = tok};
  assert_int_equal(list_jobs(f, from_file, &code), 0);
  /* The client reads its file by the daemons' rule: a leading space is not
   * trimmed away but refused, and the error names the file. */
  char spaced[300];
  fp = fopen(pki_file(f, "spaced-token", spaced, sizeof(spaced)), "w");
  assert_non_null(fp);
  fputs(" s3cret-token\n", fp);
  fclose(fp);
  struct stk_client_opts bad_file = {.address = f->d->addr, .token_file = spaced};
  struct stk_client *bad = NULL;
  assert_int_equal(stk_client_new(&bad_file, &bad), STK_EINVAL);
  assert_null(bad);
  assert_non_null(strstr(stk_client_last_error(NULL), spaced));
  struct stk_client_opts wrong = {.token = "s3cret-tokem"};
  assert_int_equal(list_jobs(f, wrong, &code), STK_EUNAUTH);
  assert_int_equal(code, RPC_UNAUTHENTICATED);
  struct stk_client_opts none = {0};
  assert_int_equal(list_jobs(f, none, &code), STK_EUNAUTH);
  assert_int_equal(code, RPC_UNAUTHENTICATED);
  /* Health checks need no token (load balancers, probes). */
  struct stk_client *c = harness_client(f->d);
  int status = 0;
  assert_int_equal(stk_health_check(c, "", 3000, &status), 0);
  assert_int_equal(status, STK_SERVING);
  stk_client_free(c);
}

int main(int argc, char **argv) {
  if (harness_init(argc, argv)) return 2;
  if (!harness_arg(1)) {
    fprintf(stderr, "usage: %s COORDINATOR GEN_CERTS_SH\n", argv[0]);
    return 2;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_tls, NULL, teardown),
      cmocka_unit_test_setup_teardown(test_mutual_tls, NULL, teardown),
      cmocka_unit_test_setup_teardown(test_token, NULL, teardown),
  };
  return cmocka_run_group_tests(tests, setup_pki, teardown_pki);
}
