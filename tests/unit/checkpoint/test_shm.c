/*
 * Tests for ckpt_shm, the zero-copy staging directory: the strict segment
 * name check, the refusal of unsafe directories and of segments that are
 * symlinks, hard links, not regular files, empty or too large; mapping the
 * right bytes; recycling into the pool up to its cap; the sweep of
 * segments of unknown attempts and of read files untouched for
 * CKPT_SHM_READ_STALE_S; and the cleanup of a previous instance.
 */
#include <dirent.h>
#include <fcntl.h>
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

#include "ckpt_shm.h"
#include "stk_error.h"

#define ATT "0123456789abcdef0123456789abcdef"

static char root[256], dir[300];

static int setup(void **state) {
  snprintf(root, sizeof(root), "/tmp/ckpt-shm-test-XXXXXX");
  if (!mkdtemp(root)) return -1;
  snprintf(dir, sizeof(dir), "%s/shm", root);
  return 0;
}

static int teardown(void **state) {
  char cmd[400];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
  return system(cmd) == 0 ? 0 : -1;
}

static void put_file(const char *name, size_t len, char fill) {
  char path[700];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
  assert_true(fd >= 0);
  char *b = malloc(len ? len : 1);
  memset(b, fill, len);
  assert_int_equal(write(fd, b, len), (ssize_t)len);
  free(b);
  close(fd);
}

static bool exists(const char *name) {
  char path[700];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  struct stat st;
  return lstat(path, &st) == 0;
}

static int count_prefix(const char *prefix) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
  closedir(d);
  return n;
}

static void test_names(void **state) {
  assert_int_equal(ckpt_shm_check_name("seg-" ATT "-3-0", ATT, 3), 0);
  assert_int_equal(ckpt_shm_check_name("seg-" ATT "-3-00ff00ff00ff00ff", ATT, 3), 0);
  const char *bad[] = {"",
                       "../x",
                       "/dev/shm/seg-" ATT "-3-1",
                       "seg-" ATT "-3-",
                       "seg-" ATT "-3-1/../../x",
                       "seg-" ATT "-3-..",
                       "seg-" ATT "-4-1",
                       "seg-" ATT "-30-1",
                       "seg-" ATT "-03-1",
                       "seg-ffffffffffffffffffffffffffffffff-3-1",
                       "free-0000000000000001",
                       "instance-" ATT,
                       "seg-" ATT "-3-1G",
                       "seg-" ATT "-3-00ff00ff00ff00ff0",
                       "xseg-" ATT "-3-1"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    if (ckpt_shm_check_name(bad[i], ATT, 3) != STK_EINVAL) fail_msg("accepted %s", bad[i]);
  }
  assert_int_equal(ckpt_shm_check_name(NULL, ATT, 3), STK_EINVAL);
  assert_int_equal(ckpt_shm_check_name("seg--3-1", "", 3), STK_EINVAL);
}

static void test_unsafe_dirs(void **state) {
  struct ckpt_shm *m = NULL;
  assert_int_equal(ckpt_shm_open("relative/dir", 1 << 20, 0, &m), STK_EINVAL);
  assert_int_equal(mkdir(dir, 0755), 0); /* Others may read it. */
  assert_int_equal(ckpt_shm_open(dir, 1 << 20, 0, &m), STK_EINVAL);
  assert_int_equal(chmod(dir, 0700), 0);
  char link[400];
  snprintf(link, sizeof(link), "%s/link", root);
  assert_int_equal(symlink(dir, link), 0);
  assert_int_equal(ckpt_shm_open(link, 1 << 20, 0, &m), STK_EINVAL);
  assert_null(m);
  assert_int_equal(ckpt_shm_open(dir, 1 << 20, 0, &m), 0);
  char inst[128];
  snprintf(inst, sizeof(inst), "instance-%s", ckpt_shm_token(m));
  assert_true(exists(inst));
  assert_int_equal(strlen(ckpt_shm_token(m)), 32);
  ckpt_shm_close(m);
  assert_false(exists(inst));
}

static void test_map_checks(void **state) {
  struct ckpt_shm *m;
  assert_int_equal(ckpt_shm_open(dir, 4096, 0, &m), 0);
  struct ckpt_shm_seg *seg = NULL;
  put_file("seg-" ATT "-0-1", 100, 'x');
  assert_int_equal(ckpt_shm_map(m, "seg-" ATT "-0-1", &seg), 0);
  assert_int_equal(seg->size, 100);
  for (int i = 0; i < 100; i++) assert_int_equal(seg->map[i], 'x');
  ckpt_shm_unmap(seg);
  assert_true(exists("seg-" ATT "-0-1")); /* Not taken: left alone. */

  char target[700], path[700];
  snprintf(target, sizeof(target), "%s/seg-" ATT "-0-1", dir);
  snprintf(path, sizeof(path), "%s/seg-" ATT "-0-2", dir);
  assert_int_equal(symlink(target, path), 0);
  assert_int_equal(ckpt_shm_map(m, "seg-" ATT "-0-2", &seg), STK_EINVAL);
  snprintf(path, sizeof(path), "%s/seg-" ATT "-0-3", dir);
  assert_int_equal(link(target, path), 0); /* Two links: could alias another file. */
  assert_int_equal(ckpt_shm_map(m, "seg-" ATT "-0-3", &seg), STK_EINVAL);
  snprintf(path, sizeof(path), "%s/seg-" ATT "-0-4", dir);
  assert_int_equal(mkfifo(path, 0600), 0);
  assert_int_equal(ckpt_shm_map(m, "seg-" ATT "-0-4", &seg), STK_EINVAL);
  put_file("seg-" ATT "-0-5", 0, 0);
  assert_int_equal(ckpt_shm_map(m, "seg-" ATT "-0-5", &seg), STK_EINVAL);
  put_file("seg-" ATT "-0-6", 4097, 'y');
  assert_int_equal(ckpt_shm_map(m, "seg-" ATT "-0-6", &seg), STK_EINVAL);
  assert_int_equal(ckpt_shm_map(m, "seg-" ATT "-0-7", &seg), STK_EINVAL); /* Missing. */
  assert_int_equal(ckpt_shm_map(m, "../shm/seg-" ATT "-0-1", &seg), STK_EINVAL);
  assert_int_equal(ckpt_shm_map(m, "..", &seg), STK_EINVAL);
  ckpt_shm_close(m);
}

static void test_pool_and_release(void **state) {
  struct ckpt_shm *m;
  assert_int_equal(ckpt_shm_open(dir, 1 << 20, 250, &m), 0);
  const char *names[] = {"seg-" ATT "-1-a", "seg-" ATT "-1-b", "seg-" ATT "-1-c"};
  for (int i = 0; i < 3; i++) {
    put_file(names[i], 100, 'z');
    struct ckpt_shm_seg *seg;
    assert_int_equal(ckpt_shm_map(m, names[i], &seg), 0);
    ckpt_shm_release(m, seg);
    assert_false(exists(names[i]));
  }
  /* Two fit the 250-byte pool; the third was removed. */
  assert_int_equal(count_prefix("free-"), 2);
  assert_int_equal(ckpt_shm_pool_bytes(m), 200);
  /* A client claims one by renaming it: the pool makes room again. */
  DIR *d = opendir(dir);
  struct dirent *e;
  char from[700] = "", to[700];
  while ((e = readdir(d)) != NULL)
    if (strncmp(e->d_name, "free-", 5) == 0) snprintf(from, sizeof(from), "%s/%s", dir, e->d_name);
  closedir(d);
  snprintf(to, sizeof(to), "%s/seg-" ATT "-1-d", dir);
  assert_int_equal(rename(from, to), 0);
  struct ckpt_shm_seg *seg;
  assert_int_equal(ckpt_shm_map(m, "seg-" ATT "-1-d", &seg), 0);
  ckpt_shm_release(m, seg);
  assert_int_equal(count_prefix("free-"), 2);
  assert_int_equal(ckpt_shm_pool_bytes(m), 200);
  ckpt_shm_close(m); /* Removes the pool, the instance file and the empty dir. */
  struct stat st;
  assert_int_not_equal(stat(dir, &st), 0);
}

static bool keep_att(void *arg, const char *attempt) {
  return strcmp(attempt, arg) == 0;
}

static void test_sweep_and_stale(void **state) {
  struct ckpt_shm *m;
  assert_int_equal(ckpt_shm_open(dir, 1 << 20, 0, &m), 0);
  put_file("seg-" ATT "-0-1", 10, 'a');
  put_file("seg-ffffffffffffffffffffffffffffffff-0-1", 10, 'a');
  put_file("unrelated", 10, 'a');
  put_file("read-01", 10, 'a'); /* A read in progress. */
  put_file("read-02", 10, 'a'); /* A dead client's. */
  char path[700];
  snprintf(path, sizeof(path), "%s/read-02", dir);
  struct timespec old[2] = {{.tv_sec = time(NULL) - CKPT_SHM_READ_STALE_S - 5},
                            {.tv_sec = time(NULL) - CKPT_SHM_READ_STALE_S - 5}};
  assert_int_equal(utimensat(AT_FDCWD, path, old, 0), 0);
  assert_int_equal(ckpt_shm_sweep(m, keep_att, ATT), 2);
  assert_true(exists("seg-" ATT "-0-1"));
  assert_false(exists("seg-ffffffffffffffffffffffffffffffff-0-1"));
  assert_true(exists("read-01"));
  assert_false(exists("read-02"));
  /* A new instance (after a kill -9) removes everything of the old one. */
  put_file("free-0000000000000009", 10, 'a');
  put_file("instance-00000000000000000000000000000000", 0, 0);
  struct ckpt_shm *m2;
  assert_int_equal(ckpt_shm_open(dir, 1 << 20, 0, &m2), 0);
  assert_int_equal(count_prefix("seg-"), 0);
  assert_int_equal(count_prefix("free-"), 0);
  assert_int_equal(count_prefix("read-"), 0);
  assert_int_equal(count_prefix("instance-"), 1); /* Only the new instance's. */
  ckpt_shm_close(m2);
  ckpt_shm_close(m);
  assert_true(exists("unrelated"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names),
      cmocka_unit_test_setup_teardown(test_unsafe_dirs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_map_checks, setup, teardown),
      cmocka_unit_test_setup_teardown(test_pool_and_release, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sweep_and_stale, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
