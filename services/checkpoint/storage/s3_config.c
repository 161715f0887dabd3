/*
 * S3 configuration defaults and the AWS_* environment variables.
 */
#include "s3_config.h"

#include "stk_error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *pick(const char *set, const char *env_name, const char *fallback) {
  if (set && set[0]) return set;
  const char *env = env_name ? getenv(env_name) : NULL;
  return env && env[0] ? env : fallback;
}

/* STOKER_S3_UNSIGNED_PAYLOAD=1/0 forces it; unset: unsigned over https
 * (TLS protects the body, as AWS's SDKs assume), hashed over plain http.
 * Either way every 1 MiB block's CRC32C is in the manifest and checked on
 * every read. */
static bool pick_unsigned_payload(bool set, const char *endpoint) {
  const char *env = getenv("STOKER_S3_UNSIGNED_PAYLOAD");
  if (set) return true;
  if (env && env[0]) return strcmp(env, "0") != 0;
  return strncmp(endpoint, "https://", 8) == 0;
}

static int pick_int(int set, int fallback) {
  return set > 0 ? set : fallback;
}

/* Copies each string into one block so the resolved config owns them. */
static int own_strings(struct s3_config *c, char **ret_owned) {
  const char **fields[] = {&c->endpoint,   &c->region,     &c->bucket,
                           &c->access_key, &c->secret_key, &c->session_token};
  size_t n = sizeof(fields) / sizeof(fields[0]), total = 0;
  for (size_t i = 0; i < n; i++) total += *fields[i] ? strlen(*fields[i]) + 1 : 0;
  char *block = malloc(total ? total : 1), *p = block;
  if (!block) return STK_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    if (!*fields[i]) continue;
    size_t len = strlen(*fields[i]) + 1;
    memcpy(p, *fields[i], len);
    *fields[i] = p;
    p += len;
  }
  *ret_owned = block;
  return 0;
}

int s3_config_resolve(const struct s3_config *cfg, struct s3_config *ret, char **ret_owned) {
  struct s3_config c = *cfg;
  c.region = pick(cfg->region, "AWS_REGION", pick(NULL, "AWS_DEFAULT_REGION", "us-east-1"));
  char aws_endpoint[128];
  snprintf(aws_endpoint, sizeof(aws_endpoint), "https://s3.%s.amazonaws.com", c.region);
  c.endpoint = pick(cfg->endpoint, "AWS_ENDPOINT_URL", aws_endpoint);
  c.access_key = pick(cfg->access_key, "AWS_ACCESS_KEY_ID", NULL);
  c.secret_key = pick(cfg->secret_key, "AWS_SECRET_ACCESS_KEY", NULL);
  c.session_token = pick(cfg->session_token, "AWS_SESSION_TOKEN", NULL);
  c.unsigned_payload = pick_unsigned_payload(cfg->unsigned_payload, c.endpoint);
  c.max_concurrency = pick_int(cfg->max_concurrency, 16);
  c.recover_every = pick_int(cfg->recover_every, 8);
  c.max_attempts = pick_int(cfg->max_attempts, 8);
  c.backoff_base_ms = pick_int(cfg->backoff_base_ms, 50);
  c.backoff_max_ms = pick_int(cfg->backoff_max_ms, 5000);
  c.timeout_ms = pick_int(cfg->timeout_ms, 120000);
  c.connect_timeout_ms = pick_int(cfg->connect_timeout_ms, 10000);
  c.low_speed_timeout_s = pick_int(cfg->low_speed_timeout_s, 30);
  if (!c.bucket || !c.bucket[0] || !c.access_key || !c.secret_key) {
    stk_set_detail("S3 needs a bucket and credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)");
    return STK_EINVAL;
  }
  if (strncmp(c.endpoint, "http://", 7) != 0 && strncmp(c.endpoint, "https://", 8) != 0) {
    stk_set_detail("S3 endpoint must start with http:// or https://");
    return STK_EINVAL;
  }
  int err = own_strings(&c, ret_owned);
  if (!err) *ret = c;
  return err;
}
