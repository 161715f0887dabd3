/*
 * client_token: a client made with a token file keeps following it, so a
 * long-running trainer or watcher survives a token rotation (the daemons
 * re-read theirs on SIGHUP). The file is re-read, by the one reader every
 * program uses (rpc_read_token_file), at most every client_token_reload_ms
 * when a call starts, and at once when a blocking call is answered
 * UNAUTHENTICATED; that call is then sent once more if the token changed.
 * Sending it again is safe: a call refused for its token never reached
 * the handler. A file that does not read (missing, empty, two words)
 * changes nothing: the token in use stays.
 *
 * Threads: any. token_mu guards the token (c->ro.token, which the extra
 * channels of batch streams are made with) and the time of the last read.
 */
#include "client_internal.h"

#include <stdlib.h>
#include <string.h>

int64_t client_token_reload_ms = CLIENT_TOKEN_RELOAD_MS;

int client_token_refresh(struct stk_client *c, bool now) {
  if (!c->token_file) return 0;
  int64_t t = client_now_ms();
  pthread_mutex_lock(&c->token_mu);
  if (!now && t - c->token_read_ms < client_token_reload_ms) {
    pthread_mutex_unlock(&c->token_mu);
    return 0;
  }
  c->token_read_ms = t;
  char *token = NULL;
  int err = rpc_read_token_file(c->token_file, &token);
  bool changed = err == 0 && strcmp(token, c->ro.token ? c->ro.token : "") != 0;
  if (changed) err = rpc_client_set_token(c->rpc, token);
  if (changed && err == 0) {
    free((char *)c->ro.token);
    c->ro.token = token;
    token = NULL;
  }
  pthread_mutex_unlock(&c->token_mu);
  free(token);
  return err ? err : changed;
}

struct rpc_client *client_rpc(struct stk_client *c) {
  client_token_refresh(c, false); /* On failure the token in use stays. */
  return c->rpc;
}

int client_new_channel(struct stk_client *c, struct rpc_client **ret_rpc) {
  client_token_refresh(c, false);
  pthread_mutex_lock(&c->token_mu);
  int err = rpc_client_new(&c->ro, ret_rpc);
  pthread_mutex_unlock(&c->token_mu);
  return err;
}
