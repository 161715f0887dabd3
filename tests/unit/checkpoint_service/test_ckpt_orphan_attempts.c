/*
 * The periodic sweep of orphaned attempt directories (ckpt_orphan_attempts.c,
 * ckpt_gc_orphan_attempts): objects planted under attempt directories that
 * the journal never heard of (as an attempt whose record was lost, or an
 * abort whose deletes failed, leaves them) are removed once found orphaned
 * for the grace period, counted, in every job; the objects of a live
 * attempt, of committed checkpoints (also one whose manifest a listing
 * does not show: its journal record claims it), of a directory holding a
 * manifest the journal does not know (an imported checkpoint) and keys the
 * service does not write stay, however many runs pass. On file:// (the real
 * backend) and on S3 through a loopback fake that pages ListObjectsV2.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "ckpt_names.h"
#include "ckpt_svc_fixture.h"
#include "fake_s3_svc_fixture.h"
#include "s3_config.h"
#include "stk_error.h"
#include "storage.h"

#define ORPHAN_A "000000000000000000000000000000a1"
#define ORPHAN_B "000000000000000000000000000000b2"
#define IMPORTED "000000000000000000000000000000c3"
#define GRACE_MS 1200

static struct ckpt_service_stats stats(struct fx *f) {
  struct ckpt_service_stats st;
  ckpt_service_get_stats(f->svc, &st);
  return st;
}

static void run_until_removed(struct fx *f, uint64_t n, uint32_t timeout_ms) {
  int64_t end = fx_now_ms() + timeout_ms;
  while (stats(f).orphan_attempts_removed < n && fx_now_ms() < end) uv_run(&f->loop, UV_RUN_ONCE);
  assert_int_equal(stats(f).orphan_attempts_removed, n);
}

/* The key of object `name` of (job, step, attempt), relative to the store. */
static char *key_of(const char *job, int64_t step, const char *attempt, const char *name) {
  char *key = NULL;
  assert_int_equal(ckpt_key_object("", job, step, attempt, name, &key), 0);
  return key;
}

static void put(struct storage *st, const char *key) {
  assert_int_equal(storage_put(st, key, "x", 1, 0), 0);
}

static bool exists(struct storage *st, const char *key) {
  uint64_t size;
  int rc = storage_head(st, key, &size);
  assert_true(rc == 0 || rc == STK_ENOENT);
  return rc == 0;
}

/* Commits a small checkpoint of job at step; its attempt id to ret_attempt. */
static void commit_one(struct fx *f, const char *job, int64_t step, char ret_attempt[65]) {
  struct model *m = model_new(1, 1000, (uint64_t)step);
  struct write_opts wo = {.world = 1, .skip_last_rank = -1};
  assert_int_equal(fx_begin(f, job, step, 1, ret_attempt), 0);
  assert_int_equal(fx_write_model(f, ret_attempt, m, &wo, NULL), 0);
  assert_int_equal(fx_commit(f, ret_attempt, NULL, 0), 0);
  model_free(m);
}

static void test_file_store(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  f.opts.orphan_attempt_grace_ms = GRACE_MS;
  f.opts.attempt_timeout_ms = 60000; /* the sweep timer ticks every second */
  assert_int_equal(fx_open(&f), 0);
  struct storage *st;
  assert_int_equal(storage_open(f.url, &st), 0);

  char kept[4][65], live[65];
  commit_one(&f, "job", 4, kept[0]);
  commit_one(&f, "job", 5, kept[1]);
  /* Step 4's manifest out of sight of listings (as on a store whose
   * listing lags): only its C/ record claims its objects now. */
  char *manifest4 = NULL;
  assert_int_equal(ckpt_key_manifest("", "job", 4, kept[0], &manifest4), 0);
  assert_int_equal(storage_delete(st, manifest4), 0);
  char *committed4 = key_of("job", 4, kept[0], "rank-00000-0000.bin");
  char *committed5 = key_of("job", 5, kept[1], "rank-00000-0000.bin");
  assert_true(exists(st, committed4));
  assert_true(exists(st, committed5));

  assert_int_equal(fx_begin(&f, "job", 7, 2, live), 0);
  char *live_obj = key_of("job", 7, live, "rank-00000-0000.bin");
  put(st, live_obj); /* an upload of the open attempt, done */

  int64_t planted = fx_now_ms();
  char *orphans[] = {key_of("job", 6, ORPHAN_A, "rank-00000-0000.bin"),
                     key_of("job", 6, ORPHAN_A, "rank-00001-0000.bin"),
                     key_of("other", 1, ORPHAN_B, "rank-00000-0003.bin")};
  for (size_t i = 0; i < 3; i++) put(st, orphans[i]);
  char *imported[] = {key_of("old", 3, IMPORTED, "manifest.pb"),
                      key_of("old", 3, IMPORTED, "rank-00000-0000.bin")};
  const char *foreign[] = {"notours.bin", "job/not-a-step/attempt-x/r.bin",
                           "job/step-000000000006/loose.bin"};
  for (size_t i = 0; i < 2; i++) put(st, imported[i]);
  for (size_t i = 0; i < 3; i++) put(st, foreign[i]);

  run_until_removed(&f, 2, 15000);
  assert_true(fx_now_ms() - planted >= GRACE_MS); /* never before the grace period */
  assert_int_equal(stats(&f).orphan_attempt_objects_removed, 3);
  for (size_t i = 0; i < 3; i++) assert_false(exists(st, orphans[i]));

  /* Several more runs: everything else stays. */
  fx_run_for(&f, 2000);
  assert_int_equal(stats(&f).orphan_attempts_removed, 2);
  assert_true(exists(st, live_obj));
  assert_true(exists(st, committed4));
  assert_true(exists(st, committed5));
  for (size_t i = 0; i < 2; i++) assert_true(exists(st, imported[i]));
  for (size_t i = 0; i < 3; i++) assert_true(exists(st, foreign[i]));
  int64_t steps[4];
  size_t n;
  assert_int_equal(fx_list(&f, "job", steps, 4, &n), 0);
  assert_int_equal(n, 2);
  uint64_t problems = 1;
  assert_int_equal(fx_verify(&f, "job", 5, &problems), 0);
  assert_int_equal(problems, 0);

  for (size_t i = 0; i < 3; i++) free(orphans[i]);
  for (size_t i = 0; i < 2; i++) free(imported[i]);
  free(manifest4);
  free(committed4);
  free(committed5);
  free(live_obj);
  fx_fini(&f);
  storage_free(st);
}

/* The default grace (1 h) keeps a fresh orphan through several runs. */
static void test_default_grace(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  f.opts.attempt_timeout_ms = 60000;
  assert_int_equal(fx_open(&f), 0);
  struct storage *st;
  assert_int_equal(storage_open(f.url, &st), 0);
  char *orphan = key_of("job", 6, ORPHAN_A, "rank-00000-0000.bin");
  put(st, orphan);
  fx_run_for(&f, 1500);
  assert_int_equal(stats(&f).orphan_attempts_removed, 0);
  assert_true(exists(st, orphan));
  free(orphan);
  fx_fini(&f);
  storage_free(st);
}

/* ---- S3: ListObjectsV2 pages, deletes seen by the server ---- */

#define MAX_KEYS 64
#define BUCKET   "/" FAKE_S3_BUCKET "/"

/* The fake store's keys (full S3 keys, sorted), shared with its thread. */
static char keys[MAX_KEYS][256];
static size_t n_keys;
static pthread_mutex_t keys_mu = PTHREAD_MUTEX_INITIALIZER;

static int cmp_key(const void *a, const void *b) {
  return strcmp(a, b);
}

/* The index of key, or n_keys. keys_mu held. */
static size_t find_key(const char *key) {
  size_t i = 0;
  while (i < n_keys && strcmp(keys[i], key) != 0) i++;
  return i;
}

static void add_key(const char *key) {
  pthread_mutex_lock(&keys_mu);
  if (find_key(key) == n_keys) {
    assert_true(n_keys < MAX_KEYS);
    snprintf(keys[n_keys++], sizeof(keys[0]), "%s", key);
    qsort(keys, n_keys, sizeof(keys[0]), cmp_key);
  }
  pthread_mutex_unlock(&keys_mu);
}

static bool has_key(const char *key) {
  pthread_mutex_lock(&keys_mu);
  bool found = find_key(key) < n_keys;
  pthread_mutex_unlock(&keys_mu);
  return found;
}

static void remove_key(const char *key) {
  pthread_mutex_lock(&keys_mu);
  size_t i = find_key(key);
  if (i < n_keys) {
    memmove(keys[i], keys[i + 1], (n_keys - i - 1) * sizeof(keys[0]));
    n_keys--;
  }
  pthread_mutex_unlock(&keys_mu);
}

/* ListObjectsV2 over the keys under the query's prefix, two a page; the
 * continuation token is the index of the next key. */
static char *list_objects(const char *query) {
  char prefix[256] = "", token[32] = "";
  fake_s3_query(query, "prefix", prefix, sizeof(prefix));
  fake_s3_query(query, "continuation-token", token, sizeof(token));
  size_t from = token[0] ? strtoul(token, NULL, 10) : 0, shown = 0, i;
  char *body = malloc(16384);
  size_t len = (size_t)snprintf(body, 16384, "<ListBucketResult>");
  pthread_mutex_lock(&keys_mu);
  for (i = from; i < n_keys && shown < 2; i++) {
    if (strncmp(keys[i], prefix, strlen(prefix)) != 0) continue;
    len += (size_t)snprintf(body + len, 16384 - len,
                            "<Contents><Key>%s</Key><Size>1</Size></Contents>", keys[i]);
    shown++;
  }
  bool more = false;
  for (size_t j = i; j < n_keys; j++) more = more || strncmp(keys[j], prefix, strlen(prefix)) == 0;
  pthread_mutex_unlock(&keys_mu);
  if (more)
    snprintf(body + len, 16384 - len,
             "<IsTruncated>true</IsTruncated><NextContinuationToken>%zu</NextContinuationToken>"
             "</ListBucketResult>",
             i);
  else
    snprintf(body + len, 16384 - len, "<IsTruncated>false</IsTruncated></ListBucketResult>");
  return body;
}

static void handler(void *arg, const char *method, const char *path, const char *query,
                    struct fake_s3_reply *r) {
  (void)arg;
  char v[64];
  bool id_q = fake_s3_query(query, "uploadId", v, sizeof(v));
  const char *key = strncmp(path, BUCKET, strlen(BUCKET)) == 0 ? path + strlen(BUCKET) : "";
  if (strcmp(method, "GET") == 0 && fake_s3_query(query, "list-type", v, sizeof(v))) {
    r->body = list_objects(query);
    return;
  }
  if (strcmp(method, "HEAD") == 0) {
    r->status = has_key(key) ? 200 : 404;
    r->head_size = 1;
    return;
  }
  if (strcmp(method, "PUT") == 0 && !id_q) add_key(key);       /* Not an upload's part. */
  if (strcmp(method, "DELETE") == 0 && !id_q) remove_key(key); /* Not an abort. */
  if (!fake_s3_answer_probe(method, query, r)) r->status = 404;
}

/* The keys the server was asked to delete (not the probe's), comma-separated. */
static void deleted_keys(struct fake_s3 *srv, char *buf, size_t len) {
  buf[0] = '\0';
  char line[2048];
  for (size_t i = 0; i < fake_s3_requests(srv); i++) {
    fake_s3_request(srv, i, line, sizeof(line));
    if (strncmp(line, "DELETE " BUCKET, 7 + strlen(BUCKET)) != 0 || strchr(line, '?') ||
        strstr(line, ".stk-") || strstr(line, "probe"))
      continue;
    size_t n = strlen(buf);
    snprintf(buf + n, len - n, "%s%s", n ? "," : "", line + 7 + strlen(BUCKET));
  }
}

static void test_s3_store(void **state) {
  (void)state;
  struct fx f;
  struct fx_fake_s3 s;
  fx_fake_s3_init(&f, &s, handler, 2);
  f.opts.key_prefix = "dep";
  f.opts.orphan_attempt_grace_ms = GRACE_MS;
  f.opts.attempt_timeout_ms = 60000;
  assert_int_equal(fx_open(&f), 0);
  char live[65], key[256];
  assert_int_equal(fx_begin(&f, "job", 7, 1, live), 0);
  snprintf(key, sizeof(key), "store/dep/job/step-000000000007/attempt-%s/rank-00000-0000.bin",
           live);
  add_key(key);
  const char *kept[] = {
      "store/dep/old/step-000000000003/attempt-" IMPORTED "/manifest.pb",
      "store/dep/old/step-000000000003/attempt-" IMPORTED "/rank-00000-0000.bin",
      "store/dep/job/not-a-step/attempt-x/r.bin",
      "store/other/job/step-000000000001/attempt-" ORPHAN_A "/r.bin", /* another prefix */
  };
  for (size_t i = 0; i < 4; i++) add_key(kept[i]);
  /* Spread over pages (two keys a page), one directory across a break. */
  add_key("store/dep/job/step-000000000006/attempt-" ORPHAN_A "/rank-00000-0000.bin");
  add_key("store/dep/job/step-000000000006/attempt-" ORPHAN_A "/rank-00001-0000.bin");
  add_key("store/dep/job/step-000000000006/attempt-" ORPHAN_A "/rank-00002-0000.bin");
  add_key("store/dep/zeta/step-000000000001/attempt-" ORPHAN_B "/rank-00000-0000.bin");
  int64_t planted = fx_now_ms();
  run_until_removed(&f, 2, 15000);
  assert_true(fx_now_ms() - planted >= GRACE_MS);
  assert_int_equal(stats(&f).orphan_attempt_objects_removed, 4);
  fx_run_for(&f, 2000); /* more runs: nothing else goes */
  assert_int_equal(stats(&f).orphan_attempts_removed, 2);
  char got[2048];
  deleted_keys(s.srv, got, sizeof(got));
  assert_string_equal(got,
                      "store/dep/job/step-000000000006/attempt-" ORPHAN_A "/rank-00000-0000.bin,"
                      "store/dep/job/step-000000000006/attempt-" ORPHAN_A "/rank-00001-0000.bin,"
                      "store/dep/job/step-000000000006/attempt-" ORPHAN_A "/rank-00002-0000.bin,"
                      "store/dep/zeta/step-000000000001/attempt-" ORPHAN_B "/rank-00000-0000.bin");
  assert_true(has_key(key));
  for (size_t i = 0; i < 4; i++) assert_true(has_key(kept[i]));
  fx_fake_s3_fini(&f, &s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_file_store),
      cmocka_unit_test(test_default_grace),
      cmocka_unit_test(test_s3_store),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
