/*
 * Orphaned multipart uploads: uploads begun directly through the storage
 * API, never journaled (as when the service dies between
 * CreateMultipartUpload's reply and the journal write), are aborted by the
 * service's GC once older than the grace period, at open and periodically;
 * uploads of an attempt in progress, young uploads and keys the service
 * does not write are kept. On file:// (the real backend) and on S3 through
 * a loopback fake that pages ListMultipartUploads two at a time (s3rver
 * does not implement it).
 */
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "ckpt_names.h"
#include "ckpt_svc_fixture.h"
#include "fake_s3_svc_fixture.h"
#include "s3_config.h"
#include "stk_error.h"
#include "storage.h"

#define ORPHAN_ATTEMPT "00000000000000000000000000000bad"

static uint64_t aborted(struct fx *f) {
  struct ckpt_service_stats st;
  ckpt_service_get_stats(f->svc, &st);
  return st.orphan_uploads_aborted;
}

/* Begins an upload of object "rank-00000-0000.bin" of (job, step, attempt). */
static char *begin_upload(struct storage *st, const char *job, int64_t step, const char *attempt) {
  char *key = NULL, *id = NULL;
  assert_int_equal(ckpt_key_object("", job, step, attempt, "rank-00000-0000.bin", &key), 0);
  assert_int_equal(storage_mpu_begin(st, key, &id), 0);
  free(key);
  return id;
}

static int find_id(void *arg, const struct storage_upload *u) {
  const char *want = arg;
  return strcmp(u->upload_id, want) == 0 ? 1 : 0;
}

static bool upload_exists(struct storage *st, const char *id) {
  int rc = storage_mpu_list(st, "", find_id, (void *)id);
  assert_true(rc == 0 || rc == 1);
  return rc == 1;
}

/* Runs the service's loop until n orphans are aborted (or fails). */
static void run_until_aborted(struct fx *f, uint64_t n, uint32_t timeout_ms) {
  int64_t end = fx_now_ms() + timeout_ms;
  while (aborted(f) < n && fx_now_ms() < end) uv_run(&f->loop, UV_RUN_ONCE);
  assert_int_equal(aborted(f), n);
}

/* Periodic GC: after the grace period the orphans go, the live attempt's
 * upload and a foreign key's stay, however long they wait. */
static void test_periodic(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  f.opts.orphan_upload_grace_ms = 400;
  f.opts.attempt_timeout_ms = 60000;
  assert_int_equal(fx_open(&f), 0);
  char live[65];
  assert_int_equal(fx_begin(&f, "job", 7, 1, live), 0);
  struct storage *st;
  assert_int_equal(storage_open(f.url, &st), 0);
  int64_t created = fx_now_ms();
  char *live_id = begin_upload(st, "job", 7, live);
  char *orphan_id = begin_upload(st, "job", 7, ORPHAN_ATTEMPT);
  char *other_job_id = begin_upload(st, "other", 3, "deadbeef");
  char *foreign_id;
  assert_int_equal(storage_mpu_begin(st, "notours/job/x.bin", &foreign_id), 0);
  run_until_aborted(&f, 2, 10000);
  assert_true(fx_now_ms() - created >= 400); /* never before the grace period */
  assert_false(upload_exists(st, orphan_id));
  assert_false(upload_exists(st, other_job_id));
  /* Several more runs (the sweep timer starts one each second here), all
   * four uploads old enough by now: the live and foreign ones stay. */
  fx_run_for(&f, 2500);
  assert_int_equal(aborted(&f), 2);
  assert_true(upload_exists(st, live_id));
  assert_true(upload_exists(st, foreign_id));
  storage_free(st);
  free(live_id);
  free(orphan_id);
  free(other_job_id);
  free(foreign_id);
  fx_fini(&f);
}

/* Moves an upload's begin time (on file://, its key file's mtime) age_ms
 * into the past. */
static void backdate(struct fx *f, const char *id, int64_t age_ms) {
  char path[512];
  snprintf(path, sizeof(path), "%s/.stk-uploads/%s/key", f->data, id);
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  int64_t t = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000 - age_ms;
  struct timespec ts[2] = {{t / 1000, (t % 1000) * 1000000}, {t / 1000, (t % 1000) * 1000000}};
  assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
}

/* At open (after recovery, before serving): old orphans are aborted before
 * open returns; a young one waits for a later run, which aborts it once it
 * is old. The ages are set, not slept: before 2026-11-29 the young upload
 * was begun 300 ms (the grace) before open, and a loaded machine that took
 * longer to open saw it aborted at open too. */
static void test_at_open(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  struct storage *st;
  assert_int_equal(storage_open(f.url, &st), 0);
  char *old_id = begin_upload(st, "job", 1, ORPHAN_ATTEMPT);
  char *young_id = begin_upload(st, "job", 2, ORPHAN_ATTEMPT);
  backdate(&f, old_id, 3600 * 1000);
  f.opts.orphan_upload_grace_ms = 8000; /* Periodic runs every 2 s. */
  assert_int_equal(fx_open(&f), 0);
  assert_int_equal(aborted(&f), 1);
  assert_false(upload_exists(st, old_id));
  assert_true(upload_exists(st, young_id));
  backdate(&f, young_id, 3600 * 1000);
  run_until_aborted(&f, 2, 10000);
  assert_false(upload_exists(st, young_id));
  storage_free(st);
  free(old_id);
  free(young_id);
  fx_fini(&f);
}

/* The default grace (1 h) keeps a fresh orphan. */
static void test_default_grace(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  struct storage *st;
  assert_int_equal(storage_open(f.url, &st), 0);
  char *id = begin_upload(st, "job", 1, ORPHAN_ATTEMPT);
  assert_int_equal(fx_open(&f), 0);
  fx_run_for(&f, 300);
  assert_int_equal(aborted(&f), 0);
  assert_true(upload_exists(st, id));
  storage_free(st);
  free(id);
  fx_fini(&f);
}

/* ---- S3: ListMultipartUploads pages, aborts seen by the server ---- */

#define MAX_UPLOADS 32

/* The fake store's uploads in progress (sorted), shared with its thread. */
static struct fake_s3_upload table[MAX_UPLOADS];
static char keybuf[MAX_UPLOADS][256], idbuf[MAX_UPLOADS][32];
static size_t n_table;
static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;

static int cmp_upload(const void *a, const void *b) {
  const struct fake_s3_upload *x = a, *y = b;
  int c = strcmp(x->key, y->key);
  return c ? c : strcmp(x->id, y->id);
}

static void add_upload(const char *key, const char *id, const char *initiated) {
  pthread_mutex_lock(&table_mu);
  size_t i = 0;
  while (i < MAX_UPLOADS && keybuf[i][0]) i++; /* a free slot */
  assert_true(i < MAX_UPLOADS);
  snprintf(keybuf[i], sizeof(keybuf[0]), "%s", key);
  snprintf(idbuf[i], sizeof(idbuf[0]), "%s", id);
  table[n_table++] = (struct fake_s3_upload){keybuf[i], idbuf[i], initiated};
  qsort(table, n_table, sizeof(table[0]), cmp_upload);
  pthread_mutex_unlock(&table_mu);
}

static void remove_upload(const char *id) {
  pthread_mutex_lock(&table_mu);
  for (size_t i = 0; i < n_table; i++) {
    if (strcmp(table[i].id, id) != 0) continue;
    ((char *)table[i].key)[0] = '\0'; /* frees the slot */
    memmove(&table[i], &table[i + 1], (n_table - i - 1) * sizeof(table[0]));
    n_table--;
    break;
  }
  pthread_mutex_unlock(&table_mu);
}

static void handler(void *arg, const char *method, const char *path, const char *query,
                    struct fake_s3_reply *r) {
  (void)arg;
  (void)path;
  char v[64];
  if (strcmp(method, "GET") == 0 && fake_s3_query(query, "uploads", v, sizeof(v))) {
    pthread_mutex_lock(&table_mu);
    r->body = fake_s3_list_uploads(table, n_table, query, 2);
    pthread_mutex_unlock(&table_mu);
    return;
  }
  if (strcmp(method, "DELETE") == 0 && fake_s3_query(query, "uploadId", v, sizeof(v)))
    remove_upload(v); /* An abort. */
  if (!fake_s3_answer_probe(method, query, r)) r->status = 404;
}

/* The upload ids the server was asked to abort, comma-separated. */
static void aborted_ids(struct fake_s3 *srv, char *buf, size_t len) {
  buf[0] = '\0';
  char line[2048], id[64];
  for (size_t i = 0; i < fake_s3_requests(srv); i++) {
    fake_s3_request(srv, i, line, sizeof(line));
    const char *q = strchr(line, '?');
    if (strncmp(line, "DELETE ", 7) != 0 || !q ||
        !fake_s3_query(q + 1, "uploadId", id, sizeof(id)) ||
        strcmp(id, FAKE_S3_PROBE_UPLOAD_ID) == 0)
      continue;
    size_t n = strlen(buf);
    snprintf(buf + n, len - n, "%s%s", n ? "," : "", id);
  }
}

/* Orphans spread over pages (two a page; one key with three uploads
 * straddles a page break), a future-dated one (clock skew), one without a
 * time, keys that are not the service's, another deployment's prefix. */
static void fill_store(void) {
  const char *old = "2020-01-01T00:00:00.000Z";
  static char future[32];
  time_t t = time(NULL) + 3600;
  strftime(future, sizeof(future), "%Y-%m-%dT%H:%M:%S.000Z", gmtime(&t));
  char key[256];
  for (int i = 0; i < 3; i++) {
    snprintf(key, sizeof(key), "store/dep/job/step-%012d/attempt-%s/rank-00000-0000.bin", i,
             ORPHAN_ATTEMPT);
    add_upload(key, i == 0 ? "o0" : i == 1 ? "o1" : "o2", old);
  }
  snprintf(key, sizeof(key), "store/dep/job/step-000000000009/attempt-%s/rank-00001-0000.bin",
           ORPHAN_ATTEMPT);
  add_upload(key, "o3a", old);
  add_upload(key, "o3b", old);
  add_upload(key, "o3c", old);
  snprintf(key, sizeof(key), "store/dep/job/step-000000000010/attempt-%s/rank-00000-0000.bin",
           ORPHAN_ATTEMPT);
  add_upload(key, "future", future);
  add_upload("store/dep/job/step-000000000011/attempt-x/rank-00000-0000.bin", "notime", NULL);
  add_upload("store/dep/job/not-a-step/attempt-x/r.bin", "foreign1", old);
  add_upload("store/dep/loose.bin", "foreign2", old);
  add_upload("store/other/job/step-000000000001/attempt-y/r.bin", "otherprefix", old);
}

static void test_s3_pages(void **state) {
  (void)state;
  fill_store();
  struct fx f;
  struct fx_fake_s3 s;
  fx_fake_s3_init(&f, &s, handler, 2);
  f.opts.key_prefix = "dep";
  f.opts.orphan_upload_grace_ms = 1000;
  f.opts.attempt_timeout_ms = 60000;
  assert_int_equal(fx_open(&f), 0);
  /* At open: every page listed, exactly the old orphans aborted. */
  char ids[512];
  aborted_ids(s.srv, ids, sizeof(ids));
  assert_string_equal(ids, "o0,o1,o2,o3a,o3b,o3c");
  assert_int_equal(aborted(&f), 6);
  /* A live attempt's uploads, old by the store's clock, survive the
   * periodic runs (due every 250 ms here, started by the sweep timer, every
   * second with this attempt timeout). */
  char live[65], key[256];
  assert_int_equal(fx_begin(&f, "job", 7, 1, live), 0);
  snprintf(key, sizeof(key), "store/dep/job/step-000000000007/attempt-%s/rank-00000-0000.bin",
           live);
  add_upload(key, "live1", "2020-01-01T00:00:00Z");
  add_upload(key, "live2", "2020-01-01T00:00:00Z");
  size_t before = fake_s3_requests(s.srv);
  fx_run_for(&f, 2500);
  assert_true(fake_s3_requests(s.srv) >= before + 2 * 3); /* two more listings of three pages */
  aborted_ids(s.srv, ids, sizeof(ids));
  assert_string_equal(ids, "o0,o1,o2,o3a,o3b,o3c");
  assert_int_equal(aborted(&f), 6);
  fx_fake_s3_fini(&f, &s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_periodic),
      cmocka_unit_test(test_at_open),
      cmocka_unit_test(test_default_grace),
      cmocka_unit_test(test_s3_pages),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
