/*
 * rpc_tls_check: PEM certificates and keys checked with OpenSSL before
 * gRPC is given them, so that a bad file is refused at once with its name
 * and the reason (gRPC C core says little, and only at the next
 * handshake): every certificate of a chain or CA bundle parses, a private
 * key parses (an encrypted one is refused, never prompted for) and
 * matches the first certificate of its chain. The same OpenSSL gRPC links.
 */
#include "rpc_internal.h"

#include "stk_error.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

/* Why OpenSSL refused, in its words ("" when it kept no reason). */
static const char *openssl_reason(void) {
  const char *why = ERR_reason_error_string(ERR_peek_last_error());
  return why ? why : "";
}

/* Parses every certificate of a PEM bundle; ret_first (may be NULL) gets
 * the first one, which the caller frees. */
static int check_certs(const char *path, const char *pem, X509 **ret_first) {
  BIO *bio = BIO_new_mem_buf(pem, -1);
  if (!bio) return STK_ENOMEM;
  X509 *first = PEM_read_bio_X509_AUX(bio, NULL, NULL, NULL);
  int err = 0, n = 1;
  if (!first) {
    stk_set_detail("rpc: %s holds no PEM certificate (%s)", path, openssl_reason());
    err = STK_EINVAL;
  }
  for (X509 *next; !err && (next = PEM_read_bio_X509(bio, NULL, NULL, NULL)) != NULL; n++)
    X509_free(next);
  /* The loop ends at the end of the text (no further BEGIN line), or at a
   * certificate that does not parse. */
  unsigned long last = ERR_peek_last_error();
  if (!err && !(ERR_GET_LIB(last) == ERR_LIB_PEM && ERR_GET_REASON(last) == PEM_R_NO_START_LINE)) {
    stk_set_detail("rpc: certificate %d in %s does not parse (%s)", n + 1, path, openssl_reason());
    err = STK_EINVAL;
  }
  BIO_free(bio);
  if (!err && ret_first)
    *ret_first = first;
  else
    X509_free(first);
  return err;
}

/* Refuses to ask for a passphrase: a daemon has no one to ask. */
static int no_passphrase(char *buf, int size, int rwflag, void *arg) {
  (void)buf, (void)size, (void)rwflag, (void)arg;
  return -1;
}

/* The key parses and belongs to cert (the chain's first certificate). */
static int check_key(const char *key_path, const char *key_pem, const char *cert_path, X509 *cert) {
  BIO *bio = BIO_new_mem_buf(key_pem, -1);
  if (!bio) return STK_ENOMEM;
  EVP_PKEY *key = PEM_read_bio_PrivateKey(bio, NULL, no_passphrase, NULL);
  BIO_free(bio);
  int err = 0;
  if (!key) {
    stk_set_detail("rpc: %s holds no usable PEM private key (%s; an encrypted key is refused too)",
                   key_path, openssl_reason());
    err = STK_EINVAL;
  } else if (X509_check_private_key(cert, key) != 1) {
    stk_set_detail("rpc: the private key in %s does not match the certificate in %s", key_path,
                   cert_path);
    err = STK_EINVAL;
  }
  EVP_PKEY_free(key);
  return err;
}

int rpc_tls_check(const char *cert_path, const char *cert_pem, const char *key_path,
                  const char *key_pem, const char *ca_path, const char *ca_pem) {
  ERR_clear_error(); /* Only our own reasons below. */
  X509 *leaf = NULL;
  int err = 0;
  if (cert_pem) err = check_certs(cert_path, cert_pem, &leaf);
  if (!err && cert_pem) err = check_key(key_path, key_pem, cert_path, leaf);
  if (!err && ca_pem) err = check_certs(ca_path, ca_pem, NULL);
  X509_free(leaf);
  /* OpenSSL's error queue is per thread and gRPC's handshakes read it on
   * this thread too: leave nothing behind. */
  ERR_clear_error();
  return err;
}
