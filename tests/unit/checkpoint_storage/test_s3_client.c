/*
 * The S3 client against a real S3-protocol server (s3rver, which checks
 * SigV4 signatures): objects, ranges, multipart, listing, the storage
 * interface on S3, the capability probe, a wrong secret refused, and
 * retries through a fault-injecting proxy (503 SlowDown halves the
 * concurrency limit; connection resets are retried). Exits 77 (skip) when
 * s3rver cannot be installed or started.
 */
#include "fault_proxy.h"
#include "s3_client.h"
#include "s3_probe.h"
#include "s3_thread.h"
#include "s3rver_config.h"
#include "s3rver_fixture.h"
#include "storage.h"

#include "stk_error.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static struct s3rver server;

static struct s3_thread *thread_new(const struct s3_config *cfg) {
  struct s3_thread *s = NULL;
  assert_int_equal(s3_thread_new(cfg, &s), 0);
  return s;
}

static char *pattern(size_t len, unsigned seed) {
  char *b = malloc(len);
  for (size_t i = 0; i < len; i++) b[i] = (char)((i * 131 + seed * 7 + (i >> 9)) & 0xff);
  return b;
}

static int do_op(struct s3_thread *s, struct s3_op op, struct s3_result *res) {
  int err = s3_thread_do(s, &op, res);
  if (err) /* Context for a failing assertion. */
    fprintf(stderr, "# op %d key %s: %s, HTTP %ld %s\n", (int)op.kind, op.key ? op.key : "-",
            stk_errname(err), res->status, res->error_code ? res->error_code : "");
  return err;
}

static void test_object_roundtrip(void **state) {
  (void)state;
  struct s3_config cfg = s3rver_config(server.endpoint);
  struct s3_thread *s = thread_new(&cfg);
  size_t len = (1 << 20) + 17;
  char *data = pattern(len, 1);
  struct s3_result res;
  const char *key = "ckpt/step 1/rank+0.bin"; /* space and '+' exercise encoding */
  assert_int_equal(
      do_op(s, (struct s3_op){.kind = S3_OP_PUT, .key = key, .body = data, .body_len = len}, &res),
      0);
  assert_non_null(res.etag);
  s3_result_clear(&res);
  assert_int_equal(do_op(s, (struct s3_op){.kind = S3_OP_HEAD, .key = key}, &res), 0);
  assert_int_equal(res.content_length, len);
  s3_result_clear(&res);
  assert_int_equal(
      do_op(s,
            (struct s3_op){.kind = S3_OP_GET, .key = key, .range_offset = 1000, .range_len = 4096},
            &res),
      0);
  assert_int_equal(res.body_len, 4096);
  assert_memory_equal(res.body, data + 1000, 4096);
  s3_result_clear(&res);
  /* From an offset to the end, and the whole object. */
  assert_int_equal(
      do_op(s, (struct s3_op){.kind = S3_OP_GET, .key = key, .range_offset = len - 10}, &res), 0);
  assert_int_equal(res.body_len, 10);
  assert_memory_equal(res.body, data + len - 10, 10);
  s3_result_clear(&res);
  assert_int_equal(do_op(s, (struct s3_op){.kind = S3_OP_GET, .key = key}, &res), 0);
  assert_int_equal(res.body_len, len);
  assert_memory_equal(res.body, data, len);
  s3_result_clear(&res);
  assert_int_equal(do_op(s, (struct s3_op){.kind = S3_OP_DELETE, .key = key}, &res), 0);
  s3_result_clear(&res);
  assert_int_equal(do_op(s, (struct s3_op){.kind = S3_OP_HEAD, .key = key}, &res), STK_ENOENT);
  s3_result_clear(&res);
  assert_int_equal(do_op(s, (struct s3_op){.kind = S3_OP_GET, .key = key}, &res), STK_ENOENT);
  assert_string_equal(res.error_code, "NoSuchKey");
  s3_result_clear(&res);
  free(data);
  s3_thread_free(s);
}

static void test_multipart(void **state) {
  (void)state;
  struct s3_config cfg = s3rver_config(server.endpoint);
  struct s3_thread *s = thread_new(&cfg);
  const char *key = "mpu/object.bin";
  size_t part = 5u << 20, last = 12345, total = 2 * part + last;
  char *data = pattern(total, 2);
  struct s3_result res;
  assert_int_equal(do_op(s, (struct s3_op){.kind = S3_OP_MPU_CREATE, .key = key}, &res), 0);
  char *id = res.upload_id;
  res.upload_id = NULL;
  s3_result_clear(&res);
  assert_non_null(id);
  char *etags[3];
  for (int i = 2; i >= 0; i--) { /* any order */
    size_t off = (size_t)i * part, n = i == 2 ? last : part;
    assert_int_equal(do_op(s,
                           (struct s3_op){.kind = S3_OP_MPU_PART,
                                          .key = key,
                                          .upload_id = id,
                                          .part_number = i + 1,
                                          .body = data + off,
                                          .body_len = n},
                           &res),
                     0);
    etags[i] = res.etag;
    res.etag = NULL;
    s3_result_clear(&res);
  }
  struct s3_part parts[3] = {{1, etags[0]}, {2, etags[1]}, {3, etags[2]}};
  assert_int_equal(do_op(s,
                         (struct s3_op){.kind = S3_OP_MPU_COMPLETE,
                                        .key = key,
                                        .upload_id = id,
                                        .parts = parts,
                                        .n_parts = 3},
                         &res),
                   0);
  assert_non_null(res.etag); /* required in the body */
  s3_result_clear(&res);
  assert_int_equal(do_op(s, (struct s3_op){.kind = S3_OP_GET, .key = key}, &res), 0);
  assert_int_equal(res.body_len, total);
  assert_memory_equal(res.body, data, total);
  s3_result_clear(&res);
  for (int i = 0; i < 3; i++) free(etags[i]);
  free(id);
  free(data);
  s3_thread_free(s);
}

static void test_list_pages(void **state) {
  (void)state;
  struct s3_config cfg = s3rver_config(server.endpoint);
  struct s3_thread *s = thread_new(&cfg);
  struct s3_result res;
  char key[64];
  for (int i = 0; i < 5; i++) {
    snprintf(key, sizeof(key), "list/k%d", i);
    assert_int_equal(
        do_op(s,
              (struct s3_op){.kind = S3_OP_PUT, .key = key, .body = key, .body_len = strlen(key)},
              &res),
        0);
    s3_result_clear(&res);
  }
  assert_int_equal(
      do_op(s, (struct s3_op){.kind = S3_OP_PUT, .key = "listx", .body = "x", .body_len = 1}, &res),
      0);
  s3_result_clear(&res);
  int seen = 0, pages = 0;
  char *marker = NULL;
  do {
    assert_int_equal(
        do_op(
            s,
            (struct s3_op){.kind = S3_OP_LIST, .prefix = "list/", .marker = marker, .max_keys = 2},
            &res),
        0);
    free(marker);
    marker = res.next_marker;
    res.next_marker = NULL;
    for (size_t i = 0; i < res.n_entries; i++) {
      assert_int_equal(strncmp(res.entries[i].key, "list/k", 6), 0);
      assert_int_equal(res.entries[i].size, 7);
      seen++;
    }
    pages++;
    bool more = res.truncated;
    s3_result_clear(&res);
    if (!more) break;
  } while (pages < 10);
  free(marker);
  assert_int_equal(seen, 5);
  assert_int_equal(pages, 3);
  s3_thread_free(s);
}

/* A wrong secret gives a signature the server rejects: signing is checked. */
static void test_wrong_secret_refused(void **state) {
  (void)state;
  struct s3_config cfg = s3rver_config(server.endpoint);
  cfg.secret_key = "not-the-secret";
  struct s3_thread *s = thread_new(&cfg);
  struct s3_result res;
  assert_int_equal(
      do_op(s, (struct s3_op){.kind = S3_OP_PUT, .key = "denied", .body = "x", .body_len = 1},
            &res),
      STK_EPERM);
  assert_int_equal(res.status, 403);
  assert_string_equal(res.error_code, "SignatureDoesNotMatch");
  assert_int_equal(res.attempts, 1); /* 4xx are not retried */
  s3_result_clear(&res);
  s3_thread_free(s);
}

/* The probe's verdict on conditional PUT matches what the server does. */
static void test_probe(void **state) {
  (void)state;
  struct s3_config cfg = s3rver_config(server.endpoint);
  struct s3_thread *s = thread_new(&cfg);
  struct s3_caps caps;
  assert_int_equal(s3_probe(s, "probe/", &caps), 0);
  struct s3_result res;
  struct s3_op put = {
      .kind = S3_OP_PUT, .key = "probe/cond", .body = "1", .body_len = 1, .if_none_match = true};
  assert_int_equal(s3_thread_do(s, &put, &res), 0);
  s3_result_clear(&res);
  int second = s3_thread_do(s, &put, &res);
  s3_result_clear(&res);
  assert_int_equal(second, caps.conditional_put ? STK_EEXIST : 0);
  /* s3rver answers 405 to Abort and ListParts: the probe says so. */
  if (!caps.multipart_list_parts) {
    struct s3_op lp = {.kind = S3_OP_MPU_LIST_PARTS, .key = "probe/x", .upload_id = "nope"};
    assert_int_not_equal(s3_thread_do(s, &lp, &res), 0);
    s3_result_clear(&res);
  }
  s3_thread_free(s);
}

static int collect(void *arg, const char *key, uint64_t size) {
  int *n = arg;
  (*n)++;
  return strncmp(key, "objs/", 5) == 0 ? 0 : -1;
}

/* The storage interface on S3: prefix, conditional put, ranged get, multipart. */
static void test_storage_on_s3(void **state) {
  (void)state;
  struct s3_config cfg = s3rver_config(server.endpoint);
  struct storage *st;
  assert_int_equal(storage_open_s3(&cfg, "jobs/j1", &st), 0);
  assert_int_equal(storage_put(st, "objs/a", "hello world", 11, STORAGE_IF_ABSENT), 0);
  assert_int_equal(storage_put(st, "objs/a", "again", 5, STORAGE_IF_ABSENT), STK_EEXIST);
  char buf[16];
  size_t got;
  assert_int_equal(storage_get(st, "objs/a", 6, buf, 16, &got), 0);
  assert_int_equal(got, 5);
  assert_memory_equal(buf, "world", 5);
  uint64_t size;
  assert_int_equal(storage_head(st, "objs/a", &size), 0);
  assert_int_equal(size, 11);
  char *id, *e1;
  assert_int_equal(storage_mpu_begin(st, "objs/b", &id), 0);
  assert_int_equal(storage_mpu_part(st, "objs/b", id, 1, "part-one", 8, &e1), 0);
  struct storage_part p[] = {{1, e1}};
  assert_int_equal(storage_mpu_complete(st, "objs/b", id, p, 1, 0), 0);
  int n = 0;
  assert_int_equal(storage_list(st, "objs/", collect, &n), 0);
  assert_int_equal(n, 2);
  assert_int_equal(storage_delete(st, "objs/a"), 0);
  assert_int_equal(storage_delete(st, "objs/a"), 0);
  assert_int_equal(storage_head(st, "objs/a", &size), STK_ENOENT);
  assert_int_equal(storage_put(st, "../escape", "x", 1, 0), STK_EINVAL);
  free(id);
  free(e1);
  storage_free(st);
  /* It landed under the prefix. */
  struct s3_thread *s = thread_new(&cfg);
  struct s3_result res;
  assert_int_equal(do_op(s, (struct s3_op){.kind = S3_OP_HEAD, .key = "jobs/j1/objs/b"}, &res), 0);
  assert_int_equal(res.content_length, 8);
  s3_result_clear(&res);
  s3_thread_free(s);
}

/* ---- Retries through the fault proxy, on the asynchronous client. ---- */

struct batch {
  int done;
  int failed;
  int max_attempts;
};

static void on_batch_done(void *arg, struct s3_result *res) {
  struct batch *b = arg;
  b->done++;
  if (res->err) b->failed++;
  if (res->attempts > b->max_attempts) b->max_attempts = res->attempts;
}

static void run_batch(struct fault_proxy *proxy, enum fault_kind kind, int faults, int ops,
                      struct s3_stats *ret_stats, struct batch *ret_batch) {
  char endpoint[64];
  snprintf(endpoint, sizeof(endpoint), "http://127.0.0.1:%d", fault_proxy_port(proxy));
  struct s3_config cfg = s3rver_config(endpoint);
  cfg.max_concurrency = 8;
  cfg.recover_every = 1000;
  fault_proxy_set(proxy, kind, faults);
  uv_loop_t loop;
  uv_loop_init(&loop);
  struct s3_client *c;
  assert_int_equal(s3_client_new(&loop, &cfg, &c), 0);
  struct batch b = {0};
  char keys[32][32], body[] = "retry me";
  for (int i = 0; i < ops; i++) {
    snprintf(keys[i], sizeof(keys[i]), "retry/%d/%d", (int)kind, i);
    struct s3_op op = {
        .kind = S3_OP_PUT, .key = keys[i], .body = body, .body_len = sizeof(body) - 1};
    assert_int_equal(s3_client_submit(c, &op, on_batch_done, &b), 0);
  }
  while (b.done < ops) uv_run(&loop, UV_RUN_ONCE);
  s3_client_stats(c, ret_stats);
  s3_client_free(c);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
  *ret_batch = b;
}

static void test_retry_slowdown(void **state) {
  (void)state;
  struct fault_proxy *proxy = fault_proxy_start(server.port);
  assert_non_null(proxy);
  struct s3_stats st;
  struct batch b;
  run_batch(proxy, FAULT_SLOWDOWN, 6, 16, &st, &b);
  assert_int_equal(b.failed, 0);
  assert_int_equal(fault_proxy_injected(proxy), 6);
  assert_true(st.slowdowns >= 6);
  assert_true(st.retries >= 6);
  assert_true(st.min_limit < 8); /* halved on SlowDown */
  assert_true(b.max_attempts >= 2);
  fault_proxy_stop(proxy);
}

static void test_retry_reset(void **state) {
  (void)state;
  struct fault_proxy *proxy = fault_proxy_start(server.port);
  assert_non_null(proxy);
  struct s3_stats st;
  struct batch b;
  run_batch(proxy, FAULT_RESET, 4, 8, &st, &b);
  assert_int_equal(b.failed, 0);
  assert_int_equal(fault_proxy_injected(proxy), 4);
  assert_true(st.retries >= 4);
  assert_int_equal(st.slowdowns, 0);
  assert_int_equal(st.min_limit, 8); /* resets do not shrink the limit */
  fault_proxy_stop(proxy);
}

/* Faults that outlast the attempts: the operation fails with the last error. */
static void test_retry_exhausted(void **state) {
  (void)state;
  struct fault_proxy *proxy = fault_proxy_start(server.port);
  char endpoint[64];
  snprintf(endpoint, sizeof(endpoint), "http://127.0.0.1:%d", fault_proxy_port(proxy));
  struct s3_config cfg = s3rver_config(endpoint);
  cfg.max_attempts = 3;
  fault_proxy_set(proxy, FAULT_SLOWDOWN, 1000);
  struct s3_thread *s = thread_new(&cfg);
  struct s3_result res;
  assert_int_equal(do_op(s, (struct s3_op){.kind = S3_OP_HEAD, .key = "x"}, &res), STK_EUNAVAIL);
  assert_int_equal(res.attempts, 3);
  assert_int_equal(res.status, 503);
  s3_result_clear(&res);
  s3_thread_free(s);
  assert_int_equal(fault_proxy_injected(proxy), 3);
  fault_proxy_set(proxy, FAULT_SLOWDOWN, 0);
  fault_proxy_stop(proxy);
}

int main(void) {
  if (s3rver_start(&server) != 0) return 77;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_object_roundtrip),
      cmocka_unit_test(test_multipart),
      cmocka_unit_test(test_list_pages),
      cmocka_unit_test(test_wrong_secret_refused),
      cmocka_unit_test(test_probe),
      cmocka_unit_test(test_storage_on_s3),
      cmocka_unit_test(test_retry_slowdown),
      cmocka_unit_test(test_retry_reset),
      cmocka_unit_test(test_retry_exhausted),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  s3rver_stop(&server);
  return rc;
}
