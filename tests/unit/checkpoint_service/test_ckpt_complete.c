/*
 * A CompleteMultipartUpload whose answer is lost: the loopback fake S3 of
 * ../checkpoint_storage completes the upload, then answers 500 (as a store
 * does to the retries of an upload it already completed). The service
 * HEADs the object, finds it complete at its sealed size and commits; an
 * object of another size is not taken for it.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ckpt_svc_fixture.h"
#include "fake_s3_svc_fixture.h"
#include "s3_config.h"
#include "stk_error.h"
#include "storage.h"

#define OBJECT_BYTES ((uint64_t)6 << 20) /* Two parts of 5 MiB + 1 MiB. */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static bool completed;
static uint64_t head_size; /* What HEAD of the completed object announces. */
static int completes;

static bool ends_with(const char *s, const char *tail) {
  size_t n = strlen(s), m = strlen(tail);
  return n >= m && strcmp(s + n - m, tail) == 0;
}

static void handler(void *arg, const char *method, const char *path, const char *query,
                    struct fake_s3_reply *r) {
  (void)arg;
  char v[64];
  bool id_q = fake_s3_query(query, "uploadId", v, sizeof(v));
  bool list_q = fake_s3_query(query, "list-type", v, sizeof(v));
  bool object = ends_with(path, "/rank-00000-0000.bin");
  pthread_mutex_lock(&mu);
  if (strcmp(method, "GET") == 0 && list_q) {
    r->body = strdup("<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>");
  } else if (strcmp(method, "POST") == 0 && id_q) {
    completes++;
    if (object) completed = true; /* Done, but the answer never arrives. */
    r->status = 500;
    r->body = strdup("<Error><Code>InternalError</Code></Error>");
  } else if (strcmp(method, "HEAD") == 0 && object && completed) {
    r->head_size = head_size;
  } else if (strcmp(method, "HEAD") == 0 || (strcmp(method, "GET") == 0 && id_q)) {
    r->status = 404;
  } else if (!fake_s3_answer_probe(method, query, r)) {
    r->status = 404;
  }
  pthread_mutex_unlock(&mu);
}

static void on_ev(void *arg, enum ckpt_write_event ev, int err, const char *msg) {
  (void)arg;
  (void)ev;
  (void)err;
  (void)msg;
}

/* Begins job "c" step `step` at world 1 and writes one 6 MiB blob; returns
 * Commit's answer. */
static int save(struct fx *f, int64_t step, char *msg, size_t len) {
  char att[65];
  assert_int_equal(fx_begin(f, "c", step, 1, att), 0);
  struct ckpt_writer *w;
  assert_int_equal(ckpt_write_open(f->svc, att, 0, on_ev, NULL, &w), 0);
  struct chunk_1d c = {.attempt = att,
                       .rank = 0,
                       .tensor = "blob",
                       .dtype = STOKER__V1__DTYPE__DTYPE_BYTES,
                       .dim = OBJECT_BYTES,
                       .off = 0,
                       .size = OBJECT_BYTES,
                       .data_len = OBJECT_BYTES,
                       .last = true};
  assert_int_equal(fx_feed_1d(w, &c), 0);
  int err = fx_commit(f, att, msg, len);
  ckpt_write_close(w);
  return err;
}

static void test_lost_complete_answer(void **state) {
  (void)state;
  struct fx f;
  struct fx_fake_s3 s;
  fx_fake_s3_init(&f, &s, handler, 3);
  f.opts.part_bytes = 5 << 20;
  assert_int_equal(fx_open(&f), 0);
  char msg[320];
  head_size = OBJECT_BYTES;
  assert_int_equal(save(&f, 1, msg, sizeof(msg)), 0);
  assert_true(completes >= 1);
  /* An object of another size at the key is not this upload. */
  pthread_mutex_lock(&mu);
  completed = false;
  head_size = OBJECT_BYTES - 1;
  pthread_mutex_unlock(&mu);
  assert_int_not_equal(save(&f, 2, msg, sizeof(msg)), 0);
  assert_non_null(strstr(msg, "complete multipart upload"));
  fx_fake_s3_fini(&f, &s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lost_complete_answer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
