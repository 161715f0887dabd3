/*
 * The client object's life: stk_client_new (the channel, its options and
 * token file, the membership state) and stk_client_free. It sits on top of
 * the library's ladder: the blocking call (client_call.c), the engine of
 * the saves in flight (client_engine.c, closed first at free), the token
 * (client_token.c) and the base (client_base.c: last error, clocks) are
 * below it, and none of them calls it.
 */
#include "client_internal.h"

#include <stdlib.h>
#include <string.h>

#define DEFAULT_TIMEOUT_MS 30000

static char *dup_opt(const char *s) {
  return s ? strdup(s) : NULL;
}

/* Keeps owned copies of the channel options in c->ro. */
static int keep_opts(struct stk_client *c, const struct rpc_client_opts *ro) {
  c->ro.target = dup_opt(ro->target);
  c->ro.tls_ca_file = dup_opt(ro->tls_ca_file);
  c->ro.tls_cert_file = dup_opt(ro->tls_cert_file);
  c->ro.tls_key_file = dup_opt(ro->tls_key_file);
  c->ro.token = dup_opt(ro->token);
  c->ro.round_robin = ro->round_robin;
  if (!c->ro.target || (ro->tls_ca_file && !c->ro.tls_ca_file) ||
      (ro->tls_cert_file && !c->ro.tls_cert_file) || (ro->tls_key_file && !c->ro.tls_key_file) ||
      (ro->token && !c->ro.token))
    return STK_ENOMEM;
  return 0;
}

static void drop_opts(struct stk_client *c) {
  free((char *)c->ro.target);
  free((char *)c->ro.tls_ca_file);
  free((char *)c->ro.tls_cert_file);
  free((char *)c->ro.tls_key_file);
  free((char *)c->ro.token);
}

int stk_client_new(const struct stk_client_opts *opts, struct stk_client **ret_client) {
  return client_new(opts, false, ret_client);
}

int client_new(const struct stk_client_opts *opts, bool round_robin,
               struct stk_client **ret_client) {
  if (!opts || !opts->address || !opts->address[0])
    return client_fail(STK_EINVAL, "no coordinator address");
  char *token = NULL;
  struct rpc_client_opts ro = {
      .target = opts->address,
      .tls_ca_file = opts->tls_ca_file,
      .tls_cert_file = opts->tls_cert_file,
      .tls_key_file = opts->tls_key_file,
      .token = opts->token,
      .round_robin = round_robin,
  };
  if (opts->token_file) {
    stk_clear_detail();
    if (rpc_read_token_file(opts->token_file, &token) < 0) {
      client_set_error(3, "%s", stk_detail());
      return STK_EINVAL;
    }
    ro.token = token;
  }
  struct stk_client *c = calloc(1, sizeof(*c));
  int err = c ? keep_opts(c, &ro) : STK_ENOMEM;
  free(token);
  if (!c) return client_fail(STK_ENOMEM, "client");
  if (err == 0 && opts->token_file && !(c->token_file = strdup(opts->token_file))) err = STK_ENOMEM;
  if (err == 0) err = rpc_client_new(&c->ro, &c->rpc);
  if (err < 0) {
    drop_opts(c);
    free(c->token_file);
    free(c);
    const char *d = stk_detail();
    client_set_error(stk_error_to_grpc(err), "%s", d[0] ? d : stk_strerror(err));
    return err;
  }
  c->default_timeout_ms =
      opts->default_timeout_ms > 0 ? opts->default_timeout_ms : DEFAULT_TIMEOUT_MS;
  c->token_read_ms = client_now_ms();
  pthread_mutex_init(&c->token_mu, NULL);
  pthread_mutex_init(&c->mu, NULL);
  client_engine_init(&c->engine);
  membership_init(&c->m);
  *ret_client = c;
  return 0;
}

int client_peer(struct stk_client *c, const char *address, struct stk_client **ret_peer) {
  pthread_mutex_lock(&c->mu);
  struct stk_client *p = c->peers;
  while (p && strcmp(p->ro.target, address) != 0) p = p->next_peer;
  int err = 0;
  if (!p) {
    pthread_mutex_lock(&c->token_mu); /* c->ro.token changes under it. */
    struct stk_client_opts o = {.address = address,
                                .tls_ca_file = c->ro.tls_ca_file,
                                .tls_cert_file = c->ro.tls_cert_file,
                                .tls_key_file = c->ro.tls_key_file,
                                .token = c->token_file ? NULL : c->ro.token,
                                .token_file = c->token_file,
                                .default_timeout_ms = c->default_timeout_ms};
    err = client_new(&o, false, &p);
    pthread_mutex_unlock(&c->token_mu);
    if (!err) {
      p->next_peer = c->peers;
      c->peers = p;
    }
  }
  pthread_mutex_unlock(&c->mu);
  if (!err) *ret_peer = p;
  return err;
}

void stk_client_free(struct stk_client *c) {
  if (!c) return;
  client_engine_close(&c->engine); /* Saves in flight end while every channel is up. */
  for (struct stk_client *p = c->peers, *next; p; p = next) {
    next = p->next_peer;
    stk_client_free(p);
  }
  membership_stop_heartbeat(c);
  rpc_client_free(c->rpc);
  drop_opts(c);
  free(c->token_file);
  membership_close(&c->m);
  pthread_mutex_destroy(&c->token_mu);
  pthread_mutex_destroy(&c->mu);
  free(c);
}
