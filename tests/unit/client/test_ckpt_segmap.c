/*
 * The client's mapped staging segments (client/c/ckpt_segmap.c) on a real
 * tmpfs directory, with the service's side played by hand (renaming a
 * handed-over segment into the pool, removing it): a recycled file is
 * claimed again with the very mapping kept from before (no new mapping,
 * pages known allocated), the process's own files are preferred over
 * foreign ones, a planted symlink in the pool is never followed, a file
 * the service removed is unmapped at the next prune, and a segment never
 * handed over is removed.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "ckpt_internal.h"
#include "stk_error.h"

#define CAP ((uint64_t)1 << 20)

static char dir[128];
static int dirfd_;

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof(dir), "/dev/shm/stoker-segmap-XXXXXX");
  if (!mkdtemp(dir)) {
    snprintf(dir, sizeof(dir), "/tmp/stoker-segmap-XXXXXX");
    if (!mkdtemp(dir)) return -1;
  }
  dirfd_ = open(dir, O_RDONLY | O_DIRECTORY);
  return dirfd_ < 0 ? -1 : 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[200];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  close(dirfd_);
  int rc = system(cmd);
  ckpt_segmap_prune(); /* Every file is gone: nothing stays mapped. */
  return rc == 0 && ckpt_segmap_cached() == 0 ? 0 : -1;
}

static ino_t inode_of(const char *name) {
  struct stat st;
  if (fstatat(dirfd_, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return 0;
  return st.st_ino;
}

static off_t size_of(const char *name) {
  struct stat st;
  return fstatat(dirfd_, name, &st, AT_SYMLINK_NOFOLLOW) == 0 ? st.st_size : -1;
}

static void fill(uint8_t *buf, size_t n, uint8_t seed) {
  for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)(i * 7 + seed);
}

static void check_bytes(const char *name, size_t n, uint8_t seed) {
  int fd = openat(dirfd_, name, O_RDONLY);
  assert_true(fd >= 0);
  uint8_t *got = malloc(n), *want = malloc(n);
  assert_int_equal(pread(fd, got, n, 0), (ssize_t)n);
  fill(want, n, seed);
  assert_memory_equal(got, want, n);
  free(got);
  free(want);
  close(fd);
}

/* Writes n bytes (pattern seed) as one segment and hands it over. */
static struct ckpt_segfile write_segment(const char *name, size_t n, uint8_t seed) {
  struct ckpt_segfile f;
  uint8_t *buf = malloc(n);
  fill(buf, n, seed);
  assert_int_equal(ckpt_segmap_acquire(dirfd_, name, CAP, &f), 0);
  assert_int_equal(ckpt_segmap_write(&f, 0, buf, n / 2), 0);
  assert_int_equal(ckpt_segmap_write(&f, n / 2, buf + n / 2, n - n / 2), 0);
  struct ckpt_segfile copy = f;
  assert_int_equal(ckpt_segmap_complete(&f, n), 0);
  free(buf);
  assert_int_equal(size_of(name), (off_t)n);
  check_bytes(name, n, seed);
  return copy;
}

static void test_recycled_file_reuses_mapping(void **state) {
  (void)state;
  size_t before = ckpt_segmap_cached();
  struct ckpt_segfile a = write_segment("seg-a", 300000, 1);
  assert_true(a.cached);
  assert_int_equal(ckpt_segmap_cached(), before + 1);
  ino_t ino = inode_of("seg-a");
  /* The service uploads it, then recycles it into its pool. */
  assert_int_equal(renameat(dirfd_, "seg-a", dirfd_, "free-0000000000000001"), 0);
  struct ckpt_segfile b;
  assert_int_equal(ckpt_segmap_acquire(dirfd_, "seg-b", CAP, &b), 0);
  assert_int_equal(inode_of("seg-b"), ino);               /* Claimed by rename... */
  assert_int_equal(inode_of("free-0000000000000001"), 0); /* ...so the pool is empty. */
  assert_ptr_equal(b.map, a.map);                         /* The same mapping, no new one. */
  assert_int_equal(b.alloc, 300000);                      /* Its pages are known to exist. */
  assert_int_equal(ckpt_segmap_cached(), before + 1);
  uint8_t buf[5000];
  fill(buf, sizeof(buf), 9);
  assert_int_equal(ckpt_segmap_write(&b, 0, buf, sizeof(buf)), 0);
  assert_int_equal(ckpt_segmap_complete(&b, sizeof(buf)), 0); /* Shrunk to what it holds. */
  assert_int_equal(size_of("seg-b"), (off_t)sizeof(buf));
  check_bytes("seg-b", sizeof(buf), 9);
  /* Beyond the capacity is refused. */
  assert_int_equal(renameat(dirfd_, "seg-b", dirfd_, "free-0000000000000002"), 0);
  assert_int_equal(ckpt_segmap_acquire(dirfd_, "seg-c", CAP, &b), 0);
  assert_int_equal(ckpt_segmap_write(&b, CAP - 10, buf, 11), STK_EINVAL);
  ckpt_segmap_discard(&b, dirfd_, "seg-c");
  assert_int_equal(inode_of("seg-c"), 0);
  assert_int_equal(ckpt_segmap_cached(), before);
}

static void put_file(const char *name, size_t n) {
  int fd = openat(dirfd_, name, O_CREAT | O_WRONLY | O_TRUNC, 0600);
  assert_true(fd >= 0);
  uint8_t *buf = calloc(1, n);
  assert_int_equal(write(fd, buf, n), (ssize_t)n);
  free(buf);
  close(fd);
}

static void test_prefers_own_files(void **state) {
  (void)state;
  write_segment("seg-own", 8192, 3);
  ino_t own = inode_of("seg-own");
  put_file("free-0000000000000000", 4096); /* Another process's, first by name. */
  ino_t foreign = inode_of("free-0000000000000000");
  assert_int_equal(renameat(dirfd_, "seg-own", dirfd_, "free-0000000000000009"), 0);
  struct ckpt_segfile f, g;
  assert_int_equal(ckpt_segmap_acquire(dirfd_, "seg-1", CAP, &f), 0);
  assert_int_equal(inode_of("seg-1"), own);
  /* Then the foreign one, mapped afresh with its pages. */
  assert_int_equal(ckpt_segmap_acquire(dirfd_, "seg-2", CAP, &g), 0);
  assert_int_equal(inode_of("seg-2"), foreign);
  assert_int_equal(g.alloc, 4096);
  assert_ptr_not_equal(g.map, f.map);
  uint8_t buf[6000];
  fill(buf, sizeof(buf), 5);
  assert_int_equal(ckpt_segmap_write(&g, 0, buf, sizeof(buf)), 0); /* Grows past 4096. */
  assert_int_equal(ckpt_segmap_complete(&g, sizeof(buf)), 0);
  check_bytes("seg-2", sizeof(buf), 5);
  /* Nothing left in the pool: a new file. */
  struct ckpt_segfile h;
  assert_int_equal(ckpt_segmap_acquire(dirfd_, "seg-3", CAP, &h), 0);
  assert_int_equal(h.alloc, 0);
  ckpt_segmap_discard(&h, dirfd_, "seg-3");
  ckpt_segmap_discard(&f, dirfd_, "seg-1");
}

static void test_symlink_in_pool_not_followed(void **state) {
  (void)state;
  char target[200];
  snprintf(target, sizeof(target), "%s/victim", dir);
  put_file("victim", 4096);
  assert_int_equal(symlinkat(target, dirfd_, "free-0000000000000005"), 0);
  struct ckpt_segfile f;
  assert_int_equal(ckpt_segmap_acquire(dirfd_, "seg-x", CAP, &f), 0);
  uint8_t buf[4096];
  fill(buf, sizeof(buf), 7);
  assert_int_equal(ckpt_segmap_write(&f, 0, buf, sizeof(buf)), 0);
  assert_int_equal(ckpt_segmap_complete(&f, sizeof(buf)), 0);
  struct stat st;
  assert_int_equal(fstatat(dirfd_, "seg-x", &st, AT_SYMLINK_NOFOLLOW), 0);
  assert_true(S_ISREG(st.st_mode)); /* A file of its own, not the link. */
  int fd = openat(dirfd_, "victim", O_RDONLY);
  uint8_t zero[4096] = {0}, got[4096];
  assert_int_equal(pread(fd, got, sizeof(got), 0), 4096);
  assert_memory_equal(got, zero, sizeof(zero)); /* Untouched. */
  close(fd);
  assert_int_equal(inode_of("free-0000000000000005"), 0);
}

static void test_removed_files_are_unmapped(void **state) {
  (void)state;
  ckpt_segmap_prune();
  size_t before = ckpt_segmap_cached();
  write_segment("seg-p", 4096, 1);
  write_segment("seg-q", 4096, 2);
  assert_int_equal(ckpt_segmap_cached(), before + 2);
  ckpt_segmap_prune(); /* Both still linked: kept. */
  assert_int_equal(ckpt_segmap_cached(), before + 2);
  assert_int_equal(unlinkat(dirfd_, "seg-p", 0), 0); /* The service removed one. */
  ckpt_segmap_prune();
  assert_int_equal(ckpt_segmap_cached(), before + 1);
  assert_int_equal(unlinkat(dirfd_, "seg-q", 0), 0);
  ckpt_segmap_prune();
  assert_int_equal(ckpt_segmap_cached(), before);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_recycled_file_reuses_mapping, setup, teardown),
      cmocka_unit_test_setup_teardown(test_prefers_own_files, setup, teardown),
      cmocka_unit_test_setup_teardown(test_symlink_in_pool_not_followed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_removed_files_are_unmapped, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
