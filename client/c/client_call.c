/*
 * client_call: the one mechanism every blocking call uses: start the
 * asynchronous rpc call, then wait on a condition variable until its
 * callback ran (curl's easy-over-multi shape: one engine, thin shells).
 * A call refused for its token is sent once more when the token file
 * changed (client_token.c, below). An idempotent call (a read, or a write
 * whose repeat changes nothing) may instead be tried again while the
 * service is UNAVAILABLE (or cancels it as it shuts down): a restarting
 * server, or one that moved to a new
 * address under the same name (a Kubernetes pod replaced by a rolling
 * update). gRPC asks DNS again when a connection fails, but fails the call
 * that found the old address at once; the next try goes to the new one.
 * The waiter is also what the asynchronous shells (membership's heartbeat,
 * batches) park on.
 */
#include "client_internal.h"

#include <stdio.h>
#include <string.h>

void waiter_init(struct waiter *w) {
  memset(w, 0, sizeof(*w));
  pthread_mutex_init(&w->mu, NULL);
  client_cond_init(&w->cv);
}

void waiter_close(struct waiter *w) {
  pthread_mutex_lock(&w->mu);
  while (w->notifying > 0) pthread_cond_wait(&w->cv, &w->mu);
  pthread_mutex_unlock(&w->mu);
  if (w->resp) protobuf_c_message_free_unpacked(w->resp, NULL);
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
}

static void waiter_done(void *arg, const struct rpc_status *st, ProtobufCMessage *resp) {
  struct waiter *w = arg;
  pthread_mutex_lock(&w->mu);
  /* The call handle dies when we return: let cancellers leave it first. */
  while (w->cancelling > 0) pthread_cond_wait(&w->cv, &w->mu);
  w->st = *st;
  w->resp = resp;
  w->done = true;
  w->call = NULL;
  bool notify = w->notify != NULL;
  if (notify) w->notifying++;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  if (!notify) return;
  /* Outside mu: a cancel may hold the locks notify takes (the engine's)
   * while it waits for mu. waiter_close waits until this is over. */
  w->notify(w->notify_arg);
  pthread_mutex_lock(&w->mu);
  w->notifying--;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

/* Not inlined: inlined into waiter_start, GCC 12 at -O2 with the
 * sanitizers takes w->st.message for an object of size 0 (-Warray-bounds). */
__attribute__((noinline)) static void fail_start(struct waiter *w, int err) {
  w->st.code = stk_error_to_grpc(err);
  snprintf(w->st.message, sizeof(w->st.message), "%s",
           err == STK_ECANCELED ? "cancelled before it started" : stk_strerror(err));
  w->done = true;
}

int waiter_start(struct waiter *w, struct stk_client *c, const char *method,
                 const ProtobufCMessage *req, const ProtobufCMessageDescriptor *resp_desc,
                 int64_t timeout_ms) {
  pthread_mutex_lock(&w->mu);
  bool cancelled = w->cancelled;
  if (cancelled) fail_start(w, STK_ECANCELED);
  pthread_mutex_unlock(&w->mu);
  if (cancelled) return STK_ECANCELED;
  struct rpc_client_call *call = NULL;
  int err = rpc_client_unary_async(client_rpc(c), method, req, resp_desc,
                                   client_timeout(c, timeout_ms), waiter_done, w, &call);
  pthread_mutex_lock(&w->mu);
  if (err < 0)
    fail_start(w, err);
  else if (!w->done)
    w->call = call;
  cancelled = err == 0 && w->cancelled; /* A cancel that came while it started. */
  pthread_mutex_unlock(&w->mu);
  if (cancelled) waiter_cancel(w);
  return err;
}

bool waiter_ended(struct waiter *w) {
  pthread_mutex_lock(&w->mu);
  bool done = w->done;
  pthread_mutex_unlock(&w->mu);
  return done;
}

void waiter_join(struct waiter *w) {
  pthread_mutex_lock(&w->mu);
  while (!w->done) pthread_cond_wait(&w->cv, &w->mu);
  pthread_mutex_unlock(&w->mu);
}

int waiter_wait(struct waiter *w) {
  pthread_mutex_lock(&w->mu);
  while (!w->done) pthread_cond_wait(&w->cv, &w->mu);
  pthread_mutex_unlock(&w->mu);
  if (w->st.code == RPC_OK) return 0;
  client_set_error(w->st.code, "%s", w->st.message);
  return stk_error_from_grpc(w->st.code);
}

void waiter_cancel(struct waiter *w) {
  pthread_mutex_lock(&w->mu);
  w->cancelled = true;
  if (!w->done && w->call) {
    struct rpc_client_call *call = w->call;
    w->cancelling++;
    pthread_mutex_unlock(&w->mu);
    rpc_client_call_cancel(call);
    pthread_mutex_lock(&w->mu);
    w->cancelling--;
    pthread_cond_broadcast(&w->cv);
  }
  pthread_mutex_unlock(&w->mu);
}

static int call_once(struct stk_client *c, const char *method, const ProtobufCMessage *req,
                     const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                     ProtobufCMessage **ret_resp) {
  struct waiter w;
  waiter_init(&w);
  waiter_start(&w, c, method, req, resp_desc, timeout_ms);
  int err = waiter_wait(&w);
  if (err == 0 && ret_resp) {
    *ret_resp = w.resp;
    w.resp = NULL;
  }
  waiter_close(&w);
  return err;
}

int client_call(struct stk_client *c, const char *method, const ProtobufCMessage *req,
                const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                ProtobufCMessage **ret_resp) {
  int err = call_once(c, method, req, resp_desc, timeout_ms, ret_resp);
  /* Refused for its token: a rotated token file gets one more try. */
  if (err == STK_EUNAUTH && client_token_refresh(c, true) == 1)
    err = call_once(c, method, req, resp_desc, timeout_ms, ret_resp);
  return err;
}

static int call_fresh(struct stk_client *c, const char *method, const ProtobufCMessage *req,
                      const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                      ProtobufCMessage **ret_resp);

int client_call_idempotent(struct stk_client *c, const char *method, const ProtobufCMessage *req,
                           const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                           ProtobufCMessage **ret_resp) {
  int64_t deadline = client_now_ms() + client_timeout(c, timeout_ms);
  int64_t delay_ms = CLIENT_RETRY_FIRST_MS;
  int err = client_call(c, method, req, resp_desc, client_timeout(c, timeout_ms), ret_resp);
  while (client_retryable(err) && deadline - client_now_ms() > delay_ms) {
    client_sleep_ms(delay_ms);
    delay_ms = delay_ms * 2 < CLIENT_RETRY_MAX_MS ? delay_ms * 2 : CLIENT_RETRY_MAX_MS;
    int64_t left = deadline - client_now_ms();
    err = call_fresh(c, method, req, resp_desc, left > 1 ? left : 1, ret_resp);
  }
  return err;
}

/* A retry on a channel of its own, closed after the call. A channel whose
 * connection failed keeps the address it had: gRPC 1.51 was seen asking DNS
 * again only 31 s later (its calls failing at once meanwhile), where a new
 * channel asks at once. So a server back at a new address under its name
 * (a pod replaced by a rolling update) is found by the next retry. */
static int call_fresh(struct stk_client *c, const char *method, const ProtobufCMessage *req,
                      const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                      ProtobufCMessage **ret_resp) {
  struct rpc_client *fresh = NULL;
  if (client_new_channel(c, &fresh) < 0)
    return client_call(c, method, req, resp_desc, timeout_ms, ret_resp);
  struct rpc_status st;
  memset(&st, 0, sizeof(st));
  ProtobufCMessage *resp = NULL;
  int err = rpc_client_unary(fresh, method, req, resp_desc, timeout_ms, &resp, &st);
  rpc_client_free(fresh);
  if (err < 0 && st.code != RPC_OK)
    client_set_error(st.code, "%s", st.message);
  else if (err < 0)
    client_fail(err, "call");
  else if (ret_resp)
    *ret_resp = resp;
  else
    protobuf_c_message_free_unpacked(resp, NULL);
  return err;
}
