/*
 * Tests for kv (the RocksDB wrapper): the operations every daemon builds
 * on, the error translation at open (locked, corrupted), and the promise
 * the design rests on: a synced write that was acknowledged survives
 * kill -9 of the writer. Every test runs twice: with RocksDB's default
 * memtable and with write_mostly (an unsorted vector memtable, which the
 * coordinator uses), which must read back the same.
 */
#include <fcntl.h>
#include <ftw.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kv.h"
#include "stk_error.h"

extern char **environ;

static struct kv_opts create = {.create_if_missing = true}; /* main() sets write_mostly. */

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  return remove(path);
}

static int setup_dir(void **state) {
  char *dir = strdup("/tmp/stk-kv-XXXXXX");
  if (!mkdtemp(dir)) return -1;
  *state = dir;
  return 0;
}

static int teardown_dir(void **state) {
  nftw(*state, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  free(*state);
  return 0;
}

static struct kv *open_db(const char *dir) {
  struct kv *kv = NULL;
  assert_int_equal(kv_open(dir, &create, &kv), 0);
  assert_non_null(kv);
  return kv;
}

static void put_str(struct kv *kv, const char *k, const char *v) {
  assert_int_equal(kv_put(kv, k, strlen(k), v, strlen(v), false), 0);
}

static void assert_value(struct kv *kv, const struct kv_snapshot *snap, const char *k,
                         const char *want) {
  void *v = NULL;
  size_t len = 0;
  int rc = kv_get(kv, snap, k, strlen(k), &v, &len);
  if (!want) {
    assert_int_equal(rc, STK_ENOENT);
    return;
  }
  assert_int_equal(rc, 0);
  assert_int_equal(len, strlen(want));
  assert_memory_equal(v, want, len);
  free(v);
}

static void test_put_get_delete(void **state) {
  struct kv *kv = open_db(*state);
  assert_value(kv, NULL, "k", NULL);
  put_str(kv, "k", "v1");
  assert_value(kv, NULL, "k", "v1");
  put_str(kv, "k", "v2");
  assert_value(kv, NULL, "k", "v2");
  assert_int_equal(kv_put(kv, "empty", 5, "", 0, true), 0);
  assert_value(kv, NULL, "empty", "");
  assert_int_equal(kv_delete(kv, "k", 1, true), 0);
  assert_value(kv, NULL, "k", NULL);
  kv_close(kv);
}

static void test_batch_survives_reopen(void **state) {
  char *dir = malloc(strlen(*state) + 16);
  sprintf(dir, "%s/a/b", (char *)*state); /* Parents created too. */
  struct kv *kv = open_db(dir);
  struct kv_batch *b = kv_batch_new();
  kv_batch_put(b, "x", 1, "1", 1);
  kv_batch_put(b, "y", 1, "2", 1);
  kv_batch_delete(b, "x", 1);
  assert_int_equal(kv_batch_count(b), 3);
  assert_int_equal(kv_write(kv, b, true), 0);
  kv_batch_clear(b);
  assert_int_equal(kv_batch_count(b), 0);
  kv_batch_free(b);
  kv_close(kv);
  kv = open_db(dir);
  assert_value(kv, NULL, "x", NULL);
  assert_value(kv, NULL, "y", "2");
  kv_close(kv);
  free(dir);
}

/* Collects the keys a prefix scan (optionally after a seek) returns. */
static int scan(struct kv *kv, const struct kv_snapshot *snap, const char *prefix, size_t plen,
                const char *seek, size_t seek_len, char keys[][8], size_t *lens) {
  struct kv_iter *it = NULL;
  assert_int_equal(kv_iter_prefix(kv, snap, prefix, plen, &it), 0);
  if (seek) kv_iter_seek(it, seek, seek_len);
  int n = 0;
  for (; kv_iter_valid(it); kv_iter_next(it), n++) {
    const void *k = kv_iter_key(it, &lens[n]);
    assert_true(lens[n] < 8);
    memcpy(keys[n], k, lens[n]);
  }
  assert_int_equal(kv_iter_error(it), 0);
  assert_null(kv_iter_key(it, &lens[n]));
  kv_iter_free(it);
  return n;
}

static void put_keys(struct kv *kv, const char *const *keys, const size_t *lens, size_t n) {
  struct kv_batch *b = kv_batch_new();
  for (size_t i = 0; i < n; i++) kv_batch_put(b, keys[i], lens[i], "v", 1);
  assert_int_equal(kv_write(kv, b, false), 0);
  kv_batch_free(b);
}

static void test_prefix_iteration(void **state) {
  struct kv *kv = open_db(*state);
  static const char *const keys[] = {"a",        "aa\xff",   "ab",          "ab\x00",
                                     "ab\x01",   "ab\xff",   "ac",          "b",
                                     "\xff\xfe", "\xff\xff", "\xff\xff\x01"};
  static const size_t lens[] = {1, 3, 2, 3, 3, 3, 2, 1, 2, 2, 3};
  put_keys(kv, keys, lens, 11);
  char got[16][8];
  size_t got_lens[16];
  assert_int_equal(scan(kv, NULL, "ab", 2, NULL, 0, got, got_lens), 4);
  assert_memory_equal(got[0], "ab", 2);
  assert_memory_equal(got[1], "ab\x00", 3);
  assert_memory_equal(got[2], "ab\x01", 3);
  assert_memory_equal(got[3], "ab\xff", 3);
  /* A prefix with no successor (all 0xff) is bounded too. */
  assert_int_equal(scan(kv, NULL, "\xff\xff", 2, NULL, 0, got, got_lens), 2);
  assert_int_equal(got_lens[1], 3);
  assert_int_equal(scan(kv, NULL, "", 0, NULL, 0, got, got_lens), 11);
  assert_int_equal(scan(kv, NULL, "zz", 2, NULL, 0, got, got_lens), 0);
  kv_close(kv);
}

static void test_seek(void **state) {
  struct kv *kv = open_db(*state);
  static const char *const keys[] = {"a", "p1", "p3", "p5", "q"};
  static const size_t lens[] = {1, 2, 2, 2, 1};
  put_keys(kv, keys, lens, 5);
  char got[8][8];
  size_t got_lens[8];
  assert_int_equal(scan(kv, NULL, "p", 1, "p2", 2, got, got_lens), 2);
  assert_memory_equal(got[0], "p3", 2);
  assert_int_equal(scan(kv, NULL, "p", 1, "p3", 2, got, got_lens), 2);
  assert_int_equal(scan(kv, NULL, "p", 1, "a", 1, got, got_lens), 3); /* Before: clamps. */
  assert_memory_equal(got[0], "p1", 2);
  assert_int_equal(scan(kv, NULL, "p", 1, "p6", 2, got, got_lens), 0);
  assert_int_equal(scan(kv, NULL, "p", 1, "q", 1, got, got_lens), 0); /* Past the prefix. */
  kv_close(kv);
}

static void test_snapshot_isolation(void **state) {
  struct kv *kv = open_db(*state);
  put_str(kv, "s/1", "old");
  struct kv_snapshot *snap = kv_snapshot_new(kv);
  assert_non_null(snap);
  put_str(kv, "s/1", "new");
  put_str(kv, "s/2", "added");
  assert_value(kv, snap, "s/1", "old");
  assert_value(kv, snap, "s/2", NULL);
  assert_value(kv, NULL, "s/1", "new");
  char got[8][8];
  size_t got_lens[8];
  assert_int_equal(scan(kv, snap, "s/", 2, NULL, 0, got, got_lens), 1);
  assert_int_equal(scan(kv, NULL, "s/", 2, NULL, 0, got, got_lens), 2);
  kv_snapshot_free(kv, snap);
  kv_close(kv);
}

static void test_delete_range(void **state) {
  struct kv *kv = open_db(*state);
  static const char *const keys[] = {"r0", "r1", "r2", "r3", "r4"};
  static const size_t lens[] = {2, 2, 2, 2, 2};
  put_keys(kv, keys, lens, 5);
  struct kv_batch *b = kv_batch_new();
  kv_batch_delete_range(b, "r1", 2, "r3", 2); /* [r1, r3) */
  assert_int_equal(kv_write(kv, b, true), 0);
  kv_batch_free(b);
  assert_value(kv, NULL, "r0", "v");
  assert_value(kv, NULL, "r1", NULL);
  assert_value(kv, NULL, "r2", NULL);
  assert_value(kv, NULL, "r3", "v");
  char got[8][8];
  size_t got_lens[8];
  assert_int_equal(scan(kv, NULL, "r", 1, NULL, 0, got, got_lens), 3);
  kv_close(kv);
}

/* Keys written out of order, overwritten and deleted, in several batches:
 * a scan sees the newest value of each live key, in key order, before and
 * after a reopen (the vector memtable sorts only when read or flushed). */
static void test_unordered_writes_read_sorted(void **state) {
  struct kv *kv = open_db(*state);
  enum { N = 500 };
  struct kv_batch *b = kv_batch_new();
  for (int round = 0; round < 3; round++) {
    for (uint32_t i = 0; i < N; i++) {
      uint32_t k = (i * 7919u + (uint32_t)round * 31u) % N; /* A permutation of 0..N-1. */
      char key[16], val[16];
      int kl = snprintf(key, sizeof(key), "u/%03u", k);
      int vl = snprintf(val, sizeof(val), "%u.%d", k, round);
      kv_batch_put(b, key, (size_t)kl, val, (size_t)vl);
      if (round == 2 && k % 5 == 0) kv_batch_delete(b, key, (size_t)kl);
    }
    assert_int_equal(kv_write(kv, b, round == 2), 0);
    kv_batch_clear(b);
  }
  kv_batch_free(b);
  for (int reopen = 0; reopen < 2; reopen++) {
    struct kv_iter *it = NULL;
    assert_int_equal(kv_iter_prefix(kv, NULL, "u/", 2, &it), 0);
    uint32_t want = 1, seen = 0;
    for (; kv_iter_valid(it); kv_iter_next(it), seen++) {
      char key[16], val[16];
      snprintf(key, sizeof(key), "u/%03u", want);
      snprintf(val, sizeof(val), "%u.2", want);
      size_t kl = 0, vl = 0;
      const void *k = kv_iter_key(it, &kl);
      const void *v = kv_iter_value(it, &vl);
      assert_int_equal(kl, strlen(key));
      assert_memory_equal(k, key, kl);
      assert_int_equal(vl, strlen(val));
      assert_memory_equal(v, val, vl);
      want += want % 5 == 4 ? 2 : 1; /* Skips the deleted multiples of 5. */
    }
    assert_int_equal(kv_iter_error(it), 0);
    kv_iter_free(it);
    assert_int_equal(seen, N - N / 5);
    assert_value(kv, NULL, "u/005", NULL);
    assert_value(kv, NULL, "u/006", "6.2");
    kv_close(kv);
    kv = open_db(*state);
  }
  kv_close(kv);
}

static void test_locked_dir_is_busy(void **state) {
  struct kv *kv = open_db(*state);
  struct kv *second = NULL;
  assert_int_equal(kv_open(*state, &create, &second), STK_EBUSY); /* Same process. */
  assert_null(second);
  assert_non_null(strstr(stk_detail(), "is already open in this process"));
  /* Another process: the open is refused, and the failed attempt above
   * left this process's lock in place (F_GETLK from the child names us).
   * The child is this program run afresh (--try-open), not a fork: RocksDB's
   * background threads outlive kv_close, and a forked child that opens a
   * database may deadlock on a lock one of them held at the fork. */
  char *argv[] = {"/proc/self/exe", "--try-open", *state, NULL};
  pid_t pid = -1;
  assert_int_equal(posix_spawn(&pid, argv[0], NULL, NULL, argv, environ), 0);
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  kv_close(kv);
  kv = open_db(*state); /* Released by close. */
  kv_close(kv);
}

static void test_garbage_current_is_error(void **state) {
  kv_close(open_db(*state));
  char path[256];
  snprintf(path, sizeof(path), "%s/CURRENT", (char *)*state);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("\x01garbage-no-newline", f);
  fclose(f);
  struct kv *kv = NULL;
  int rc = kv_open(*state, &create, &kv);
  assert_true(rc == STK_ECORRUPT || rc == STK_EIO);
  assert_null(kv);
  assert_true(strlen(stk_detail()) > 0);
}

static void test_missing_without_create(void **state) {
  char path[256];
  snprintf(path, sizeof(path), "%s/none", (char *)*state);
  struct kv_opts opts = {.create_if_missing = false};
  struct kv *kv = NULL;
  assert_true(kv_open(path, &opts, &kv) < 0);
  assert_null(kv);
}

/* Child: synced batches of keys n/0, n/1, ...; reports each n over the
 * pipe only after kv_write returned. Never returns. */
static void writer_child(const char *dir, int fd, uint64_t first) {
  struct kv *kv = NULL;
  if (kv_open(dir, &create, &kv) != 0) _exit(2);
  struct kv_batch *b = kv_batch_new();
  for (uint64_t n = first;; n++) {
    uint8_t key[8];
    kv_put_u64be(key, n);
    kv_batch_clear(b);
    kv_batch_put(b, key, 8, &n, sizeof(n));
    kv_batch_put(b, "last", 4, &n, sizeof(n));
    if (kv_write(kv, b, true) != 0) _exit(3);
    if (write(fd, &n, sizeof(n)) != sizeof(n)) _exit(4);
  }
}

/* Returns the highest acknowledged n (first - 1 if none). */
static uint64_t run_and_kill(const char *dir, uint64_t first, unsigned delay_us) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    writer_child(dir, fds[1], first);
  }
  close(fds[1]);
  usleep(delay_us);
  kill(pid, SIGKILL);
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFSIGNALED(status));
  uint64_t n, last = first - 1;
  while (read(fds[0], &n, sizeof(n)) == sizeof(n)) {
    assert_int_equal(n, last + 1);
    last = n;
  }
  close(fds[0]);
  return last;
}

static void test_kill9_keeps_acknowledged(void **state) {
  srand((unsigned)time(NULL) ^ (unsigned)getpid());
  uint64_t next = 1;
  for (int round = 0; round < 4; round++) {
    uint64_t last = run_and_kill(*state, next, 150000 + (unsigned)(rand() % 300000));
    struct kv *kv = open_db(*state);
    for (uint64_t n = 1; n <= last; n++) {
      uint8_t key[8];
      kv_put_u64be(key, n);
      void *v = NULL;
      size_t len = 0;
      assert_int_equal(kv_get(kv, NULL, key, 8, &v, &len), 0);
      assert_int_equal(len, sizeof(n));
      assert_memory_equal(v, &n, sizeof(n));
      free(v);
    }
    kv_close(kv);
    next = last + 1;
  }
  assert_true(next > 4); /* The writer made progress. */
}

/* The other process of test_locked_dir_is_busy: 0 when its open of DIR is
 * refused as busy and the lock's holder is its parent. */
static int try_open(const char *dir) {
  struct kv *other = NULL;
  bool busy = kv_open(dir, &create, &other) == STK_EBUSY;
  char path[512];
  snprintf(path, sizeof(path), "%s/LOCK", dir);
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
  int fd = open(path, O_RDONLY);
  bool held = fd >= 0 && fcntl(fd, F_GETLK, &fl) == 0 && fl.l_pid == getppid();
  return busy && held ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--try-open") == 0) return try_open(argv[2]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_put_get_delete, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_batch_survives_reopen, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_prefix_iteration, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_seek, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_snapshot_isolation, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_delete_range, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_unordered_writes_read_sorted, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_locked_dir_is_busy, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_garbage_current_is_error, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_missing_without_create, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_kill9_keeps_acknowledged, setup_dir, teardown_dir),
  };
  int failed = cmocka_run_group_tests_name("kv, skiplist memtable", tests, NULL, NULL);
  create.write_mostly = true;
  failed += cmocka_run_group_tests_name("kv, write_mostly (vector memtable)", tests, NULL, NULL);
  return failed;
}
