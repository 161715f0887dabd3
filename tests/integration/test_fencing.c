/*
 * Fencing against the real daemon: once a job has moved to a newer
 * generation, calls that carry the old one are refused with
 * FAILED_PRECONDITION (KvSet, KvGet, Barrier), while Heartbeat answers
 * RESTART so the rank learns it must rejoin. Exact status codes are read
 * with the raw rpc client.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "harness.h"
#include "ranks.h"

struct fixture {
  struct harness_daemon *d;
  struct rpc_client *rc;
  struct rank r[2];
  uint64_t old_gen;
};

/* Two ranks form generation g; rank 1 leaves, which opens g + 1. */
static int setup(void **state) {
  struct fixture *f = calloc(1, sizeof(*f));
  f->d = harness_daemon_start(NULL);
  if (!f->d) return -1;
  *state = f;
  f->rc = harness_rpc(f->d);
  struct stk_client *op = harness_client(f->d);
  if (!f->rc || !op || harness_create_job(op, "fence", 2, 2, 100, 200)) return -1;
  stk_client_free(op);
  if (ranks_new(f->r, 2, f->d, "fence", "w")) return -1;
  ranks_join_start(f->r, 2, 30000);
  if (ranks_join_wait(f->r, 2)) return -1;
  f->old_gen = f->r[0].m.generation;
  return stk_leave(f->r[1].client);
}

static int teardown(void **state) {
  struct fixture *f = *state;
  ranks_free(f->r, 2);
  rpc_client_free(f->rc);
  harness_daemon_free(f->d);
  free(f);
  return 0;
}

static void test_kv_set_stale(void **state) {
  struct fixture *f = *state;
  Stoker__V1__KvSetRequest req = STOKER__V1__KV_SET_REQUEST__INIT;
  req.job = "fence";
  req.generation = f->old_gen;
  req.key = "nccl-id";
  req.value.data = (uint8_t *)"x";
  req.value.len = 1;
  char msg[256];
  assert_int_equal(harness_call(f->rc, "KvSet", &req.base, &stoker__v1__empty__descriptor, NULL,
                                msg, sizeof(msg)),
                   RPC_FAILED_PRECONDITION);
  /* Refused means not stored: the next generation cannot see it either. */
  Stoker__V1__KvGetRequest get = STOKER__V1__KV_GET_REQUEST__INIT;
  get.job = "fence";
  get.generation = f->old_gen + 1;
  get.key = "nccl-id";
  assert_int_equal(harness_call(f->rc, "KvGet", &get.base, &stoker__v1__kv_get_response__descriptor,
                                NULL, NULL, 0),
                   RPC_NOT_FOUND);
}

static void test_kv_get_stale(void **state) {
  struct fixture *f = *state;
  Stoker__V1__KvGetRequest req = STOKER__V1__KV_GET_REQUEST__INIT;
  req.job = "fence";
  req.generation = f->old_gen;
  req.key = "nccl-id";
  assert_int_equal(harness_call(f->rc, "KvGet", &req.base, &stoker__v1__kv_get_response__descriptor,
                                NULL, NULL, 0),
                   RPC_FAILED_PRECONDITION);
}

static void test_barrier_stale(void **state) {
  struct fixture *f = *state;
  Stoker__V1__BarrierRequest req = STOKER__V1__BARRIER_REQUEST__INIT;
  req.job = "fence";
  req.member_id = "w-0";
  req.generation = f->old_gen;
  req.name = "step-1";
  assert_int_equal(harness_call(f->rc, "Barrier", &req.base,
                                &stoker__v1__barrier_response__descriptor, NULL, NULL, 0),
                   RPC_FAILED_PRECONDITION);
}

static void test_heartbeat_stale_restarts(void **state) {
  struct fixture *f = *state;
  Stoker__V1__HeartbeatRequest req = STOKER__V1__HEARTBEAT_REQUEST__INIT;
  req.job = "fence";
  req.member_id = "w-0";
  req.generation = f->old_gen;
  ProtobufCMessage *resp = NULL;
  assert_int_equal(harness_call(f->rc, "Heartbeat", &req.base,
                                &stoker__v1__heartbeat_response__descriptor, &resp, NULL, 0),
                   RPC_OK);
  Stoker__V1__HeartbeatResponse *hb = (Stoker__V1__HeartbeatResponse *)resp;
  assert_int_equal(hb->action, STOKER__V1__HEARTBEAT_ACTION__HEARTBEAT_ACTION_RESTART);
  assert_int_equal(hb->generation, f->old_gen + 1);
  protobuf_c_message_free_unpacked(resp, NULL);
  /* The client library learns the same through its heartbeat thread. */
  assert_int_equal(ranks_wait_action(&f->r[0], STK_ACTION_RESTART, 5000), STK_ACTION_RESTART);
}

/* A generation from the future is not a stale member: it is refused. */
static void test_heartbeat_future_refused(void **state) {
  struct fixture *f = *state;
  Stoker__V1__HeartbeatRequest req = STOKER__V1__HEARTBEAT_REQUEST__INIT;
  req.job = "fence";
  req.member_id = "w-0";
  req.generation = f->old_gen + 5;
  assert_int_equal(harness_call(f->rc, "Heartbeat", &req.base,
                                &stoker__v1__heartbeat_response__descriptor, NULL, NULL, 0),
                   RPC_FAILED_PRECONDITION);
}

int main(int argc, char **argv) {
  if (harness_init(argc, argv)) return 2;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_kv_set_stale, setup, teardown),
      cmocka_unit_test_setup_teardown(test_kv_get_stale, setup, teardown),
      cmocka_unit_test_setup_teardown(test_barrier_stale, setup, teardown),
      cmocka_unit_test_setup_teardown(test_heartbeat_stale_restarts, setup, teardown),
      cmocka_unit_test_setup_teardown(test_heartbeat_future_refused, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
