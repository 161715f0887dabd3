/*
 * Hostile and broken input to the checkpoint service: bad names, boxes
 * outside their shapes, byte counts that do not match, overlapping chunks,
 * truncated streams, and bytes flipped in storage. Each gets a clear error
 * and nothing is committed; a flipped byte fails reads with STK_ECORRUPT
 * naming the object (every read wanting it at once), verify reports it, and
 * once repaired the object reads again at once. List answers in pages, each
 * checkpoint exactly once by step, and refuses a token it did not give.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ckpt_svc_fixture.h"
#include "stk_error.h"

static void on_ev(void *arg, enum ckpt_write_event ev, int err, const char *msg) {
  (void)err;
  (void)msg;
  if (ev == CKPT_WRITE_FAILED) *(bool *)arg = true;
}

/* Feeds one chunk of a 1-D f32 tensor [16] to rank 0 of a fresh world-1
 * attempt; returns feed's answer and checks the attempt then fails. */
static int feed_bad(struct fx *f, const char *tensor, int dtype, uint64_t dim, uint64_t off,
                    uint64_t size, size_t data_len, uint32_t rank) {
  char att[65], msg[256];
  assert_int_equal(fx_begin(f, "bad", 1, 1, att), 0);
  struct ckpt_writer *w;
  bool failed = false;
  assert_int_equal(ckpt_write_open(f->svc, att, 0, on_ev, &failed, &w), 0);
  struct chunk_1d c = {.attempt = att,
                       .rank = rank,
                       .tensor = tensor,
                       .dtype = dtype,
                       .dim = dim,
                       .off = off,
                       .size = size,
                       .data_len = data_len,
                       .last = true};
  int rc = fx_feed_1d(w, &c);
  if (rc < 0) {
    assert_true(strstr(stk_detail(), att) != NULL); /* The error says which attempt. */
    assert_int_equal(fx_commit(f, att, msg, sizeof(msg)) < 0, 1);
    fx_run_until(f, &failed, 5000);
  } else {
    assert_int_equal(fx_commit(f, att, msg, sizeof(msg)), 0);
  }
  ckpt_write_close(w);
  return rc;
}

static void test_bad_chunks(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  assert_int_equal(fx_open(&f), 0);
  const int F32 = STOKER__V1__DTYPE__DTYPE_F32;
  assert_int_equal(feed_bad(&f, "a/../b", F32, 16, 0, 16, 64, 0), STK_EINVAL);
  assert_int_equal(feed_bad(&f, "/abs", F32, 16, 0, 16, 64, 0), STK_EINVAL);
  assert_int_equal(feed_bad(&f, "w", F32, 16, 8, 16, 64, 0), STK_EINVAL); /* Outside. */
  assert_int_equal(feed_bad(&f, "w", F32, 16, 0, 16, 63, 0), STK_EINVAL); /* Short data. */
  assert_int_equal(feed_bad(&f, "w", 99, 16, 0, 16, 64, 0), STK_EINVAL);  /* Dtype. */
  assert_int_equal(feed_bad(&f, "w", F32, 16, 0, 16, 64, 5), STK_EINVAL); /* Rank. */
  assert_int_equal(feed_bad(&f, "w", F32, UINT64_MAX / 2, 0, 16, 64, 0), STK_EINVAL);
  /* The good one commits. */
  assert_int_equal(feed_bad(&f, "w", F32, 16, 0, 16, 64, 0), 0);
  int64_t steps[4];
  size_t n;
  assert_int_equal(fx_list(&f, "bad", steps, 4, &n), 0);
  assert_int_equal(n, 1);
  /* Names that could escape the job's directory are refused at Begin. */
  char att[65];
  assert_int_equal(fx_begin(&f, "..", 1, 1, att), STK_EINVAL);
  assert_int_equal(fx_begin(&f, "a/b", 1, 1, att), STK_EINVAL);
  assert_int_equal(fx_begin(&f, "ok", -1, 1, att), STK_EINVAL);
  assert_int_equal(fx_begin(&f, "ok", 1, 0, att), STK_EINVAL);
  struct ckpt_writer *w;
  assert_int_equal(ckpt_write_open(f.svc, "nope", 0, on_ev, NULL, &w), STK_ENOENT);
  fx_fini(&f);
}

/* Rank r of attempt att writes w[off, off+size) of a [16] f32 tensor. */
static void write_part(struct fx *f, const char *att, uint32_t r, uint64_t off, uint64_t size) {
  struct ckpt_writer *w;
  bool failed = false;
  assert_int_equal(ckpt_write_open(f->svc, att, r, on_ev, &failed, &w), 0);
  struct chunk_1d c = {.attempt = att,
                       .rank = r,
                       .tensor = "w",
                       .dtype = STOKER__V1__DTYPE__DTYPE_F32,
                       .dim = 16,
                       .off = off,
                       .size = size,
                       .data_len = size * 4,
                       .last = true};
  assert_int_equal(fx_feed_1d(w, &c), 0);
  ckpt_write_close(w);
}

static void test_overlap_and_gap(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  assert_int_equal(fx_open(&f), 0);
  char att[65], msg[256];
  assert_int_equal(fx_begin(&f, "cov", 1, 2, att), 0);
  write_part(&f, att, 0, 0, 10);
  write_part(&f, att, 1, 8, 8); /* Overlaps [8, 10). */
  assert_int_equal(fx_commit(&f, att, msg, sizeof(msg)), STK_EINVAL);
  assert_non_null(strstr(msg, "overlap"));
  assert_int_equal(fx_begin(&f, "cov", 1, 2, att), 0);
  write_part(&f, att, 0, 0, 7);
  write_part(&f, att, 1, 8, 8); /* Element 7 missing. */
  assert_int_equal(fx_commit(&f, att, msg, sizeof(msg)), STK_EINVAL);
  int64_t steps[4];
  size_t n = 9;
  assert_int_equal(fx_list(&f, "cov", steps, 4, &n), 0);
  assert_int_equal(n, 0);
  char cmd[256];
  snprintf(cmd, sizeof(cmd), "test -z \"$(find %s -type f -not -path '*/.stk-*')\"", f.data);
  assert_int_equal(system(cmd), 0); /* Both attempts cleaned. */
  fx_fini(&f);
}

static void flip_byte(const char *path, off_t at) {
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  uint8_t b;
  assert_int_equal(pread(fd, &b, 1, at), 1);
  b ^= 0x40;
  assert_int_equal(pwrite(fd, &b, 1, at), 1);
  close(fd);
}

static void test_corrupt_object(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  assert_int_equal(fx_open(&f), 0);
  struct model *m = model_new(1, 1000000, 10);
  char att[65];
  assert_int_equal(fx_begin(&f, "crc", 2, 1, att), 0);
  struct write_opts wo = {.world = 1, .skip_last_rank = -1};
  assert_int_equal(fx_write_model(&f, att, m, &wo, NULL), 0);
  assert_int_equal(fx_commit(&f, att, NULL, 0), 0);
  assert_int_equal(fx_read_all(&f, "crc", 2, m, 1), 0);
  char path[512];
  snprintf(path, sizeof(path), "%s/crc/step-000000000002/attempt-%s/rank-00000-0000.bin", f.data,
           att);
  flip_byte(path, 3 << 20); /* In the fourth 1 MiB block (model/flat0). */
  char msg[512];
  struct ckpt_box whole;
  ckpt_box_of_shape(&m->t[2].shape, &whole);
  assert_int_equal(fx_read_check(&f, "crc", 2, &m->t[2], &whole, msg, sizeof(msg)), STK_ECORRUPT);
  assert_non_null(strstr(msg, "rank-00000-0000.bin"));
  /* Reads at once that want the bad block all fail (a fetch that failed
   * its check is shared with none, its waiters get its error). */
  struct fx_read together[3];
  int rcs[3];
  for (int i = 0; i < 3; i++) together[i] = (struct fx_read){"crc", 2, m, 0, 1};
  assert_int_equal(fx_read_together(&f, together, 3, rcs), STK_ECORRUPT);
  for (int i = 0; i < 3; i++) assert_int_equal(rcs[i], STK_ECORRUPT);
  /* A read that does not touch the bad block still works. */
  struct ckpt_box small = {.ndim = 1, .offsets = {0}, .sizes = {1000}};
  assert_int_equal(fx_read_check(&f, "crc", 2, &m->t[2], &small, msg, sizeof(msg)), 0);
  uint64_t problems = 0;
  assert_int_equal(fx_verify(&f, "crc", 2, &problems), STK_ECORRUPT);
  assert_int_equal(problems, 1);
  /* Repaired in storage: read again at once (nothing failed was kept). */
  flip_byte(path, 3 << 20);
  assert_int_equal(fx_read_all(&f, "crc", 2, m, 1), 0);
  model_free(m);
  fx_fini(&f);
}

/* A manifest damaged in storage fails reads, and once repaired reads work
 * again at once: the damaged bytes are not held by the manifest cache for
 * its lifetime (a minute of failed restores after a store answered one bad
 * object). */
static void test_damaged_manifest_not_held(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  assert_int_equal(fx_open(&f), 0);
  struct model *m = model_new(1, 1000, 4);
  char att[65];
  assert_int_equal(fx_begin(&f, "mf", 3, 1, att), 0);
  struct write_opts wo = {.world = 1, .skip_last_rank = -1};
  assert_int_equal(fx_write_model(&f, att, m, &wo, NULL), 0);
  assert_int_equal(fx_commit(&f, att, NULL, 0), 0);
  char path[512];
  snprintf(path, sizeof(path), "%s/mf/step-000000000003/attempt-%s/manifest.pb", f.data, att);
  FILE *fp = fopen(path, "rb");
  assert_non_null(fp);
  static uint8_t good[1 << 20];
  size_t len = fread(good, 1, sizeof(good), fp);
  fclose(fp);
  assert_true(len > 16 && len < sizeof(good));
  struct ckpt_box whole;
  ckpt_box_of_shape(&m->t[0].shape, &whole);
  char msg[512];
  assert_int_equal(truncate(path, 7), 0); /* Cut inside its first field: it does not parse. */
  assert_true(fx_read_check(&f, "mf", 3, &m->t[0], &whole, msg, sizeof(msg)) < 0);
  fp = fopen(path, "wb");
  assert_non_null(fp);
  assert_int_equal(fwrite(good, 1, len, fp), len);
  fclose(fp);
  assert_int_equal(fx_read_check(&f, "mf", 3, &m->t[0], &whole, msg, sizeof(msg)), 0);
  model_free(m);
  fx_fini(&f);
}

/* Reads whose wanted box is wrong (too many or too few dims, out of the
 * tensor's bounds) are refused with a reason and leave nothing behind: the
 * sanitized build once found each such Read leaking the entry it had begun. */
static void test_bad_read_boxes(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  assert_int_equal(fx_open(&f), 0);
  struct model *m = model_new(1, 100000, 10);
  char att[65];
  assert_int_equal(fx_begin(&f, "box", 1, 1, att), 0);
  struct write_opts wo = {.world = 1, .skip_last_rank = -1};
  assert_int_equal(fx_write_model(&f, att, m, &wo, NULL), 0);
  assert_int_equal(fx_commit(&f, att, NULL, 0), 0);
  const struct tspec *t = &m->t[2];
  char msg[512];
  struct ckpt_box more = {.ndim = t->shape.ndim + 1};
  for (uint32_t d = 0; d < more.ndim; d++) more.sizes[d] = 1;
  assert_int_equal(fx_read_check(&f, "box", 1, t, &more, msg, sizeof(msg)), STK_EINVAL);
  assert_non_null(strstr(msg, "dims"));
  struct ckpt_box none = {.ndim = 0};
  assert_int_equal(fx_read_check(&f, "box", 1, t, &none, msg, sizeof(msg)), STK_EINVAL);
  struct ckpt_box out;
  ckpt_box_of_shape(&t->shape, &out);
  out.offsets[0] = 1; /* one past the end */
  assert_true(fx_read_check(&f, "box", 1, t, &out, msg, sizeof(msg)) < 0);
  model_free(m);
  fx_fini(&f);
}

/* List answers in pages (services/common/page.h): 150 checkpoints paged
 * at several sizes come back each exactly once, by step; a bad token is
 * STK_EINVAL. The page size is capped at 64 here only by the fixture's
 * buffer of steps. */
static void test_list_pages(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  assert_int_equal(fx_open(&f), 0);
  struct model *m = model_new(1, 1000, 3);
  enum { N = 150 };
  for (int64_t i = 0; i < N; i++) {
    int64_t step = (i * 37) % N + 1; /* committed out of order */
    char att[65];
    assert_int_equal(fx_begin(&f, "many", step, 1, att), 0);
    struct write_opts wo = {.world = 1, .skip_last_rank = -1};
    assert_int_equal(fx_write_model(&f, att, m, &wo, NULL), 0);
    assert_int_equal(fx_commit(&f, att, NULL, 0), 0);
  }
  const uint32_t sizes[] = {1, 7, 64};
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    char token[128] = "", next[128];
    int64_t steps[64], want = 1;
    size_t n, pages = 0;
    do {
      assert_int_equal(
          fx_list_page(&f, "many", sizes[s], *token ? token : NULL, steps, 64, &n, next), 0);
      assert_true(n >= 1 && n <= sizes[s]);
      for (size_t i = 0; i < n; i++) assert_int_equal(steps[i], want++);
      memcpy(token, next, sizeof token);
      pages++;
    } while (*token);
    assert_int_equal(want, N + 1);
    assert_int_equal(pages, (N + sizes[s] - 1) / sizes[s]);
  }
  int64_t steps[64];
  size_t n;
  char next[128];
  assert_int_equal(fx_list_page(&f, "many", 0, "p1.zz", steps, 64, &n, next), STK_EINVAL);
  assert_int_equal(fx_list_page(&f, "many", 0, "p1.6162", steps, 64, &n, next), STK_EINVAL);
  assert_non_null(strstr(next, "page_token"));
  model_free(m);
  fx_fini(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_read_boxes),
      cmocka_unit_test(test_bad_chunks),
      cmocka_unit_test(test_overlap_and_gap),
      cmocka_unit_test(test_corrupt_object),
      cmocka_unit_test(test_damaged_manifest_not_held),
      cmocka_unit_test(test_list_pages),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
