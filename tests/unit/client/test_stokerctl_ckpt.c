/*
 * The stokerctl binary's checkpoint commands against the real checkpoint
 * core served in-process (fake_ckpt.h): list, show (table and --json),
 * verify (clean, with a progress bar, and after a byte of an object was
 * flipped on storage), delete, abort, and exit codes from the --help table. The
 * checkpoint is written with libstoker-client. The binary's path is argv[1].
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

#include "fake_ckpt.h"
#include "stoker_ckpt.h"

static const char *stokerctl;
static struct fake_ckpt fake;

/* Runs stokerctl with args (a shell fragment) against the fake. */
static void run(struct cli_run *r, const char *args) {
  char env[256];
  snprintf(env, sizeof(env), "STOKER_CHECKPOINT=%s", fake.server.addr);
  cli_run(r, env, stokerctl, args);
}

/* Step 5 of job "m" at world 2: "emb" [64 x 4096] f32 (1 MiB), blob "opt". */
static void write_checkpoint(void) {
  struct stk_client_opts o = {.address = fake.server.addr};
  struct stk_client *c;
  assert_int_equal(stk_ckpt_connect(&o, &c), 0);
  char att[STK_CKPT_ATTEMPT_MAX];
  assert_int_equal(stk_ckpt_begin(c, "m", 5, 2, 0, att), 0);
  static const uint64_t shape[2] = {64, 4096}, bshape[1] = {100};
  static const uint64_t bo[1] = {0}, bs[1] = {100};
  float *buf = malloc(32 * 4096 * 4);
  static char blob[100];
  for (uint32_t r = 0; r < 2; r++) {
    for (size_t i = 0; i < 32 * 4096; i++) buf[i] = (float)(r * 7 + i);
    uint64_t off[2] = {r * 32, 0}, sz[2] = {32, 4096};
    struct stk_ckpt_tensor t[2] = {
        {"emb", STK_DTYPE_F32, shape, {2, off, sz}, buf, 32 * 4096 * 4},
        {"opt", STK_DTYPE_U8, bshape, {1, bo, bs}, blob, 100},
    };
    assert_int_equal(stk_ckpt_save(c, att, r, t, r == 0 ? 2 : 1, NULL), 0);
  }
  assert_int_equal(stk_ckpt_commit(c, att, 0, NULL), 0);
  free(buf);
  stk_client_free(c);
}

static int setup(void **state) {
  (void)state;
  cli_run_init("stokerctl-ckpt");
  fake_ckpt_start(&fake, NULL);
  write_checkpoint();
  return 0;
}

static int teardown(void **state) {
  (void)state;
  fake_ckpt_stop(&fake);
  cli_run_cleanup();
  return 0;
}

static void test_list_show(void **state) {
  (void)state;
  static struct cli_run r;
  run(&r, "checkpoint list m");
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "STEP  COMMITTED"));
  assert_non_null(strstr(r.out, "\n5     "));
  run(&r, "checkpoint list m --json");
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "\"checkpoints\":[{\"step\":5,"));
  run(&r, "checkpoint show m 5");
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "checkpoint m step 5"));
  assert_non_null(strstr(r.out, "emb     F32    [64, 4096]  2       2        1.0 MiB"));
  assert_non_null(strstr(r.out, "opt     U8     [100]"));
  run(&r, "checkpoint show m 5 --json");
  assert_int_equal(r.rc, 0);
  cJSON *j = cJSON_Parse(r.out);
  assert_non_null(j);
  assert_int_equal(cJSON_GetObjectItem(j, "world")->valueint, 2);
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "objects")), 2);
  cJSON_Delete(j);
  run(&r, "checkpoint show m 6");
  assert_int_equal(r.rc, 2); /* Not found. */
  assert_non_null(strstr(r.err, "stokerctl: checkpoint show: "));
  run(&r, "checkpoint show m x");
  assert_int_equal(r.rc, 1);
  run(&r, "checkpoint list");
  assert_int_equal(r.rc, 1);
}

/* Flips one byte in the middle of the first object file on storage. */
static void corrupt_object(void) {
  char cmd[512], path[512] = {0};
  snprintf(cmd, sizeof(cmd), "find '%s' -name 'rank-00001-*.bin' | head -1", fake.store_dir);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  assert_non_null(fgets(path, sizeof(path), p));
  pclose(p);
  path[strcspn(path, "\n")] = '\0';
  FILE *f = fopen(path, "r+b");
  assert_non_null(f);
  assert_int_equal(fseek(f, 300000, SEEK_SET), 0);
  int ch = fgetc(f);
  assert_int_equal(fseek(f, 300000, SEEK_SET), 0);
  fputc(ch ^ 0x5a, f);
  fclose(f);
}

static void test_verify_delete(void **state) {
  (void)state;
  static struct cli_run r;
  run(&r, "checkpoint verify m 5");
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "checkpoint m step 5: OK, 2 objects"));
  run(&r, "checkpoint verify m 5 --progress");
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.err, "[########################################] 100%"));
  corrupt_object();
  run(&r, "checkpoint verify m 5 --json");
  assert_int_equal(r.rc, 6);
  assert_non_null(strstr(r.out, "\"ok\":false"));
  assert_non_null(strstr(r.out, "rank-00001-"));
  assert_non_null(strstr(r.err, "1 problem found"));
  run(&r, "checkpoint delete m 5");
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "checkpoint m step 5 deleted"));
  run(&r, "checkpoint list m --json");
  assert_non_null(strstr(r.out, "\"checkpoints\":[]"));
  run(&r, "checkpoint verify m 5");
  assert_int_equal(r.rc, 2);
}

/* checkpoint abort: an open attempt is aborted (its Commit then fails),
 * again is fine, a committed one exits 3, an unknown one 2; --help. */
static void test_abort(void **state) {
  (void)state;
  struct stk_client_opts o = {.address = fake.server.addr};
  struct stk_client *c;
  assert_int_equal(stk_ckpt_connect(&o, &c), 0);
  char att[STK_CKPT_ATTEMPT_MAX], cmd[256];
  assert_int_equal(stk_ckpt_begin(c, "a", 7, 2, 0, att), 0);
  struct cli_run r;
  snprintf(cmd, sizeof(cmd), "checkpoint abort %s --reason 'rank 1 died'", att);
  run(&r, cmd);
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "aborted"));
  assert_int_equal(stk_ckpt_commit(c, att, 0, NULL), STK_EABORTED);
  assert_non_null(strstr(stk_client_last_error(NULL), "rank 1 died"));
  snprintf(cmd, sizeof(cmd), "checkpoint abort %s --json", att);
  run(&r, cmd);
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "\"aborted_attempt\""));
  run(&r, "checkpoint abort 0123456789abcdef0123456789abcdef");
  assert_int_equal(r.rc, 2);
  run(&r, "checkpoint abort --help");
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "--reason TEXT"));
  stk_client_free(c);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s STOKERCTL\n", argv[0]);
    return 2;
  }
  stokerctl = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_list_show),
      cmocka_unit_test(test_verify_delete),
      cmocka_unit_test(test_abort),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
