/*
 * Synchronisation within a generation: barriers, the key-value store (the
 * NCCL unique id, ring addresses) and checkpoint reports. Barrier and KvGet
 * park on the coordinator, so each has an asynchronous form; the blocking
 * form waits on it with a condition variable.
 */
#include "client_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One asynchronous Barrier or KvGet: the user's callback and the strings
 * the request points into (kept until the call is done). */
struct async_op {
  stk_done_fn done;
  stk_kv_done_fn kv_done;
  void *arg;
  char job[128];
  char member_id[160];
};

/* A blocking caller's side of an asynchronous op. */
struct sync_wait {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  int err;
  char msg[512];
  uint8_t *value;
  size_t len;
};

/* Fills the membership fields of a request; STK_ESTATE when not joined. */
static int current(struct stk_client *c, struct async_op *op, uint64_t *ret_gen) {
  pthread_mutex_lock(&c->mu);
  bool joined = c->m.joined;
  memcpy(op->job, c->m.job, sizeof(op->job));
  memcpy(op->member_id, c->m.member_id, sizeof(op->member_id));
  *ret_gen = c->m.generation;
  pthread_mutex_unlock(&c->mu);
  return joined ? 0 : STK_ESTATE;
}

static void op_done(void *arg, const struct rpc_status *st, ProtobufCMessage *resp) {
  struct async_op *op = arg;
  int err = stk_error_from_grpc(st->code);
  const char *msg = st->code == RPC_OK ? "" : st->message;
  if (op->done) op->done(op->arg, err, msg);
  if (op->kv_done) {
    Stoker__V1__KvGetResponse *r = (Stoker__V1__KvGetResponse *)resp;
    op->kv_done(op->arg, err, msg, r ? r->value.data : NULL, r ? r->value.len : 0);
  }
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  free(op);
}

static struct async_op *op_new(stk_done_fn done, stk_kv_done_fn kv_done, void *arg) {
  struct async_op *op = calloc(1, sizeof(*op));
  if (!op) return NULL;
  op->done = done;
  op->kv_done = kv_done;
  op->arg = arg;
  return op;
}

static int op_start(struct stk_client *c, struct async_op *op, const char *method,
                    const ProtobufCMessage *req, const ProtobufCMessageDescriptor *resp_desc,
                    int64_t timeout_ms) {
  struct rpc_client_call *call; /* Not kept: these calls end on their own. */
  int err = rpc_client_unary_async(client_rpc(c), method, req, resp_desc,
                                   client_timeout(c, timeout_ms), op_done, op, &call);
  if (err < 0) {
    free(op);
    return client_fail(err, method);
  }
  return 0;
}

int stk_barrier_async(struct stk_client *c, const char *name, int64_t timeout_ms, stk_done_fn done,
                      void *arg) {
  if (!name || !done) return client_fail(STK_EINVAL, "barrier");
  struct async_op *op = op_new(done, NULL, arg);
  if (!op) return client_fail(STK_ENOMEM, "barrier");
  Stoker__V1__BarrierRequest req = STOKER__V1__BARRIER_REQUEST__INIT;
  if (current(c, op, &req.generation) < 0) {
    free(op);
    return client_fail(STK_ESTATE, "barrier: not joined");
  }
  req.job = op->job;
  req.member_id = op->member_id;
  req.name = (char *)name;
  return op_start(c, op, COORD_METHOD(barrier, &req), &req.base,
                  &stoker__v1__barrier_response__descriptor, timeout_ms);
}

int stk_kv_get_async(struct stk_client *c, const char *key, bool wait, int64_t timeout_ms,
                     stk_kv_done_fn done, void *arg) {
  if (!key || !done) return client_fail(STK_EINVAL, "kv get");
  struct async_op *op = op_new(NULL, done, arg);
  if (!op) return client_fail(STK_ENOMEM, "kv get");
  Stoker__V1__KvGetRequest req = STOKER__V1__KV_GET_REQUEST__INIT;
  if (current(c, op, &req.generation) < 0) {
    free(op);
    return client_fail(STK_ESTATE, "kv get: not joined");
  }
  req.job = op->job;
  req.key = (char *)key;
  req.wait = wait;
  return op_start(c, op, COORD_METHOD(kv_get, &req), &req.base,
                  &stoker__v1__kv_get_response__descriptor, timeout_ms);
}

/* ------------------------------------------------------- blocking shells */

static void sync_init(struct sync_wait *s) {
  memset(s, 0, sizeof(*s));
  pthread_mutex_init(&s->mu, NULL);
  client_cond_init(&s->cv);
}

/* Waits, records the last error, destroys the sync objects. */
static int sync_finish(struct sync_wait *s) {
  pthread_mutex_lock(&s->mu);
  while (!s->done) pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  if (s->err < 0) client_set_error(stk_error_to_grpc(s->err), "%s", s->msg);
  return s->err;
}

static void sync_done(void *arg, int err, const char *msg) {
  struct sync_wait *s = arg;
  pthread_mutex_lock(&s->mu);
  s->err = err;
  snprintf(s->msg, sizeof(s->msg), "%s", msg);
  s->done = true;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static void sync_kv_done(void *arg, int err, const char *msg, const uint8_t *value, size_t len) {
  struct sync_wait *s = arg;
  if (err == 0) {
    s->value = malloc(len + 1);
    if (s->value) {
      if (len) memcpy(s->value, value, len);
      s->value[len] = 0;
      s->len = len;
    } else {
      err = STK_ENOMEM;
      msg = "out of memory";
    }
  }
  sync_done(arg, err, msg);
}

int stk_barrier(struct stk_client *c, const char *name, int64_t timeout_ms) {
  struct sync_wait s;
  sync_init(&s);
  int err = stk_barrier_async(c, name, timeout_ms, sync_done, &s);
  if (err < 0) sync_done(&s, err, stk_client_last_error(NULL));
  return sync_finish(&s);
}

int stk_kv_get(struct stk_client *c, const char *key, bool wait, int64_t timeout_ms,
               uint8_t **ret_value, size_t *ret_len) {
  struct sync_wait s;
  sync_init(&s);
  int err = stk_kv_get_async(c, key, wait, timeout_ms, sync_kv_done, &s);
  if (err < 0) sync_done(&s, err, stk_client_last_error(NULL));
  err = sync_finish(&s);
  if (err < 0) return err;
  *ret_value = s.value;
  if (ret_len) *ret_len = s.len;
  return 0;
}

int stk_kv_set(struct stk_client *c, const char *key, const void *value, size_t len,
               int64_t timeout_ms) {
  struct async_op op;
  Stoker__V1__KvSetRequest req = STOKER__V1__KV_SET_REQUEST__INIT;
  if (!key || (len && !value)) return client_fail(STK_EINVAL, "kv set");
  if (current(c, &op, &req.generation) < 0) return client_fail(STK_ESTATE, "kv set: not joined");
  req.job = op.job;
  req.key = (char *)key;
  req.value.data = (uint8_t *)value;
  req.value.len = len;
  return COORD_CALL(c, kv_set, &req, timeout_ms, (Stoker__V1__Empty **)NULL);
}

int stk_report_checkpoint(struct stk_client *c, const char *job, int64_t step, const char *uri) {
  struct async_op op;
  Stoker__V1__ReportCheckpointRequest req = STOKER__V1__REPORT_CHECKPOINT_REQUEST__INIT;
  if (!uri) return client_fail(STK_EINVAL, "report checkpoint");
  if (current(c, &op, &req.generation) == 0) {
    req.job = op.job;
  } else if (job) {
    req.job = (char *)job;
    req.generation = 0;
  } else {
    return client_fail(STK_ESTATE, "report checkpoint: not joined and no job");
  }
  req.step = step;
  req.uri = (char *)uri;
  return COORD_CALL(c, report_checkpoint, &req, 0, (Stoker__V1__Empty **)NULL);
}
