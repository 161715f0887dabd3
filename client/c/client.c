/*
 * The client object and the one mechanism every blocking call uses: start
 * the asynchronous rpc call, then wait on a condition variable until its
 * callback ran (curl's easy-over-multi shape: one engine, thin shells).
 * Also keeps each thread's last server status for error messages.
 */
#include "client_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_TIMEOUT_MS 30000

static _Thread_local struct {
  int code;
  char message[512];
} last_error;

void client_set_error(int grpc_code, const char *fmt, ...) {
  va_list ap;
  last_error.code = grpc_code;
  va_start(ap, fmt);
  vsnprintf(last_error.message, sizeof(last_error.message), fmt, ap);
  va_end(ap);
}

const char *stk_client_last_error(int *ret_grpc_code) {
  if (ret_grpc_code) *ret_grpc_code = last_error.code;
  return last_error.message;
}

int client_fail(int err, const char *what) {
  client_set_error(stk_error_to_grpc(err), "%s: %s", what, stk_strerror(err));
  return err;
}

int64_t client_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t client_timeout(const struct stk_client *c, int64_t timeout_ms) {
  return timeout_ms > 0 ? timeout_ms : c->default_timeout_ms;
}

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
  if (!opts || !opts->address || !opts->address[0])
    return client_fail(STK_EINVAL, "no coordinator address");
  char *token = NULL;
  struct rpc_client_opts ro = {
      .target = opts->address,
      .tls_ca_file = opts->tls_ca_file,
      .tls_cert_file = opts->tls_cert_file,
      .tls_key_file = opts->tls_key_file,
      .token = opts->token,
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
  membership_init(&c->m);
  *ret_client = c;
  return 0;
}

void stk_client_free(struct stk_client *c) {
  if (!c) return;
  membership_stop_heartbeat(c);
  rpc_client_free(c->rpc);
  drop_opts(c);
  free(c->token_file);
  membership_close(&c->m);
  pthread_mutex_destroy(&c->token_mu);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

/* ----------------------------------------------------------------- waiter */

void waiter_init(struct waiter *w) {
  memset(w, 0, sizeof(*w));
  pthread_mutex_init(&w->mu, NULL);
  client_cond_init(&w->cv);
}

void waiter_close(struct waiter *w) {
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
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

int waiter_start(struct waiter *w, struct stk_client *c, const char *method,
                 const ProtobufCMessage *req, const ProtobufCMessageDescriptor *resp_desc,
                 int64_t timeout_ms) {
  struct rpc_client_call *call = NULL;
  int err = rpc_client_unary_async(client_rpc(c), method, req, resp_desc,
                                   client_timeout(c, timeout_ms), waiter_done, w, &call);
  pthread_mutex_lock(&w->mu);
  if (err < 0) {
    w->st.code = stk_error_to_grpc(err);
    snprintf(w->st.message, sizeof(w->st.message), "%s", stk_strerror(err));
    w->done = true;
  } else if (!w->done) {
    w->call = call;
  }
  pthread_mutex_unlock(&w->mu);
  return err;
}

int waiter_wait(struct waiter *w) {
  pthread_mutex_lock(&w->mu);
  while (!w->done) pthread_cond_wait(&w->cv, &w->mu);
  pthread_mutex_unlock(&w->mu);
  if (w->st.code == RPC_OK) return 0;
  client_set_error(w->st.code, "%s", w->st.message);
  return stk_error_from_grpc(w->st.code);
}

void client_cond_init(pthread_cond_t *cv) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(cv, &a);
  pthread_condattr_destroy(&a);
}

void client_deadline_after(struct timespec *ts, int64_t ms) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  int64_t ns = ts->tv_nsec + (ms % 1000) * 1000000;
  ts->tv_sec += ms / 1000 + ns / 1000000000;
  ts->tv_nsec = ns % 1000000000;
}

void waiter_cancel(struct waiter *w) {
  pthread_mutex_lock(&w->mu);
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
