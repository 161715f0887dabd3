/*
 * rpc_server_tls: the server's TLS certificate chain, private key and
 * client CA, read from their files, checked with OpenSSL, and handed to
 * gRPC through its certificate-config fetcher so that they can be replaced
 * while the server runs (a daemon's SIGHUP).
 *
 * Checked before gRPC sees them (rpc_tls_check.c): the chain parses, the
 * key matches it, the client CA parses. A bad file fails start-up, or
 * leaves a reload without effect, with a detail that names the file and
 * the reason; gRPC would otherwise only fail the next handshakes, or keep
 * the old files while saying little.
 *
 * Threads. rpc_server_tls_reload runs on the loop thread; gRPC calls the
 * fetcher on whichever thread accepts a connection, before each
 * handshake. They meet at `pending`, under `mu`: a reload parks a new,
 * validated config there (replacing one gRPC has not taken yet), the
 * fetcher takes it and answers RELOAD_NEW, or answers RELOAD_UNCHANGED
 * when nothing is parked. gRPC owns and destroys every config it takes;
 * a config still parked when the server is freed is destroyed here. So
 * each config is destroyed exactly once. Nothing calls into gRPC with mu
 * held. Connections already open keep the certificates they started with.
 */
#include "rpc_internal.h"

#include "stk_error.h"

#include <openssl/crypto.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct rpc_server_tls {
  char *cert_file;
  char *key_file;
  char *client_ca_file; /* NULL: clients are not asked for a certificate. */
  pthread_mutex_t mu;
  grpc_ssl_server_certificate_config *pending; /* Guarded by mu; not yet taken by gRPC. */
};

/* Reads and checks the files; ret_config is a new config for gRPC. */
static int load_config(const struct rpc_server_tls *t,
                       grpc_ssl_server_certificate_config **ret_config) {
  char *cert = NULL, *key = NULL, *ca = NULL;
  int err = rpc_security_read_file(t->cert_file, &cert, NULL);
  if (!err) err = rpc_security_read_file(t->key_file, &key, NULL);
  if (!err && t->client_ca_file) err = rpc_security_read_file(t->client_ca_file, &ca, NULL);
  if (!err) err = rpc_tls_check(t->cert_file, cert, t->key_file, key, t->client_ca_file, ca);
  grpc_ssl_server_certificate_config *config = NULL;
  if (!err) {
    grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
    /* gRPC 1.51 asserts that a fetched config has client roots, wanted or
     * not. Without a client CA, clients are never asked for a certificate
     * (GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE), so the server's own chain
     * stands in: loaded, never used. */
    config = grpc_ssl_server_certificate_config_create(ca ? ca : cert, &pair, 1); /* Copies. */
    if (!config) err = STK_ENOMEM;
  }
  if (key) OPENSSL_cleanse(key, strlen(key));
  free(cert);
  free(key);
  free(ca);
  if (!err) *ret_config = config;
  return err;
}

/* gRPC's fetcher: any thread, before each handshake. */
static grpc_ssl_certificate_config_reload_status
fetch(void *arg, grpc_ssl_server_certificate_config **config) {
  struct rpc_server_tls *t = arg;
  pthread_mutex_lock(&t->mu);
  grpc_ssl_server_certificate_config *fresh = t->pending;
  t->pending = NULL;
  pthread_mutex_unlock(&t->mu);
  if (!fresh) return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
  *config = fresh; /* gRPC owns it now. */
  return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
}

int rpc_server_tls_new(const struct rpc_server_opts *opts, struct rpc_server_tls **ret_tls) {
  struct rpc_server_tls *t = calloc(1, sizeof(*t));
  if (!t) return STK_ENOMEM;
  pthread_mutex_init(&t->mu, NULL);
  t->cert_file = strdup(opts->tls_cert_file);
  t->key_file = strdup(opts->tls_key_file);
  t->client_ca_file = opts->tls_client_ca_file ? strdup(opts->tls_client_ca_file) : NULL;
  int err = !t->cert_file || !t->key_file || (opts->tls_client_ca_file && !t->client_ca_file)
                ? STK_ENOMEM
                : load_config(t, &t->pending); /* The fetcher's first answer. */
  if (err) {
    rpc_server_tls_free(t);
    return err;
  }
  *ret_tls = t;
  return 0;
}

int rpc_server_tls_creds(struct rpc_server_tls *t, grpc_server_credentials **ret_creds) {
  grpc_ssl_client_certificate_request_type req =
      t->client_ca_file ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                        : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
  grpc_ssl_server_credentials_options *o =
      grpc_ssl_server_credentials_create_options_using_config_fetcher(req, fetch, t);
  grpc_server_credentials *creds = o ? grpc_ssl_server_credentials_create_with_options(o) : NULL;
  if (!creds) {
    stk_set_detail("rpc: gRPC refused the TLS options (%s)", t->cert_file);
    return STK_EINVAL;
  }
  *ret_creds = creds;
  return 0;
}

int rpc_server_tls_reload(struct rpc_server_tls *t) {
  grpc_ssl_server_certificate_config *config = NULL;
  int err = load_config(t, &config);
  if (err) return err; /* What gRPC holds stays in use. */
  pthread_mutex_lock(&t->mu);
  grpc_ssl_server_certificate_config *untaken = t->pending;
  t->pending = config;
  pthread_mutex_unlock(&t->mu);
  if (untaken) grpc_ssl_server_certificate_config_destroy(untaken);
  return 0;
}

void rpc_server_tls_free(struct rpc_server_tls *t) {
  if (!t) return;
  if (t->pending) grpc_ssl_server_certificate_config_destroy(t->pending);
  pthread_mutex_destroy(&t->mu);
  free(t->cert_file);
  free(t->key_file);
  free(t->client_ca_file);
  free(t);
}
