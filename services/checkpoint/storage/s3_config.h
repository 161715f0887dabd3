/*
 * s3_config: where and how the S3 client connects. Fields left NULL or 0
 * are taken from the environment (AWS_ENDPOINT_URL, AWS_REGION,
 * AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN,
 * STOKER_S3_UNSIGNED_PAYLOAD) or defaults by s3_config_resolve.
 */
#ifndef STK_S3_CONFIG_H
#define STK_S3_CONFIG_H

#include <stdbool.h>

struct s3_config {
  const char *endpoint; /* "http://127.0.0.1:4568"; default https://s3.<region>.amazonaws.com */
  const char *region;   /* default "us-east-1" */
  const char *bucket;   /* required */
  const char *access_key;
  const char *secret_key;
  const char *session_token; /* optional */
  bool virtual_host;         /* bucket.host/key instead of host/bucket/key */
  bool unsigned_payload;     /* send UNSIGNED-PAYLOAD instead of hashing bodies;
                                default: over https only */
  int max_concurrency;       /* default 16 */
  int recover_every;         /* successes per +1 of the limit after SlowDown; default 8 */
  int max_attempts;          /* tries per operation; default 8 */
  int backoff_base_ms;       /* default 50 */
  int backoff_max_ms;        /* default 5000 */
  int timeout_ms;            /* whole attempt; default 120000 */
  int connect_timeout_ms;    /* default 10000 */
  int low_speed_timeout_s;   /* abort when under 1 KiB/s this long; default 30 */
};

/* Returns a copy of cfg with every unset field filled in, strings
 * duplicated into one allocation owned by *ret_owned (free() it). */
int s3_config_resolve(const struct s3_config *cfg, struct s3_config *ret, char **ret_owned);

#endif
