/*
 * Bad input against the real daemon: oversized messages answer
 * RESOURCE_EXHAUSTED, undecodable payloads INVALID_ARGUMENT, unknown
 * methods UNIMPLEMENTED, invalid names, member ids and keys
 * INVALID_ARGUMENT, and none of it changes anything (ListJobs unchanged).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"
#include "ranks.h"

struct fixture {
  struct harness_daemon *d;
  struct rpc_client *rc;
  struct rank r; /* Joined member "w-0" of job "in" (min 1, max 1). */
};

static int setup(void **state) {
  struct fixture *f = calloc(1, sizeof(*f));
  *state = f;
  const char *args[] = {"--max-message-size", "64KiB", NULL};
  f->d = harness_daemon_start(args);
  if (!f->d || !(f->rc = harness_rpc(f->d))) return -1;
  struct stk_client *op = harness_client(f->d);
  if (!op || harness_create_job(op, "in", 1, 1, 1000, 100)) return -1;
  stk_client_free(op);
  if (ranks_new(&f->r, 1, f->d, "in", "w")) return -1;
  ranks_join_start(&f->r, 1, 30000);
  return ranks_join_wait(&f->r, 1) ? -1 : 0;
}

static int teardown(void **state) {
  struct fixture *f = *state;
  ranks_free(&f->r, 1);
  rpc_client_free(f->rc);
  harness_daemon_free(f->d);
  free(f);
  return 0;
}

/* "name,name,..." of every job, in the order ListJobs gives. */
static void job_names(struct fixture *f, char *ret, size_t len) {
  Stoker__V1__ListJobsRequest req = STOKER__V1__LIST_JOBS_REQUEST__INIT;
  ProtobufCMessage *resp = NULL;
  assert_int_equal(harness_call(f->rc, "ListJobs", &req.base,
                                &stoker__v1__list_jobs_response__descriptor, &resp, NULL, 0),
                   RPC_OK);
  Stoker__V1__ListJobsResponse *l = (Stoker__V1__ListJobsResponse *)resp;
  size_t off = 0;
  ret[0] = 0;
  for (size_t i = 0; i < l->n_jobs && off < len; i++)
    off += (size_t)snprintf(ret + off, len - off, "%s,", l->jobs[i]->spec->name);
  protobuf_c_message_free_unpacked(resp, NULL);
}

static int kv_set(struct fixture *f, const char *key, size_t value_len) {
  uint8_t *value = calloc(1, value_len + 1);
  Stoker__V1__KvSetRequest req = STOKER__V1__KV_SET_REQUEST__INIT;
  req.job = "in";
  req.generation = f->r.m.generation;
  req.key = (char *)key;
  req.value.data = value;
  req.value.len = value_len;
  int code = harness_call(f->rc, "KvSet", &req.base, &stoker__v1__empty__descriptor, NULL, NULL, 0);
  free(value);
  return code;
}

static void test_oversized_request(void **state) {
  struct fixture *f = *state;
  assert_int_equal(kv_set(f, "big", 100 * 1024), RPC_RESOURCE_EXHAUSTED);
  assert_int_equal(kv_set(f, "small", 1024), RPC_OK); /* The daemon is still fine. */
  Stoker__V1__KvGetRequest get = STOKER__V1__KV_GET_REQUEST__INIT;
  get.job = "in";
  get.generation = f->r.m.generation;
  get.key = "big";
  assert_int_equal(harness_call(f->rc, "KvGet", &get.base, &stoker__v1__kv_get_response__descriptor,
                                NULL, NULL, 0),
                   RPC_NOT_FOUND);
}

/* A JobEvent (field 1 a varint) is not a GetJobRequest (field 1 a string). */
static void test_malformed_payload(void **state) {
  struct fixture *f = *state;
  Stoker__V1__JobEvent ev = STOKER__V1__JOB_EVENT__INIT;
  ev.seq = 5;
  assert_int_equal(
      harness_call(f->rc, "GetJob", &ev.base, &stoker__v1__job__descriptor, NULL, NULL, 0),
      RPC_INVALID_ARGUMENT);
}

static void test_unknown_methods(void **state) {
  struct fixture *f = *state;
  Stoker__V1__Empty e = STOKER__V1__EMPTY__INIT;
  /* A full path: a bare name is looked up in the descriptor by the harness. */
  assert_int_equal(harness_call(f->rc, "/stoker.v1.Coordinator/NoSuchMethod", &e.base,
                                &stoker__v1__empty__descriptor, NULL, NULL, 0),
                   RPC_UNIMPLEMENTED);
  assert_int_equal(harness_call(f->rc, "/stoker.v1.Nothing/Get", &e.base,
                                &stoker__v1__empty__descriptor, NULL, NULL, 0),
                   RPC_UNIMPLEMENTED);
}

static int create(struct fixture *f, const char *name) {
  Stoker__V1__JobSpec spec = STOKER__V1__JOB_SPEC__INIT;
  Stoker__V1__CreateJobRequest req = STOKER__V1__CREATE_JOB_REQUEST__INIT;
  spec.name = (char *)name;
  spec.min_ranks = 1;
  spec.max_ranks = 1;
  req.spec = &spec;
  return harness_call(f->rc, "CreateJob", &req.base, &stoker__v1__job__descriptor, NULL, NULL, 0);
}

static void test_invalid_job_names(void **state) {
  struct fixture *f = *state;
  char before[1024], after[1024];
  job_names(f, before, sizeof(before));
  assert_string_equal(before, "in,");
  const char *bad[] = {
      "Bad Name", "../x",
      "",         "a/b",
      "-lead",    "x\n",
      "UPPER",    "a234567890123456789012345678901234567890123456789012345678901234"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    if (create(f, bad[i]) != RPC_INVALID_ARGUMENT) fail_msg("CreateJob \"%s\" accepted", bad[i]);
  }
  Stoker__V1__GetJobRequest get = STOKER__V1__GET_JOB_REQUEST__INIT;
  get.job = "../x";
  assert_int_equal(
      harness_call(f->rc, "GetJob", &get.base, &stoker__v1__job__descriptor, NULL, NULL, 0),
      RPC_INVALID_ARGUMENT);
  job_names(f, after, sizeof(after));
  assert_string_equal(after, before);
  assert_int_equal(create(f, "good.name-1_x"), RPC_OK); /* The check is not blanket. */
}

static void test_invalid_member_and_keys(void **state) {
  struct fixture *f = *state;
  char before[1024], after[1024];
  job_names(f, before, sizeof(before));
  Stoker__V1__JoinRequest join = STOKER__V1__JOIN_REQUEST__INIT;
  join.job = "in";
  join.member_id = "rank 1";
  assert_int_equal(harness_call(f->rc, "Join", &join.base, &stoker__v1__join_response__descriptor,
                                NULL, NULL, 0),
                   RPC_INVALID_ARGUMENT);
  assert_int_equal(kv_set(f, "nccl\x01id", 4), RPC_INVALID_ARGUMENT);
  assert_int_equal(kv_set(f, "line\nbreak", 4), RPC_INVALID_ARGUMENT);
  assert_int_equal(kv_set(f, "", 4), RPC_INVALID_ARGUMENT);
  Stoker__V1__BarrierRequest bar = STOKER__V1__BARRIER_REQUEST__INIT;
  bar.job = "in";
  bar.member_id = "w-0";
  bar.generation = f->r.m.generation;
  bar.name = "bad name";
  assert_int_equal(harness_call(f->rc, "Barrier", &bar.base,
                                &stoker__v1__barrier_response__descriptor, NULL, NULL, 0),
                   RPC_INVALID_ARGUMENT);
  job_names(f, after, sizeof(after));
  assert_string_equal(after, before);
  /* The bad Join did not touch the running generation. */
  Stoker__V1__GetJobRequest get = STOKER__V1__GET_JOB_REQUEST__INIT;
  get.job = "in";
  ProtobufCMessage *resp = NULL;
  assert_int_equal(
      harness_call(f->rc, "GetJob", &get.base, &stoker__v1__job__descriptor, &resp, NULL, 0),
      RPC_OK);
  Stoker__V1__Job *job = (Stoker__V1__Job *)resp;
  assert_int_equal(job->state, STOKER__V1__JOB_STATE__JOB_STATE_RUNNING);
  assert_int_equal(job->generation, f->r.m.generation);
  assert_int_equal(job->waiting, 0);
  protobuf_c_message_free_unpacked(resp, NULL);
}

int main(int argc, char **argv) {
  if (harness_init(argc, argv)) return 2;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_oversized_request, setup, teardown),
      cmocka_unit_test_setup_teardown(test_malformed_payload, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unknown_methods, setup, teardown),
      cmocka_unit_test_setup_teardown(test_invalid_job_names, setup, teardown),
      cmocka_unit_test_setup_teardown(test_invalid_member_and_keys, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
