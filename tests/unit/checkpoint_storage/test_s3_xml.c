/*
 * The minimal XML scanner on the shapes S3 answers with: whole-name tag
 * matching, entity decoding, element iteration, and malformed input.
 */
#include "s3_xml.h"

#include "strbuf.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static struct s3_xml_span span(const char *s) {
  return (struct s3_xml_span){s, strlen(s)};
}

static void test_text_and_entities(void **state) {
  (void)state;
  const char *doc = "<?xml version=\"1.0\"?>\n<CompleteMultipartUploadResult xmlns=\"x\">"
                    "<Location>l</Location><Key>a&amp;b</Key>"
                    "<ETag>&quot;3858f62230ac3c915f300c664312c11f-9&quot;</ETag>"
                    "</CompleteMultipartUploadResult>";
  char *etag = s3_xml_text(span(doc), "ETag");
  assert_string_equal(etag, "\"3858f62230ac3c915f300c664312c11f-9\"");
  free(etag);
  char *key = s3_xml_text(span(doc), "Key");
  assert_string_equal(key, "a&b");
  free(key);
  assert_null(s3_xml_text(span(doc), "UploadId"));
  char *num = s3_xml_decode(span("&#65;&#x42;&lt;&gt;&apos;&#xe9;"));
  assert_string_equal(num, "AB<>'\xc3\xa9");
  free(num);
  assert_null(s3_xml_decode(span("a &bogus; b")));
  assert_null(s3_xml_decode(span("a & b")));
}

/* <Key> must not match <KeyMarker>, and elements are iterated in order. */
static void test_iteration_whole_names(void **state) {
  (void)state;
  const char *doc = "<ListBucketResult><KeyMarker>zz</KeyMarker><IsTruncated>true</IsTruncated>"
                    "<Contents><Key>a</Key><Size>3</Size></Contents>"
                    "<Contents ><Key>b/c</Key><Size>10</Size></Contents>"
                    "<Contents/></ListBucketResult>";
  size_t cursor = 0;
  struct s3_xml_span inner;
  const char *want[] = {"a", "b/c", NULL};
  for (int i = 0; i < 3; i++) {
    assert_true(s3_xml_next(span(doc), "Contents", &cursor, &inner));
    char *k = s3_xml_text(inner, "Key");
    if (want[i])
      assert_string_equal(k, want[i]);
    else
      assert_null(k);
    free(k);
  }
  assert_false(s3_xml_next(span(doc), "Contents", &cursor, &inner));
  char *km = s3_xml_text(span(doc), "Key");
  assert_string_equal(km, "a");
  free(km);
}

static void test_malformed(void **state) {
  (void)state;
  size_t cursor = 0;
  struct s3_xml_span inner;
  assert_false(s3_xml_next(span("<Error><Code>SlowDown</Code"), "Code", &cursor, &inner));
  cursor = 0;
  assert_false(s3_xml_next(span("<Error"), "Error", &cursor, &inner));
  assert_null(s3_xml_text(span(""), "Code"));
}

static void test_escape(void **state) {
  (void)state;
  struct strbuf sb = STRBUF_INIT;
  s3_xml_escape(&sb, "\"e\"<&>'");
  assert_string_equal(sb.buf, "&quot;e&quot;&lt;&amp;&gt;&apos;");
  char *back = s3_xml_decode(span(sb.buf));
  assert_string_equal(back, "\"e\"<&>'");
  free(back);
  strbuf_release(&sb);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_text_and_entities),
      cmocka_unit_test(test_iteration_whole_names),
      cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_escape),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
