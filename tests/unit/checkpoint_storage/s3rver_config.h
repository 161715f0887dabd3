/*
 * s3rver_config: the client configuration for the test s3rver
 * (s3rver_fixture.h) at an endpoint, its own or a proxy's in front of it.
 * Apart from s3rver_fixture.c, which the integration tests build without
 * the storage headers.
 */
#ifndef STK_TEST_S3RVER_CONFIG_H
#define STK_TEST_S3RVER_CONFIG_H

#include "s3_config.h"
#include "s3rver_fixture.h"

/* s3rver's bucket and credentials, 5-50 ms back-off, the default attempts. */
static inline struct s3_config s3rver_config(const char *endpoint) {
  struct s3_config cfg = {.endpoint = endpoint,
                          .region = "us-east-1",
                          .bucket = S3RVER_BUCKET,
                          .access_key = S3RVER_KEY,
                          .secret_key = S3RVER_KEY,
                          .backoff_base_ms = 5,
                          .backoff_max_ms = 50};
  return cfg;
}

#endif
