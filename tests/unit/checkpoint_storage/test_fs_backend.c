/*
 * The file backend (file:///dir) through the storage interface: atomic and
 * conditional puts, ranged reads, listing, multipart uploads, key
 * validation, and no temp files left behind.
 */
#include "storage.h"

#include "stk_error.h"

#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "fs_fixture.h"

static int count_entries(const char *path) {
  DIR *d = opendir(path);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) n += e->d_name[0] != '.' || strlen(e->d_name) > 2;
  closedir(d);
  return n - (int)0;
}

static void assert_no_temp_files(struct fs_fixture *f) {
  char path[128];
  snprintf(path, sizeof(path), "%s/root/.stk-tmp", f->dir);
  DIR *d = opendir(path);
  assert_non_null(d);
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    assert_true(strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0);
  closedir(d);
}

static void test_put_get_head_delete(void **state) {
  struct fs_fixture *f = *state;
  const char *data = "0123456789abcdef";
  assert_int_equal(storage_put(f->st, "ckpt/step-1/rank-0.bin", data, 16, 0), 0);
  uint64_t size = 0;
  assert_int_equal(storage_head(f->st, "ckpt/step-1/rank-0.bin", &size), 0);
  assert_int_equal(size, 16);
  char buf[32] = {0};
  size_t got = 0;
  assert_int_equal(storage_get(f->st, "ckpt/step-1/rank-0.bin", 4, buf, 6, &got), 0);
  assert_int_equal(got, 6);
  assert_memory_equal(buf, "456789", 6);
  /* A read running past the end is short; one starting past it is an error. */
  assert_int_equal(storage_get(f->st, "ckpt/step-1/rank-0.bin", 10, buf, 32, &got), 0);
  assert_int_equal(got, 6);
  assert_memory_equal(buf, "abcdef", 6);
  assert_int_equal(storage_get(f->st, "ckpt/step-1/rank-0.bin", 16, buf, 1, &got), STK_ERANGE);
  assert_int_equal(storage_get(f->st, "ckpt/step-1/rank-0.bin", 99, buf, 1, &got), STK_ERANGE);
  /* A directory is not an object. */
  assert_int_equal(storage_head(f->st, "ckpt/step-1", &size), STK_ENOENT);
  assert_int_equal(storage_delete(f->st, "ckpt/step-1/rank-0.bin"), 0);
  assert_int_equal(storage_head(f->st, "ckpt/step-1/rank-0.bin", &size), STK_ENOENT);
  assert_int_equal(storage_get(f->st, "ckpt/step-1/rank-0.bin", 0, buf, 1, &got), STK_ENOENT);
  assert_int_equal(storage_delete(f->st, "ckpt/step-1/rank-0.bin"), 0); /* idempotent */
  assert_no_temp_files(f);
}

static void test_conditional_put(void **state) {
  struct fs_fixture *f = *state;
  assert_int_equal(storage_put(f->st, "m/manifest", "first", 5, STORAGE_IF_ABSENT), 0);
  assert_int_equal(storage_put(f->st, "m/manifest", "second", 6, STORAGE_IF_ABSENT), STK_EEXIST);
  char buf[16];
  size_t got;
  assert_int_equal(storage_get(f->st, "m/manifest", 0, buf, sizeof(buf), &got), 0);
  assert_int_equal(got, 5);
  assert_memory_equal(buf, "first", 5);
  /* Unconditional put replaces. */
  assert_int_equal(storage_put(f->st, "m/manifest", "third!", 6, 0), 0);
  assert_int_equal(storage_get(f->st, "m/manifest", 0, buf, sizeof(buf), &got), 0);
  assert_int_equal(got, 6);
  assert_memory_equal(buf, "third!", 6);
  assert_true(storage_caps(f->st)->conditional_put);
  assert_no_temp_files(f);
}

static void test_key_validation(void **state) {
  struct fs_fixture *f = *state;
  const char *bad[] = {"",   "/abs",  "a/../b", "..",         "a/./b",         "a//b",
                       "a/", "a\x01", "x\x7f",  ".stk-tmp/x", "a/.stk-uploads"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    assert_int_equal(storage_put(f->st, bad[i], "x", 1, 0), STK_EINVAL);
  char longkey[STORAGE_KEY_MAX + 2];
  memset(longkey, 'a', sizeof(longkey));
  longkey[sizeof(longkey) - 1] = '\0';
  assert_int_equal(storage_key_check(longkey), STK_EINVAL);
  char longseg[STORAGE_SEGMENT_MAX + 2];
  memset(longseg, 'b', sizeof(longseg));
  longseg[sizeof(longseg) - 1] = '\0';
  assert_int_equal(storage_key_check(longseg), STK_EINVAL);
  assert_int_equal(storage_key_check("ok/name-1_2.bin"), 0);
  assert_int_equal(storage_key_check("a/..b/c.."), 0);
  assert_null(NULL);
  /* Nothing escaped the root. */
  char path[128];
  snprintf(path, sizeof(path), "%s/b", f->dir);
  assert_int_equal(access(path, F_OK), -1);
  struct storage *st;
  assert_int_equal(storage_open("file://relative/dir", &st), STK_EINVAL);
  assert_int_equal(storage_open("ftp://x", &st), STK_EINVAL);
}

struct listed {
  char keys[16][64];
  uint64_t sizes[16];
  int n;
  int stop_after;
};

static int collect(void *arg, const char *key, uint64_t size) {
  struct listed *l = arg;
  if (l->n >= 16) return -1;
  snprintf(l->keys[l->n], 64, "%s", key);
  l->sizes[l->n++] = size;
  return l->stop_after && l->n >= l->stop_after ? 42 : 0;
}

static int find_key(const struct listed *l, const char *key) {
  for (int i = 0; i < l->n; i++)
    if (strcmp(l->keys[i], key) == 0) return i;
  return -1;
}

static void test_list_prefix(void **state) {
  struct fs_fixture *f = *state;
  assert_int_equal(storage_put(f->st, "job/step-10/a", "1", 1, 0), 0);
  assert_int_equal(storage_put(f->st, "job/step-10/b/c", "22", 2, 0), 0);
  assert_int_equal(storage_put(f->st, "job/step-11/a", "333", 3, 0), 0);
  assert_int_equal(storage_put(f->st, "other", "4444", 4, 0), 0);
  char *id;
  assert_int_equal(storage_mpu_begin(f->st, "job/step-10/big", &id), 0);
  struct listed l = {0};
  assert_int_equal(storage_list(f->st, "job/step-10/", collect, &l), 0);
  assert_int_equal(l.n, 2);
  assert_int_equal(l.sizes[find_key(&l, "job/step-10/b/c")], 2);
  assert_true(find_key(&l, "job/step-10/a") >= 0);
  memset(&l, 0, sizeof(l));
  assert_int_equal(storage_list(f->st, "job/step-1", collect, &l), 0); /* not a segment boundary */
  assert_int_equal(l.n, 3);
  memset(&l, 0, sizeof(l));
  assert_int_equal(storage_list(f->st, "", collect, &l), 0); /* bookkeeping never listed */
  assert_int_equal(l.n, 4);
  memset(&l, 0, sizeof(l));
  l.stop_after = 1;
  assert_int_equal(storage_list(f->st, "", collect, &l), 42);
  assert_int_equal(l.n, 1);
  assert_int_equal(storage_list(f->st, "../", collect, &l), STK_EINVAL);
  assert_int_equal(storage_mpu_abort(f->st, "job/step-10/big", id), 0);
  free(id);
}

static void test_multipart(void **state) {
  struct fs_fixture *f = *state;
  char *id = NULL, *e1 = NULL, *e2 = NULL, *e3 = NULL, *e2b = NULL;
  assert_int_equal(storage_mpu_begin(f->st, "big/object", &id), 0);
  /* Parts arrive out of order; part 2 is sent twice and the second wins. */
  assert_int_equal(storage_mpu_part(f->st, "big/object", id, 3, "CC", 2, &e3), 0);
  assert_int_equal(storage_mpu_part(f->st, "big/object", id, 1, "AAAA", 4, &e1), 0);
  assert_int_equal(storage_mpu_part(f->st, "big/object", id, 2, "xx", 2, &e2), 0);
  assert_int_equal(storage_mpu_part(f->st, "big/object", id, 2, "BBB", 3, &e2b), 0);
  assert_string_not_equal(e2, e2b);
  assert_int_equal(storage_mpu_part(f->st, "wrong/key", id, 1, "A", 1, &e1), STK_ENOENT);
  assert_int_equal(storage_mpu_part(f->st, "big/object", id, 0, "A", 1, &e1), STK_EINVAL);
  assert_int_equal(storage_mpu_part(f->st, "big/object", id, 10001, "A", 1, &e1), STK_EINVAL);
  /* A stale ETag or unordered list is refused and changes nothing. */
  struct storage_part stale[] = {{1, e1}, {2, e2}, {3, e3}};
  assert_int_equal(storage_mpu_complete(f->st, "big/object", id, stale, 3, 0), STK_EINVAL);
  struct storage_part unordered[] = {{2, e2b}, {1, e1}};
  assert_int_equal(storage_mpu_complete(f->st, "big/object", id, unordered, 2, 0), STK_EINVAL);
  uint64_t size;
  assert_int_equal(storage_head(f->st, "big/object", &size), STK_ENOENT);
  /* Conditional complete over an existing key is refused; the upload stays. */
  assert_int_equal(storage_put(f->st, "big/object", "old", 3, 0), 0);
  struct storage_part good[] = {{1, e1}, {2, e2b}, {3, e3}};
  assert_int_equal(storage_mpu_complete(f->st, "big/object", id, good, 3, STORAGE_IF_ABSENT),
                   STK_EEXIST);
  assert_int_equal(storage_delete(f->st, "big/object"), 0);
  assert_int_equal(storage_mpu_complete(f->st, "big/object", id, good, 3, STORAGE_IF_ABSENT), 0);
  char buf[16];
  size_t got;
  assert_int_equal(storage_get(f->st, "big/object", 0, buf, sizeof(buf), &got), 0);
  assert_int_equal(got, 9);
  assert_memory_equal(buf, "AAAABBBCC", 9);
  /* The upload is gone once completed. */
  assert_int_equal(storage_mpu_abort(f->st, "big/object", id), STK_ENOENT);
  assert_int_equal(storage_mpu_complete(f->st, "big/object", id, good, 3, 0), STK_ENOENT);
  char path[160];
  snprintf(path, sizeof(path), "%s/root/.stk-uploads", f->dir);
  assert_int_equal(count_entries(path), 0);
  free(id);
  free(e1);
  free(e2);
  free(e3);
  free(e2b);
  assert_no_temp_files(f);
}

static void test_multipart_abort(void **state) {
  struct fs_fixture *f = *state;
  char *id, *e1;
  assert_int_equal(storage_mpu_begin(f->st, "x/y", &id), 0);
  assert_int_equal(storage_mpu_part(f->st, "x/y", id, 1, "data", 4, &e1), 0);
  assert_int_equal(storage_mpu_abort(f->st, "x/y", id), 0);
  struct storage_part p[] = {{1, e1}};
  assert_int_equal(storage_mpu_complete(f->st, "x/y", id, p, 1, 0), STK_ENOENT);
  assert_int_equal(storage_mpu_abort(f->st, "x/y", "not-an-id"), STK_ENOENT);
  assert_int_equal(storage_mpu_abort(f->st, "x/y", "../../etc"), STK_ENOENT);
  uint64_t size;
  assert_int_equal(storage_head(f->st, "x/y", &size), STK_ENOENT);
  free(id);
  free(e1);
}

/* A second handle on the same root sees what the first wrote (durable files). */
static void test_reopen(void **state) {
  struct fs_fixture *f = *state;
  assert_int_equal(storage_put(f->st, "persist", "yes", 3, 0), 0);
  char url[96];
  snprintf(url, sizeof(url), "file://%s/root", f->dir);
  struct storage *again;
  assert_int_equal(storage_open(url, &again), 0);
  uint64_t size;
  assert_int_equal(storage_head(again, "persist", &size), 0);
  assert_int_equal(size, 3);
  storage_free(again);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_put_get_head_delete, fs_setup, fs_teardown),
      cmocka_unit_test_setup_teardown(test_conditional_put, fs_setup, fs_teardown),
      cmocka_unit_test_setup_teardown(test_key_validation, fs_setup, fs_teardown),
      cmocka_unit_test_setup_teardown(test_list_prefix, fs_setup, fs_teardown),
      cmocka_unit_test_setup_teardown(test_multipart, fs_setup, fs_teardown),
      cmocka_unit_test_setup_teardown(test_multipart_abort, fs_setup, fs_teardown),
      cmocka_unit_test_setup_teardown(test_reopen, fs_setup, fs_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
