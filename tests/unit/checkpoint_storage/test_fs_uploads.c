/*
 * The file backend's list of multipart uploads in progress
 * (storage_mpu_list): begun uploads are listed with their key, id and begin
 * time; completed and aborted ones are not; the prefix filters; a
 * half-begun upload directory (no key file yet) is not listed.
 */
#include "storage.h"

#include "stk_error.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cmocka.h>

#include "fs_fixture.h"

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

struct seen {
  char keys[8][128], ids[8][64];
  int64_t initiated[8];
  int n;
};

static int collect(void *arg, const struct storage_upload *u) {
  struct seen *s = arg;
  if (s->n == 8) return STK_ERANGE;
  snprintf(s->keys[s->n], sizeof(s->keys[0]), "%s", u->key);
  snprintf(s->ids[s->n], sizeof(s->ids[0]), "%s", u->upload_id);
  s->initiated[s->n] = u->initiated_ms;
  s->n++;
  return 0;
}

/* Index of id in s, or -1. */
static int find(const struct seen *s, const char *id) {
  for (int i = 0; i < s->n; i++)
    if (strcmp(s->ids[i], id) == 0) return i;
  return -1;
}

static void test_list_in_progress(void **state) {
  struct fs_fixture *f = *state;
  assert_true(storage_caps(f->st)->multipart_list_uploads);
  int64_t before = now_ms();
  char *a, *b, *c, *d, *etag;
  assert_int_equal(storage_mpu_begin(f->st, "job/step-1/a.bin", &a), 0);
  assert_int_equal(storage_mpu_begin(f->st, "job/step-1/a.bin", &b), 0); /* same key again */
  assert_int_equal(storage_mpu_begin(f->st, "job/step-2/c.bin", &c), 0);
  assert_int_equal(storage_mpu_begin(f->st, "other/d.bin", &d), 0);
  int64_t after = now_ms();
  struct seen s = {0};
  assert_int_equal(storage_mpu_list(f->st, "", collect, &s), 0);
  assert_int_equal(s.n, 4);
  int ia = find(&s, a);
  assert_true(ia >= 0);
  assert_string_equal(s.keys[ia], "job/step-1/a.bin");
  assert_true(s.initiated[ia] >= before - 1000 && s.initiated[ia] <= after + 1000);
  assert_string_equal(s.keys[find(&s, b)], "job/step-1/a.bin");
  /* Complete one, abort another: neither is listed any more. */
  assert_int_equal(storage_mpu_part(f->st, "job/step-2/c.bin", c, 1, "xyz", 3, &etag), 0);
  struct storage_part p = {1, etag};
  assert_int_equal(storage_mpu_complete(f->st, "job/step-2/c.bin", c, &p, 1, 0), 0);
  assert_int_equal(storage_mpu_abort(f->st, "job/step-1/a.bin", a), 0);
  memset(&s, 0, sizeof(s));
  assert_int_equal(storage_mpu_list(f->st, "", collect, &s), 0);
  assert_int_equal(s.n, 2);
  assert_true(find(&s, b) >= 0 && find(&s, d) >= 0);
  /* The prefix filters. */
  memset(&s, 0, sizeof(s));
  assert_int_equal(storage_mpu_list(f->st, "job/", collect, &s), 0);
  assert_int_equal(s.n, 1);
  assert_string_equal(s.ids[0], b);
  memset(&s, 0, sizeof(s));
  assert_int_equal(storage_mpu_list(f->st, "nothing/", collect, &s), 0);
  assert_int_equal(s.n, 0);
  assert_int_equal(storage_mpu_list(f->st, "/abs/", collect, &s), STK_EINVAL);
  free(a);
  free(b);
  free(c);
  free(d);
  free(etag);
}

/* A directory left by a begin that died before its key file is not an
 * upload anyone can name; nor is a stray entry. Neither is listed. */
static void test_half_begun_ignored(void **state) {
  struct fs_fixture *f = *state;
  char path[160];
  snprintf(path, sizeof(path), "%s/root/.stk-uploads/0123456789abcdef0123456789abcdef", f->dir);
  assert_int_equal(mkdir(path, 0755), 0);
  snprintf(path, sizeof(path), "%s/root/.stk-uploads/not-an-id", f->dir);
  assert_int_equal(mkdir(path, 0755), 0);
  char *id;
  assert_int_equal(storage_mpu_begin(f->st, "k.bin", &id), 0);
  struct seen s = {0};
  assert_int_equal(storage_mpu_list(f->st, "", collect, &s), 0);
  assert_int_equal(s.n, 1);
  assert_string_equal(s.ids[0], id);
  assert_string_equal(s.keys[0], "k.bin");
  /* A callback's non-zero return stops the listing and is returned. */
  s.n = 8;
  assert_int_equal(storage_mpu_list(f->st, "", collect, &s), STK_ERANGE);
  free(id);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_list_in_progress, fs_setup, fs_teardown),
      cmocka_unit_test_setup_teardown(test_half_begun_ignored, fs_setup, fs_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
