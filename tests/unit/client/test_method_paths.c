/*
 * The method paths libstoker-client calls (COORD_METHOD, DL_METHOD,
 * CKPT_METHOD, and RPC_METHOD_PATH of rpc.h for health): for every method
 * of each service, named by its field and request type as a call site names
 * it, the path is "/" + the service's full name + "/" + the method's name,
 * from the descriptor the service's client macro is tied to, in the
 * descriptor's order, every method listed. A call site's path is written
 * once and kept (the same buffer every time), also when many threads reach
 * it first at once. The response descriptor a call unpacks with
 * (RPC_METHOD_REPLY) is the method's own. That a method the service lacks,
 * or a request or response of another type, does not compile is the
 * compiler's part (rpc.h).
 */
#include "ckpt_internal.h"
#include "client_internal.h"
#include "loader_internal.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* cmocka needs the headers above. */
#include <cmocka.h>

/* Every method of each service, in the .proto's order: its field and the
 * type of its request (of the stream's messages for Write). */
#define COORDINATOR_METHODS(X)                                                                     \
  X(create_job, Stoker__V1__CreateJobRequest)                                                      \
  X(get_job, Stoker__V1__GetJobRequest)                                                            \
  X(list_jobs, Stoker__V1__ListJobsRequest)                                                        \
  X(watch_job, Stoker__V1__WatchJobRequest)                                                        \
  X(pause_job, Stoker__V1__JobActionRequest)                                                       \
  X(resume_job, Stoker__V1__JobActionRequest)                                                      \
  X(stop_job, Stoker__V1__JobActionRequest)                                                        \
  X(delete_job, Stoker__V1__JobActionRequest)                                                      \
  X(scale_job, Stoker__V1__ScaleJobRequest)                                                        \
  X(join, Stoker__V1__JoinRequest)                                                                 \
  X(heartbeat, Stoker__V1__HeartbeatRequest)                                                       \
  X(leave, Stoker__V1__LeaveRequest)                                                               \
  X(barrier, Stoker__V1__BarrierRequest)                                                           \
  X(kv_set, Stoker__V1__KvSetRequest)                                                              \
  X(kv_get, Stoker__V1__KvGetRequest)                                                              \
  X(kv_add, Stoker__V1__KvAddRequest)                                                              \
  X(kv_compare_set, Stoker__V1__KvCompareSetRequest)                                               \
  X(kv_delete, Stoker__V1__KvDeleteRequest)                                                        \
  X(kv_count, Stoker__V1__KvCountRequest)                                                          \
  X(report_checkpoint, Stoker__V1__ReportCheckpointRequest)                                        \
  X(preempt_job, Stoker__V1__PreemptJobRequest)                                                    \
  X(report_queue, Stoker__V1__ReportQueueRequest)                                                  \
  X(list_members, Stoker__V1__ListMembersRequest)

#define DATALOADER_METHODS(X)                                                                      \
  X(create_loader, Stoker__V1__CreateLoaderRequest)                                                \
  X(get_loader, Stoker__V1__GetLoaderRequest)                                                      \
  X(get_batch, Stoker__V1__GetBatchRequest)                                                        \
  X(stream_batches, Stoker__V1__StreamBatchesRequest)                                              \
  X(update_mixture, Stoker__V1__UpdateMixtureRequest)                                              \
  X(commit, Stoker__V1__CommitRequest)                                                             \
  X(export_state, Stoker__V1__ExportStateRequest)                                                  \
  X(import_state, Stoker__V1__LoaderState)                                                         \
  X(explain, Stoker__V1__ExplainRequest)                                                           \
  X(list_loaders, Stoker__V1__ListLoadersRequest)                                                  \
  X(delete_loader, Stoker__V1__DeleteLoaderRequest)

#define CHECKPOINT_METHODS(X)                                                                      \
  X(begin, Stoker__V1__BeginRequest)                                                               \
  X(write, Stoker__V1__WriteChunk)                                                                 \
  X(commit, Stoker__V1__CommitCheckpointRequest)                                                   \
  X(abort, Stoker__V1__AbortCheckpointRequest)                                                     \
  X(list, Stoker__V1__ListCheckpointsRequest)                                                      \
  X(get_manifest, Stoker__V1__GetManifestRequest)                                                  \
  X(read, Stoker__V1__ReadRequest)                                                                 \
  X(delete, Stoker__V1__DeleteCheckpointRequest)                                                   \
  X(verify, Stoker__V1__VerifyCheckpointRequest)                                                   \
  X(get_staging_info, Stoker__V1__StagingInfoRequest)

#define HEALTH_METHODS(X)                                                                          \
  X(check, Grpc__Health__V1__HealthCheckRequest)                                                   \
  X(watch, Grpc__Health__V1__HealthCheckRequest)

/* A call site's path for each listed method, as the client's macros give it. */
#define COORD_PATH(field, type)  COORD_METHOD(field, (type *)NULL),
#define DL_PATH(field, type)     DL_METHOD(field, (type *)NULL),
#define CKPT_PATH(field, type)   CKPT_METHOD(field, (type *)NULL),
#define HEALTH_PATH(field, type) RPC_METHOD_PATH(grpc__health__v1__health, field, (type *)NULL),

/* paths are desc's methods, all of them, in order: "/<service>/<Method>". */
static void expect_paths(const ProtobufCServiceDescriptor *desc, const char *const *paths,
                         size_t n) {
  assert_int_equal(n, desc->n_methods);
  for (size_t i = 0; i < n; i++) {
    char want[RPC_METHOD_PATH_MAX];
    snprintf(want, sizeof(want), "/%s/%s", desc->name, desc->methods[i].name);
    assert_string_equal(paths[i], want);
  }
}

static void test_every_method_of_every_service(void **state) {
  (void)state;
  const char *coord[] = {COORDINATOR_METHODS(COORD_PATH)};
  const char *dl[] = {DATALOADER_METHODS(DL_PATH)};
  const char *ckpt[] = {CHECKPOINT_METHODS(CKPT_PATH)};
  const char *health[] = {HEALTH_METHODS(HEALTH_PATH)};
  expect_paths(&stoker__v1__coordinator__descriptor, coord, sizeof(coord) / sizeof(*coord));
  expect_paths(&stoker__v1__dataloader__descriptor, dl, sizeof(dl) / sizeof(*dl));
  expect_paths(&stoker__v1__checkpoint__descriptor, ckpt, sizeof(ckpt) / sizeof(*ckpt));
  expect_paths(&grpc__health__v1__health__descriptor, health, sizeof(health) / sizeof(*health));
}

static const char *kv_count_path(void) {
  return COORD_METHOD(kv_count, (Stoker__V1__KvCountRequest *)NULL);
}

static void test_call_site_keeps_its_path(void **state) {
  (void)state;
  const char *first = kv_count_path();
  assert_string_equal(first, "/stoker.v1.Coordinator/KvCount");
  assert_ptr_equal(kv_count_path(), first);
}

#define THREADS 8
static pthread_barrier_t start;

/* A call site no other test reaches: its first use is the threads'. */
static void *first_use(void *arg) {
  (void)arg;
  pthread_barrier_wait(&start);
  return (void *)DL_METHOD(export_state, (Stoker__V1__ExportStateRequest *)NULL);
}

static void test_first_use_from_many_threads(void **state) {
  (void)state;
  pthread_t t[THREADS];
  assert_int_equal(pthread_barrier_init(&start, NULL, THREADS), 0);
  for (int k = 0; k < THREADS; k++)
    assert_int_equal(pthread_create(&t[k], NULL, first_use, NULL), 0);
  const char *path[THREADS];
  for (int k = 0; k < THREADS; k++) assert_int_equal(pthread_join(t[k], (void **)&path[k]), 0);
  pthread_barrier_destroy(&start);
  for (int k = 0; k < THREADS; k++) {
    assert_ptr_equal(path[k], path[0]);
    assert_string_equal(path[k], "/stoker.v1.Dataloader/ExportState");
  }
}

/* Only reachable without the macro, which does not compile then: a path the
 * server answers UNIMPLEMENTED, naming the field. */
static void test_field_the_service_lacks(void **state) {
  (void)state;
  static struct rpc_method_path_cache cache;
  assert_string_equal(
      rpc_method_path_cached(&cache, &stoker__v1__coordinator__descriptor, "commit"),
      "/stoker.v1.Coordinator/commit");
}

/* RPC_METHOD_REPLY: the response descriptor is the method's own, taken
 * from the service descriptor (a call site names no response type; a
 * wrong one does not compile); none for a field the service lacks. */
static void test_reply_descriptors_are_the_methods(void **state) {
  (void)state;
  Stoker__V1__GetJobRequest get = STOKER__V1__GET_JOB_REQUEST__INIT;
  Stoker__V1__Job **job = NULL;
  assert_ptr_equal(RPC_METHOD_REPLY(stoker__v1__coordinator, get_job, &get, job),
                   &stoker__v1__job__descriptor);
  Stoker__V1__JobActionRequest act = STOKER__V1__JOB_ACTION_REQUEST__INIT;
  assert_ptr_equal(
      RPC_METHOD_REPLY(stoker__v1__coordinator, delete_job, &act, (Stoker__V1__Empty **)NULL),
      &stoker__v1__empty__descriptor);
  Stoker__V1__ListLoadersRequest ll = STOKER__V1__LIST_LOADERS_REQUEST__INIT;
  Stoker__V1__ListLoadersResponse **lr = NULL;
  assert_ptr_equal(RPC_METHOD_REPLY(stoker__v1__dataloader, list_loaders, &ll, lr),
                   &stoker__v1__list_loaders_response__descriptor);
  Stoker__V1__VerifyCheckpointRequest v = STOKER__V1__VERIFY_CHECKPOINT_REQUEST__INIT;
  Stoker__V1__VerifyCheckpointResponse **vr = NULL;
  assert_ptr_equal(RPC_METHOD_REPLY(stoker__v1__checkpoint, verify, &v, vr),
                   &stoker__v1__verify_checkpoint_response__descriptor);
  for (unsigned i = 0; i < stoker__v1__coordinator__descriptor.n_methods; i++)
    assert_non_null(stoker__v1__coordinator__descriptor.methods[i].output);
  assert_null(rpc_method_output(&stoker__v1__coordinator__descriptor, "commit"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_method_of_every_service),
      cmocka_unit_test(test_call_site_keeps_its_path),
      cmocka_unit_test(test_first_use_from_many_threads),
      cmocka_unit_test(test_field_the_service_lacks),
      cmocka_unit_test(test_reply_descriptors_are_the_methods),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
