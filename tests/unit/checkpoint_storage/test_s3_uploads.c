/*
 * ListMultipartUploads through the storage interface on S3. The test
 * servers cannot answer it (s3rver replies 501 NotImplemented), so a small
 * loopback HTTP server (fake_s3.c) speaks S3's XML here: pages of two
 * uploads, several uploads under one key (the upload-id-marker matters),
 * keys outside the prefix or refused by storage_key_check, entities in
 * keys, <Initiated> times; a store that never advances; a store without
 * the call. Also the ISO 8601 parser the <Initiated> element goes through.
 */
#include "fake_s3.h"
#include "s3_config.h"
#include "s3_xml.h"
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

/* Sorted by (key, upload id), as S3 lists them. */
static const struct fake_s3_upload uploads[] = {
    {"deploy/.stk-probe-0001", "p1", "2024-03-01T12:00:00Z"},
    {"deploy/jobA/step-000000000001/attempt-a/rank-00000-0000.bin", "u1",
     "2024-03-01T12:00:00.250Z"},
    {"deploy/jobA/step-000000000001/attempt-a/rank-00001-0000.bin", "u2",
     "2024-03-01T12:00:01.000Z"},
    {"deploy/jobA/step-000000000002/attempt-b/same.bin", "u3a", "2024-03-01T12:00:02.000Z"},
    {"deploy/jobA/step-000000000002/attempt-b/same.bin", "u3b", "2024-03-01T12:00:03.000Z"},
    {"deploy/jobA/step-000000000002/attempt-b/same.bin", "u3c", "2024-03-01T12:00:04.000Z"},
    {"deploy/jobB/x&y.bin", "u4", NULL},
    {"deploy/jobB/z.bin", "u5", "2024-03-01T13:00:00+01:00"},
    {"other/jobA/q.bin", "u6", "2024-03-01T12:00:00Z"},
};
#define N_UPLOADS (sizeof(uploads) / sizeof(uploads[0]))

enum mode {
  MODE_OK,          /* Honest pages of at most two. */
  MODE_STUCK,       /* Truncated, always the same markers. */
  MODE_NO_MARKER,   /* Truncated without NextKeyMarker. */
  MODE_UNSUPPORTED, /* 501 NotImplemented, as s3rver answers. */
};

static enum mode mode;

static char *bad_page(void) {
  if (mode == MODE_UNSUPPORTED)
    return strdup("<Error><Code>NotImplemented</Code><Message>no</Message></Error>");
  const char *markers = mode == MODE_STUCK ? "<NextKeyMarker>deploy/a</NextKeyMarker>"
                                             "<NextUploadIdMarker>u</NextUploadIdMarker>"
                                           : "";
  char buf[512];
  snprintf(buf, sizeof(buf),
           "<ListMultipartUploadsResult><Upload><Key>deploy/a</Key><UploadId>u</UploadId>"
           "</Upload><IsTruncated>true</IsTruncated>%s</ListMultipartUploadsResult>",
           markers);
  return strdup(buf);
}

/* Enough of S3 for the capability probe, and ListMultipartUploads. */
static void handler(void *arg, const char *method, const char *path, const char *query,
                    struct fake_s3_reply *r) {
  (void)arg;
  (void)path;
  char v[8];
  if (strcmp(method, "GET") == 0 && fake_s3_query(query, "uploads", v, sizeof(v))) {
    r->status = mode == MODE_UNSUPPORTED ? 501 : 200;
    r->body = mode == MODE_OK ? fake_s3_list_uploads(uploads, N_UPLOADS, query, 2) : bad_page();
  } else if (!fake_s3_answer_probe(method, query, r)) {
    r->status = 404;
  }
}

struct fixture {
  struct fake_s3 *srv;
  struct storage *st;
};

static int setup(void **state) {
  struct fixture *f = calloc(1, sizeof(*f));
  mode = MODE_OK;
  f->srv = fake_s3_start(handler, NULL);
  if (!f->srv) return -1;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  struct fixture *f = *state;
  storage_free(f->st);
  fake_s3_stop(f->srv);
  free(f);
  return 0;
}

static void open_store(struct fixture *f) {
  struct s3_config cfg = fake_s3_config(f->srv, 2);
  assert_int_equal(storage_open_s3(&cfg, "deploy", &f->st), 0);
}

struct seen {
  char keys[16][256], ids[16][16];
  int64_t initiated[16];
  int n;
};

static int collect(void *arg, const struct storage_upload *u) {
  struct seen *s = arg;
  if (s->n == 16) return STK_ERANGE;
  snprintf(s->keys[s->n], sizeof(s->keys[0]), "%s", u->key);
  snprintf(s->ids[s->n], sizeof(s->ids[0]), "%s", u->upload_id);
  s->initiated[s->n] = u->initiated_ms;
  s->n++;
  return 0;
}

/* GET ?uploads requests of the listing (the probe's asks for one upload). */
static int listing_requests(struct fake_s3 *srv, int *ret_with_id_marker) {
  int n = 0, with = 0;
  char line[2048];
  for (size_t i = 0; i < fake_s3_requests(srv); i++) {
    fake_s3_request(srv, i, line, sizeof(line));
    if (strncmp(line, "GET ", 4) != 0 || !strstr(line, "?uploads") || strstr(line, "max-uploads=1"))
      continue;
    n++;
    with += strstr(line, "upload-id-marker=") != NULL;
  }
  *ret_with_id_marker = with;
  return n;
}

static void test_pages(void **state) {
  struct fixture *f = *state;
  open_store(f);
  assert_true(storage_caps(f->st)->multipart_list_uploads);
  struct seen s = {0};
  assert_int_equal(storage_mpu_list(f->st, "", collect, &s), 0);
  /* Everything under the prefix but the probe's key, relative to it, in order. */
  static const char *ids[] = {"u1", "u2", "u3a", "u3b", "u3c", "u4", "u5"};
  assert_int_equal(s.n, 7);
  for (int i = 0; i < 7; i++) {
    assert_string_equal(s.ids[i], ids[i]);
    assert_int_equal(strncmp(s.keys[i], "job", 3), 0);
  }
  assert_string_equal(s.keys[0], "jobA/step-000000000001/attempt-a/rank-00000-0000.bin");
  assert_string_equal(s.keys[5], "jobB/x&y.bin");
  assert_int_equal(s.initiated[0], INT64_C(1709294400250));
  assert_int_equal(s.initiated[1], INT64_C(1709294401000));
  assert_int_equal(s.initiated[5], 0);                      /* no <Initiated> */
  assert_int_equal(s.initiated[6], INT64_C(1709294400000)); /* 13:00+01:00 */
  /* Eight under the prefix, two a page; every page after the first names
   * both markers (three uploads share one key across a page break). */
  int with_id = 0;
  assert_int_equal(listing_requests(f->srv, &with_id), 4);
  assert_int_equal(with_id, 3);
}

static void test_sub_prefix_and_stop(void **state) {
  struct fixture *f = *state;
  open_store(f);
  struct seen s = {0};
  assert_int_equal(storage_mpu_list(f->st, "jobB/", collect, &s), 0);
  assert_int_equal(s.n, 2);
  assert_string_equal(s.ids[0], "u4");
  assert_string_equal(s.ids[1], "u5");
  /* A callback's non-zero return stops the listing and is returned. */
  s.n = 15;
  assert_int_equal(storage_mpu_list(f->st, "", collect, &s), STK_ERANGE);
  assert_int_equal(storage_mpu_list(f->st, "../", collect, &s), STK_EINVAL);
}

/* A store that says "truncated" without moving on is an error, not a loop. */
static void test_no_progress(void **state) {
  struct fixture *f = *state;
  open_store(f);
  struct seen s = {0};
  mode = MODE_STUCK;
  assert_int_equal(storage_mpu_list(f->st, "", collect, &s), STK_EIO);
  assert_int_equal(s.n, 2); /* the first page, then the same markers again */
  mode = MODE_NO_MARKER;
  s.n = 0;
  assert_int_equal(storage_mpu_list(f->st, "", collect, &s), STK_EIO);
  assert_int_equal(s.n, 1);
}

static void test_unsupported(void **state) {
  struct fixture *f = *state;
  mode = MODE_UNSUPPORTED;
  open_store(f);
  assert_false(storage_caps(f->st)->multipart_list_uploads);
  struct seen s = {0};
  size_t before = fake_s3_requests(f->srv);
  assert_int_equal(storage_mpu_list(f->st, "", collect, &s), STK_ENOTSUP);
  assert_int_equal(fake_s3_requests(f->srv), before); /* not even asked */
}

/* 501 is permanent: the probe asks ListMultipartUploads once, even with
 * eight attempts allowed. */
static void test_unsupported_asked_once(void **state) {
  struct fixture *f = *state;
  mode = MODE_UNSUPPORTED;
  struct s3_config cfg = fake_s3_config(f->srv, 8);
  assert_int_equal(storage_open_s3(&cfg, "deploy", &f->st), 0);
  assert_false(storage_caps(f->st)->multipart_list_uploads);
  int asked = 0;
  char line[2048];
  for (size_t i = 0; i < fake_s3_requests(f->srv); i++) {
    fake_s3_request(f->srv, i, line, sizeof(line));
    asked += strncmp(line, "GET ", 4) == 0 && strstr(line, "?uploads") != NULL;
  }
  assert_int_equal(asked, 1);
}

static void test_time_parse(void **state) {
  (void)state;
  int64_t ms = -1;
  assert_int_equal(s3_xml_time_ms("2010-11-10T20:48:33.000Z", &ms), 0);
  assert_int_equal(ms, INT64_C(1289422113000));
  assert_int_equal(s3_xml_time_ms("2010-11-10T20:48:33Z", &ms), 0);
  assert_int_equal(ms, INT64_C(1289422113000));
  assert_int_equal(s3_xml_time_ms("2010-11-10T21:48:33.5+01:00", &ms), 0);
  assert_int_equal(ms, INT64_C(1289422113500));
  assert_int_equal(s3_xml_time_ms("2010-11-10T19:48:33.123456-01:00", &ms), 0);
  assert_int_equal(ms, INT64_C(1289422113123));
  static const char *bad[] = {"",
                              "2010-11-10",
                              "2010-13-10T00:00:00Z",
                              "2010-11-10T24:00:00Z",
                              "2010-11-10T20:48:33.Z",
                              "2010-11-10T20:48:33.000",
                              "2010-11-10T20:48:33Zjunk",
                              "2010-11-10 20:48:33Z",
                              "2010-11-10T20:48:33+0100"};
  ms = 7;
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    assert_int_equal(s3_xml_time_ms(bad[i], &ms), STK_EINVAL);
  assert_int_equal(ms, 7); /* untouched on failure */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_pages, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sub_prefix_and_stop, setup, teardown),
      cmocka_unit_test_setup_teardown(test_no_progress, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unsupported, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unsupported_asked_once, setup, teardown),
      cmocka_unit_test(test_time_parse),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
