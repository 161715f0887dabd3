/*
 * The checkpoint service's main path against a real S3-protocol server
 * (npm s3rver, which verifies SigV4 signatures; it has no conditional PUT,
 * so the manifest is written with HEAD + PUT): write 4 ranks with multipart
 * objects -> commit -> list -> read back at 4 and 3 ranks -> verify ->
 * delete. Then the restore's request count (issue 26): a checkpoint FSDP
 * style (4 ranks, 64 tensors sharded by rows: 256 small chunks) read back at
 * worlds 3 and 1, each rank with one Read call, as a trainer restores; the
 * GETs counted in s3rver's request log are at most 2 per object a rank
 * touches (one GET per stored chunk piece before: 1 to 2 per tensor and
 * rank), and every byte comes back exact. Then the ranks of a restore
 * reading together, and two jobs' restores at once: each range is fetched
 * once and shared by the ranks that want it, never across jobs. Exit 77
 * (skipped) when s3rver cannot be installed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ckpt_svc_fixture.h"
#include "s3_config.h"
#include "s3rver_config.h"
#include "s3rver_fixture.h"
#include "stk_error.h"
#include "storage.h"

static struct s3rver server;
static char request_log[] = "/tmp/stk-s3rver-requests-XXXXXX";

static void test_s3_write_commit_read(void **state) {
  (void)state;
  struct s3_config cfg = s3rver_config(server.endpoint);
  struct storage *st;
  assert_int_equal(storage_open_s3(&cfg, "ck3/", &st), 0);
  assert_false(storage_caps(st)->conditional_put);
  struct fx f;
  fx_init(&f);
  f.opts.storage = st;
  f.opts.storage_url = "s3://" S3RVER_BUCKET "/ck3";
  assert_int_equal(fx_open(&f), 0);
  struct model *m = model_new(4, 6000000, 31); /* 9 MB a rank: multipart. */
  char att[65], msg[256];
  assert_int_equal(fx_begin(&f, "s3job", 40, 4, att), 0);
  struct write_opts wo = {.world = 4, .skip_last_rank = -1};
  assert_int_equal(fx_write_model(&f, att, m, &wo, NULL), 0);
  int rc = fx_commit(&f, att, msg, sizeof(msg));
  if (rc) fail_msg("commit: %s", msg);
  int64_t steps[4];
  size_t n;
  assert_int_equal(fx_list(&f, "s3job", steps, 4, &n), 0);
  assert_int_equal(n, 1);
  assert_int_equal(steps[0], 40);
  assert_int_equal(fx_read_all(&f, "s3job", 40, m, 4), 0);
  assert_int_equal(fx_read_all(&f, "s3job", 40, m, 3), 0);
  uint64_t problems = 1;
  assert_int_equal(fx_verify(&f, "s3job", 40, &problems), 0);
  assert_int_equal(problems, 0);
  struct ckpt_service_stats sst;
  ckpt_service_get_stats(f.svc, &sst);
  assert_true(sst.parts_uploaded >= 8);
  assert_int_equal(fx_delete(&f, "s3job", 40), 0);
  assert_int_equal(fx_list(&f, "s3job", steps, 4, &n), 0);
  assert_int_equal(n, 0);
  fx_close(&f);
  fx_fini(&f);
  storage_free(st);
  model_free(m);
}

/* GETs of manifests logged from line *at on (moved past them). */
static size_t manifest_gets(size_t *at) {
  FILE *fp = fopen(request_log, "r");
  assert_non_null(fp);
  char line[2048];
  size_t n = 0, gets = 0;
  while (fgets(line, sizeof(line), fp))
    if (n++ >= *at && strncmp(line, "GET ", 4) == 0 && strstr(line, "manifest.pb")) gets++;
  fclose(fp);
  *at = n;
  return gets;
}

/* Ranged GETs of checkpoint objects logged from line *at on (moved past
 * them): how many, how many named a distinct object (by_range: a distinct
 * object and range), and how many named an object under `part` of the key
 * (NULL: none). */
static size_t object_gets(size_t *at, bool by_range, size_t *ret_distinct, const char *part,
                          size_t *ret_part) {
  FILE *fp = fopen(request_log, "r");
  assert_non_null(fp);
  static char seen[256][1200];
  char line[2048];
  size_t n = 0, gets = 0, distinct = 0, in_part = 0;
  while (fgets(line, sizeof(line), fp)) {
    if (n++ < *at) continue;
    char method[16], url[1024], range[128];
    if (sscanf(line, "%15s %1023s %127s", method, url, range) != 3) continue;
    if (strcmp(method, "GET") != 0 || !strstr(url, "/rank-")) continue;
    gets++;
    in_part += part && strstr(url, part);
    char key[1200];
    snprintf(key, sizeof(key), "%s %s", url, by_range ? range : "");
    size_t k = 0;
    while (k < distinct && strcmp(seen[k], key) != 0) k++;
    if (k == distinct && distinct < 256) snprintf(seen[distinct++], sizeof(seen[0]), "%s", key);
  }
  fclose(fp);
  *at = n;
  *ret_distinct = distinct;
  if (ret_part) *ret_part = in_part;
  return gets;
}

static void test_s3_restore_few_gets(void **state) {
  (void)state;
  struct s3_config cfg = s3rver_config(server.endpoint);
  struct storage *st;
  assert_int_equal(storage_open_s3(&cfg, "ck4/", &st), 0);
  struct fx f;
  fx_init(&f);
  f.opts.storage = st;
  f.opts.storage_url = "s3://" S3RVER_BUCKET "/ck4";
  assert_int_equal(fx_open(&f), 0);
  struct model *m = model_new_fsdp(64, 48, 96, 7); /* 18 KiB a tensor, 4.5 KiB a chunk. */
  char att[65], msg[256];
  assert_int_equal(fx_begin(&f, "fsdp", 5, 4, att), 0);
  struct write_opts wo = {.world = 4, .skip_last_rank = -1};
  assert_int_equal(fx_write_model(&f, att, m, &wo, NULL), 0);
  int rc = fx_commit(&f, att, msg, sizeof(msg));
  if (rc) fail_msg("commit: %s", msg);
  size_t at = 0, objects, mat = 0;
  object_gets(&at, false, &objects, NULL, NULL);
  manifest_gets(&mat);
  const uint32_t worlds[] = {3, 1};
  for (size_t w = 0; w < 2; w++) {
    for (uint32_t r = 0; r < worlds[w]; r++) {
      assert_int_equal(fx_read_rank(&f, "fsdp", 5, m, r, worlds[w]), 0);
      size_t gets = object_gets(&at, false, &objects, NULL, NULL);
      print_message("# world %u rank %u: %zu GETs of %zu objects\n", worlds[w], r, gets, objects);
      assert_true(objects >= 1);
      assert_true(gets <= 2 * objects);
    }
  }
  /* The manifest was loaded once for the four reads (ckpt_mcache.c). */
  assert_int_equal(manifest_gets(&mat), 1);
  fx_close(&f);
  fx_fini(&f);
  storage_free(st);
  model_free(m);
}

/* The ranks of a restore at world 3 read together (issue 26, part 2): each
 * rank's boxes cross two saved ranks' objects, so the middle objects are
 * wanted by two Reads at once; each range is fetched once and shared
 * (ckpt_fetch.c), every byte still exact. Two jobs' checkpoints of the
 * same shapes and tensor names, restored at the same time, share nothing:
 * each job's objects are fetched for it, and each reader gets its own
 * job's bytes. */
static void test_s3_restore_shares_gets(void **state) {
  (void)state;
  struct s3_config cfg = s3rver_config(server.endpoint);
  struct storage *st;
  assert_int_equal(storage_open_s3(&cfg, "ck5/", &st), 0);
  struct fx f;
  fx_init(&f);
  f.opts.storage = st;
  f.opts.storage_url = "s3://" S3RVER_BUCKET "/ck5";
  assert_int_equal(fx_open(&f), 0);
  const char *jobs[2] = {"fsdp-a", "fsdp-b"};
  struct model *m[2] = {model_new_fsdp(64, 48, 96, 7), model_new_fsdp(64, 48, 96, 8)};
  for (int j = 0; j < 2; j++) {
    char att[65], msg[256];
    assert_int_equal(fx_begin(&f, jobs[j], 5, 4, att), 0);
    struct write_opts wo = {.world = 4, .skip_last_rank = -1};
    assert_int_equal(fx_write_model(&f, att, m[j], &wo, NULL), 0);
    int rc = fx_commit(&f, att, msg, sizeof(msg));
    if (rc) fail_msg("commit: %s", msg);
  }
  size_t at = 0, distinct, part;
  object_gets(&at, true, &distinct, NULL, NULL);
  struct ckpt_service_stats before, after;
  ckpt_service_get_stats(f.svc, &before);

  /* One job's restore at world 3: 6 spans (each a whole small object), 4
   * objects, each GET once (6 before spans were shared). Sharing needs the
   * Reads to overlap in time, which a host stalling a thread for a whole
   * GET can deny: up to three tries, one of them must show it, and every
   * try restores exactly with at most the 6 GETs of unshared spans. */
  struct fx_read reads[6];
  int rcs[6];
  for (uint32_t r = 0; r < 3; r++) reads[r] = (struct fx_read){jobs[0], 5, m[0], r, 3};
  size_t gets = 0;
  for (int k = 0; k < 3 && gets != 4; k++) {
    ckpt_service_get_stats(f.svc, &before);
    assert_int_equal(fx_read_together(&f, reads, 3, rcs), 0);
    gets = object_gets(&at, true, &distinct, NULL, NULL);
    ckpt_service_get_stats(f.svc, &after);
    print_message("# 3 reads together: %zu GETs, %zu distinct ranges\n", gets, distinct);
    assert_true(gets >= 4 && gets <= 6);
    assert_int_equal(distinct, 4);
    assert_int_equal(after.read_gets - before.read_gets, gets);
    assert_int_equal(after.read_gets_shared - before.read_gets_shared, 6 - gets);
  }
  assert_int_equal(gets, 4);

  /* Both jobs at once: every reader gets its own job's bytes (a reader
   * given the other job's bytes reads -1000), each job's objects are
   * fetched for it (4 distinct ranges each; 4 GETs each when the Reads
   * overlap). */
  for (uint32_t r = 0; r < 6; r++) reads[r] = (struct fx_read){jobs[r % 2], 5, m[r % 2], r / 2, 3};
  assert_int_equal(fx_read_together(&f, reads, 6, rcs), 0);
  gets = object_gets(&at, true, &distinct, "/fsdp-a/", &part);
  print_message("# 2 jobs, 6 reads together: %zu GETs (%zu of fsdp-a), %zu distinct\n", gets, part,
                distinct);
  assert_int_equal(distinct, 8);
  assert_true(part >= 4 && part <= 6);
  assert_true(gets - part >= 4 && gets - part <= 6);
  /* Nothing is kept once the reads ended: the next restore GETs again. */
  ckpt_service_get_stats(f.svc, &after);
  assert_int_equal(after.read_fetched_bytes, 0);
  assert_int_equal(fx_read_rank(&f, jobs[1], 5, m[1], 1, 3), 0);
  assert_int_equal(object_gets(&at, true, &distinct, NULL, NULL), 2);
  fx_close(&f);
  fx_fini(&f);
  storage_free(st);
  model_free(m[0]);
  model_free(m[1]);
}

int main(void) {
  int fd = mkstemp(request_log);
  if (fd < 0) return 1;
  close(fd);
  setenv("S3RVER_REQUEST_LOG", request_log, 1);
  if (s3rver_start(&server) != 0) {
    unlink(request_log);
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_s3_write_commit_read),
      cmocka_unit_test(test_s3_restore_few_gets),
      cmocka_unit_test(test_s3_restore_shares_gets),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  s3rver_stop(&server);
  unlink(request_log);
  return rc;
}
