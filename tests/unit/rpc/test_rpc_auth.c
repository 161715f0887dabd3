/*
 * Bearer-token authentication: the token file is read at start (by the one
 * reader, rpc_read_token_file: trailing whitespace trimmed, one printable
 * word or refused), every call but health must carry
 * "authorization: Bearer <token>", and anything else is UNAUTHENTICATED
 * before the handler runs. A server's table may grant names (queues=,
 * priorities=) after a scope; a bad grant fails the load naming its line.
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

/* The one token-file rule: trailing whitespace dropped, nothing else; one
 * word of printable ASCII; bounded size; errors name the file. */
static void test_token_file_rule(void **state) {
  static const struct {
    const char *text, *want;
  } good[] = {{"abc\n", "abc"},
              {"abc\r\n", "abc"},
              {"abc  \t\n\n", "abc"},
              {"a.b-c_d~e+f/g==", "a.b-c_d~e+f/g=="}};
  char path[256];
  snprintf(path, sizeof(path), "%s/rule", tmp_dir);
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
    write_file(path, good[i].text);
    char *token = NULL;
    assert_int_equal(rpc_read_token_file(path, &token), 0);
    assert_string_equal(token, good[i].want);
    free(token);
  }
  static const struct {
    const char *text, *why;
  } bad[] = {{"", "empty"},
             {" \n\n", "empty"},
             {" abc\n", "printable"},
             {"ab c\n", "printable"},
             {"abc\nsecond\n", "printable"},
             {"ab\x01c", "printable"},
             {"caf\xc3\xa9", "printable"}};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    write_file(path, bad[i].text);
    char *token = (char *)"untouched";
    assert_int_equal(rpc_read_token_file(path, &token), STK_EINVAL);
    assert_string_equal(token, "untouched");
    assert_non_null(strstr(stk_detail(), path));
    assert_non_null(strstr(stk_detail(), bad[i].why));
  }
  char big[RPC_TOKEN_FILE_MAX_BYTES + 2];
  memset(big, 'a', sizeof(big) - 1);
  big[sizeof(big) - 1] = '\0';
  write_file(path, big);
  char *token = NULL;
  assert_int_equal(rpc_read_token_file(path, &token), STK_EINVAL);
  assert_non_null(strstr(stk_detail(), "larger than 4096 bytes"));
  big[RPC_TOKEN_FILE_MAX_BYTES] = '\0'; /* Exactly the bound: fine. */
  write_file(path, big);
  assert_int_equal(rpc_read_token_file(path, &token), 0);
  assert_int_equal(strlen(token), RPC_TOKEN_FILE_MAX_BYTES);
  free(token);
  assert_int_equal(rpc_read_token_file("/nonexistent/token", &token), STK_EINVAL);
  assert_non_null(strstr(stk_detail(), "token file /nonexistent/token: No such file"));
}

/* A table line may grant, after its scope, KEY=LIST words (rpc.h); the
 * server loads them or, on any bad word, nothing, naming the line. */
static void test_token_grants(void **state) {
  char path[128];
  snprintf(path, sizeof(path), "%s/grants", tmp_dir);
  uv_loop_t loop;
  uv_loop_init(&loop);
  struct rpc_server *s = NULL;
  struct rpc_server_opts o = {.listen = "127.0.0.1:0", .token_file = path};
  write_file(path, "op-token\n"
                   "a team-a-*  queues=team-a,shared  priorities=low,normal  # team A\n"
                   "b team-b-* priorities=*\n"
                   "c queues=\n"
                   "d * queues=x\n");
  assert_int_equal(rpc_server_new(&loop, &o, &s), 0);
  rpc_server_free(s);
  s = NULL;
  static const struct {
    const char *line, *why;
  } bad[] = {{"a team-a-* queues=Team-A", "queues='Team-A'"},
             {"a team-a-* queues=a,", "queues='a,'"},
             {"a team-a-* queues=a,,b", "queues='a,,b'"},
             {"a team-a-* queues=a queues=b", "queues= twice"},
             {"a team-a-* colour=red", "unknown key"},
             {"a queues=a team-a-*", "neither the token's scope"},
             {"a team-a-* team-b-*", "neither the token's scope"}};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    char text[256];
    snprintf(text, sizeof(text), "op-token\n%s\n", bad[i].line);
    write_file(path, text);
    assert_int_equal(rpc_server_new(&loop, &o, &s), STK_EINVAL);
    assert_null(s);
    assert_non_null(strstr(stk_detail(), "line 2"));
    if (!strstr(stk_detail(), bad[i].why)) fail_msg("%s: %s", bad[i].line, stk_detail());
  }
  assert_int_equal(uv_loop_close(&loop), 0);

  assert_true(rpc_grant_holds("team-a,shared", "team-a"));
  assert_true(rpc_grant_holds("team-a,shared", "shared"));
  assert_false(rpc_grant_holds("team-a,shared", "team"));
  assert_false(rpc_grant_holds("team-a,shared", "shared2"));
  assert_false(rpc_grant_holds("team-a,shared", "a,shared"));
  assert_true(rpc_grant_holds("*", "anything"));
  assert_false(rpc_grant_holds("*", ""));
  assert_false(rpc_grant_holds("", "x"));
  assert_false(rpc_grant_holds(NULL, "x"));
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
      cmocka_unit_test(test_token_file_rule),
      cmocka_unit_test(test_token_grants),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
