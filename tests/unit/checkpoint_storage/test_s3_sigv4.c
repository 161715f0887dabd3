/*
 * SigV4 signer against AWS's published examples: the four S3 examples of
 * "Signature Calculations for the Authorization Header: Transferring
 * Payload in a Single Chunk" (bucket examplebucket, 20130524T000000Z) and
 * cases from the generic SigV4 test suite (service "service",
 * 20150830T123600Z). Expected signatures are AWS's, not ours.
 */
#include "s3_sigv4.h"

#include "stk_error.h"
#include "strbuf.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static const struct s3_credentials s3_cred = {"AKIAIOSFODNN7EXAMPLE",
                                              "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", NULL};
static const struct s3_sigv4_scope s3_scope = {"20130524T000000Z", "us-east-1", "s3"};
static const struct s3_credentials suite_cred = {"AKIDEXAMPLE",
                                                 "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", NULL};
static const struct s3_sigv4_scope suite_scope = {"20150830T123600Z", "us-east-1", "service"};

#define N(a) (sizeof(a) / sizeof((a)[0]))

static void expect_auth(const struct s3_sigv4_request *req, const struct s3_credentials *cred,
                        const struct s3_sigv4_scope *scope, const char *want) {
  char *auth = NULL;
  assert_int_equal(s3_sigv4_authorization(req, cred, scope, &auth), 0);
  assert_string_equal(auth, want);
  free(auth);
}

/* GET /test.txt with Range: the AWS document also prints the canonical request. */
static void test_s3_get_object_range(void **state) {
  (void)state;
  struct s3_kv h[] = {{"Host", "examplebucket.s3.amazonaws.com"},
                      {"Range", "bytes=0-9"},
                      {"x-amz-content-sha256", S3_EMPTY_SHA256},
                      {"x-amz-date", "20130524T000000Z"}};
  struct s3_sigv4_request req = {"GET", "/test.txt", NULL, 0, h, N(h), S3_EMPTY_SHA256};
  char *creq, *signed_headers;
  assert_int_equal(s3_sigv4_canonical_request(&req, &creq, &signed_headers), 0);
  assert_string_equal(creq, "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\n"
                            "range:bytes=0-9\nx-amz-content-sha256:" S3_EMPTY_SHA256
                            "\nx-amz-date:20130524T000000Z\n\n"
                            "host;range;x-amz-content-sha256;x-amz-date\n" S3_EMPTY_SHA256);
  assert_string_equal(signed_headers, "host;range;x-amz-content-sha256;x-amz-date");
  char *sts;
  assert_int_equal(s3_sigv4_string_to_sign(creq, &s3_scope, &sts), 0);
  assert_string_equal(sts, "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/"
                           "aws4_request\n"
                           "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  free(creq);
  free(signed_headers);
  free(sts);
  expect_auth(&req, &s3_cred, &s3_scope,
              "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/"
              "aws4_request, SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
              "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

/* PUT /test$file.text: '$' is encoded in the path; the payload is hashed. */
static void test_s3_put_object(void **state) {
  (void)state;
  const char *body = "Welcome to Amazon S3.";
  char hash[65];
  s3_sha256_hex(body, strlen(body), hash);
  assert_string_equal(hash, "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  struct s3_kv h[] = {{"Host", "examplebucket.s3.amazonaws.com"},
                      {"Date", "Fri, 24 May 2013 00:00:00 GMT"},
                      {"x-amz-date", "20130524T000000Z"},
                      {"x-amz-storage-class", "REDUCED_REDUNDANCY"},
                      {"x-amz-content-sha256", hash}};
  struct s3_sigv4_request req = {"PUT", "/test$file.text", NULL, 0, h, N(h), hash};
  expect_auth(&req, &s3_cred, &s3_scope,
              "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/"
              "aws4_request, SignedHeaders=date;host;x-amz-content-sha256;x-amz-date;"
              "x-amz-storage-class, "
              "Signature=98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
}

/* GET /?lifecycle: a parameter without a value is signed as "lifecycle=". */
static void test_s3_get_lifecycle(void **state) {
  (void)state;
  struct s3_kv q[] = {{"lifecycle", NULL}};
  struct s3_kv h[] = {{"Host", "examplebucket.s3.amazonaws.com"},
                      {"x-amz-date", "20130524T000000Z"},
                      {"x-amz-content-sha256", S3_EMPTY_SHA256}};
  struct s3_sigv4_request req = {"GET", "/", q, N(q), h, N(h), S3_EMPTY_SHA256};
  char *creq, *signed_headers;
  assert_int_equal(s3_sigv4_canonical_request(&req, &creq, &signed_headers), 0);
  assert_non_null(strstr(creq, "GET\n/\nlifecycle=\nhost:"));
  free(creq);
  free(signed_headers);
  expect_auth(&req, &s3_cred, &s3_scope,
              "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/"
              "aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date, "
              "Signature=fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
}

/* GET /?max-keys=2&prefix=J, given out of order to prove the sort. */
static void test_s3_list_objects(void **state) {
  (void)state;
  struct s3_kv q[] = {{"prefix", "J"}, {"max-keys", "2"}};
  struct s3_kv h[] = {{"x-amz-date", "20130524T000000Z"},
                      {"x-amz-content-sha256", S3_EMPTY_SHA256},
                      {"host", "examplebucket.s3.amazonaws.com"}};
  struct s3_sigv4_request req = {"GET", "/", q, N(q), h, N(h), S3_EMPTY_SHA256};
  expect_auth(&req, &s3_cred, &s3_scope,
              "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/"
              "aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date, "
              "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

static const struct s3_kv suite_headers[] = {{"Host", "example.amazonaws.com"},
                                             {"X-Amz-Date", "20150830T123600Z"}};

static void test_suite_get_vanilla(void **state) {
  (void)state;
  struct s3_sigv4_request req = {"GET", "/", NULL, 0, suite_headers, 2, S3_EMPTY_SHA256};
  char *creq, *signed_headers, *sts;
  assert_int_equal(s3_sigv4_canonical_request(&req, &creq, &signed_headers), 0);
  assert_int_equal(s3_sigv4_string_to_sign(creq, &suite_scope, &sts), 0);
  assert_string_equal(sts, "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/"
                           "aws4_request\n"
                           "bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63");
  free(creq);
  free(signed_headers);
  free(sts);
  expect_auth(&req, &suite_cred, &suite_scope,
              "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
              "SignedHeaders=host;x-amz-date, "
              "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
}

static void test_suite_query_order_key_case(void **state) {
  (void)state;
  struct s3_kv q[] = {{"Param2", "value2"}, {"Param1", "value1"}};
  struct s3_sigv4_request req = {"GET", "/", q, 2, suite_headers, 2, S3_EMPTY_SHA256};
  expect_auth(&req, &suite_cred, &suite_scope,
              "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
              "SignedHeaders=host;x-amz-date, "
              "Signature=b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500");
}

/* get-vanilla-empty-query-key: GET /?Param1=value1. */
static void test_suite_empty_query_key(void **state) {
  (void)state;
  struct s3_kv q[] = {{"Param1", "value1"}};
  struct s3_sigv4_request req = {"GET", "/", q, 1, suite_headers, 2, S3_EMPTY_SHA256};
  expect_auth(&req, &suite_cred, &suite_scope,
              "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
              "SignedHeaders=host;x-amz-date, "
              "Signature=a67d582fa61cc504c4bae71f336f98b97f1ea3c7a6bfe1b6e45aec72011b9aeb");
}

static void test_suite_post_form(void **state) {
  (void)state;
  const char *body = "Param1=value1";
  char hash[65];
  s3_sha256_hex(body, strlen(body), hash);
  struct s3_kv h[] = {{"Content-Type", "application/x-www-form-urlencoded"},
                      {"Host", "example.amazonaws.com"},
                      {"X-Amz-Date", "20150830T123600Z"}};
  struct s3_sigv4_request req = {"POST", "/", NULL, 0, h, 3, hash};
  expect_auth(&req, &suite_cred, &suite_scope,
              "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
              "SignedHeaders=content-type;host;x-amz-date, "
              "Signature=ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a");
}

/* post-sts-header-before: the session token is a signed header. */
static void test_suite_session_token(void **state) {
  (void)state;
  const char *token =
      "AQoDYXdzEPT//////////wEXAMPLEtc764bNrC9SAPBSM22wDOk4x4HIZ8j4FZTwdQWLWsKWHGBuFqwAeMicRXmx"
      "fpSPfIeoIYRqTflfKD8YUuwthAx7mSEI/qkPpKPi/kMcGdQrmGdeehM4IC1NtBmUpp2wUE8phUZampKsburEDy0"
      "KPkyQDYwT7WZ0wq5VSXDvp75YU9HFvlRd8Tx6q6fE8YQcHNVXAkiY9q6d+xo0rKwT38xVqr7ZD0u0iPPkUL64lI"
      "ZbqBAz+scqKmlzm8FDrypNC9Yjc8fPOLn9FX9KSYvKTr4rvx3iSIlTJabIQwj2ICCR/oLxBA==";
  struct s3_kv h[] = {{"Host", "example.amazonaws.com"},
                      {"X-Amz-Date", "20150830T123600Z"},
                      {"X-Amz-Security-Token", token}};
  struct s3_sigv4_request req = {"POST", "/", NULL, 0, h, 3, S3_EMPTY_SHA256};
  expect_auth(&req, &suite_cred, &suite_scope,
              "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
              "SignedHeaders=host;x-amz-date;x-amz-security-token, "
              "Signature=85d96828115b5dc0cfc3bd16ad9e210dd772bbebba041836c64533a82be05ead");
}

/* Header values are trimmed and inner spaces folded; duplicates join with ','. */
static void test_header_canonical_form(void **state) {
  (void)state;
  struct s3_kv h[] = {{"My-Header1", "  a   b   c  "},
                      {"host", "h"},
                      {"my-header1", "second"},
                      {"X-Amz-Date", "20150830T123600Z"}};
  struct s3_sigv4_request req = {"GET", "/", NULL, 0, h, 4, S3_UNSIGNED_PAYLOAD};
  char *creq, *signed_headers;
  assert_int_equal(s3_sigv4_canonical_request(&req, &creq, &signed_headers), 0);
  assert_string_equal(creq, "GET\n/\n\nhost:h\nmy-header1:a b c,second\n"
                            "x-amz-date:20150830T123600Z\n\nhost;my-header1;x-amz-date\n"
                            "UNSIGNED-PAYLOAD");
  free(creq);
  free(signed_headers);
}

/* Paths keep '/' and encode each byte once; query values encode '/', '=' and space. */
static void test_uri_encoding(void **state) {
  (void)state;
  struct strbuf sb = STRBUF_INIT;
  s3_uri_encode(&sb, "/ck pt/a+b=c/~x_y-z.0/\xc3\xa9%", true);
  assert_string_equal(sb.buf, "/ck%20pt/a%2Bb%3Dc/~x_y-z.0/%C3%A9%25");
  strbuf_release(&sb);
  struct s3_kv q[] = {{"prefix", "a b/c"}, {"uploads", ""}, {"a", "2"}, {"a", "1"}};
  struct s3_kv h[] = {{"host", "h"}};
  struct s3_sigv4_request req = {"GET", "/b/k%", q, 4, h, 1, S3_UNSIGNED_PAYLOAD};
  char *creq, *signed_headers;
  assert_int_equal(s3_sigv4_canonical_request(&req, &creq, &signed_headers), 0);
  assert_non_null(strstr(creq, "GET\n/b/k%25\na=1&a=2&prefix=a%20b%2Fc&uploads=\nhost:h\n"));
  free(creq);
  free(signed_headers);
}

static void test_rejects_bad_input(void **state) {
  (void)state;
  struct s3_kv h[] = {{"", "x"}};
  char *a = NULL, *b = NULL;
  struct s3_sigv4_request no_slash = {"GET", "x", NULL, 0, NULL, 0, S3_EMPTY_SHA256};
  assert_int_equal(s3_sigv4_canonical_request(&no_slash, &a, &b), STK_EINVAL);
  struct s3_sigv4_request empty_name = {"GET", "/", NULL, 0, h, 1, S3_EMPTY_SHA256};
  assert_int_equal(s3_sigv4_canonical_request(&empty_name, &a, &b), STK_EINVAL);
  struct s3_sigv4_scope bad_date = {"2015", "us-east-1", "s3"};
  assert_int_equal(s3_sigv4_string_to_sign("x", &bad_date, &a), STK_EINVAL);
  assert_null(a);
  char date[17];
  s3_sigv4_format_date(1369353600, date);
  assert_string_equal(date, "20130524T000000Z");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_s3_get_object_range),
      cmocka_unit_test(test_s3_put_object),
      cmocka_unit_test(test_s3_get_lifecycle),
      cmocka_unit_test(test_s3_list_objects),
      cmocka_unit_test(test_suite_get_vanilla),
      cmocka_unit_test(test_suite_query_order_key_case),
      cmocka_unit_test(test_suite_empty_query_key),
      cmocka_unit_test(test_suite_post_form),
      cmocka_unit_test(test_suite_session_token),
      cmocka_unit_test(test_header_canonical_form),
      cmocka_unit_test(test_uri_encoding),
      cmocka_unit_test(test_rejects_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
