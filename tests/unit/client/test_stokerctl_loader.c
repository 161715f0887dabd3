/*
 * The stokerctl binary's loader commands against the real dataloader core
 * served in-process (fake_loader.h): create, show, list, delete, mixture,
 * explain, commit as tables and JSON (a job whose dataset went missing
 * listed as failed with the reason), exit codes from the --help table, and `health`
 * checking the dataloader when given. The binary's path is argv[1].
 */
#include <cjson/cJSON.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cli_run.h"

#include "dl_synthetic.h"
#include "fake_loader.h"

static const char *stokerctl;
static struct fake_loader fake;

/* Runs stokerctl with args (a shell fragment) against the fake. */
static void run(struct cli_run *r, const char *args) {
  char env[256];
  snprintf(env, sizeof(env), "STOKER_DATALOADER=%s STOKER_COORDINATOR=127.0.0.1:1",
           fake.server.addr);
  cli_run(r, env, stokerctl, args);
}

static int setup(void **state) {
  cli_run_init("stokerctl-loader");
  fake_loader_start(&fake);
  return 0;
}

static int teardown(void **state) {
  fake_loader_stop(&fake);
  cli_run_cleanup();
  return 0;
}

static const char create_args[] =
    "loader create j --dataset web=synthetic:1000:20:300:1@3 --dataset code=synthetic:200:10:50:2 "
    "--seq-len 127 --global-batch 8 --seed 5 --shards 8 --lanes 2 --eos 7";

static void test_create_show(void **state) {
  static struct cli_run r;
  run(&r, create_args);
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "seq_len 127, global batch 8 lines"));
  assert_non_null(strstr(r.out, "bos off, eos 7"));
  assert_non_null(strstr(r.out, "web      synthetic:1000:20:300:1  -       3"));
  run(&r, create_args);
  assert_int_equal(r.rc, 3); /* Already exists. */
  assert_non_null(strstr(r.err, "stokerctl: loader create: "));
  assert_non_null(strstr(r.err, "(ALREADY_EXISTS)"));
  run(&r, "--json loader show j");
  assert_int_equal(r.rc, 0);
  cJSON *o = cJSON_Parse(r.out);
  assert_non_null(o);
  assert_int_equal(cJSON_GetObjectItem(o, "seq_len")->valuedouble, 127);
  assert_int_equal(cJSON_GetObjectItem(o, "committed_step")->valuedouble, -1);
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "datasets")), 2);
  cJSON_Delete(o);
  run(&r, "loader show nope");
  assert_int_equal(r.rc, 2);
  run(&r, "loader create k --dataset web=synthetic:x --seq-len 8 --global-batch 2");
  assert_int_equal(r.rc, 1); /* The dataloader refuses the source: INVALID_ARGUMENT. */
  assert_non_null(strstr(r.err, "synthetic"));
  run(&r, "loader create k --seq-len 8 --global-batch 2");
  assert_int_equal(r.rc, 1);
  assert_non_null(strstr(r.err, "--dataset"));
}

/* The document of step 12's first source, blocked from step 12 on with
 * --block-document as explain names it, is gone from step 12's explain. */
static void block_a_document(struct cli_run *r) {
  char args[512], doc[300];
  run(r, "--json loader explain j 12");
  assert_int_equal(r->rc, 0);
  cJSON *o = cJSON_Parse(r->out);
  cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "sources"), 0);
  snprintf(doc, sizeof(doc), "%s/%s/%.0f", cJSON_GetObjectItem(first, "dataset")->valuestring,
           cJSON_GetObjectItem(first, "file")->valuestring,
           cJSON_GetObjectItem(first, "document")->valuedouble);
  cJSON_Delete(o);
  snprintf(args, sizeof(args), "loader mixture j --from-step 12 --block-document %s", doc);
  run(r, args);
  assert_int_equal(r->rc, 0);
  run(r, "--json loader explain j 12");
  assert_int_equal(r->rc, 0);
  o = cJSON_Parse(r->out);
  cJSON *src = cJSON_GetObjectItem(o, "sources");
  for (int i = 0; i < cJSON_GetArraySize(src); i++) {
    cJSON *l = cJSON_GetArrayItem(src, i);
    char got[300];
    snprintf(got, sizeof(got), "%s/%s/%.0f", cJSON_GetObjectItem(l, "dataset")->valuestring,
             cJSON_GetObjectItem(l, "file")->valuestring,
             cJSON_GetObjectItem(l, "document")->valuedouble);
    assert_string_not_equal(got, doc);
  }
  cJSON_Delete(o);
  run(r, "loader mixture j --from-step 13 --block-document web/synthetic/1000");
  assert_int_equal(r->rc, 1); /* web has documents 0..999: INVALID_ARGUMENT */
  assert_non_null(strstr(r->err, "no document 1000"));
}

static void test_explain_commit_mixture(void **state) {
  static struct cli_run r;
  run(&r, create_args);
  run(&r, "loader explain j 3 --rank 1 --world 2");
  assert_int_equal(r.rc, 0);
  assert_true(strncmp(r.out, "LINE  DATASET", 13) == 0);
  run(&r, "--json loader explain j 3 --rank 1 --world 2");
  assert_int_equal(r.rc, 0);
  cJSON *o = cJSON_Parse(r.out);
  cJSON *src = cJSON_GetObjectItem(o, "sources");
  uint64_t covered = 0;
  for (int i = 0; i < cJSON_GetArraySize(src); i++) {
    cJSON *l = cJSON_GetArrayItem(src, i);
    assert_true(cJSON_GetObjectItem(l, "line")->valuedouble < 4);
    covered += (uint64_t)(cJSON_GetObjectItem(l, "token_end")->valuedouble -
                          cJSON_GetObjectItem(l, "token_begin")->valuedouble);
  }
  assert_int_equal(covered, 4 * 128);
  cJSON_Delete(o);
  run(&r, "loader explain j 3 --rank 2 --world 2");
  assert_int_equal(r.rc, 1);
  run(&r, "loader commit j 5");
  assert_int_equal(r.rc, 0);
  assert_string_equal(r.out, "loader \"j\" committed at step 5\n");
  run(&r, "--json loader show j");
  assert_non_null(strstr(r.out, "\"committed_step\":5"));
  run(&r, "loader mixture j --from-step 3 --dataset web=synthetic:1000:20:300:1");
  assert_int_equal(r.rc, 1); /* Before the commit: refused by the dataloader. */
  run(&r, "--json loader mixture j --from-step 9 --dataset web=synthetic:1000:20:300:1@1 "
          "--global-batch 16");
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "\"global_batch\":16"));
  block_a_document(&r);
  run(&r, "loader commit nope 1");
  assert_int_equal(r.rc, 2);
}

static void test_list_delete_failed(void **state) {
  static struct cli_run r;
  char path[128], cmd[400];
  snprintf(path, sizeof(path), "%s-corpus.bin", fake.dir);
  assert_int_equal(dl_synthetic_write_llmc(path, 0, 400, 100, 300, 1), 0);
  snprintf(cmd, sizeof(cmd),
           "loader create f --dataset web=file://%s:llmc --seq-len 63 --global-batch 4 --lanes 1",
           path);
  run(&r, cmd);
  assert_int_equal(r.rc, 0);
  run(&r, "loader create ok --dataset web=synthetic:100:20:300:1 --seq-len 15 --global-batch 2");
  assert_int_equal(r.rc, 0);
  assert_int_equal(unlink(path), 0);
  fake_loader_reopen(&fake); /* a restart: "f" cannot load */

  run(&r, "loader list");
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "JOB"));
  assert_non_null(strstr(r.out, "failed"));
  assert_non_null(strstr(r.out, "corpus.bin"));
  assert_non_null(strstr(r.out, "ok "));
  run(&r, "--json loader list");
  assert_int_equal(r.rc, 0);
  cJSON *arr = cJSON_Parse(r.out);
  assert_int_equal(cJSON_GetArraySize(arr), 3); /* f, j (the tests before), ok: by name */
  cJSON *f0 = cJSON_GetArrayItem(arr, 0);
  assert_string_equal(cJSON_GetObjectItem(f0, "job")->valuestring, "f");
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(f0, "failed")));
  assert_non_null(strstr(cJSON_GetObjectItem(f0, "failure")->valuestring, "corpus.bin"));
  assert_null(cJSON_GetObjectItem(cJSON_GetArrayItem(arr, 2), "failed"));
  cJSON_Delete(arr);
  run(&r, "loader show f");
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "failed: "));
  run(&r, "loader commit f 1");
  assert_int_equal(r.rc, 3); /* FAILED_PRECONDITION */
  assert_non_null(strstr(r.err, "failed to load"));

  run(&r, "loader delete f");
  assert_int_equal(r.rc, 0);
  assert_string_equal(r.out, "loader \"f\" deleted\n");
  run(&r, "loader delete f");
  assert_int_equal(r.rc, 2);
  run(&r, "loader list");
  assert_null(strstr(r.out, "failed"));
  run(&r, "loader delete ok");
  assert_int_equal(r.rc, 0);
  run(&r, "loader delete --help");
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "loader delete JOB"));
}

static void test_health_and_missing_address(void **state) {
  static struct cli_run r;
  char args[512];
  snprintf(args, sizeof(args), "--json --coordinator %s health", fake.server.addr);
  run(&r, args); /* The fake serves health for both "services". */
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "\"service\":\"dataloader\""));
  assert_non_null(strstr(r.out, "\"status\":\"SERVING\""));
  cli_run(&r, "STOKER_DATALOADER=", stokerctl, "loader show j");
  assert_int_equal(r.rc, 1);
  assert_non_null(strstr(r.err, "no dataloader address"));
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PATH_TO_STOKERCTL\n", argv[0]);
    return 2;
  }
  stokerctl = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_create_show),
      cmocka_unit_test(test_explain_commit_mixture),
      cmocka_unit_test(test_list_delete_failed),
      cmocka_unit_test(test_health_and_missing_address),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
