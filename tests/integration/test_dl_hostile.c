/*
 * Hostile input to the real dataloader daemon: bad steps, worlds and ranks,
 * unknown jobs, oversized batches (a daemon with a small max-batch-size),
 * malformed payloads, garbage state blobs, and datasets that do not exist
 * or are corrupt. Each gets a clear one-line status, and nothing changes:
 * the job's info and batches are the same afterwards, and a failed
 * CreateLoader leaves no job behind.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dl_synthetic.h"
#include "test_dl_helpers.h"

struct fixture {
  struct harness_daemon *d;
  struct rpc_client *rc;
  size_t ref_len;
  uint8_t *ref; /* Step 5 of job "h" before the hostile calls. */
};

static int setup(void **state) {
  struct fixture *f = calloc(1, sizeof(*f));
  const char *args[] = {"--max-batch-size", "16KiB", NULL};
  if (tdl_daemon_open(&f->d, &f->rc, args, NULL) != 0) return -1;
  struct tdl_spec t;
  tdl_spec_init(&t, "h", "synthetic:2000:16:300:1", 0, 255, 32);
  if (tdl_create(f->rc, &t.spec, NULL, 0) != RPC_OK) return -1;
  f->ref = tdl_global(f->rc, "h", 5, 8, &f->ref_len);
  *state = f;
  return f->ref ? 0 : -1;
}

static int teardown(void **state) {
  struct fixture *f = *state;
  tdl_daemon_close(f->d, f->rc);
  free(f->ref);
  free(f);
  return 0;
}

/* Nothing changed: same spec and commit, same bytes. */
static void assert_unchanged(struct fixture *f) {
  assert_int_equal(tdl_committed_step(f->rc, "h"), -1);
  size_t len;
  uint8_t *now = tdl_global(f->rc, "h", 5, 8, &len);
  assert_non_null(now);
  assert_int_equal(len, f->ref_len);
  assert_memory_equal(now, f->ref, len);
  free(now);
}

static int get_batch(struct fixture *f, const char *job, int64_t step, uint32_t rank,
                     uint32_t world, char *msg) {
  Stoker__V1__GetBatchRequest req = STOKER__V1__GET_BATCH_REQUEST__INIT;
  req.job = (char *)job;
  req.step = step;
  req.rank = rank;
  req.world = world;
  int code = tdl_call(f->rc, "GetBatch", &req.base, &stoker__v1__batch__descriptor, NULL, msg, 512);
  if (code != RPC_OK) assert_true(msg[0] != 0); /* A reason, on one line. */
  assert_null(strchr(msg, '\n'));
  return code;
}

static void test_bad_batch_requests(void **state) {
  struct fixture *f = *state;
  char msg[512];
  assert_int_equal(get_batch(f, "h", -1, 0, 8, msg), RPC_INVALID_ARGUMENT);
  assert_int_equal(get_batch(f, "h", INT64_MAX, 0, 8, msg), RPC_INVALID_ARGUMENT);
  assert_int_equal(get_batch(f, "h", (int64_t)1 << 39, 0, 8, msg), RPC_OUT_OF_RANGE);
  assert_int_equal(get_batch(f, "h", 0, 0, 0, msg), RPC_INVALID_ARGUMENT);
  assert_int_equal(get_batch(f, "h", 0, 8, 8, msg), RPC_INVALID_ARGUMENT);
  assert_int_equal(get_batch(f, "h", 0, UINT32_MAX, 8, msg), RPC_INVALID_ARGUMENT);
  assert_int_equal(get_batch(f, "h", 0, 0, 5, msg), RPC_INVALID_ARGUMENT); /* 32 % 5 */
  assert_int_equal(get_batch(f, "nope", 0, 0, 8, msg), RPC_NOT_FOUND);
  int code = get_batch(f, "", 0, 0, 8, msg);
  assert_true(code == RPC_INVALID_ARGUMENT || code == RPC_NOT_FOUND);
  /* 16 lines x 256 tokens x 4 bytes = 16 KiB fits; 32 lines do not. */
  assert_int_equal(get_batch(f, "h", 0, 0, 2, msg), RPC_OK);
  code = get_batch(f, "h", 0, 0, 1, msg);
  assert_true(code == RPC_INVALID_ARGUMENT || code == RPC_RESOURCE_EXHAUSTED);
  print_message("oversized: %s: %s\n", rpc_code_name(code), msg);
  assert_unchanged(f);
}

static void test_bad_changes(void **state) {
  struct fixture *f = *state;
  char msg[512];
  Stoker__V1__CommitRequest c = STOKER__V1__COMMIT_REQUEST__INIT;
  c.job = "h";
  c.step = -5;
  assert_int_equal(
      tdl_call(f->rc, "Commit", &c.base, &stoker__v1__empty__descriptor, NULL, msg, sizeof(msg)),
      RPC_INVALID_ARGUMENT);
  c.job = "nope";
  c.step = 1;
  assert_int_equal(
      tdl_call(f->rc, "Commit", &c.base, &stoker__v1__empty__descriptor, NULL, msg, sizeof(msg)),
      RPC_NOT_FOUND);
  Stoker__V1__UpdateMixtureRequest u = STOKER__V1__UPDATE_MIXTURE_REQUEST__INIT;
  u.job = "h";
  u.from_step = -1;
  assert_int_equal(tdl_call(f->rc, "UpdateMixture", &u.base, &stoker__v1__loader_info__descriptor,
                            NULL, msg, sizeof(msg)),
                   RPC_INVALID_ARGUMENT);
  static uint8_t junk[64] = {0x44, 0x4c, 0x58, 0x31, 1, 2, 3};
  Stoker__V1__LoaderState st = STOKER__V1__LOADER_STATE__INIT;
  st.job = "h";
  st.state.data = junk;
  st.state.len = sizeof(junk);
  int code = tdl_call(f->rc, "ImportState", &st.base, &stoker__v1__loader_info__descriptor, NULL,
                      msg, sizeof(msg));
  assert_true(code == RPC_DATA_LOSS || code == RPC_INVALID_ARGUMENT);
  st.job = "";
  assert_int_equal(tdl_call(f->rc, "ImportState", &st.base, &stoker__v1__loader_info__descriptor,
                            NULL, msg, sizeof(msg)),
                   RPC_INVALID_ARGUMENT);
  Stoker__V1__CreateLoaderRequest cr = STOKER__V1__CREATE_LOADER_REQUEST__INIT;
  assert_int_equal(tdl_call(f->rc, "CreateLoader", &cr.base, &stoker__v1__loader_info__descriptor,
                            NULL, msg, sizeof(msg)),
                   RPC_INVALID_ARGUMENT);
  struct tdl_spec t; /* The same job again. */
  tdl_spec_init(&t, "h", "synthetic:10:16:300:1", 0, 15, 4);
  assert_int_equal(tdl_create(f->rc, &t.spec, msg, sizeof(msg)), RPC_ALREADY_EXISTS);
  assert_unchanged(f);
}

/* A JobEvent (field 1 a varint) is not a GetBatchRequest (field 1 a string). */
static void test_malformed_payload(void **state) {
  struct fixture *f = *state;
  Stoker__V1__JobEvent ev = STOKER__V1__JOB_EVENT__INIT;
  ev.seq = 5;
  assert_int_equal(
      tdl_call(f->rc, "GetBatch", &ev.base, &stoker__v1__batch__descriptor, NULL, NULL, 0),
      RPC_INVALID_ARGUMENT);
  assert_int_equal(
      tdl_call(f->rc, "ImportState", &ev.base, &stoker__v1__loader_info__descriptor, NULL, NULL, 0),
      RPC_INVALID_ARGUMENT);
  assert_unchanged(f);
}

/* CreateLoader on a path: fails naming the file; no job is left. */
static void assert_create_fails(struct fixture *f, const char *job, const char *path, int format,
                                const char *named) {
  char uri[512], msg[512] = "";
  snprintf(uri, sizeof(uri), "file://%s", path);
  struct tdl_spec t;
  tdl_spec_init(&t, job, uri, format, 63, 8);
  int code = tdl_create(f->rc, &t.spec, msg, sizeof(msg));
  print_message("%s: %s: %s\n", job, rpc_code_name(code), msg);
  assert_int_not_equal(code, RPC_OK);
  assert_non_null(strstr(msg, named));
  assert_null(strchr(msg, '\n'));
  assert_int_equal(tdl_committed_step(f->rc, job), INT64_MIN);
  Stoker__V1__GetLoaderRequest g = STOKER__V1__GET_LOADER_REQUEST__INIT;
  g.job = (char *)job;
  assert_int_equal(
      tdl_call(f->rc, "GetLoader", &g.base, &stoker__v1__loader_info__descriptor, NULL, NULL, 0),
      RPC_NOT_FOUND);
}

static void test_missing_and_corrupt_datasets(void **state) {
  struct fixture *f = *state;
  char path[400];
  snprintf(path, sizeof(path), "%s/absent/corpus", f->d->root);
  assert_create_fails(f, "missing", path, STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_MEGATRON,
                      "absent/corpus");

  snprintf(path, sizeof(path), "%s/bad", f->d->root);
  assert_int_equal(dl_synthetic_write_megatron(path, 100, 16, 300, 5, 4, 0), 0);
  char idx[420];
  snprintf(idx, sizeof(idx), "%s.idx", path);
  FILE *fp = fopen(idx, "r+b");
  assert_non_null(fp);
  fwrite("GARBAGE!!", 1, 9, fp); /* Over the MMIDIDX magic. */
  fclose(fp);
  assert_create_fails(f, "corrupt", path, STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_MEGATRON,
                      "bad.idx");

  snprintf(path, sizeof(path), "%s/short.bin", f->d->root);
  fp = fopen(path, "wb");
  assert_non_null(fp);
  fwrite("tiny", 1, 4, fp); /* Shorter than an llm.c header. */
  fclose(fp);
  assert_create_fails(f, "short", path, STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_LLMC,
                      "short.bin");
  assert_unchanged(f);
}

int main(int argc, char **argv) {
  if (harness_init(argc, argv) != 0) return 2;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_bad_batch_requests, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_changes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_malformed_payload, setup, teardown),
      cmocka_unit_test_setup_teardown(test_missing_and_corrupt_datasets, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
