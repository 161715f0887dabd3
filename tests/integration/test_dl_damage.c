/*
 * Datasets damaged under the real dataloader daemon cost only the jobs that
 * read them: a file truncated under a live job (its reads raise SIGBUS in the
 * memory map) fails that job's calls with DATA_LOSS naming the file while
 * the daemon keeps serving every other job.
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
  f->d = harness_daemon_start(NULL);
  if (!f->d || !(f->rc = harness_rpc(f->d))) return -1;
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
  rpc_client_free(f->rc);
  harness_daemon_free(f->d);
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

int main(int argc, char **argv) {
  if (harness_init(argc, argv) != 0) return 2;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_truncated_under_live_job, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
