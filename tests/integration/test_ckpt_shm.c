/*
 * Zero-copy staging through shared memory against the real
 * stoker-checkpoint daemon (file:// storage, loopback): bytes saved through
 * segments restore bit-exactly at another world size, segments are gone
 * after commit and recycled (the next checkpoint reuses the same files),
 * hostile segment references are refused with INVALID_ARGUMENT and commit
 * nothing, an abort releases mapped segments, a daemon without shm (or a
 * client told "off") sends bytes over gRPC, and kill -9 of the daemon with
 * staged segments leaves no segment and no corrupt checkpoint after the
 * restart. The client keeps its segments mapped across checkpoints: a
 * checkpoint saved while the previous one is still uploading corrupts
 * neither (a mapping is written only after the service recycled its
 * file), and once the daemon removed its pool no mapping is left. A
 * segment larger than a few parts goes as a multipart upload, a smaller
 * one as one PUT (held while other ranks still copy, but started when a
 * rank waits for memory); all restore bit-exactly. A clean stop (SIGTERM)
 * with the default directory leaves nothing under /dev/shm. A segment
 * truncated after hand-over costs its attempt (a clear reason), never the
 * daemon; a sparse segment claiming the whole budget holds only the bytes
 * its chunks named, so another job's checkpoint goes through. Async saves
 * of every rank on one client (the save machine, one engine thread), held
 * back by the budget, restore bit-exactly. argv:
 * stoker-checkpoint.
 */
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
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
#include "stoker_ckpt.h"
#include "test_ckpt_helpers.h"
#include "test_ckpt_shard.h"

#define COLS 262144 /* f32: 1 MiB rows. */
#define ROWS 12     /* Per rank: 12 MiB, multipart at 5 MiB parts. */
#define BLOB 1000

/* ---- The model: every byte a function of (step, tensor, index) ---- */

static uint8_t byte_at(int64_t step, int tensor, uint64_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(step * 131 + tensor);
  return (uint8_t)(x >> 29);
}

static const struct tck_model model = {ROWS, COLS, BLOB, byte_at};

/* ---- Saving through the writer (asserting the path taken) ---- */

struct saver {
  const char *addr, *attempt;
  int64_t step;
  uint32_t rank, world;
  enum stk_ckpt_shm_mode mode;
  int err;
  char why[512]; /* The rank's error, when err. */
  bool shm;
  pthread_t th;
};

static void *save_main(void *p) {
  struct saver *v = p;
  struct stk_client_opts o = {.address = v->addr, .default_timeout_ms = 60000};
  struct stk_client *c = NULL;
  struct tck_shard s;
  tck_shard_init(&s, &model, v->step, v->rank, v->world);
  struct stk_ckpt_writer *w = NULL;
  v->err = stk_ckpt_connect(&o, &c);
  if (!v->err) v->err = stk_ckpt_writer_open(c, v->attempt, v->rank, 0, &w);
  if (!v->err) stk_ckpt_writer_set_shm(w, v->mode);
  for (int i = 0; i < 2 && !v->err; i++)
    v->err = stk_ckpt_write_chunk(w, s.t[i].name, s.t[i].dtype, s.t[i].global_shape, &s.t[i].box,
                                  s.t[i].data, s.t[i].len);
  v->shm = stk_ckpt_writer_shm_active(w);
  if (w && v->err) stk_ckpt_writer_abort(w);
  if (w && !v->err) v->err = stk_ckpt_writer_finish(w, false, NULL, NULL);
  /* The last error is per thread: keep this rank's for the report. */
  if (v->err) snprintf(v->why, sizeof(v->why), "%s", stk_client_last_error(NULL));
  stk_client_free(c);
  tck_shard_free(&s); /* Staged: the rank's buffers are free again. */
  return NULL;
}

/* Saves every rank from its own thread; asserts each took path shm. */
static void save_all(const struct harness_daemon *d, const char *attempt, int64_t step,
                     uint32_t world, enum stk_ckpt_shm_mode mode, bool want_shm) {
  struct saver v[TCK_SHARD_MAX_WORLD];
  for (uint32_t r = 0; r < world; r++) {
    v[r] = (struct saver){
        .addr = d->addr, .attempt = attempt, .step = step, .rank = r, .world = world, .mode = mode};
    pthread_create(&v[r].th, NULL, save_main, &v[r]);
  }
  for (uint32_t r = 0; r < world; r++) {
    pthread_join(v[r].th, NULL);
    if (v[r].err) fail_msg("rank %u: %s", r, v[r].why);
    assert_int_equal(v[r].shm, want_shm);
  }
}

/* ---- The segment directory ---- */

static int count_entries(const char *prefix, ino_t *ret_inodes, int max) {
  DIR *d = opendir(tck_shm_dir);
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
      if (ret_inodes && n < max) ret_inodes[n] = e->d_ino;
      n++;
    }
  closedir(d);
  return n;
}

static void put_file(const char *name, size_t len) {
  char path[1100];
  snprintf(path, sizeof(path), "%s/%s", tck_shm_dir, name);
  int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, (off_t)len), 0);
  close(fd);
}

static struct harness_daemon *start_budget(const char *shm, const char *timeout,
                                           const char *budget) {
  const char *args[] = {
      "--part-size",          "5MiB", "--staging-budget",  budget,  "--shm-dir", shm,
      "--upload-concurrency", "2",    "--attempt-timeout", timeout, NULL};
  struct harness_daemon *d = harness_daemon_start(args);
  assert_non_null(d);
  return d;
}

static struct harness_daemon *start(const char *shm, const char *timeout) {
  return start_budget(shm, timeout, "64MiB");
}

/* ---- Tests ---- */

static void commit_ok(struct stk_client *c, const char *attempt) {
  if (stk_ckpt_commit(c, attempt, 60000, NULL) != 0)
    fail_msg("commit: %s", stk_client_last_error(NULL));
}

static void test_roundtrip_and_recycling(void **state) {
  struct harness_daemon *d = start(tck_shm_dir, "60s");
  struct stk_client *c = tck_shard_client(d->addr);
  char attempt[STK_CKPT_ATTEMPT_MAX];
  ino_t first[16], second[16];
  int n_first = 0;
  for (int64_t step = 1; step <= 2; step++) {
    assert_int_equal(stk_ckpt_begin(c, "shm", step, 2, 0, attempt), 0);
    save_all(d, attempt, step, 2, STK_CKPT_SHM_ON, true);
    commit_ok(c, attempt);
    assert_int_equal(count_entries("seg-", NULL, 0), 0);
    tck_shard_restore_all(c, &model, "shm", step, 3, 2);
    int n = count_entries("free-", step == 1 ? first : second, 16);
    assert_true(n > 0 && n <= 16);
    if (step == 1) n_first = n;
  }
  /* The second checkpoint claimed the first one's files (same inodes), so
   * its copies allocated no pages: without reuse the pool (room for five
   * segments) would hold n_first + 2 files. (Within one checkpoint a rank
   * may already reuse a file another rank released.) */
  int n_second = count_entries("free-", second, 16);
  assert_true(n_second <= 2);
  for (int i = 0; i < n_first; i++) {
    bool found = false;
    for (int k = 0; k < n_second; k++) found |= first[i] == second[k];
    assert_true(found);
  }
  /* "off" forces bytes over gRPC even here. */
  assert_int_equal(stk_ckpt_begin(c, "shm", 3, 1, 0, attempt), 0);
  save_all(d, attempt, 3, 1, STK_CKPT_SHM_OFF, false);
  commit_ok(c, attempt);
  tck_shard_restore_all(c, &model, "shm", 3, 2, 1);
  stk_client_free(c);
  int status = -1;
  assert_int_equal(harness_daemon_term(d, 20000, &status), 0);
  assert_int_equal(status, 0);
  struct stat st;
  assert_int_not_equal(stat(tck_shm_dir, &st), 0); /* Pool and instance file removed. */
  harness_daemon_free(d);
}

/* A clean stop (SIGTERM) with the default directory leaves nothing in
 * /dev/shm: not the pool, the instance file, a segment a rank wrote but
 * never sent, nor the directory with its owner record. */
static void test_clean_stop_leaves_nothing(void **state) {
  struct harness_daemon *d = start("auto", "60s");
  char dir[sizeof(tck_shm_dir)];
  if (!harness_shm_auto_dir("stoker-ckpt-", d->data_dir, dir, sizeof(dir))) {
    harness_daemon_free(d);
    skip(); /* No /dev/shm on this host: staging is off. */
  }
  char saved[sizeof(tck_shm_dir)];
  snprintf(saved, sizeof(saved), "%s", tck_shm_dir);
  snprintf(tck_shm_dir, sizeof(tck_shm_dir), "%s", dir);
  struct stk_client *c = tck_shard_client(d->addr);
  char attempt[STK_CKPT_ATTEMPT_MAX];
  assert_int_equal(stk_ckpt_begin(c, "clean", 1, 2, 0, attempt), 0);
  save_all(d, attempt, 1, 2, STK_CKPT_SHM_ON, true);
  commit_ok(c, attempt);
  stk_client_free(c);
  assert_true(count_entries("free-", NULL, 0) > 0);
  assert_int_equal(count_entries("instance-", NULL, 0), 1);
  put_file("seg-0123456789abcdef0123456789abcdef-0-1", 4096); /* Staged, never sent. */
  int status = -1;
  assert_int_equal(harness_daemon_term(d, 20000, &status), 0);
  assert_int_equal(status, 0);
  struct stat st;
  if (stat(dir, &st) == 0) {
    fail_msg("%s is left after a clean stop (%d free-, %d seg-, %d instance-)", dir,
             count_entries("free-", NULL, 0), count_entries("seg-", NULL, 0),
             count_entries("instance-", NULL, 0));
  }
  snprintf(tck_shm_dir, sizeof(tck_shm_dir), "%s", saved);
  harness_daemon_free(d);
}

static void test_fallback_when_off(void **state) {
  struct harness_daemon *d = start("", "60s");
  struct stk_client *c = tck_shard_client(d->addr);
  char attempt[STK_CKPT_ATTEMPT_MAX];
  assert_int_equal(stk_ckpt_begin(c, "grpc", 1, 2, 0, attempt), 0);
  save_all(d, attempt, 1, 2, STK_CKPT_SHM_AUTO, false);
  commit_ok(c, attempt);
  tck_shard_restore_all(c, &model, "grpc", 1, 3, 2);
  /* "on" where the service has none: the first write fails. */
  struct stk_ckpt_writer *w;
  assert_int_equal(stk_ckpt_begin(c, "grpc", 2, 1, 0, attempt), 0);
  assert_int_equal(stk_ckpt_writer_open(c, attempt, 0, 0, &w), 0);
  stk_ckpt_writer_set_shm(w, STK_CKPT_SHM_ON);
  uint64_t shape = 4, off = 0, sz = 4;
  struct stk_ckpt_box box = {1, &off, &sz};
  assert_int_equal(stk_ckpt_write_chunk(w, "x", STK_DTYPE_U8, &shape, &box, "abcd", 4),
                   STK_ENOTSUP);
  stk_ckpt_writer_abort(w);
  stk_client_free(c);
  harness_daemon_free(d);
}

/* ---- Hostile references, over a raw stream ---- */

struct hostile {
  const char *what;
  char name[720];
  uint64_t bytes; /* Box bytes claimed. */
  bool with_data;
  bool valid_first; /* A valid segment chunk goes before it. */
};

/* One chunk of tensor `tensor` (U8, `shape` bytes) at [off, off + len),
 * staged in segment `seg` at seg_off, written on a raw stream. */
static void raw_shm_chunk(struct rpc_client_cstream *s, const char *attempt, uint32_t rank,
                          const char *tensor, uint64_t shape, uint64_t off, uint64_t len,
                          const char *seg, uint64_t seg_off) {
  struct tck_chunk c;
  tck_chunk_u8(&c, attempt, rank, tensor, shape, off, len);
  c.ch.shm_name = (char *)seg;
  c.ch.shm_offset = seg_off;
  assert_int_equal(rpc_client_cstream_write(s, &c.ch.base), 0);
}

static int send_raw(struct rpc_client *rc, const char *attempt, const struct hostile *h, char *msg,
                    size_t msg_len) {
  struct rpc_client_cstream *s = NULL;
  assert_int_equal(rpc_client_cstream_open(rc, "/stoker.v1.Checkpoint/Write",
                                           &stoker__v1__write_response__descriptor, 30000, &s),
                   0);
  struct tck_chunk c;
  tck_chunk_u8(&c, attempt, 0, "t", 1 << 20, 0, h->bytes);
  char good[128];
  if (h->valid_first) {
    snprintf(good, sizeof(good), "seg-%s-0-aa", attempt);
    put_file(good, 8192);
    c.ch.shm_name = good;
    c.len = 8192;
    rpc_client_cstream_write(s, &c.ch.base);
    c.off = 8192;
    c.len = h->bytes;
  }
  uint8_t data[16] = {0};
  c.ch.shm_name = (char *)h->name;
  if (h->with_data) {
    c.ch.data.data = data;
    c.ch.data.len = c.len = sizeof(data);
  }
  rpc_client_cstream_write(s, &c.ch.base);
  return tck_write_finish(s, attempt, 0, false, msg, msg_len);
}

static void test_hostile_names(void **state) {
  struct harness_daemon *d = start(tck_shm_dir, "60s");
  struct stk_client *c = tck_shard_client(d->addr);
  struct rpc_client *rc = harness_rpc(d);
  char outside[700];
  snprintf(outside, sizeof(outside), "%s/outside", tck_shm_root);
  FILE *f = fopen(outside, "w");
  fputs("precious", f);
  fclose(f);
  for (int i = 0; i < 9; i++) {
    char attempt[STK_CKPT_ATTEMPT_MAX], msg[512], target[700], link_path[1500];
    assert_int_equal(stk_ckpt_begin(c, "hostile", 10 + i, 1, 0, attempt), 0);
    struct hostile h = {.bytes = 4096};
    switch (i) {
    case 0:
      h.what = "../outside";
      snprintf(h.name, sizeof(h.name), "../outside");
      break;
    case 1:
      h.what = "an absolute path";
      snprintf(h.name, sizeof(h.name), "%s", outside);
      break;
    case 2:
      h.what = "another attempt's segment";
      snprintf(h.name, sizeof(h.name), "seg-ffffffffffffffffffffffffffffffff-0-1");
      put_file(h.name, 4096);
      break;
    case 3:
      h.what = "a name outside the prefix";
      snprintf(h.name, sizeof(h.name), "free-0000000000000001");
      put_file(h.name, 4096);
      break;
    case 4:
      h.what = "a segment too short";
      snprintf(h.name, sizeof(h.name), "seg-%s-0-1", attempt);
      put_file(h.name, 100);
      break;
    case 5:
      h.what = "a symlink";
      snprintf(h.name, sizeof(h.name), "seg-%s-0-2", attempt);
      snprintf(target, sizeof(target), "%s/seg-%s-0-3", tck_shm_dir, attempt);
      put_file(target + strlen(tck_shm_dir) + 1, 4096);
      snprintf(link_path, sizeof(link_path), "%s/%s", tck_shm_dir, h.name);
      assert_int_equal(symlink(target, link_path), 0);
      break;
    case 6:
      h.what = "another rank's segment";
      snprintf(h.name, sizeof(h.name), "seg-%s-1-1", attempt);
      put_file(h.name, 4096);
      break;
    case 7:
      h.what = "bytes beside a segment";
      snprintf(h.name, sizeof(h.name), "seg-%s-0-4", attempt);
      put_file(h.name, 4096);
      h.with_data = true;
      break;
    case 8:
      h.what = "a chunk that does not follow on (after a valid one, mapped)";
      snprintf(h.name, sizeof(h.name), "seg-%s-0-aa", attempt);
      h.valid_first = true;
      h.bytes = 100;
      break;
    }
    int code = send_raw(rc, attempt, &h, msg, sizeof(msg));
    if (code != RPC_INVALID_ARGUMENT) fail_msg("%s: status %d (%s)", h.what, code, msg);
    assert_int_not_equal(stk_ckpt_commit(c, attempt, 30000, NULL), 0);
    /* The aborted attempt's segments are removed with it. */
    char prefix[128];
    snprintf(prefix, sizeof(prefix), "seg-%s", attempt);
    int64_t t0 = harness_now_ms();
    while (count_entries(prefix, NULL, 0) > 0 && harness_now_ms() - t0 < 5000) harness_sleep_ms(20);
    if (count_entries(prefix, NULL, 0) != 0) fail_msg("%s: segments left", h.what);
  }
  Stoker__V1__ListCheckpointsResponse *list = NULL;
  assert_int_equal(stk_ckpt_list(c, "hostile", 0, &list), 0);
  assert_int_equal(list->n_checkpoints, 0);
  protobuf_c_message_free_unpacked(&list->base, NULL);
  char buf[16] = "";
  f = fopen(outside, "r");
  assert_non_null(fgets(buf, sizeof(buf), f));
  fclose(f);
  assert_string_equal(buf, "precious");
  rpc_client_free(rc);
  stk_client_free(c);
  harness_daemon_free(d);
}

/* kill -9 with segments staged (and one written but never sent): after
 * the restart no segment is left and every listed checkpoint reads back. */
static void test_kill_with_staged_segments(void **state) {
  struct harness_daemon *d = start(tck_shm_dir, "60s");
  for (int64_t step = 1; step <= 3; step++) {
    struct stk_client *c = tck_shard_client(d->addr);
    char attempt[STK_CKPT_ATTEMPT_MAX], stray[128];
    assert_int_equal(stk_ckpt_begin(c, "kill", step, 2, 0, attempt), 0);
    snprintf(stray, sizeof(stray), "seg-%s-1-ff", attempt);
    put_file(stray, 4096);
    save_all(d, attempt, step, 2, STK_CKPT_SHM_ON, true);
    stk_client_free(c);
    harness_sleep_ms(step == 1 ? 0 : 30 * step);
    harness_daemon_kill(d);
    assert_int_equal(harness_daemon_restart(d), 0);
    assert_int_equal(count_entries("seg-", NULL, 0), 0);
    c = tck_shard_client(d->addr);
    Stoker__V1__ListCheckpointsResponse *list = NULL;
    assert_int_equal(stk_ckpt_list(c, "kill", 0, &list), 0);
    for (size_t i = 0; i < list->n_checkpoints; i++)
      tck_shard_restore_all(c, &model, "kill", list->checkpoints[i]->step, 1, 2);
    fprintf(stderr, "kill %lld: %zu committed\n", (long long)step, list->n_checkpoints);
    protobuf_c_message_free_unpacked(&list->base, NULL);
    stk_client_free(c);
  }
  /* The restarted instance serves shm again (a new token). */
  struct stk_client *c = tck_shard_client(d->addr);
  char attempt[STK_CKPT_ATTEMPT_MAX];
  assert_int_equal(stk_ckpt_begin(c, "kill", 10, 2, 0, attempt), 0);
  save_all(d, attempt, 10, 2, STK_CKPT_SHM_ON, true);
  commit_ok(c, attempt);
  tck_shard_restore_all(c, &model, "kill", 10, 2, 2);
  stk_client_free(c);
  harness_daemon_free(d);
}

/* Step 2 is saved while step 1 may still be uploading from its segments
 * (its files are not in the pool yet, so no rank may write them): both
 * restore bit-exactly. Mappings kept by this process go when the daemon
 * removes its pool. */
static void test_overlapping_checkpoints(void **state) {
  struct harness_daemon *d = start(tck_shm_dir, "60s");
  struct stk_client *c = tck_shard_client(d->addr);
  char a0[STK_CKPT_ATTEMPT_MAX], a1[STK_CKPT_ATTEMPT_MAX], a2[STK_CKPT_ATTEMPT_MAX];
  assert_int_equal(stk_ckpt_begin(c, "ovl", 1, 2, 0, a0), 0);
  save_all(d, a0, 1, 2, STK_CKPT_SHM_ON, true);
  commit_ok(c, a0); /* The pool now holds files this process has mapped. */
  assert_true(ckpt_segmap_cached() > 0);
  for (int round = 0; round < 3; round++) {
    int64_t s1 = 2 + 2 * round, s2 = s1 + 1;
    assert_int_equal(stk_ckpt_begin(c, "ovl", s1, 2, 0, a1), 0);
    save_all(d, a1, s1, 2, STK_CKPT_SHM_ON, true);
    assert_int_equal(stk_ckpt_begin(c, "ovl", s2, 2, 0, a2), 0);
    save_all(d, a2, s2, 2, STK_CKPT_SHM_ON, true);
    commit_ok(c, a1);
    commit_ok(c, a2);
    tck_shard_restore_all(c, &model, "ovl", s1, 3, 2);
    tck_shard_restore_all(c, &model, "ovl", s2, 1, 2);
  }
  stk_client_free(c);
  int status = -1;
  assert_int_equal(harness_daemon_term(d, 20000, &status), 0);
  assert_int_equal(status, 0);
  harness_daemon_free(d);
  ckpt_segmap_prune();
  assert_int_equal(ckpt_segmap_cached(), 0);
}

/* One rank's 26 MiB tensor: a segment of more than four 5 MiB parts goes
 * as a multipart upload straight from the mapping. */
static void test_large_segment_multipart(void **state) {
  struct harness_daemon *d = start(tck_shm_dir, "60s");
  struct stk_client *c = tck_shard_client(d->addr);
  char attempt[STK_CKPT_ATTEMPT_MAX];
  uint64_t n = (uint64_t)26 << 20, shape = n, off = 0;
  uint8_t *buf = malloc(n);
  for (uint64_t i = 0; i < n; i++) buf[i] = byte_at(7, 0, i);
  struct stk_ckpt_tensor t = {"big", STK_DTYPE_BYTES, &shape, {1, &off, &shape}, buf, n};
  assert_int_equal(stk_ckpt_begin(c, "big", 1, 1, 0, attempt), 0);
  if (stk_ckpt_save(c, attempt, 0, &t, 1, NULL) != 0)
    fail_msg("save: %s", stk_client_last_error(NULL));
  commit_ok(c, attempt);
  memset(buf, 0, n);
  struct stk_ckpt_want w = {"big", {1, &off, &shape}, buf, n};
  assert_int_equal(stk_ckpt_read(c, "big", 1, &w, 1, 60000, NULL), 0);
  for (uint64_t i = 0; i < n; i++)
    if (buf[i] != byte_at(7, 0, i)) fail_msg("byte %llu differs", (unsigned long long)i);
  free(buf);
  stk_client_free(c);
  harness_daemon_free(d);
}

/* Four ranks of 12 MiB segments against a 40 MiB budget: PUTs held while
 * other ranks copy must be started when a rank waits for memory, or the
 * last rank would wait forever. */
static void test_held_puts_under_pressure(void **state) {
  struct harness_daemon *d = start_budget(tck_shm_dir, "60s", "40MiB");
  struct stk_client *c = tck_shard_client(d->addr);
  char attempt[STK_CKPT_ATTEMPT_MAX];
  for (int64_t step = 1; step <= 3; step++) {
    assert_int_equal(stk_ckpt_begin(c, "held", step, 4, 0, attempt), 0);
    save_all(d, attempt, step, 4, STK_CKPT_SHM_ON, true);
    commit_ok(c, attempt);
    tck_shard_restore_all(c, &model, "held", step, 3, 4);
  }
  stk_client_free(c);
  harness_daemon_free(d);
}

/* One rank's extra tensor "x/R" of X_BYTES: bytes byte_at(step, 'x' + R, i). */
#define X_BYTES ((uint64_t)8 << 20)

struct extra {
  char name[16];
  uint64_t shape, off;
  uint8_t *buf;
};

static void extra_init(struct extra *x, int64_t step, uint32_t rank, struct stk_ckpt_tensor *ret) {
  snprintf(x->name, sizeof(x->name), "x/%u", rank);
  x->shape = X_BYTES, x->off = 0;
  x->buf = malloc(X_BYTES);
  assert_non_null(x->buf);
  for (uint64_t i = 0; i < X_BYTES; i++) x->buf[i] = byte_at(step, 'x' + (int)rank, i);
  *ret = (struct stk_ckpt_tensor){x->name, STK_DTYPE_BYTES, &x->shape, {1, &x->off, &x->shape},
                                  x->buf,  X_BYTES};
}

static void extra_check(struct stk_client *c, const char *job, int64_t step, uint32_t rank) {
  char name[16];
  snprintf(name, sizeof(name), "x/%u", rank);
  uint64_t off = 0, n = X_BYTES;
  uint8_t *buf = malloc(n);
  assert_non_null(buf);
  struct stk_ckpt_want want = {name, {1, &off, &n}, buf, n};
  if (stk_ckpt_read(c, job, step, &want, 1, 60000, NULL) != 0)
    fail_msg("read %s: %s", name, stk_client_last_error(NULL));
  for (uint64_t i = 0; i < n; i++)
    if (buf[i] != byte_at(step, 'x' + (int)rank, i))
      fail_msg("%s byte %" PRIu64 " differs", name, i);
  free(buf);
}

/* What an async save's callback saw. */
struct async_saved {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int calls, err;
  char msg[512];
};

static void on_async_saved(void *arg, int err, const char *msg, uint64_t bytes) {
  struct async_saved *a = arg;
  pthread_mutex_lock(&a->mu);
  if (err && !a->err) a->err = err, snprintf(a->msg, sizeof(a->msg), "%s", msg);
  a->calls++;
  pthread_cond_broadcast(&a->cv);
  pthread_mutex_unlock(&a->mu);
}

/* Every rank's save in flight at once on one client's engine (the save
 * machine), through segments of at most 16 MiB (the budget): a rank's
 * 12 MiB "w" and its blob fill one segment that its 8 MiB "x" does not
 * fit, so that segment's chunk messages go (one a step) before "x" starts
 * the next, whose message goes at the end. The budget holds less than one
 * rank's shard, so the service holds the ranks' streams back in turn while
 * it uploads; the checkpoints restore bit-exactly at another world size. */
static void test_async_saves_under_pressure(void **state) {
  struct harness_daemon *d = start_budget(tck_shm_dir, "60s", "16MiB");
  struct stk_client *c = tck_shard_client(d->addr);
  setenv(STK_CKPT_SHM_ENV, "on", 1); /* Shared memory or the saves fail. */
  char attempt[STK_CKPT_ATTEMPT_MAX];
  enum { WORLD = 4 };
  for (int64_t step = 1; step <= 2; step++) {
    assert_int_equal(stk_ckpt_begin(c, "async", step, WORLD, 0, attempt), 0);
    struct tck_shard sh[WORLD];
    struct extra x[WORLD];
    struct stk_ckpt_tensor t[WORLD][3];
    struct async_saved a = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    for (uint32_t r = 0; r < WORLD; r++) {
      tck_shard_init(&sh[r], &model, step, r, WORLD);
      t[r][0] = sh[r].t[0], t[r][1] = sh[r].t[1];
      extra_init(&x[r], step, r, &t[r][2]);
      assert_int_equal(stk_ckpt_save_async(c, attempt, r, t[r], 3, on_async_saved, &a), 0);
    }
    pthread_mutex_lock(&a.mu);
    while (a.calls < WORLD) pthread_cond_wait(&a.cv, &a.mu);
    pthread_mutex_unlock(&a.mu);
    if (a.err) fail_msg("save: %s", a.msg);
    for (uint32_t r = 0; r < WORLD; r++) tck_shard_free(&sh[r]), free(x[r].buf);
    commit_ok(c, attempt);
    assert_int_equal(count_entries("seg-", NULL, 0), 0);
    tck_shard_restore_all(c, &model, "async", step, 3, WORLD);
    for (uint32_t r = 0; r < WORLD; r++) extra_check(c, "async", step, r);
  }
  unsetenv(STK_CKPT_SHM_ENV);
  stk_client_free(c);
  harness_daemon_free(d);
}

static void write_bytes(struct stk_ckpt_writer *w, const char *name, uint64_t n, int64_t step) {
  uint64_t shape = n, off = 0;
  struct stk_ckpt_box box = {1, &off, &shape};
  uint8_t *buf = malloc(n);
  for (uint64_t i = 0; i < n; i++) buf[i] = byte_at(step, name[0], i);
  if (stk_ckpt_write_chunk(w, name, STK_DTYPE_BYTES, &shape, &box, buf, n) != 0)
    fail_msg("write %s: %s", name, stk_client_last_error(NULL));
  free(buf);
}

/* Budget 20 MiB (segments of at most 20 MiB, each one PUT). Rank 1 hands
 * over a 4 MiB segment and pauses mid-stream; rank 0 saves two 12 MiB
 * segments, so its second one's PUT is held (rank 1 is still copying).
 * Rank 1's 17 MiB segment then fits only once that held PUT has run: it
 * must be started when rank 1 waits for memory. */
static void test_held_put_started_for_a_waiting_rank(void **state) {
  struct harness_daemon *d = start_budget(tck_shm_dir, "60s", "20MiB");
  struct stk_client *c = tck_shard_client(d->addr), *c1 = tck_shard_client(d->addr);
  char attempt[STK_CKPT_ATTEMPT_MAX];
  assert_int_equal(stk_ckpt_begin(c, "held1", 1, 2, 0, attempt), 0);
  struct stk_ckpt_writer *w1 = NULL, *w0 = NULL;
  assert_int_equal(stk_ckpt_writer_open(c1, attempt, 1, 20000, &w1), 0);
  write_bytes(w1, "a/1", 4 << 20, 1);
  write_bytes(w1, "b/1", 17 << 20, 1); /* Sends a/1's segment. */
  assert_true(stk_ckpt_writer_shm_active(w1));
  harness_sleep_ms(200);
  assert_int_equal(stk_ckpt_writer_open(c, attempt, 0, 20000, &w0), 0);
  write_bytes(w0, "c/0", 12 << 20, 1);
  write_bytes(w0, "d/0", 12 << 20, 1);
  assert_int_equal(stk_ckpt_writer_finish(w0, false, NULL, NULL), 0);
  if (stk_ckpt_writer_finish(w1, false, NULL, NULL) != 0)
    fail_msg("rank 1: %s", stk_client_last_error(NULL));
  commit_ok(c, attempt);
  const char *names[] = {"a/1", "b/1", "c/0", "d/0"};
  uint64_t sizes[] = {4 << 20, 17 << 20, 12 << 20, 12 << 20};
  for (int k = 0; k < 4; k++) {
    uint64_t off = 0, n = sizes[k];
    uint8_t *buf = malloc(n);
    struct stk_ckpt_want want = {names[k], {1, &off, &sizes[k]}, buf, n};
    assert_int_equal(stk_ckpt_read(c, "held1", 1, &want, 1, 60000, NULL), 0);
    for (uint64_t i = 0; i < n; i++)
      if (buf[i] != byte_at(1, names[k][0], i)) fail_msg("%s byte differs", names[k]);
    free(buf);
  }
  stk_client_free(c1);
  stk_client_free(c);
  harness_daemon_free(d);
}

/* Budget 16 MiB. Rank 0 sends the first of its 10 MiB segment's two chunks;
 * rank 1's 12 MiB segment does not fit, so rank 1 waits and the service relieves the
 * budget by sealing what it can. Rank 0's segment is not complete yet: it
 * must stay open, and its second chunk must be taken (once a race in
 * test_held_puts_under_pressure, when every segment was sealed). */
static void test_relief_keeps_a_partial_segment_open(void **state) {
  (void)state;
  struct harness_daemon *d = start_budget(tck_shm_dir, "60s", "16MiB");
  struct stk_client *c = tck_shard_client(d->addr);
  struct rpc_client *rc = harness_rpc(d);
  char attempt[STK_CKPT_ATTEMPT_MAX], seg0[160], seg1[160], msg[512];
  assert_int_equal(stk_ckpt_begin(c, "relief", 1, 2, 0, attempt), 0);
  const uint64_t half = 5 << 20, big = 12 << 20;
  snprintf(seg0, sizeof(seg0), "seg-%s-0-a1", attempt);
  snprintf(seg1, sizeof(seg1), "seg-%s-1-b1", attempt);
  put_file(seg0, 2 * half);
  put_file(seg1, big);
  struct rpc_client_cstream *s0 = NULL, *s1 = NULL;
  const char *method = "/stoker.v1.Checkpoint/Write";
  assert_int_equal(
      rpc_client_cstream_open(rc, method, &stoker__v1__write_response__descriptor, 30000, &s0), 0);
  assert_int_equal(
      rpc_client_cstream_open(rc, method, &stoker__v1__write_response__descriptor, 30000, &s1), 0);
  raw_shm_chunk(s0, attempt, 0, "t0", 2 * half, 0, half, seg0, 0);
  harness_sleep_ms(300); /* Rank 0's segment is staged, half full. */
  raw_shm_chunk(s1, attempt, 1, "t1", big, 0, big, seg1, 0);
  harness_sleep_ms(300); /* Rank 1 waits for the budget. */
  raw_shm_chunk(s0, attempt, 0, "t0", 2 * half, half, half, seg0, half);
  int code = tck_write_finish(s0, attempt, 0, false, msg, sizeof(msg));
  if (code != RPC_OK) fail_msg("rank 0: status %d (%s)", code, msg);
  code = tck_write_finish(s1, attempt, 1, false, msg, sizeof(msg));
  if (code != RPC_OK) fail_msg("rank 1: status %d (%s)", code, msg);
  commit_ok(c, attempt);
  rpc_client_free(rc);
  stk_client_free(c);
  harness_daemon_free(d);
}

/* A segment of n bytes whose pages hold data (not a sparse file). */
static void put_file_filled(const char *name, size_t n) {
  char path[1100];
  snprintf(path, sizeof(path), "%s/%s", tck_shm_dir, name);
  int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
  assert_true(fd >= 0);
  uint8_t *buf = malloc(n);
  assert_non_null(buf);
  memset(buf, 0x5a, n);
  assert_int_equal(write(fd, buf, n), (ssize_t)n);
  free(buf);
  close(fd);
}

static void truncate_file(const char *name) {
  char path[1100];
  snprintf(path, sizeof(path), "%s/%s", tck_shm_dir, name);
  assert_int_equal(truncate(path, 0), 0);
}

/* Rank 0 hands over the first half of an 8 MiB segment (one PUT, read only
 * when sealed), truncates the file, then sends the second half and "last":
 * the service reads a shrunk map. The attempt is aborted naming the
 * segment; the daemon lives, and another job's checkpoint commits and
 * restores. */
static void test_truncated_segment_costs_its_attempt_only(void **state) {
  (void)state;
  struct harness_daemon *d = start(tck_shm_dir, "60s");
  struct stk_client *c = tck_shard_client(d->addr);
  struct rpc_client *rc = harness_rpc(d);
  char attempt[STK_CKPT_ATTEMPT_MAX], seg[160], msg[512];
  assert_int_equal(stk_ckpt_begin(c, "shrunk", 1, 1, 0, attempt), 0);
  const uint64_t half = 4 << 20;
  snprintf(seg, sizeof(seg), "seg-%s-0-c1", attempt);
  put_file_filled(seg, 2 * half);
  struct rpc_client_cstream *s = NULL;
  assert_int_equal(rpc_client_cstream_open(rc, "/stoker.v1.Checkpoint/Write",
                                           &stoker__v1__write_response__descriptor, 30000, &s),
                   0);
  raw_shm_chunk(s, attempt, 0, "t", 2 * half, 0, half, seg, 0);
  harness_sleep_ms(300); /* Mapped by the service, not read yet. */
  truncate_file(seg);
  raw_shm_chunk(s, attempt, 0, "t", 2 * half, half, half, seg, half);
  tck_write_finish(s, attempt, 0, false, msg, sizeof(msg)); /* OK or the abort, by timing */
  assert_int_not_equal(stk_ckpt_commit(c, attempt, 30000, NULL), 0);
  const char *why = stk_client_last_error(NULL);
  if (!strstr(why, "shrank after it was handed over")) fail_msg("commit: %s", why);
  assert_true(harness_daemon_alive(d));
  assert_int_equal(stk_ckpt_begin(c, "whole", 1, 2, 0, attempt), 0);
  save_all(d, attempt, 1, 2, STK_CKPT_SHM_ON, true);
  commit_ok(c, attempt);
  tck_shard_restore_all(c, &model, "whole", 1, 3, 2);
  rpc_client_free(rc);
  stk_client_free(c);
  harness_daemon_free(d);
}

/* Budget 16 MiB. Job A's rank truncates a segment out to 16 MiB (nothing
 * allocated), sends one 4 KiB chunk naming it and keeps its stream open.
 * Job B's 12 MiB segment must still be taken at once and commit: A holds
 * the 4 KiB it sent, not the 16 MiB it claimed. */
static void test_sparse_segment_holds_only_what_it_sent(void **state) {
  (void)state;
  struct harness_daemon *d = start_budget(tck_shm_dir, "60s", "16MiB");
  struct stk_client *c = tck_shard_client(d->addr);
  struct rpc_client *rc = harness_rpc(d);
  char att_a[STK_CKPT_ATTEMPT_MAX], att_b[STK_CKPT_ATTEMPT_MAX], seg_a[160], seg_b[160];
  char msg[512];
  assert_int_equal(stk_ckpt_begin(c, "sparse", 1, 1, 0, att_a), 0);
  assert_int_equal(stk_ckpt_begin(c, "honest", 1, 1, 0, att_b), 0);
  snprintf(seg_a, sizeof(seg_a), "seg-%s-0-a1", att_a);
  snprintf(seg_b, sizeof(seg_b), "seg-%s-0-b1", att_b);
  put_file(seg_a, 16 << 20);
  put_file(seg_b, 12 << 20);
  const char *method = "/stoker.v1.Checkpoint/Write";
  struct rpc_client_cstream *sa = NULL, *sb = NULL;
  assert_int_equal(
      rpc_client_cstream_open(rc, method, &stoker__v1__write_response__descriptor, 60000, &sa), 0);
  raw_shm_chunk(sa, att_a, 0, "t", 16 << 20, 0, 4096, seg_a, 0);
  harness_sleep_ms(300); /* A's segment is taken. */
  assert_int_equal(
      rpc_client_cstream_open(rc, method, &stoker__v1__write_response__descriptor, 30000, &sb), 0);
  raw_shm_chunk(sb, att_b, 0, "t", 12 << 20, 0, 12 << 20, seg_b, 0);
  int code = tck_write_finish(sb, att_b, 0, false, msg, sizeof(msg));
  if (code != RPC_OK) fail_msg("job B: status %d (%s)", code, msg);
  if (stk_ckpt_commit(c, att_b, 15000, NULL) != 0)
    fail_msg("job B's commit behind a sparse segment: %s", stk_client_last_error(NULL));
  assert_int_equal(stk_ckpt_abort(c, att_a, "test done", 10000), 0);
  ProtobufCMessage *resp = NULL;
  struct rpc_status st = {0};
  rpc_client_cstream_finish(sa, &resp, &st);
  assert_int_equal(st.code, RPC_ABORTED);
  rpc_client_free(rc);
  stk_client_free(c);
  harness_daemon_free(d);
}

int main(int argc, char **argv) {
  if (harness_init(argc, argv) != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_roundtrip_and_recycling, tck_shm_setup,
                                      tck_shm_teardown),
      cmocka_unit_test_setup_teardown(test_fallback_when_off, tck_shm_setup, tck_shm_teardown),
      cmocka_unit_test_setup_teardown(test_clean_stop_leaves_nothing, tck_shm_setup,
                                      tck_shm_teardown),
      cmocka_unit_test_setup_teardown(test_hostile_names, tck_shm_setup, tck_shm_teardown),
      cmocka_unit_test_setup_teardown(test_kill_with_staged_segments, tck_shm_setup,
                                      tck_shm_teardown),
      cmocka_unit_test_setup_teardown(test_overlapping_checkpoints, tck_shm_setup,
                                      tck_shm_teardown),
      cmocka_unit_test_setup_teardown(test_large_segment_multipart, tck_shm_setup,
                                      tck_shm_teardown),
      cmocka_unit_test_setup_teardown(test_held_puts_under_pressure, tck_shm_setup,
                                      tck_shm_teardown),
      cmocka_unit_test_setup_teardown(test_async_saves_under_pressure, tck_shm_setup,
                                      tck_shm_teardown),
      cmocka_unit_test_setup_teardown(test_held_put_started_for_a_waiting_rank, tck_shm_setup,
                                      tck_shm_teardown),
      cmocka_unit_test_setup_teardown(test_relief_keeps_a_partial_segment_open, tck_shm_setup,
                                      tck_shm_teardown),
      cmocka_unit_test_setup_teardown(test_truncated_segment_costs_its_attempt_only, tck_shm_setup,
                                      tck_shm_teardown),
      cmocka_unit_test_setup_teardown(test_sparse_segment_holds_only_what_it_sent, tck_shm_setup,
                                      tck_shm_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
