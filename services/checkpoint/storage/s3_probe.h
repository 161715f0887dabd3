/*
 * s3_probe: what this S3 store actually does, found out at start against
 * the bucket, so the commit protocol can rely on facts instead of hopes.
 *  - conditional PUT: If-None-Match: * twice on a fresh probe key; the
 *    second answer must be 412 (S3 since 2024; test servers ignore it);
 *  - multipart ListParts and Abort: a one-part upload is listed, aborted,
 *    and must then be gone;
 *  - ListMultipartUploads answers at all (s3rver: 501 NotImplemented); the
 *    orphan-upload GC needs it.
 */
#ifndef STK_S3_PROBE_H
#define STK_S3_PROBE_H

#include "s3_thread.h"

struct s3_caps {
  bool conditional_put;
  bool multipart_list_parts;
  bool multipart_abort;
  bool multipart_list_uploads;
};

/* Probes with keys starting with key_prefix (it creates and removes
 * objects and an upload there). Fails only if the store cannot take a
 * plain PUT or a multipart upload at all. */
int s3_probe(struct s3_thread *s, const char *key_prefix, struct s3_caps *ret);

#endif
