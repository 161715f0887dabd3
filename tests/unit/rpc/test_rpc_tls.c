/*
 * TLS and mutual TLS with certificates made at test time by gen_certs.sh
 * (argv[1]) in a temporary directory: a TLS server refuses plaintext and
 * serves a client that trusts its CA; with a client CA it refuses clients
 * without a certificate or with one from another CA. rpc_server_reload_tls
 * swaps the certificate for new handshakes, keeps open connections, and
 * keeps the old certificate when the new files do not check out. Files
 * that do not check out (rpc_tls_check) are refused at start, server or
 * client, with the file's name and the reason.
 */
#include "rpc_fixture.h"

#include "stk_error.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* cmocka needs the headers above. */
#include <cmocka.h>

static const char *gen_script;
static char dir[] = "/tmp/stk-rpc-tls-XXXXXX";
static char paths[11][160];

enum {
  SERVER_CA,
  SERVER_CERT,
  SERVER_KEY,
  CLIENT_CA,
  CLIENT_CERT,
  CLIENT_KEY,
  STRANGER_CERT,
  STRANGER_KEY,
  OTHER_CA,
  SERVER2_CERT,
  SERVER2_KEY,
  N_PATHS
};

static const char *const names[N_PATHS] = {
    "server-ca.pem", "server.pem",   "server.key",   "client-ca.pem", "client.pem", "client.key",
    "stranger.pem",  "stranger.key", "other-ca.pem", "server2.pem",   "server2.key"};

/* Returns the Echo result of a client with the given TLS files. */
static int echo_with(struct fixture *f, const char *ca, const char *cert, const char *key,
                     struct rpc_status *st) {
  struct rpc_client_opts o = {
      .target = f->addr, .tls_ca_file = ca, .tls_cert_file = cert, .tls_key_file = key};
  struct rpc_client *c = NULL;
  assert_int_equal(rpc_client_new(&o, &c), 0);
  int64_t v = -1;
  int err = fx_echo(c, 9, &v, st);
  if (!err) assert_int_equal(v, 9);
  rpc_client_free(c);
  return err;
}

static void test_tls_server(void **state) {
  struct fixture f = {0};
  struct rpc_server_opts o = {.tls_cert_file = paths[SERVER_CERT],
                              .tls_key_file = paths[SERVER_KEY]};
  fx_start(&f, &o);
  struct rpc_status st;
  assert_int_equal(echo_with(&f, NULL, NULL, NULL, &st), STK_EUNAVAIL); /* Plaintext. */
  assert_int_equal(st.code, RPC_UNAVAILABLE);
  assert_int_equal(echo_with(&f, paths[SERVER_CA], NULL, NULL, &st), 0);
  /* A CA that did not sign the server's certificate is refused. */
  assert_int_not_equal(echo_with(&f, paths[CLIENT_CA], NULL, NULL, &st), 0);
  fx_stop(&f, 1000);
}

static void test_mutual_tls(void **state) {
  struct fixture f = {0};
  struct rpc_server_opts o = {.tls_cert_file = paths[SERVER_CERT],
                              .tls_key_file = paths[SERVER_KEY],
                              .tls_client_ca_file = paths[CLIENT_CA]};
  fx_start(&f, &o);
  struct rpc_status st;
  assert_int_not_equal(echo_with(&f, paths[SERVER_CA], NULL, NULL, &st), 0);
  assert_int_not_equal(
      echo_with(&f, paths[SERVER_CA], paths[STRANGER_CERT], paths[STRANGER_KEY], &st), 0);
  assert_int_equal(echo_with(&f, paths[SERVER_CA], paths[CLIENT_CERT], paths[CLIENT_KEY], &st), 0);
  assert_int_equal(st.code, RPC_OK);
  fx_stop(&f, 1000);
}

static void test_tls_name_override(void **state) {
  struct fixture f = {0};
  struct rpc_server_opts o = {.tls_cert_file = paths[SERVER_CERT],
                              .tls_key_file = paths[SERVER_KEY]};
  fx_start(&f, &o);
  const char *names_to_try[] = {"localhost", "not-in-the-cert.example"};
  for (int i = 0; i < 2; i++) {
    struct rpc_client_opts co = {
        .target = f.addr, .tls_ca_file = paths[SERVER_CA], .tls_server_name = names_to_try[i]};
    struct rpc_client *c = NULL;
    assert_int_equal(rpc_client_new(&co, &c), 0);
    int err = fx_echo(c, 1, NULL, NULL);
    if (i == 0)
      assert_int_equal(err, 0);
    else
      assert_int_not_equal(err, 0);
    rpc_client_free(c);
  }
  fx_stop(&f, 1000);
}

static void test_bad_tls_files(void **state) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  struct rpc_server *s = NULL;
  struct rpc_server_opts o = {.listen = "127.0.0.1:0", .tls_cert_file = paths[SERVER_CERT]};
  assert_int_equal(rpc_server_new(&loop, &o, &s), STK_EINVAL); /* No key. */
  o.tls_key_file = "/nonexistent.key";
  assert_int_equal(rpc_server_new(&loop, &o, &s), STK_EINVAL);
  assert_non_null(strstr(stk_detail(), "/nonexistent.key"));
  assert_null(s);
  o.tls_key_file = paths[SERVER2_KEY]; /* Another certificate's key. */
  assert_int_equal(rpc_server_new(&loop, &o, &s), STK_EINVAL);
  assert_non_null(strstr(stk_detail(), "does not match"));
  assert_null(s);
  assert_int_equal(uv_loop_close(&loop), 0);
  struct rpc_client_opts co = {.target = "127.0.0.1:1", .tls_ca_file = "/nonexistent.pem"};
  struct rpc_client *c = NULL;
  assert_int_equal(rpc_client_new(&co, &c), STK_EINVAL);
  assert_null(c);
  co.tls_ca_file = paths[SERVER_KEY]; /* A key where the CA belongs. */
  assert_int_equal(rpc_client_new(&co, &c), STK_EINVAL);
  assert_non_null(strstr(stk_detail(), "holds no PEM certificate"));
  co.tls_ca_file = paths[SERVER_CA];
  co.tls_cert_file = paths[CLIENT_CERT];
  co.tls_key_file = paths[STRANGER_KEY];
  assert_int_equal(rpc_client_new(&co, &c), STK_EINVAL);
  assert_non_null(strstr(stk_detail(), "does not match"));
  assert_null(c);
}

/* Copies file from to to (the server's live files, replaced by tests). */
static void put_file(const char *to, const char *from) {
  char cmd[512];
  snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", from, to);
  assert_int_equal(system(cmd), 0);
}

struct reload_result {
  int err;
  char detail[512];
};

static void reload_on_loop(struct fixture *f, void *arg) {
  struct reload_result *r = arg;
  stk_clear_detail();
  r->err = rpc_server_reload_tls(f->srv);
  snprintf(r->detail, sizeof(r->detail), "%s", stk_detail());
}

static int reload(struct fixture *f, char *ret_detail, size_t detail_len) {
  struct reload_result r = {0};
  fx_on_loop(f, reload_on_loop, &r);
  if (ret_detail) snprintf(ret_detail, detail_len, "%s", r.detail);
  return r.err;
}

static void test_tls_reload(void **state) {
  char cert[200], key[200], why[512];
  snprintf(cert, sizeof(cert), "%s/live.pem", dir);
  snprintf(key, sizeof(key), "%s/live.key", dir);
  put_file(cert, paths[SERVER_CERT]);
  put_file(key, paths[SERVER_KEY]);
  struct fixture f = {0};
  struct rpc_server_opts o = {.tls_cert_file = cert, .tls_key_file = key};
  fx_start(&f, &o);
  struct rpc_status st;
  assert_int_equal(echo_with(&f, paths[SERVER_CA], NULL, NULL, &st), 0);
  assert_int_not_equal(echo_with(&f, paths[OTHER_CA], NULL, NULL, &st), 0);
  /* A connection opened before the rotation. */
  struct rpc_client_opts co = {.target = f.addr, .tls_ca_file = paths[SERVER_CA]};
  struct rpc_client *open_before = NULL;
  assert_int_equal(rpc_client_new(&co, &open_before), 0);
  assert_int_equal(fx_echo(open_before, 1, NULL, NULL), 0);

  put_file(cert, paths[SERVER2_CERT]);
  put_file(key, paths[SERVER2_KEY]);
  assert_int_equal(echo_with(&f, paths[SERVER_CA], NULL, NULL, &st), 0); /* Not yet. */
  assert_int_equal(reload(&f, NULL, 0), 0);
  assert_int_equal(reload(&f, NULL, 0), 0); /* Replaces a config gRPC has not taken yet. */
  assert_int_equal(echo_with(&f, paths[OTHER_CA], NULL, NULL, &st), 0);
  assert_int_not_equal(echo_with(&f, paths[SERVER_CA], NULL, NULL, &st), 0);
  assert_int_equal(fx_echo(open_before, 2, NULL, NULL), 0); /* Still open, still served. */
  rpc_client_free(open_before);

  /* Files that do not check out: refused with the file and the reason;
   * server2's certificate stays in use. */
  put_file(key, paths[SERVER_KEY]);
  assert_int_equal(reload(&f, why, sizeof(why)), STK_EINVAL);
  assert_non_null(strstr(why, "does not match"));
  assert_non_null(strstr(why, key));
  FILE *junk = fopen(cert, "w");
  assert_non_null(junk);
  fputs("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n", junk);
  fclose(junk);
  assert_int_equal(reload(&f, why, sizeof(why)), STK_EINVAL);
  assert_non_null(strstr(why, cert));
  unlink(cert);
  assert_int_equal(reload(&f, why, sizeof(why)), STK_EINVAL);
  assert_non_null(strstr(why, cert));
  assert_int_equal(echo_with(&f, paths[OTHER_CA], NULL, NULL, &st), 0);
  assert_int_not_equal(echo_with(&f, paths[SERVER_CA], NULL, NULL, &st), 0);

  /* A reload parked when the server stops is freed with it (ASan). */
  put_file(cert, paths[SERVER_CERT]);
  assert_int_equal(reload(&f, NULL, 0), 0);
  fx_stop(&f, 1000);
}

/* Mutual TLS: a reload also swaps the CA that client certificates must
 * chain to. */
static void test_client_ca_reload(void **state) {
  char ca[200];
  snprintf(ca, sizeof(ca), "%s/live-client-ca.pem", dir);
  put_file(ca, paths[CLIENT_CA]);
  struct fixture f = {0};
  struct rpc_server_opts o = {.tls_cert_file = paths[SERVER_CERT],
                              .tls_key_file = paths[SERVER_KEY],
                              .tls_client_ca_file = ca};
  fx_start(&f, &o);
  struct rpc_status st;
  assert_int_equal(echo_with(&f, paths[SERVER_CA], paths[CLIENT_CERT], paths[CLIENT_KEY], &st), 0);
  assert_int_not_equal(
      echo_with(&f, paths[SERVER_CA], paths[STRANGER_CERT], paths[STRANGER_KEY], &st), 0);
  put_file(ca, paths[OTHER_CA]); /* The stranger's CA. */
  assert_int_equal(reload(&f, NULL, 0), 0);
  assert_int_equal(echo_with(&f, paths[SERVER_CA], paths[STRANGER_CERT], paths[STRANGER_KEY], &st),
                   0);
  assert_int_not_equal(echo_with(&f, paths[SERVER_CA], paths[CLIENT_CERT], paths[CLIENT_KEY], &st),
                       0);
  char why[512];
  put_file(ca, paths[SERVER_KEY]); /* Not a certificate. */
  assert_int_equal(reload(&f, why, sizeof(why)), STK_EINVAL);
  assert_non_null(strstr(why, ca));
  assert_int_equal(echo_with(&f, paths[SERVER_CA], paths[STRANGER_CERT], paths[STRANGER_KEY], &st),
                   0);
  fx_stop(&f, 1000);
}

static void test_reload_without_tls(void **state) {
  struct fixture f = {0};
  fx_start(&f, NULL);
  assert_int_equal(reload(&f, NULL, 0), 0);
  fx_stop(&f, 1000);
}

static int setup(void **state) {
  if (!mkdtemp(dir)) return -1;
  char cmd[512];
  snprintf(cmd, sizeof(cmd), "sh '%s' '%s'", gen_script, dir);
  if (system(cmd) != 0) return -1;
  for (int i = 0; i < N_PATHS; i++) snprintf(paths[i], sizeof(paths[i]), "%s/%s", dir, names[i]);
  return 0;
}

static int teardown(void **state) {
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  return system(cmd);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s gen_certs.sh\n", argv[0]);
    return 2;
  }
  gen_script = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tls_server),         cmocka_unit_test(test_mutual_tls),
      cmocka_unit_test(test_tls_name_override),  cmocka_unit_test(test_bad_tls_files),
      cmocka_unit_test(test_tls_reload),         cmocka_unit_test(test_client_ca_reload),
      cmocka_unit_test(test_reload_without_tls),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
