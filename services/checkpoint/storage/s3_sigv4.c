/*
 * AWS Signature Version 4 for S3 requests (see s3_sigv4.h). Each step of
 * the algorithm is one function so the tests can compare the intermediate
 * texts with AWS's published examples when a signature does not match.
 */
#include "s3_sigv4.h"

#include "stk_error.h"
#include "strbuf.h"

#include <ctype.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char hex_upper[] = "0123456789ABCDEF";
static const char hex_lower[] = "0123456789abcdef";

static bool unreserved(unsigned char c) {
  return isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~';
}

void s3_uri_encode(struct strbuf *sb, const char *s, bool keep_slash) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (unreserved(*p) || (keep_slash && *p == '/')) {
      strbuf_putc(sb, (char)*p);
    } else {
      char esc[3] = {'%', hex_upper[*p >> 4], hex_upper[*p & 15]};
      strbuf_append(sb, esc, 3);
    }
  }
}

static void to_hex(const unsigned char *bytes, size_t n, char *ret_hex) {
  for (size_t i = 0; i < n; i++) {
    ret_hex[2 * i] = hex_lower[bytes[i] >> 4];
    ret_hex[2 * i + 1] = hex_lower[bytes[i] & 15];
  }
  ret_hex[2 * n] = '\0';
}

void s3_sha256_hex(const void *data, size_t len, char ret_hex[65]) {
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(data, len, md);
  to_hex(md, sizeof(md), ret_hex);
}

static void hmac(const void *key, size_t key_len, const char *msg, unsigned char out[32]) {
  unsigned int out_len = 32;
  HMAC(EVP_sha256(), key, (int)key_len, (const unsigned char *)msg, strlen(msg), out, &out_len);
}

/* One canonical query pair, encoded, for sorting. */
struct enc_pair {
  char *name;
  char *value;
};

static int cmp_pair(const void *a, const void *b) {
  const struct enc_pair *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  return c ? c : strcmp(x->value, y->value);
}

static char *encode_dup(const char *s) {
  struct strbuf sb = STRBUF_INIT;
  s3_uri_encode(&sb, s ? s : "", false);
  return strbuf_take(&sb, NULL);
}

/* Query parameters encoded, sorted by name then value, empty values "name=". */
static int append_query(struct strbuf *sb, const struct s3_kv *q, size_t n) {
  struct enc_pair *pairs = calloc(n ? n : 1, sizeof(*pairs));
  int err = pairs ? 0 : STK_ENOMEM;
  for (size_t i = 0; i < n && !err; i++) {
    pairs[i].name = encode_dup(q[i].name);
    pairs[i].value = encode_dup(q[i].value);
    if (!pairs[i].name || !pairs[i].value) err = STK_ENOMEM;
  }
  if (!err) {
    qsort(pairs, n, sizeof(*pairs), cmp_pair);
    for (size_t i = 0; i < n; i++)
      strbuf_printf(sb, "%s%s=%s", i ? "&" : "", pairs[i].name, pairs[i].value);
  }
  for (size_t i = 0; pairs && i < n; i++) {
    free(pairs[i].name);
    free(pairs[i].value);
  }
  free(pairs);
  return err;
}

/* A header reduced to its canonical form: lower-case name, value trimmed
 * with inner runs of spaces folded to one. index keeps the sort stable so
 * repeated headers join in their original order. */
struct canon_header {
  char *name;
  char *value;
  size_t index;
};

static int cmp_header(const void *a, const void *b) {
  const struct canon_header *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  return c ? c : (x->index < y->index ? -1 : x->index > y->index);
}

static char *canon_value(const char *v) {
  struct strbuf sb = STRBUF_INIT;
  const char *p = v ? v : "";
  while (*p == ' ' || *p == '\t') p++;
  bool space = false;
  for (; *p; p++) {
    if (*p == ' ' || *p == '\t') {
      space = true;
      continue;
    }
    if (space && sb.len) strbuf_putc(&sb, ' ');
    space = false;
    strbuf_putc(&sb, *p);
  }
  return strbuf_take(&sb, NULL);
}

static char *lower_dup(const char *s) {
  char *d = strdup(s);
  for (char *p = d; p && *p; p++) *p = (char)tolower((unsigned char)*p);
  return d;
}

static void free_headers(struct canon_header *h, size_t n) {
  for (size_t i = 0; h && i < n; i++) {
    free(h[i].name);
    free(h[i].value);
  }
  free(h);
}

/* Appends "name:value\n" lines, then "\n", then the signed-header list to
 * *signed_sb. Duplicate names are merged into one line, values joined by ','. */
static int append_headers(struct strbuf *sb, struct strbuf *signed_sb, const struct s3_kv *hd,
                          size_t n) {
  struct canon_header *h = calloc(n ? n : 1, sizeof(*h));
  if (!h) return STK_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    if (!hd[i].name || !hd[i].name[0]) {
      free_headers(h, n);
      return STK_EINVAL;
    }
    h[i] = (struct canon_header){lower_dup(hd[i].name), canon_value(hd[i].value), i};
    if (!h[i].name || !h[i].value) {
      free_headers(h, n);
      return STK_ENOMEM;
    }
  }
  qsort(h, n, sizeof(*h), cmp_header);
  for (size_t i = 0; i < n; i++) {
    bool same = i > 0 && strcmp(h[i].name, h[i - 1].name) == 0;
    if (same) {
      strbuf_printf(sb, ",%s", h[i].value);
      continue;
    }
    strbuf_printf(sb, "%s%s:%s", i ? "\n" : "", h[i].name, h[i].value);
    strbuf_printf(signed_sb, "%s%s", i ? ";" : "", h[i].name);
  }
  strbuf_puts(sb, "\n\n");
  free_headers(h, n);
  return 0;
}

int s3_sigv4_canonical_request(const struct s3_sigv4_request *req, char **ret_text,
                               char **ret_signed_headers) {
  if (!req->method || !req->path || req->path[0] != '/' || !req->payload_hash) return STK_EINVAL;
  struct strbuf sb = STRBUF_INIT, signed_sb = STRBUF_INIT;
  strbuf_printf(&sb, "%s\n", req->method);
  s3_uri_encode(&sb, req->path, true);
  strbuf_putc(&sb, '\n');
  int err = append_query(&sb, req->query, req->n_query);
  if (!err) {
    strbuf_putc(&sb, '\n');
    err = append_headers(&sb, &signed_sb, req->headers, req->n_headers);
  }
  if (!err) strbuf_printf(&sb, "%s\n%s", signed_sb.buf ? signed_sb.buf : "", req->payload_hash);
  if (!err && (sb.failed || signed_sb.failed)) err = STK_ENOMEM;
  if (err) {
    strbuf_release(&sb);
    strbuf_release(&signed_sb);
    return err;
  }
  *ret_text = strbuf_take(&sb, NULL);
  *ret_signed_headers = strbuf_take(&signed_sb, NULL);
  return 0;
}

static bool scope_valid(const struct s3_sigv4_scope *scope) {
  return scope->amz_date && strlen(scope->amz_date) == 16 && scope->region && scope->service;
}

int s3_sigv4_string_to_sign(const char *canonical_request, const struct s3_sigv4_scope *scope,
                            char **ret_text) {
  if (!scope_valid(scope)) return STK_EINVAL;
  char hash[65];
  s3_sha256_hex(canonical_request, strlen(canonical_request), hash);
  struct strbuf sb = STRBUF_INIT;
  strbuf_printf(&sb, "AWS4-HMAC-SHA256\n%s\n%.8s/%s/%s/aws4_request\n%s", scope->amz_date,
                scope->amz_date, scope->region, scope->service, hash);
  char *text = strbuf_take(&sb, NULL);
  if (!text) return STK_ENOMEM;
  *ret_text = text;
  return 0;
}

void s3_sigv4_signing_key(const char *secret_key, const char *date8, const char *region,
                          const char *service, unsigned char ret_key[32]) {
  size_t klen = strlen(secret_key) + 4;
  char *k = malloc(klen + 1);
  unsigned char a[32], b[32];
  if (!k) abort(); /* A few bytes; out of memory here is not recoverable. */
  memcpy(k, "AWS4", 4);
  memcpy(k + 4, secret_key, klen - 4 + 1);
  char date[9];
  snprintf(date, sizeof(date), "%.8s", date8);
  hmac(k, klen, date, a);
  hmac(a, 32, region, b);
  hmac(b, 32, service, a);
  hmac(a, 32, "aws4_request", ret_key);
  OPENSSL_cleanse(k, klen);
  free(k);
}

int s3_sigv4_authorization(const struct s3_sigv4_request *req, const struct s3_credentials *cred,
                           const struct s3_sigv4_scope *scope, char **ret_value) {
  if (!cred->access_key || !cred->secret_key || !scope_valid(scope)) return STK_EINVAL;
  char *creq = NULL, *signed_headers = NULL, *sts = NULL;
  int err = s3_sigv4_canonical_request(req, &creq, &signed_headers);
  if (!err) err = s3_sigv4_string_to_sign(creq, scope, &sts);
  if (!err) {
    unsigned char key[32], sig[32];
    char sig_hex[65];
    s3_sigv4_signing_key(cred->secret_key, scope->amz_date, scope->region, scope->service, key);
    hmac(key, sizeof(key), sts, sig);
    to_hex(sig, sizeof(sig), sig_hex);
    struct strbuf sb = STRBUF_INIT;
    strbuf_printf(&sb,
                  "AWS4-HMAC-SHA256 Credential=%s/%.8s/%s/%s/aws4_request, SignedHeaders=%s, "
                  "Signature=%s",
                  cred->access_key, scope->amz_date, scope->region, scope->service, signed_headers,
                  sig_hex);
    char *value = strbuf_take(&sb, NULL);
    if (value)
      *ret_value = value;
    else
      err = STK_ENOMEM;
    OPENSSL_cleanse(key, sizeof(key));
  }
  free(creq);
  free(signed_headers);
  free(sts);
  return err;
}

void s3_sigv4_format_date(long long unix_seconds, char ret[17]) {
  time_t t = (time_t)unix_seconds;
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(ret, 17, "%Y%m%dT%H%M%SZ", &tm);
}
