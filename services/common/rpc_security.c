/*
 * rpc_security: a client's TLS credentials and the server's bearer tokens,
 * both optional (the server's TLS files are rpc_server_tls.c's). Files are
 * read at server or client creation, so that a typo in a path fails
 * start-up with a clear detail instead of every later handshake; the
 * server re-reads its token file when asked (rpc_server_reload_token).
 * rpc_read_token_file is the one reader of a client's token file (the
 * checkpoint service's reporter, libstoker-client, stokerctl): one word.
 * The server's file is a table, one token per line with its scope
 * (rpc_tokens_load, format in rpc.h). Every token is compared in constant
 * time, and all of them on every call, so response timing leaks neither a
 * token nor which line matched.
 */
#include "rpc_internal.h"

#include "stk_error.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_PEM_BYTES (1u << 20)

/* Reads a whole file of at most max bytes into a NUL-terminated buffer;
 * errors name it as "<label> <path>: ...". */
static int read_bounded(const char *path, size_t max, const char *label, char **ret_text,
                        size_t *ret_len) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    stk_set_detail("%s %s: %s", label, path, strerror(errno));
    return STK_EINVAL;
  }
  char *buf = malloc(max + 2);
  size_t n = buf ? fread(buf, 1, max + 1, f) : 0;
  bool failed = ferror(f);
  fclose(f);
  if (!buf) return STK_ENOMEM;
  if (failed || n > max) {
    free(buf);
    if (failed)
      stk_set_detail("%s %s: read error", label, path);
    else
      stk_set_detail("%s %s: larger than %zu bytes", label, path, max);
    return STK_EINVAL;
  }
  buf[n] = '\0';
  *ret_text = buf;
  if (ret_len) *ret_len = n;
  return 0;
}

int rpc_security_read_file(const char *path, char **ret_text, size_t *ret_len) {
  return read_bounded(path, MAX_PEM_BYTES, "rpc: TLS file", ret_text, ret_len);
}

/* Reads the files of a key/cert pair (either may be NULL: no pair). */
static int read_pair(const char *cert_file, const char *key_file, char **cert, char **key) {
  *cert = *key = NULL;
  if (!cert_file && !key_file) return 0;
  if (!cert_file || !key_file) {
    stk_set_detail("rpc: a TLS certificate needs its key and the key its certificate");
    return STK_EINVAL;
  }
  int err = rpc_security_read_file(cert_file, cert, NULL);
  if (!err) err = rpc_security_read_file(key_file, key, NULL);
  if (err) {
    free(*cert);
    *cert = NULL;
  }
  return err;
}

int rpc_security_channel_creds(const struct rpc_client_opts *opts,
                               grpc_channel_credentials **ret_creds) {
  if (!opts->tls_ca_file) {
    if (opts->tls_cert_file || opts->tls_key_file) {
      stk_set_detail("rpc: a client certificate needs tls_ca_file (TLS)");
      return STK_EINVAL;
    }
    *ret_creds = grpc_insecure_credentials_create();
    return 0;
  }
  char *ca, *cert, *key;
  int err = rpc_security_read_file(opts->tls_ca_file, &ca, NULL);
  if (err) return err;
  if ((err = read_pair(opts->tls_cert_file, opts->tls_key_file, &cert, &key)) != 0) {
    free(ca);
    return err;
  }
  err = rpc_tls_check(opts->tls_cert_file, cert, opts->tls_key_file, key, opts->tls_ca_file, ca);
  grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
  grpc_channel_credentials *creds =
      err ? NULL : grpc_ssl_credentials_create(ca, cert ? &pair : NULL, NULL, NULL);
  free(ca);
  free(cert);
  free(key);
  if (err) return err;
  if (!creds) {
    stk_set_detail("rpc: invalid TLS files for the client");
    return STK_EINVAL;
  }
  *ret_creds = creds;
  return 0;
}

/* The one rule for token files (rpc.h): trailing whitespace is dropped,
 * what is left must be one word of printable ASCII. */
static int check_token(const char *path, char *text, size_t n) {
  while (n > 0 && isspace((unsigned char)text[n - 1])) text[--n] = '\0';
  if (n == 0) {
    stk_set_detail("token file %s: empty", path);
    return STK_EINVAL;
  }
  for (size_t i = 0; i < n; i++) {
    if (text[i] <= ' ' || text[i] >= 0x7f) {
      stk_set_detail("token file %s: not one word of printable ASCII (byte %zu: 0x%02x)", path, i,
                     (unsigned char)text[i]);
      return STK_EINVAL;
    }
  }
  return 0;
}

int rpc_read_token_file(const char *path, char **ret_token) {
  char *buf;
  size_t n;
  int err = read_bounded(path, RPC_TOKEN_FILE_MAX_BYTES, "token file", &buf, &n);
  if (err) return err;
  err = check_token(path, buf, n);
  if (err) {
    free(buf);
    return err;
  }
  *ret_token = buf;
  return 0;
}

void rpc_tokens_free(struct rpc_tokens *t) {
  if (!t) return;
  for (size_t i = 0; i < t->n; i++) {
    free(t->v[i].token), free(t->v[i].scope);
    for (int g = 0; g < RPC_GRANT_N; g++) free(t->v[i].grants[g]);
  }
  free(t->v);
  free(t);
}

static int parse_grant(const char *path, size_t line, const char *w, char **grants);
static bool grant_list_ok(const char *list);

/* A scope as written: "*" (every job) or a job-name prefix ending in '*'
 * whose other characters may appear in job names. */
static int parse_scope(const char *path, size_t line, const char *w, char **ret_scope) {
  size_t n = strlen(w);
  *ret_scope = NULL;
  if (strcmp(w, "*") == 0) return 0;
  bool ok = n >= 2 && n <= 129 && w[n - 1] == '*';
  for (size_t i = 0; ok && i + 1 < n; i++)
    ok = isalnum((unsigned char)w[i]) || w[i] == '-' || w[i] == '_' || w[i] == '.';
  if (!ok) {
    stk_set_detail("token file %s line %zu: scope '%.80s' is not '*' nor a job-name prefix "
                   "ending in '*' (letters, digits, '-', '_', '.')",
                   path, line, w);
    return STK_EINVAL;
  }
  if (!(*ret_scope = strndup(w, n - 1))) return STK_ENOMEM;
  return 0;
}

static int add_line(struct rpc_tokens *t, const char *path, size_t line, char *text) {
  char *save = NULL, *token = strtok_r(text, " \t", &save);
  if (!token || token[0] == '#') return 0;
  for (const char *p = token; *p; p++) {
    if (*p <= ' ' || *p >= 0x7f) {
      stk_set_detail("token file %s line %zu: the token is not printable ASCII", path, line);
      return STK_EINVAL;
    }
  }
  for (size_t i = 0; i < t->n; i++) {
    if (strcmp(t->v[i].token, token) == 0) {
      stk_set_detail("token file %s line %zu: the token of line %zu again", path, line,
                     t->v[i].line);
      return STK_EINVAL;
    }
  }
  struct rpc_token e = {.line = line};
  int err = 0;
  bool first = true;
  for (char *w; !err && (w = strtok_r(NULL, " \t", &save)) != NULL && w[0] != '#'; first = false) {
    if (strchr(w, '=')) {
      err = parse_grant(path, line, w, e.grants);
    } else if (first) {
      err = parse_scope(path, line, w, &e.scope);
    } else {
      stk_set_detail("token file %s line %zu: '%.80s' is neither the token's scope (the word "
                     "after the token) nor KEY=LIST (queues=, priorities=)",
                     path, line, w);
      err = STK_EINVAL;
    }
  }
  struct rpc_token *v = err ? NULL : realloc(t->v, (t->n + 1) * sizeof(*v));
  if (v) t->v = v;
  if (!err && (!v || !(e.token = strdup(token)))) err = STK_ENOMEM;
  if (err) {
    free(e.scope);
    for (int g = 0; g < RPC_GRANT_N; g++) free(e.grants[g]);
    return err;
  }
  t->v[t->n++] = e;
  return 0;
}

/* A grant as written: queues=LIST or priorities=LIST, LIST being "*" or
 * names of cluster objects ([a-z0-9][a-z0-9.-]{0,62}) separated by ','
 * (empty: none); each key once per line. */
static int parse_grant(const char *path, size_t line, const char *w, char **grants) {
  static const char *const keys[RPC_GRANT_N] = {
      [RPC_GRANT_QUEUES] = "queues", [RPC_GRANT_PRIORITIES] = "priorities"};
  const char *eq = strchr(w, '=');
  int g = 0;
  while (g < RPC_GRANT_N &&
         (strlen(keys[g]) != (size_t)(eq - w) || strncmp(w, keys[g], (size_t)(eq - w)) != 0))
    g++;
  if (g == RPC_GRANT_N) {
    stk_set_detail("token file %s line %zu: '%.80s': unknown key (queues=, priorities=)", path,
                   line, w);
    return STK_EINVAL;
  }
  if (grants[g]) {
    stk_set_detail("token file %s line %zu: %s= twice", path, line, keys[g]);
    return STK_EINVAL;
  }
  const char *list = eq + 1;
  if (strcmp(list, "*") != 0 && !grant_list_ok(list)) {
    stk_set_detail("token file %s line %zu: %s='%.80s' is not '*' nor names "
                   "[a-z0-9][a-z0-9.-]{0,62} separated by ','",
                   path, line, keys[g], list);
    return STK_EINVAL;
  }
  if (!(grants[g] = strdup(list))) return STK_ENOMEM;
  return 0;
}

/* Whether list is "" or names of cluster objects separated by ','. */
static bool grant_list_ok(const char *list) {
  for (const char *p = list; *p;) {
    size_t n = strcspn(p, ",");
    bool ok = n >= 1 && n <= 63 && (islower((unsigned char)p[0]) || isdigit((unsigned char)p[0]));
    for (size_t i = 1; ok && i < n; i++)
      ok = islower((unsigned char)p[i]) || isdigit((unsigned char)p[i]) || p[i] == '.' ||
           p[i] == '-';
    if (!ok) return false;
    p += n;
    if (*p == ',' && *++p == '\0') return false; /* A trailing ','. */
  }
  return true;
}

int rpc_tokens_load(const char *path, struct rpc_tokens **ret_tokens) {
  char *text;
  int err = read_bounded(path, RPC_TOKENS_FILE_MAX_BYTES, "token file", &text, NULL);
  if (err) return err;
  struct rpc_tokens *t = calloc(1, sizeof(*t));
  if (!t) err = STK_ENOMEM;
  size_t line = 0;
  for (char *p = text, *next; !err && p; p = next) {
    next = strchr(p, '\n');
    if (next) *next++ = '\0';
    line++;
    err = add_line(t, path, line, p);
  }
  free(text);
  if (!err && t->n == 0) {
    stk_set_detail("token file %s: no token", path);
    err = STK_EINVAL;
  }
  if (err) {
    rpc_tokens_free(t);
    return err;
  }
  *ret_tokens = t;
  return 0;
}

/* Compares in time that depends only on the lengths. */
static bool same_bytes(const uint8_t *a, size_t a_len, const char *b, size_t b_len) {
  uint8_t diff = a_len == b_len ? 0 : 1;
  for (size_t i = 0; i < b_len; i++) diff |= (uint8_t)((i < a_len ? a[i] : 0) ^ (uint8_t)b[i]);
  return diff == 0;
}

/* The credentials as RFC 6750 reads them: the scheme in any case, one or
 * more spaces, then the token, compared with every line's in constant
 * time. */
const struct rpc_token *rpc_tokens_match(const struct rpc_tokens *t,
                                         const grpc_metadata_array *md) {
  static const char scheme[] = "bearer";
  const size_t k = sizeof(scheme) - 1;
  for (size_t i = 0; i < md->count; i++) {
    if (grpc_slice_str_cmp(md->metadata[i].key, "authorization") != 0) continue;
    grpc_slice v = md->metadata[i].value;
    const uint8_t *p = GRPC_SLICE_START_PTR(v);
    size_t n = GRPC_SLICE_LENGTH(v), at = k;
    if (n <= k || strncasecmp((const char *)p, scheme, k) != 0 || p[k] != ' ') return NULL;
    while (at < n && p[at] == ' ') at++;
    const struct rpc_token *found = NULL;
    for (size_t j = 0; j < t->n; j++)
      if (same_bytes(p + at, n - at, t->v[j].token, strlen(t->v[j].token)) && !found)
        found = &t->v[j];
    return found;
  }
  return NULL;
}

const char *rpc_tokens_tenant(const struct rpc_tokens *t, const char *job) {
  const char *best = NULL;
  for (size_t i = 0; t && i < t->n; i++) {
    const char *scope = t->v[i].scope;
    if (scope && rpc_scope_covers(scope, job) && (!best || strlen(scope) > strlen(best)))
      best = scope;
  }
  return best;
}

bool rpc_grant_holds(const char *list, const char *name) {
  if (!list || !name || !*name) return false;
  if (strcmp(list, "*") == 0) return true;
  size_t n = strlen(name);
  for (const char *p = list; *p;) {
    size_t k = strcspn(p, ",");
    if (k == n && strncmp(p, name, n) == 0) return true;
    p += k;
    if (*p == ',') p++;
  }
  return false;
}
