/*
 * Datasets damaged under the real dataloader daemon cost only the jobs that
 * read them: a file truncated under a live job (its reads raise SIGBUS in the
 * memory map) fails that job's calls with DATA_LOSS naming the file while
 * the daemon keeps serving every other job; a dataset missing at a restart
 * leaves its job failed (GetLoader and ListLoaders say why, its calls fail
 * FAILED_PRECONDITION) while every other job loads and serves, and
 * DeleteLoader removes it and everything it stored.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "dl_synthetic.h"
#include "test_dl_helpers.h"

#define LLMC STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_LLMC

struct fixture {
  struct harness_daemon *d;
  struct rpc_client *rc;
  char a[400], b[400]; /* llm.c files under the daemon's data root */
};

static int setup(void **state) {
  struct fixture *f = calloc(1, sizeof(*f));
  if (tdl_daemon_open(&f->d, &f->rc, NULL, NULL) != 0) return -1;
  snprintf(f->a, sizeof f->a, "%s/a.bin", f->d->root);
  snprintf(f->b, sizeof f->b, "%s/b.bin", f->d->root);
  if (dl_synthetic_write_llmc(f->a, 0, 3000, 500, 1500, 1) != 0 ||
      dl_synthetic_write_llmc(f->b, 0, 3000, 500, 1500, 2) != 0)
    return -1;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  struct fixture *f = *state;
  tdl_daemon_close(f->d, f->rc);
  free(f);
  return 0;
}

static void create(struct fixture *f, const char *job, const char *path) {
  struct tdl_spec t;
  char uri[420];
  snprintf(uri, sizeof uri, "file://%s", path);
  tdl_spec_init(&t, job, uri, LLMC, 1023, 8);
  assert_int_equal(tdl_create(f->rc, &t.spec, NULL, 0), RPC_OK);
}

static int get_batch(struct fixture *f, const char *job, int64_t step, char *msg, size_t len) {
  Stoker__V1__GetBatchRequest req = STOKER__V1__GET_BATCH_REQUEST__INIT;
  req.job = (char *)job;
  req.step = step;
  req.rank = 0;
  req.world = 1;
  msg[0] = 0;
  return tdl_call(f->rc, "GetBatch", &req.base, &stoker__v1__batch__descriptor, NULL, msg, len);
}

static void test_truncated_under_live_job(void **state) {
  struct fixture *f = *state;
  char msg[512];
  create(f, "bad", f->a);
  create(f, "good", f->b);
  assert_int_equal(get_batch(f, "bad", 0, msg, sizeof msg), RPC_OK);
  assert_int_equal(get_batch(f, "good", 0, msg, sizeof msg), RPC_OK);

  assert_int_equal(truncate(f->a, 8192), 0);
  int code = RPC_OK;
  int64_t step = 1;
  for (; step < 400 && code == RPC_OK; step++) code = get_batch(f, "bad", step, msg, sizeof msg);
  assert_int_equal(code, RPC_DATA_LOSS);
  assert_non_null(strstr(msg, "a.bin"));
  assert_true(harness_daemon_alive(f->d));

  /* Every later call of the job that reads data says the same. */
  assert_int_equal(get_batch(f, "bad", 0, msg, sizeof msg), RPC_DATA_LOSS);
  assert_int_equal(tdl_commit(f->rc, "bad", 0), RPC_DATA_LOSS);
  Stoker__V1__StreamBatchesRequest sr = STOKER__V1__STREAM_BATCHES_REQUEST__INIT;
  sr.job = "bad";
  sr.world = 1;
  sr.prefetch = 2;
  struct tdl_stream s;
  tdl_stream_run(f->rc, &sr, 4, &s);
  assert_int_equal(s.st.code, RPC_DATA_LOSS);
  tdl_stream_free(&s);

  /* The other job and the daemon carry on. */
  for (int64_t g = 1; g < step + 4; g++)
    assert_int_equal(get_batch(f, "good", g, msg, sizeof msg), RPC_OK);
  assert_int_equal(tdl_commit(f->rc, "good", step), RPC_OK);
  assert_int_equal(tdl_committed_step(f->rc, "bad"), -1); /* GetLoader still answers */
  assert_true(harness_daemon_alive(f->d));
}

static Stoker__V1__LoaderInfo *get_loader(struct fixture *f, const char *job, int *ret_code) {
  Stoker__V1__GetLoaderRequest req = STOKER__V1__GET_LOADER_REQUEST__INIT;
  req.job = (char *)job;
  ProtobufCMessage *resp = NULL;
  *ret_code =
      tdl_call(f->rc, "GetLoader", &req.base, &stoker__v1__loader_info__descriptor, &resp, NULL, 0);
  return (Stoker__V1__LoaderInfo *)resp;
}

static Stoker__V1__ListLoadersResponse *list_loaders(struct fixture *f) {
  Stoker__V1__ListLoadersRequest req = STOKER__V1__LIST_LOADERS_REQUEST__INIT;
  ProtobufCMessage *resp = NULL;
  assert_int_equal(tdl_call(f->rc, "ListLoaders", &req.base,
                            &stoker__v1__list_loaders_response__descriptor, &resp, NULL, 0),
                   RPC_OK);
  return (Stoker__V1__ListLoadersResponse *)resp;
}

static int delete_loader(struct fixture *f, const char *job) {
  Stoker__V1__DeleteLoaderRequest req = STOKER__V1__DELETE_LOADER_REQUEST__INIT;
  req.job = (char *)job;
  return tdl_call(f->rc, "DeleteLoader", &req.base, &stoker__v1__empty__descriptor, NULL, NULL, 0);
}

static void restart(struct fixture *f) {
  rpc_client_free(f->rc);
  harness_daemon_kill(f->d);
  assert_int_equal(harness_daemon_restart(f->d), 0);
  assert_non_null(f->rc = harness_rpc(f->d));
}

static void test_restart_with_missing_dataset(void **state) {
  struct fixture *f = *state;
  char msg[512];
  create(f, "gone", f->a);
  create(f, "kept", f->b);
  assert_int_equal(tdl_commit(f->rc, "gone", 2), RPC_OK);
  assert_int_equal(tdl_commit(f->rc, "kept", 2), RPC_OK);
  size_t ref_len = 0, len = 0;
  uint8_t *ref = tdl_global(f->rc, "kept", 5, 2, &ref_len);
  assert_non_null(ref);

  char moved[420];
  snprintf(moved, sizeof moved, "%s.moved", f->a);
  assert_int_equal(rename(f->a, moved), 0);
  restart(f);

  /* The other job loaded and serves the same bytes. */
  uint8_t *now = tdl_global(f->rc, "kept", 5, 2, &len);
  assert_non_null(now);
  assert_int_equal(len, ref_len);
  assert_memory_equal(now, ref, len);
  free(now);
  assert_int_equal(tdl_committed_step(f->rc, "kept"), 2);

  /* The broken one is there, failed, with the reason. */
  int code;
  Stoker__V1__LoaderInfo *info = get_loader(f, "gone", &code);
  assert_int_equal(code, RPC_OK);
  assert_true(info->failed);
  assert_non_null(strstr(info->failure, "a.bin"));
  assert_string_equal(info->spec->job, "gone");
  protobuf_c_message_free_unpacked(&info->base, NULL);
  assert_int_equal(get_batch(f, "gone", 0, msg, sizeof msg), RPC_FAILED_PRECONDITION);
  assert_non_null(strstr(msg, "failed to load"));
  assert_int_equal(tdl_commit(f->rc, "gone", 3), RPC_FAILED_PRECONDITION);
  struct tdl_spec t;
  tdl_spec_init(&t, "gone", "synthetic:2000:16:300:1", 0, 255, 8);
  assert_int_equal(tdl_create(f->rc, &t.spec, NULL, 0), RPC_ALREADY_EXISTS);

  Stoker__V1__ListLoadersResponse *list = list_loaders(f);
  assert_int_equal(list->n_loaders, 2);
  assert_string_equal(list->loaders[0]->spec->job, "gone");
  assert_true(list->loaders[0]->failed);
  assert_string_equal(list->loaders[1]->spec->job, "kept");
  assert_false(list->loaders[1]->failed);
  assert_int_equal(list->loaders[1]->committed_step, 2);
  protobuf_c_message_free_unpacked(&list->base, NULL);

  /* Deleted, it is gone now and after a restart with its file back: its
   * configuration and commits were removed, so the name starts afresh. */
  assert_int_equal(delete_loader(f, "gone"), RPC_OK);
  assert_null(get_loader(f, "gone", &code));
  assert_int_equal(code, RPC_NOT_FOUND);
  assert_int_equal(delete_loader(f, "gone"), RPC_NOT_FOUND);
  assert_int_equal(rename(moved, f->a), 0);
  restart(f);
  assert_null(get_loader(f, "gone", &code));
  assert_int_equal(code, RPC_NOT_FOUND);
  list = list_loaders(f);
  assert_int_equal(list->n_loaders, 1);
  assert_string_equal(list->loaders[0]->spec->job, "kept");
  protobuf_c_message_free_unpacked(&list->base, NULL);
  create(f, "gone", f->a);
  assert_int_equal(tdl_committed_step(f->rc, "gone"), -1);
  free(ref);
}

/* A loaded job deleted while in use: later calls are NOT_FOUND, and nothing
 * it stored comes back after a restart. */
static void test_delete_live_job(void **state) {
  struct fixture *f = *state;
  char msg[512];
  create(f, "live", f->a);
  assert_int_equal(get_batch(f, "live", 0, msg, sizeof msg), RPC_OK);
  assert_int_equal(tdl_commit(f->rc, "live", 0), RPC_OK);
  assert_int_equal(delete_loader(f, "live"), RPC_OK);
  assert_int_equal(get_batch(f, "live", 1, msg, sizeof msg), RPC_NOT_FOUND);
  assert_int_equal(tdl_commit(f->rc, "live", 1), RPC_NOT_FOUND);
  restart(f);
  int code;
  assert_null(get_loader(f, "live", &code));
  assert_int_equal(code, RPC_NOT_FOUND);
  create(f, "live", f->a);
  assert_int_equal(tdl_committed_step(f->rc, "live"), -1);
}

int main(int argc, char **argv) {
  if (harness_init(argc, argv) != 0) return 2;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_truncated_under_live_job, setup, teardown),
      cmocka_unit_test_setup_teardown(test_restart_with_missing_dataset, setup, teardown),
      cmocka_unit_test_setup_teardown(test_delete_live_job, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
