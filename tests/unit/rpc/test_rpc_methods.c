/*
 * The method table against the descriptor (rpc_methods.c): a complete
 * table registers; a table that leaves a method out, names one twice,
 * names one the .proto lacks, or pairs a handler with an unserved row is
 * refused at registration with the method named, and registers nothing.
 * Field names map to the descriptor's method names as protobuf-c generates
 * them, and paths come from the descriptor.
 */
#include "rpc_internal.h"
#include "rpctest.pb-c.h"
#include "stk_error.h"
#include "stoker/v1/coordinator.pb-c.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

/* cmocka needs the headers above. */
#include <cmocka.h>

#define SVC Stoker__Test__Test_Service

static void handle(struct rpc_call *c, const ProtobufCMessage *req, void *data) {
  (void)req;
  (void)data;
  rpc_fail(c, RPC_INTERNAL, "never called");
}

/* Adds defs to a fresh server; the error, and the detail in why. */
static int add(const struct rpc_method_def *defs, size_t n, char *why, size_t why_len,
               size_t *ret_registered) {
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  struct rpc_server_opts o = {.listen = "127.0.0.1:0"};
  struct rpc_server *s;
  assert_int_equal(rpc_server_new(&loop, &o, &s), 0);
  size_t before = s->n_methods; /* health's */
  stk_clear_detail();
  int err = rpc_server_add_service(s, &stoker__test__test__descriptor, defs, n, NULL);
  snprintf(why, why_len, "%s", stk_detail() ? stk_detail() : "");
  *ret_registered = s->n_methods - before;
  rpc_server_free(s);
  assert_int_equal(uv_loop_close(&loop), 0);
  return err;
}

static void test_complete_table(void **state) {
  (void)state;
  static const struct rpc_method_def defs[] = {
      RPC_UNARY_ROW(SVC, echo, handle),
      RPC_SERVER_STREAM_ROW(SVC, count, handle),
      RPC_CLIENT_STREAM_ROW(SVC, sum, handle),
      RPC_UNARY_ROW(SVC, later, handle),
      RPC_UNSERVED_ROW(SVC, park),
  };
  char why[300];
  size_t n;
  assert_int_equal(add(defs, RPC_N_ROWS(defs), why, sizeof(why), &n), 0);
  assert_int_equal(n, 4); /* Park unserved: left to the UNIMPLEMENTED answer */
}

static void test_missing_method(void **state) {
  (void)state;
  static const struct rpc_method_def defs[] = {
      RPC_UNARY_ROW(SVC, echo, handle),
      RPC_SERVER_STREAM_ROW(SVC, count, handle),
      RPC_CLIENT_STREAM_ROW(SVC, sum, handle),
      RPC_UNARY_ROW(SVC, later, handle),
  };
  char why[300];
  size_t n;
  assert_int_equal(add(defs, RPC_N_ROWS(defs), why, sizeof(why), &n), STK_EINVAL);
  assert_non_null(strstr(why, "stoker.test.Test/Park has no row"));
  assert_int_equal(n, 0);
}

static void test_method_twice(void **state) {
  (void)state;
  static const struct rpc_method_def defs[] = {
      RPC_UNARY_ROW(SVC, echo, handle),        RPC_SERVER_STREAM_ROW(SVC, count, handle),
      RPC_CLIENT_STREAM_ROW(SVC, sum, handle), RPC_UNARY_ROW(SVC, later, handle),
      RPC_UNARY_ROW(SVC, park, handle),        RPC_UNSERVED_ROW(SVC, echo),
  };
  char why[300];
  size_t n;
  assert_int_equal(add(defs, RPC_N_ROWS(defs), why, sizeof(why), &n), STK_EINVAL);
  assert_non_null(strstr(why, "stoker.test.Test/Echo has two rows"));
  assert_int_equal(n, 0);
}

/* Rows written by hand can name anything: the names of another version of
 * the .proto, or protobuf's own spelling instead of the field's. */
static void test_method_not_in_proto(void **state) {
  (void)state;
  const char *wrong[] = {"frobnicate", "Echo", "echo_", "ech", "", NULL};
  for (size_t w = 0; w < sizeof(wrong) / sizeof(wrong[0]); w++) {
    const struct rpc_method_def defs[] = {
        {.name = wrong[w], .kind = RPC_UNARY, .handler = handle},
        RPC_UNARY_ROW(SVC, echo, handle),
        RPC_SERVER_STREAM_ROW(SVC, count, handle),
        RPC_CLIENT_STREAM_ROW(SVC, sum, handle),
        RPC_UNARY_ROW(SVC, later, handle),
        RPC_UNARY_ROW(SVC, park, handle),
    };
    char why[300];
    size_t n;
    assert_int_equal(add(defs, RPC_N_ROWS(defs), why, sizeof(why), &n), STK_EINVAL);
    assert_non_null(strstr(why, "stoker.test.Test has no method"));
    assert_int_equal(n, 0);
  }
}

static void test_handler_and_kind_agree(void **state) {
  (void)state;
  struct rpc_method_def defs[] = {
      RPC_UNARY_ROW(SVC, echo, handle),        RPC_SERVER_STREAM_ROW(SVC, count, handle),
      RPC_CLIENT_STREAM_ROW(SVC, sum, handle), RPC_UNARY_ROW(SVC, later, handle),
      RPC_UNARY_ROW(SVC, park, handle),
  };
  char why[300];
  size_t n;
  defs[4].handler = NULL; /* served, no handler */
  assert_int_equal(add(defs, RPC_N_ROWS(defs), why, sizeof(why), &n), STK_EINVAL);
  assert_non_null(strstr(why, "stoker.test.Test/Park"));
  defs[4].kind = RPC_UNSERVED; /* unserved with a handler */
  defs[4].handler = handle;
  assert_int_equal(add(defs, RPC_N_ROWS(defs), why, sizeof(why), &n), STK_EINVAL);
  assert_non_null(strstr(why, "stoker.test.Test/Park"));
}

/* protobuf-c's field names ("kv_compare_set") against the descriptor's
 * method names ("KvCompareSet"), and the paths clients call. */
static void test_names_and_paths(void **state) {
  (void)state;
  const ProtobufCServiceDescriptor *d = &stoker__v1__coordinator__descriptor;
  const ProtobufCMethodDescriptor *md =
      rpc_method_by_field(d, RPC_METHOD_FIELD(Stoker__V1__Coordinator_Service, kv_compare_set));
  assert_non_null(md);
  assert_string_equal(md->name, "KvCompareSet");
  assert_ptr_equal(md->input, &stoker__v1__kv_compare_set_request__descriptor);
  assert_null(rpc_method_by_field(d, "kvcompare_set"));
  assert_null(rpc_method_by_field(d, "kv_compare_set_"));
  assert_null(rpc_method_by_field(d, "KvCompareSet"));
  char path[64];
  assert_int_equal(rpc_method_path(d, "report_checkpoint", path, sizeof(path)), 0);
  assert_string_equal(path, "/stoker.v1.Coordinator/ReportCheckpoint");
  assert_int_equal(rpc_method_path(d, "report_checkpoint", path, 10), STK_ERANGE);
  assert_int_equal(rpc_method_path(d, "no_such", path, sizeof(path)), STK_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_complete_table),         cmocka_unit_test(test_missing_method),
      cmocka_unit_test(test_method_twice),           cmocka_unit_test(test_method_not_in_proto),
      cmocka_unit_test(test_handler_and_kind_agree), cmocka_unit_test(test_names_and_paths),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
