/*
 * s3_sigv4: AWS Signature Version 4, computed by our code with OpenSSL.
 * libcurl's CURLOPT_AWS_SIGV4 (7.88) does not canonicalize query strings and
 * signs `?uploads` wrongly, so every S3 request is signed here instead.
 *
 * The steps are exposed one by one (canonical request, string to sign,
 * signing key, Authorization value) so that each can be checked against
 * AWS's published examples. S3 rules apply to the path: each segment is
 * URI-encoded once ('/' kept), never double encoded, never normalized.
 *
 * All functions are pure and thread-safe. Strings returned through ret_*
 * are heap-allocated; the caller frees them.
 */
#ifndef STK_S3_SIGV4_H
#define STK_S3_SIGV4_H

#include <stdbool.h>
#include <stddef.h>

struct strbuf;

/* A name and a value, both unencoded. A NULL value reads as "". */
struct s3_kv {
  const char *name;
  const char *value;
};

struct s3_credentials {
  const char *access_key;
  const char *secret_key;
  const char *session_token; /* NULL when none; sent as x-amz-security-token. */
};

struct s3_sigv4_request {
  const char *method;        /* "GET", "PUT", ... */
  const char *path;          /* Unencoded, starts with '/': "/bucket/a b.txt". */
  const struct s3_kv *query; /* Unencoded parameters, any order. */
  size_t n_query;
  const struct s3_kv *headers; /* The headers to sign (host and x-amz-date included). */
  size_t n_headers;
  const char *payload_hash; /* 64 lower-case hex digits or "UNSIGNED-PAYLOAD". */
};

/* The credential scope: time stamp, region and service. */
struct s3_sigv4_scope {
  const char *amz_date; /* "20130524T000000Z" (ISO 8601 basic, UTC). */
  const char *region;   /* "us-east-1" */
  const char *service;  /* "s3" */
};

/* The literal payload hash for bodies that are not hashed. */
#define S3_UNSIGNED_PAYLOAD "UNSIGNED-PAYLOAD"
/* SHA-256 of the empty string. */
#define S3_EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

/* Appends s URI-encoded as AWS wants: unreserved bytes (A-Z a-z 0-9 - . _ ~)
 * kept, every other byte as %XX with upper-case hex; '/' kept when
 * keep_slash (paths), encoded otherwise (query names and values). */
void s3_uri_encode(struct strbuf *sb, const char *s, bool keep_slash);

/* Lower-case hex SHA-256 of data into ret_hex (65 bytes with the NUL). */
void s3_sha256_hex(const void *data, size_t len, char ret_hex[65]);

/* The canonical request text and the signed-headers list ("host;range;...").
 * STK_EINVAL if a field is missing or a header name is empty; STK_ENOMEM. */
int s3_sigv4_canonical_request(const struct s3_sigv4_request *req, char **ret_text,
                               char **ret_signed_headers);

/* "AWS4-HMAC-SHA256\n<date>\n<scope>\n<hex sha256 of canonical request>". */
int s3_sigv4_string_to_sign(const char *canonical_request, const struct s3_sigv4_scope *scope,
                            char **ret_text);

/* HMAC chain "AWS4"+secret -> date (8 digits) -> region -> service -> "aws4_request". */
void s3_sigv4_signing_key(const char *secret_key, const char *date8, const char *region,
                          const char *service, unsigned char ret_key[32]);

/* The whole signature: the value of the Authorization header,
 * "AWS4-HMAC-SHA256 Credential=AK/20130524/us-east-1/s3/aws4_request,
 * SignedHeaders=..., Signature=<64 hex>". The session token is not added
 * here: a caller using one puts x-amz-security-token among req->headers. */
int s3_sigv4_authorization(const struct s3_sigv4_request *req, const struct s3_credentials *cred,
                           const struct s3_sigv4_scope *scope, char **ret_value);

/* Formats a UNIX time as "YYYYMMDDTHHMMSSZ" into ret (17 bytes). */
void s3_sigv4_format_date(long long unix_seconds, char ret[17]);

#endif
