/*
 * fake_s3: a tiny HTTP/1.1 server on 127.0.0.1 (ephemeral port) for the S3
 * client tests that need answers the real test servers cannot give (s3rver
 * answers ListMultipartUploads with 501 NotImplemented). Each connection
 * carries one request, answered by the test's handler and closed. Every
 * request's method and target are logged for the test to inspect.
 */
#ifndef STK_TEST_FAKE_S3_H
#define STK_TEST_FAKE_S3_H

#include <stddef.h>
#include <stdint.h>

#include "s3_config.h"

#define FAKE_S3_BUCKET "stoker-test"

struct fake_s3_reply {
  int status;         /* 200 unless set. */
  char etag[64];      /* Sent as an ETag header when non-empty. */
  char *body;         /* malloc'd by the handler (freed by the server), or NULL. */
  uint64_t head_size; /* HEAD: the Content-Length announced (no body is sent). */
};

/* Runs on the server thread: method ("GET"), path ("/bucket/key", still
 * percent-encoded) and query (after '?', "" if none). */
typedef void (*fake_s3_handler)(void *arg, const char *method, const char *path, const char *query,
                                struct fake_s3_reply *ret);

struct fake_s3;

struct fake_s3 *fake_s3_start(fake_s3_handler fn, void *arg);
int fake_s3_port(const struct fake_s3 *f);
/* A client configuration for f: its URL, bucket FAKE_S3_BUCKET, any
 * credentials (it checks no signature), 1-5 ms back-off, max_attempts
 * tries. Valid while f runs. */
struct s3_config fake_s3_config(const struct fake_s3 *f, uint32_t max_attempts);
void fake_s3_stop(struct fake_s3 *f);

/* Requests served so far, and the n-th "METHOD target" line (copied). */
size_t fake_s3_requests(struct fake_s3 *f);
void fake_s3_request(struct fake_s3 *f, size_t n, char *buf, size_t len);

/* The percent-decoded value of a query parameter into buf: 1 if present
 * (an empty value too), 0 if absent. */
int fake_s3_query(const char *query, const char *name, char *buf, size_t len);

/* The UploadId fake_s3_answer_probe gives every CreateMultipartUpload. */
#define FAKE_S3_PROBE_UPLOAD_ID "probe"

/* Answers what the storage's start-up capability probe (s3_probe.h) asks, as
 * the stores of these tests all answer it, for any key: PUT 200 with an ETag
 * (If-None-Match ignored), DELETE 204, CreateMultipartUpload (POST ?uploads)
 * FAKE_S3_PROBE_UPLOAD_ID, ListParts (GET ?uploadId) 404 NoSuchUpload, and
 * ListMultipartUploads (GET ?uploads) an empty list. 1 if the request was
 * one of these (ret filled), 0 if not (ret untouched): a handler answers its
 * own cases first and leaves the rest to this. */
int fake_s3_answer_probe(const char *method, const char *query, struct fake_s3_reply *ret);

/* One upload of an emulated ListMultipartUploads. */
struct fake_s3_upload {
  const char *key, *id;
  const char *initiated; /* ISO 8601, or NULL: no <Initiated> element. */
};

/* A ListMultipartUploadsResult body for the request's query (prefix,
 * key-marker, upload-id-marker, max-uploads) over u (sorted by key, then
 * id), at most page_max uploads a page, with S3's marker semantics: after
 * key-marker K alone, keys > K; with upload-id-marker I too, also key K with
 * ids > I. malloc'd. */
char *fake_s3_list_uploads(const struct fake_s3_upload *u, size_t n, const char *query,
                           int page_max);

#endif
