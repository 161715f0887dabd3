/*
 * A job's members in pages against the real daemon. 60,000 ranks join over
 * HTTP/2 (the coordinator bench's client, as in it-memory: one connection
 * carries thousands of pending calls) with 200-byte addresses, about 14 MB
 * of members: before members were paged one GetJob answer held them all
 * and a client with gRPC's default 4 MiB receive limit could not read the
 * job. Now a client held to 4 MiB reads GetJob's first page, which says how
 * many members there are and that more follow, and libstoker-client's
 * stk_job_get (stokerctl job show) follows ListMembers to every rank, each
 * exactly once, in order.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "h2_grpc.h"
#include "harness.h"
#include "ranks.h"
#include "rpc.h"

#define N                       60000
#define CONNS                   8
#define JOIN_WAIT_MS            150000
#define GRPC_DEFAULT_RECV_BYTES (4u << 20)

static atomic_long ok, failed;

static int setup(void **state) {
  struct harness_daemon *d = harness_daemon_start(NULL);
  if (!d) return -1;
  *state = d;
  return 0;
}

static int teardown(void **state) {
  harness_daemon_free(*state);
  return 0;
}

static void joined(void *arg, int status, const uint8_t *msg, size_t len) {
  (void)arg;
  Stoker__V1__JoinResponse *r =
      status == 0 && msg ? stoker__v1__join_response__unpack(NULL, len, msg) : NULL;
  if (r && r->world_size == N)
    atomic_fetch_add(&ok, 1);
  else
    atomic_fetch_add(&failed, 1);
  if (r) stoker__v1__join_response__free_unpacked(r, NULL);
}

static void test_60000_members(void **state) {
  struct harness_daemon *d = *state;
  /* A long interval: no lease ends while the test reads. */
  struct stk_client *op = ranks_operator(d, "wide", N, N, 600000, 1000);
  struct h2_grpc *conns[CONNS];
  for (int i = 0; i < CONNS; i++) assert_int_equal(h2_grpc_connect(d->addr, &conns[i]), 0);
  static char ids[N][16];
  static char address[201];
  memset(address, 'a', 200);
  Stoker__V1__JoinRequest jr = STOKER__V1__JOIN_REQUEST__INIT;
  jr.job = "wide";
  jr.host = "localhost";
  jr.address = address;
  for (int r = 0; r < N; r++) {
    snprintf(ids[r], sizeof(ids[r]), "rank-%d", r);
    jr.member_id = ids[r];
    assert_int_equal(
        h2_grpc_call(conns[r % CONNS], "/stoker.v1.Coordinator/Join", &jr.base, joined, NULL), 0);
  }
  for (int64_t until = harness_now_ms() + JOIN_WAIT_MS;
       atomic_load(&ok) + atomic_load(&failed) < N && harness_now_ms() < until;)
    harness_sleep_ms(20);
  assert_int_equal(atomic_load(&failed), 0);
  assert_int_equal(atomic_load(&ok), N);
  for (int i = 0; i < CONNS; i++) h2_grpc_close(conns[i]);

  /* A client held to gRPC's default receive limit reads the first page. */
  struct rpc_client_opts o = {.target = d->addr, .max_recv_bytes = GRPC_DEFAULT_RECV_BYTES};
  struct rpc_client *rc = NULL;
  assert_int_equal(rpc_client_new(&o, &rc), 0);
  Stoker__V1__GetJobRequest get = STOKER__V1__GET_JOB_REQUEST__INIT;
  get.job = "wide";
  ProtobufCMessage *resp = NULL;
  assert_int_equal(
      harness_call(rc, "GetJob", &get.base, &stoker__v1__job__descriptor, &resp, NULL, 0), RPC_OK);
  Stoker__V1__Job *first = (Stoker__V1__Job *)resp;
  assert_true(protobuf_c_message_get_packed_size(resp) < GRPC_DEFAULT_RECV_BYTES);
  assert_true(first->n_members > 0 && first->n_members < N);
  assert_int_equal(first->member_count, N);
  assert_int_equal(first->world_size, N);
  assert_true(first->next_members_page_token[0] != '\0');
  print_message("GetJob's first page: %zu of %d members\n", first->n_members, N);
  protobuf_c_message_free_unpacked(resp, NULL);
  rpc_client_free(rc);

  /* libstoker-client follows the pages: every rank once, in order. */
  Stoker__V1__Job *job = harness_get_job(op, "wide");
  assert_non_null(job);
  assert_int_equal(job->n_members, N);
  assert_string_equal(job->next_members_page_token, "");
  for (size_t i = 0; i < job->n_members; i++) {
    assert_int_equal(job->members[i]->rank, i);
    assert_string_equal(job->members[i]->address, address);
  }
  protobuf_c_message_free_unpacked(&job->base, NULL);
  stk_client_free(op);
}

int main(int argc, char **argv) {
  if (harness_init(argc, argv) != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_60000_members, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
