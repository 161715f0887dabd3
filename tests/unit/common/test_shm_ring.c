/*
 * shm_ring: the daemon's ring and the client's view of it agree (slots,
 * geometry, release words); the daemon never gets a slot back before the
 * client released it; the client refuses every file that is not the ring
 * it asked for (wrong nonce or magic, geometry larger than the file, a
 * symbolic link, a short file); the daemon's file takes pages as its slots
 * are first written (the header at creation, each slot at shm_ring_reserve),
 * and the name goes away once attached; the ring directory must be private, and opening it removes
 * stale rings; orphaned auto directories are swept.
 */
#include <fcntl.h>
#include <limits.h>
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

#include "shm_ring.h"
#include "stk_error.h"

struct fixture {
  char dir[256];
  int dirfd;
  uint8_t nonce[SHM_RING_NONCE_BYTES];
};

static int setup(void **state) {
  struct fixture *f = calloc(1, sizeof(*f));
  snprintf(f->dir, sizeof(f->dir), "/tmp/stk-shm-ring-XXXXXX");
  if (!mkdtemp(f->dir)) return -1;
  chmod(f->dir, 0700);
  for (int i = 0; i < SHM_RING_NONCE_BYTES; i++) f->nonce[i] = (uint8_t)(i * 7 + 1);
  if (shm_ring_dir_open(f->dir, NULL, &f->dirfd) != 0) return -1;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  struct fixture *f = *state;
  char cmd[300];
  close(f->dirfd);
  snprintf(cmd, sizeof(cmd), "rm -rf %s", f->dir);
  if (system(cmd) != 0) return -1;
  free(f);
  return 0;
}

static bool exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

static void test_round_trip(void **state) {
  struct fixture *f = *state;
  struct shm_ring *d = NULL, *c = NULL;
  assert_int_equal(shm_ring_create(f->dirfd, f->dir, f->nonce, 3, 5000, &d), 0);
  assert_int_equal(shm_ring_slot_bytes(d), 8192); /* Whole pages. */
  struct stat st; /* Its whole size, but only the header's page so far. */
  assert_int_equal(stat(shm_ring_path(d), &st), 0);
  assert_int_equal(st.st_size, 4096 + 3 * 8192);
  assert_true((uint64_t)st.st_blocks * 512 < 4096 + 8192);
  assert_int_equal(shm_ring_reserve(d, 1), 0);
  assert_int_equal(shm_ring_reserve(d, 1), 0); /* Once per slot. */
  assert_int_equal(stat(shm_ring_path(d), &st), 0);
  assert_true((uint64_t)st.st_blocks * 512 >= 4096 + 8192);
  assert_true((uint64_t)st.st_blocks * 512 < 4096 + 2 * 8192);
  for (uint64_t seq = 2; seq <= 3; seq++) assert_int_equal(shm_ring_reserve(d, seq), 0);
  assert_int_equal(stat(shm_ring_path(d), &st), 0);
  assert_true((uint64_t)st.st_blocks * 512 >= 4096 + 3 * 8192);
  char path[SHM_RING_PATH_MAX];
  snprintf(path, sizeof(path), "%s", shm_ring_path(d));
  assert_true(strncmp(path, f->dir, strlen(f->dir)) == 0);
  for (uint64_t seq = 1; seq <= 3; seq++) {
    assert_int_equal(shm_ring_next_free(d, 0), seq); /* Fresh slots in turn. */
    memset(shm_ring_slot(d, seq), (int)seq, 8192);
    shm_ring_written(d, seq);
  }

  assert_int_equal(shm_ring_attach(path, f->nonce, &c), 0);
  assert_false(exists(path)); /* The client took the name away. */
  assert_int_equal(shm_ring_slots(c), 3);
  assert_int_equal(shm_ring_slot_bytes(c), 8192);
  for (uint64_t seq = 1; seq <= 3; seq++) {
    assert_int_equal(shm_ring_slot(c, seq)[0], (int)seq);
    assert_int_equal(shm_ring_slot(c, seq)[8191], (int)seq);
  }
  /* Every slot is the client's: nothing is free. */
  assert_int_equal(shm_ring_next_free(d, 0), 0);
  /* Slot 1 (sequence 2) released first: the turn starts at slot 0, which
   * the client keeps, so sequence 4 is passed over and 5 (slot 1) is next. */
  shm_ring_release(c, 2);
  assert_int_equal(shm_ring_next_free(d, 0), 5);
  assert_int_equal(shm_ring_next_free(d, 5), 0); /* Only one slot free. */
  shm_ring_release(c, 1);
  /* The client freed slot 0 between two probes of one turn: a probe going
   * on after 5 must not answer 5 again (two batches in one slot); slot 0
   * waits for the next turn. */
  assert_int_equal(shm_ring_next_free(d, 5), 0);
  assert_int_equal(shm_ring_next_free(d, 0), 4); /* In turn again: slot 0 first. */
  assert_int_equal(shm_ring_next_free(d, 4), 5);
  memset(shm_ring_slot(d, 5), 0x55, 16);
  shm_ring_written(d, 5); /* Slot 0 left for later: it is skipped, never lost. */
  assert_int_equal(shm_ring_slot(c, 5)[0], 0x55);
  assert_ptr_equal(shm_ring_slot(c, 5), shm_ring_slot(c, 2));
  /* After 5 (slot 1) the turn goes on at slot 2 (still the client's: 3),
   * then slot 0: sequence 7. */
  assert_int_equal(shm_ring_next_free(d, 0), 7);
  shm_ring_release(c, 3);
  assert_int_equal(shm_ring_next_free(d, 0), 6);
  assert_int_equal(shm_ring_next_free(d, 6), 7);
  assert_int_equal(shm_ring_next_free(d, 7), 0); /* 5 is not released. */
  shm_ring_release(c, 5);
  shm_ring_release(c, 2); /* Late and lower: ignored. */
  assert_int_equal(shm_ring_next_free(d, 7), 8);
  shm_ring_written(d, 7);
  memset(shm_ring_slot(d, 7), 0x77, 16);
  assert_int_equal(shm_ring_slot(c, 7)[0], 0x77);
  assert_ptr_equal(shm_ring_slot(c, 7), shm_ring_slot(c, 1));
  /* Sequences only grow: after 7 (slot 0) the next free slot is 1: 8. */
  assert_int_equal(shm_ring_next_free(d, 0), 8);
  shm_ring_unlink(d); /* Already gone: harmless. */
  shm_ring_free(c);
  shm_ring_free(d);
}

/* Creates a ring, then lets edit change its file before a client attaches. */
static int attach_after(struct fixture *f, void (*edit)(const char *path, int fd),
                        const uint8_t *nonce) {
  struct shm_ring *d = NULL, *c = NULL;
  assert_int_equal(shm_ring_create(f->dirfd, f->dir, f->nonce, 2, 4096, &d), 0);
  char path[SHM_RING_PATH_MAX];
  snprintf(path, sizeof(path), "%s", shm_ring_path(d));
  if (edit) {
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    edit(path, fd);
    close(fd);
  }
  stk_clear_detail();
  int err = shm_ring_attach(path, nonce ? nonce : f->nonce, &c);
  if (err == 0)
    shm_ring_free(c);
  else
    assert_true(stk_detail()[0] != '\0'); /* Says why. */
  shm_ring_unlink(d);
  shm_ring_free(d);
  return err;
}

static void bad_magic(const char *path, int fd) {
  (void)path;
  assert_int_equal(pwrite(fd, "NOTARING", 8, 0), 8);
}
static void huge_slots(const char *path, int fd) {
  (void)path;
  const uint64_t slot = (uint64_t)1 << 30; /* Far past the end of the file. */
  assert_int_equal(pwrite(fd, &slot, 8, 32), 8);
}
static void too_many_slots(const char *path, int fd) {
  (void)path;
  const uint32_t slots = SHM_RING_MAX_SLOTS + 1;
  assert_int_equal(pwrite(fd, &slots, 4, 24), 4);
}
static void short_file(const char *path, int fd) {
  (void)path;
  assert_int_equal(ftruncate(fd, 100), 0);
}
static void symlinked(const char *path, int fd) {
  (void)fd;
  char real[SHM_RING_PATH_MAX + 8];
  snprintf(real, sizeof(real), "%s.real", path);
  assert_int_equal(rename(path, real), 0);
  assert_int_equal(symlink(real, path), 0);
}

static void test_attach_refuses(void **state) {
  struct fixture *f = *state;
  uint8_t other[SHM_RING_NONCE_BYTES] = {9};
  assert_int_equal(attach_after(f, NULL, other), STK_EINVAL);
  assert_int_equal(attach_after(f, bad_magic, NULL), STK_EINVAL);
  assert_int_equal(attach_after(f, huge_slots, NULL), STK_EINVAL);
  assert_int_equal(attach_after(f, too_many_slots, NULL), STK_EINVAL);
  assert_int_equal(attach_after(f, short_file, NULL), STK_EINVAL);
  assert_int_equal(attach_after(f, symlinked, NULL), STK_EINVAL);
  assert_int_equal(attach_after(f, NULL, NULL), 0); /* The unedited ring is fine. */
  struct shm_ring *c = NULL;
  char missing[300];
  snprintf(missing, sizeof(missing), "%s/ring-missing", f->dir);
  assert_int_equal(shm_ring_attach(missing, f->nonce, &c), STK_ENOENT);
  assert_int_equal(shm_ring_attach("relative/ring", f->nonce, &c), STK_EINVAL);
}

static void test_create_limits(void **state) {
  struct fixture *f = *state;
  struct shm_ring *d = NULL;
  assert_int_equal(shm_ring_create(f->dirfd, f->dir, f->nonce, 0, 4096, &d), STK_EINVAL);
  assert_int_equal(shm_ring_create(f->dirfd, f->dir, f->nonce, SHM_RING_MAX_SLOTS + 1, 4096, &d),
                   STK_EINVAL);
  assert_int_equal(shm_ring_create(f->dirfd, f->dir, f->nonce, 2, 0, &d), STK_EINVAL);
}

static void test_dir_rules(void **state) {
  struct fixture *f = *state;
  int fd = -1;
  assert_int_equal(shm_ring_dir_open("relative", NULL, &fd), STK_EINVAL);
  /* Group or other access: refused. */
  char open_dir[300];
  snprintf(open_dir, sizeof(open_dir), "%s/public", f->dir);
  assert_int_equal(mkdir(open_dir, 0755), 0);
  chmod(open_dir, 0755);
  assert_int_equal(shm_ring_dir_open(open_dir, NULL, &fd), STK_EINVAL);
  /* A symbolic link to a good directory: refused. */
  char good[300], link[300];
  snprintf(good, sizeof(good), "%s/good", f->dir);
  snprintf(link, sizeof(link), "%s/link", f->dir);
  assert_int_equal(mkdir(good, 0700), 0);
  assert_int_equal(symlink(good, link), 0);
  assert_int_equal(shm_ring_dir_open(link, NULL, &fd), STK_EINVAL);
  /* Stale rings go, other files stay, the owner is recorded. */
  char stale[320], keep[320], owner[320];
  snprintf(stale, sizeof(stale), "%s/ring-0123", good);
  snprintf(keep, sizeof(keep), "%s/notes", good);
  snprintf(owner, sizeof(owner), "%s/owner", good);
  fclose(fopen(stale, "w"));
  fclose(fopen(keep, "w"));
  assert_int_equal(shm_ring_dir_open(good, "/some/data/dir", &fd), 0);
  assert_false(exists(stale));
  assert_true(exists(keep));
  assert_true(exists(owner));
  shm_ring_dir_close(good, fd);
  assert_false(exists(owner));
  assert_true(exists(good)); /* Not empty (notes): left. */
}

static void test_orphans_swept(void **state) {
  (void)state;
  struct stat st;
  if (stat("/dev/shm", &st) != 0) skip();
  char data[256], dir[PATH_MAX], owner[PATH_MAX];
  snprintf(data, sizeof(data), "/tmp/stk-shm-data-XXXXXX");
  assert_non_null(mkdtemp(data));
  assert_int_equal(shm_ring_auto_dir("test", data, dir, sizeof(dir), owner, sizeof(owner)), 0);
  assert_true(strncmp(dir, "/dev/shm/stoker-test-", 21) == 0);
  int fd = -1;
  assert_int_equal(shm_ring_dir_open(dir, owner, &fd), 0);
  close(fd); /* As a killed daemon leaves it. */
  /* Its data dir still exists: another daemon's start keeps it. */
  char data2[256], dir2[PATH_MAX], owner2[PATH_MAX];
  snprintf(data2, sizeof(data2), "/tmp/stk-shm-data-XXXXXX");
  assert_non_null(mkdtemp(data2));
  assert_int_equal(shm_ring_auto_dir("test", data2, dir2, sizeof(dir2), owner2, sizeof(owner2)), 0);
  assert_string_not_equal(dir, dir2);
  assert_true(exists(dir));
  /* Once the data dir is gone, the next start sweeps it. */
  assert_int_equal(rmdir(data), 0);
  assert_int_equal(shm_ring_auto_dir("test", data2, dir2, sizeof(dir2), owner2, sizeof(owner2)), 0);
  assert_false(exists(dir));
  rmdir(data2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
      cmocka_unit_test_setup_teardown(test_attach_refuses, setup, teardown),
      cmocka_unit_test_setup_teardown(test_create_limits, setup, teardown),
      cmocka_unit_test_setup_teardown(test_dir_rules, setup, teardown),
      cmocka_unit_test(test_orphans_swept),
  };
  return cmocka_run_group_tests_name("shm_ring", tests, NULL, NULL);
}
