/*
 * Bearer-token authentication: the token file is read at start (trailing
 * newline trimmed, empty refused), every call but health must carry
 * "authorization: Bearer <token>", and anything else is UNAUTHENTICATED
 * before the handler runs.
 */
#include "rpc_fixture.h"

#include "grpc/health/v1/health.pb-c.h"
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

static char tmp_dir[] = "/tmp/stk-rpc-auth-XXXXXX";

static void write_file(const char *path, const char *text) {
  FILE *fp = fopen(path, "w");
  assert_non_null(fp);
  fputs(text, fp);
  fclose(fp);
}

static void test_token(void **state) {
  char path[128];
  snprintf(path, sizeof(path), "%s/token", tmp_dir);
  write_file(path, "s3cret-token\n");
  struct fixture f = {0};
  struct rpc_server_opts o = {.token_file = path};
  fx_start(&f, &o);

  struct rpc_client *good = fx_client(&f, "s3cret-token");
  int64_t v = 0;
  assert_int_equal(fx_echo(good, 5, &v, NULL), 0);
  assert_int_equal(v, 5);

  const char *bad_tokens[] = {NULL, "wrong-token!", "s3cret-toke", "s3cret-token2", ""};
  for (size_t i = 0; i < sizeof(bad_tokens) / sizeof(bad_tokens[0]); i++) {
    struct rpc_client *bad = fx_client(&f, bad_tokens[i]);
    struct rpc_status st;
    assert_int_equal(fx_echo(bad, 5, NULL, &st), STK_EUNAUTH);
    assert_int_equal(st.code, RPC_UNAUTHENTICATED);
    assert_string_equal(st.message, "missing or invalid bearer token");
    rpc_client_free(bad);
  }
  /* The Park handler never ran for unauthenticated calls. */
  struct rpc_client *anon = fx_client(&f, NULL);
  Stoker__Test__Num req = STOKER__TEST__NUM__INIT;
  assert_int_equal(rpc_client_unary(anon, TEST_PATH("Park"), &req.base,
                                    &stoker__test__num__descriptor, 2000, NULL, NULL),
                   STK_EUNAUTH);
  assert_int_equal(f.svc.parked, 0);

  /* Health probes need no token. */
  Grpc__Health__V1__HealthCheckRequest hreq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  ProtobufCMessage *resp = NULL;
  assert_int_equal(rpc_client_unary(anon, "/grpc.health.v1.Health/Check", &hreq.base,
                                    &grpc__health__v1__health_check_response__descriptor, 2000,
                                    &resp, NULL),
                   0);
  assert_int_equal(((Grpc__Health__V1__HealthCheckResponse *)resp)->status,
                   GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
  protobuf_c_message_free_unpacked(resp, NULL);
  rpc_client_free(anon);
  rpc_client_free(good);
  fx_stop(&f, 1000);
}

static void test_bad_token_files(void **state) {
  char path[128];
  snprintf(path, sizeof(path), "%s/empty", tmp_dir);
  write_file(path, "\n");
  uv_loop_t loop;
  uv_loop_init(&loop);
  struct rpc_server *s = NULL;
  struct rpc_server_opts o = {.listen = "127.0.0.1:0", .token_file = path};
  assert_int_equal(rpc_server_new(&loop, &o, &s), STK_EINVAL);
  assert_non_null(strstr(stk_detail(), "empty"));
  o.token_file = "/nonexistent/token";
  assert_int_equal(rpc_server_new(&loop, &o, &s), STK_EINVAL);
  assert_non_null(strstr(stk_detail(), "/nonexistent/token"));
  assert_null(s);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static int setup(void **state) {
  return mkdtemp(tmp_dir) ? 0 : -1;
}

static int teardown(void **state) {
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf %s", tmp_dir);
  return system(cmd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_token),
      cmocka_unit_test(test_bad_token_files),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
