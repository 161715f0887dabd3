/*
 * storage_submit, the asynchronous object calls: on file:// a request is
 * answered inline in the submitting thread (bad arguments on any store
 * too); on S3 storage_submit returns while the store still holds the
 * request, and the answer comes from the S3 engine's thread, with the
 * bytes of a ranged GET exact and several requests out at once.
 */
#include "storage.h"

#include "fake_s3.h"
#include "fs_fixture.h"
#include "stk_error.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

/* One answer, kept for the test to read. */
struct answer {
  atomic_int fired;
  pthread_t thread;
  struct storage_result res;
};

static void on_answer(void *arg, struct storage_result *res) {
  struct answer *a = arg;
  a->thread = pthread_self();
  a->res = *res;
  memset(res, 0, sizeof(*res)); /* Moved out. */
  atomic_fetch_add(&a->fired, 1);
}

static void wait_fired(struct answer *a) {
  for (int i = 0; i < 5000 && !atomic_load(&a->fired); i++) usleep(1000);
  assert_int_equal(atomic_load(&a->fired), 1);
}

/* ---- file:// ---- */

static void test_fs_inline(void **state) {
  struct fs_fixture *f = *state;
  const char data[] = "0123456789";
  struct answer put = {0}, get = {0}, head = {0};
  struct storage_req rq = {.op = STORAGE_OP_PUT, .key = "a/b", .data = data, .len = 10};
  storage_submit(f->st, &rq, on_answer, &put);
  assert_int_equal(atomic_load(&put.fired), 1); /* Before storage_submit returned. */
  assert_true(pthread_equal(put.thread, pthread_self()));
  assert_int_equal(put.res.err, 0);
  char buf[8] = {0};
  rq = (struct storage_req){.op = STORAGE_OP_GET, .key = "a/b", .buf = buf, .len = 4, .offset = 3};
  storage_submit(f->st, &rq, on_answer, &get);
  assert_int_equal(atomic_load(&get.fired), 1);
  assert_int_equal(get.res.err, 0);
  assert_int_equal(get.res.len, 4);
  assert_memory_equal(buf, "3456", 4);
  rq = (struct storage_req){.op = STORAGE_OP_HEAD, .key = "a/b"};
  storage_submit(f->st, &rq, on_answer, &head);
  assert_int_equal(head.res.size, 10);
  assert_true(storage_caps(f->st)->completes_inline);
}

static void test_fs_multipart(void **state) {
  struct fs_fixture *f = *state;
  struct answer begin = {0}, part = {0}, done = {0};
  struct storage_req rq = {.op = STORAGE_OP_MPU_BEGIN, .key = "m"};
  storage_submit(f->st, &rq, on_answer, &begin);
  assert_int_equal(begin.res.err, 0);
  assert_non_null(begin.res.upload_id);
  rq = (struct storage_req){.op = STORAGE_OP_MPU_PART,
                            .key = "m",
                            .upload_id = begin.res.upload_id,
                            .number = 1,
                            .data = "xyz",
                            .len = 3};
  storage_submit(f->st, &rq, on_answer, &part);
  assert_int_equal(part.res.err, 0);
  assert_non_null(part.res.etag);
  struct storage_part sp = {1, part.res.etag};
  rq = (struct storage_req){.op = STORAGE_OP_MPU_COMPLETE,
                            .key = "m",
                            .upload_id = begin.res.upload_id,
                            .parts = &sp,
                            .n_parts = 1};
  storage_submit(f->st, &rq, on_answer, &done);
  assert_int_equal(done.res.err, 0);
  char buf[4];
  size_t got = 0;
  assert_int_equal(storage_get(f->st, "m", 0, buf, 3, &got), 0); /* The blocking wait. */
  assert_memory_equal(buf, "xyz", 3);
  storage_result_clear(&begin.res);
  storage_result_clear(&part.res);
}

/* Refused arguments are answered through the callback, with a detail. */
static void test_bad_request_answered(void **state) {
  struct fs_fixture *f = *state;
  struct answer a = {0}, b = {0};
  struct storage_req rq = {.op = STORAGE_OP_PUT, .key = "../x", .data = "1", .len = 1};
  storage_submit(f->st, &rq, on_answer, &a);
  assert_int_equal(atomic_load(&a.fired), 1);
  assert_int_equal(a.res.err, STK_EINVAL);
  assert_true(a.res.detail[0] != '\0');
  rq = (struct storage_req){.op = STORAGE_OP_MPU_PART, .key = "k", .upload_id = "u", .number = 0};
  storage_submit(f->st, &rq, on_answer, &b);
  assert_int_equal(b.res.err, STK_EINVAL);
}

/* ---- S3 ---- */

#define OBJ "0123456789abcdefghijklmnopqrstuvwxyz"

static atomic_int held;     /* PUTs the fake holds unanswered. */
static atomic_int released; /* Set: the fake answers them. */

static void handler(void *arg, const char *method, const char *path, const char *query,
                    struct fake_s3_reply *r) {
  (void)arg;
  if (strstr(path, "/async/") && strcmp(method, "PUT") == 0) {
    atomic_fetch_add(&held, 1);
    while (!atomic_load(&released)) usleep(1000);
    atomic_fetch_sub(&held, 1);
    snprintf(r->etag, sizeof(r->etag), "\"e\"");
  } else if (strstr(path, "/async/") && strcmp(method, "GET") == 0) {
    r->body = strndup(OBJ + 5, 10); /* The range the test asks for. */
  } else if (!fake_s3_answer_probe(method, query, r)) {
    r->status = 404;
  }
}

static void test_s3_submit_returns_first(void **state) {
  (void)state;
  atomic_store(&held, 0);
  atomic_store(&released, 0);
  struct fake_s3 *srv = fake_s3_start(handler, NULL);
  assert_non_null(srv);
  struct s3_config cfg = fake_s3_config(srv, 1);
  struct storage *st;
  assert_int_equal(storage_open_s3(&cfg, "p", &st), 0);
  assert_false(storage_caps(st)->completes_inline);
  struct answer put = {0};
  struct storage_req rq = {.op = STORAGE_OP_PUT, .key = "async/one", .data = OBJ, .len = 36};
  storage_submit(st, &rq, on_answer, &put);
  /* The store holds the PUT, and the caller is already back. */
  for (int i = 0; i < 5000 && !atomic_load(&held); i++) usleep(1000);
  assert_int_equal(atomic_load(&held), 1);
  assert_int_equal(atomic_load(&put.fired), 0);
  atomic_store(&released, 1);
  wait_fired(&put);
  assert_int_equal(put.res.err, 0);
  assert_false(pthread_equal(put.thread, pthread_self())); /* The engine's thread. */
  char buf[16] = {0};
  struct answer get = {0};
  rq = (struct storage_req){
      .op = STORAGE_OP_GET, .key = "async/one", .buf = buf, .len = 10, .offset = 5};
  storage_submit(st, &rq, on_answer, &get);
  wait_fired(&get);
  assert_int_equal(get.res.err, 0);
  assert_int_equal(get.res.len, 10);
  assert_memory_equal(buf, OBJ + 5, 10);
  storage_free(st);
  fake_s3_stop(srv);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_fs_inline, fs_setup, fs_teardown),
      cmocka_unit_test_setup_teardown(test_fs_multipart, fs_setup, fs_teardown),
      cmocka_unit_test_setup_teardown(test_bad_request_answered, fs_setup, fs_teardown),
      cmocka_unit_test(test_s3_submit_returns_first),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
