/*
 * Batches that arrive asynchronously: GetBatch with a completion callback,
 * and the trainer's batch iterator over StreamBatches. The iterator owns a
 * channel (and so a completion thread) of its own: when its bounded queue
 * is full the completion thread simply waits for the trainer, no further
 * message is read, and HTTP/2 flow control holds the server back. Blocking
 * the shared client thread instead would stall (or deadlock) the rank's
 * other calls, such as a Commit issued while the queue is full.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client_internal.h"
#include "loader_internal.h"

#define DEFAULT_PREFETCH 4

/* ------------------------------------------------------ async GetBatch */

struct batch_call {
  stk_batch_done_fn done;
  void *arg;
  bool partial_ok;
};

static void batch_call_done(void *arg, const struct rpc_status *st, ProtobufCMessage *resp) {
  struct batch_call *bc = arg;
  struct stk_batch *b = NULL;
  int err = st->code == RPC_OK ? 0 : stk_error_from_grpc(st->code);
  const char *msg = st->message;
  if (err == 0) {
    b = calloc(1, sizeof(*b));
    err = b ? loader_batch_from_msg(resp, bc->partial_ok, b) : STK_ENOMEM;
    if (!b) protobuf_c_message_free_unpacked(resp, NULL);
    if (err < 0) {
      msg = b ? stk_client_last_error(NULL) : stk_strerror(err);
      free(b);
      b = NULL;
    }
  }
  bc->done(bc->arg, err, msg, b);
  free(bc);
}

int stk_loader_get_batch_async(struct stk_client *c, const char *job, int64_t step, uint32_t rank,
                               uint32_t world, int64_t timeout_ms, stk_batch_done_fn done,
                               void *arg) {
  return loader_get_batch_async(c, job, step, rank, world, timeout_ms, false, done, arg);
}

int loader_get_batch_async(struct stk_client *c, const char *job, int64_t step, uint32_t rank,
                           uint32_t world, int64_t timeout_ms, bool partial_ok,
                           stk_batch_done_fn done, void *arg) {
  if (!job || !done) return client_fail(STK_EINVAL, "get batch");
  struct batch_call *bc = malloc(sizeof(*bc));
  if (!bc) return client_fail(STK_ENOMEM, "get batch");
  bc->done = done;
  bc->arg = arg;
  bc->partial_ok = partial_ok;
  Stoker__V1__GetBatchRequest req = STOKER__V1__GET_BATCH_REQUEST__INIT;
  req.job = (char *)job;
  req.step = step;
  req.rank = rank;
  req.world = world;
  int err = rpc_client_unary_async(c->rpc, DL_METHOD("GetBatch"), &req.base,
                                   &stoker__v1__batch__descriptor, client_timeout(c, timeout_ms),
                                   batch_call_done, bc, NULL);
  if (err < 0) {
    free(bc);
    return client_fail(err, "get batch");
  }
  return 0;
}

/* ----------------------------------------------------- batch iterator */

struct stk_batch_stream {
  struct parts_stream *assembled; /* Set: a scaled-out job's stream; nothing below is used. */
  bool partial_ok;                /* Part of an assembled stream: partial batches expected. */
  struct rpc_client *rpc;         /* This stream's own channel. */
  pthread_mutex_t mu;
  pthread_cond_t cv; /* Queue changes, end of the stream, cancellers leaving. */
  struct stk_batch *q;
  size_t cap, head, n; /* Ring of n batches from q[head]. */
  int64_t next_step;   /* Step the next arriving batch must carry. */
  bool closing;        /* stk_batch_stream_free: stop waiting for room. */
  bool done;           /* The call ended; st holds its status. */
  int local_err;       /* A bad batch ended the stream. */
  int cancelling;      /* Threads inside rpc_client_call_cancel. */
  struct rpc_client_call *call;
  struct rpc_status st;
};

/* Completion thread: queue one batch, waiting for room. */
static void stream_msg(void *arg, ProtobufCMessage *msg) {
  struct stk_batch_stream *s = arg;
  struct stk_batch b;
  int err = loader_batch_from_msg(msg, s->partial_ok, &b);
  pthread_mutex_lock(&s->mu);
  if (err == 0 && b.step != s->next_step) {
    stk_batch_free(&b);
    err = STK_ECORRUPT;
  }
  while (err == 0 && s->n == s->cap && !s->closing) pthread_cond_wait(&s->cv, &s->mu);
  if (err < 0 || s->closing) {
    if (err == 0) stk_batch_free(&b);
    if (err < 0 && !s->local_err) s->local_err = err;
    if (s->call) rpc_client_call_cancel(s->call); /* The handle is alive: we run on it. */
  } else {
    s->q[(s->head + s->n) % s->cap] = b;
    s->n++;
    s->next_step++;
    pthread_cond_broadcast(&s->cv);
  }
  pthread_mutex_unlock(&s->mu);
}

static void stream_done(void *arg, const struct rpc_status *st) {
  struct stk_batch_stream *s = arg;
  pthread_mutex_lock(&s->mu);
  while (s->cancelling > 0) pthread_cond_wait(&s->cv, &s->mu);
  s->st = *st;
  s->done = true;
  s->call = NULL;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static void stream_destroy(struct stk_batch_stream *s) {
  rpc_client_free(s->rpc);
  for (size_t i = 0; i < s->n; i++) stk_batch_free(&s->q[(s->head + i) % s->cap]);
  free(s->q);
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

/* Allocates a stream and its channel. */
static int stream_new(struct stk_client *c, uint32_t prefetch, struct stk_batch_stream **ret) {
  struct stk_batch_stream *s = calloc(1, sizeof(*s));
  if (!s) return STK_ENOMEM;
  s->cap = prefetch;
  s->q = calloc(s->cap, sizeof(*s->q));
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  int err = s->q ? client_new_channel(c, &s->rpc) : STK_ENOMEM;
  if (err < 0) {
    stream_destroy(s);
    return err;
  }
  *ret = s;
  return 0;
}

int stk_batch_stream_open(struct stk_client *c, const char *job, int64_t from_step, uint32_t rank,
                          uint32_t world, uint32_t prefetch, struct stk_batch_stream **ret_stream) {
  return loader_stream_open(c, job, from_step, rank, world, prefetch, false, ret_stream);
}

int loader_stream_wrap(struct parts_stream *ps, struct stk_batch_stream **ret_stream) {
  struct stk_batch_stream *s = calloc(1, sizeof(*s));
  if (!s) {
    loader_parts_stream_free(ps);
    return client_fail(STK_ENOMEM, "stream batches");
  }
  s->assembled = ps;
  *ret_stream = s;
  return 0;
}

int loader_stream_open(struct stk_client *c, const char *job, int64_t from_step, uint32_t rank,
                       uint32_t world, uint32_t prefetch, bool partial_ok,
                       struct stk_batch_stream **ret_stream) {
  if (!c || !job || !ret_stream || world == 0 || rank >= world || from_step < 0)
    return client_fail(STK_EINVAL, "stream batches");
  if (prefetch == 0) prefetch = DEFAULT_PREFETCH;
  struct stk_batch_stream *s;
  int err = stream_new(c, prefetch, &s);
  if (err < 0) return client_fail(err, "stream batches");
  s->next_step = from_step;
  s->partial_ok = partial_ok;
  Stoker__V1__StreamBatchesRequest req = STOKER__V1__STREAM_BATCHES_REQUEST__INIT;
  req.job = (char *)job;
  req.from_step = from_step;
  req.rank = rank;
  req.world = world;
  req.prefetch = prefetch;
  struct rpc_client_call *call = NULL;
  pthread_mutex_lock(&s->mu);
  err =
      rpc_client_stream_async(s->rpc, DL_METHOD("StreamBatches"), &req.base,
                              &stoker__v1__batch__descriptor, 0, stream_msg, stream_done, s, &call);
  if (err == 0 && !s->done) s->call = call;
  pthread_mutex_unlock(&s->mu);
  if (err < 0) {
    stream_destroy(s);
    return client_fail(err, "stream batches");
  }
  *ret_stream = s;
  return 0;
}

/* The error an ended, drained stream reports (call with s->mu held). */
static int end_error(const struct stk_batch_stream *s) {
  if (s->local_err) return client_fail(s->local_err, "stream batches");
  if (s->st.code == RPC_OK) {
    client_set_error(11, "the dataloader ended the stream");
    return STK_ERANGE;
  }
  client_set_error(s->st.code, "%s", s->st.message);
  return stk_error_from_grpc(s->st.code);
}

int stk_batch_stream_next(struct stk_batch_stream *s, int64_t timeout_ms,
                          struct stk_batch *ret_batch) {
  if (s->assembled) return loader_parts_stream_next(s->assembled, timeout_ms, ret_batch);
  struct timespec ts;
  if (timeout_ms >= 0) client_deadline_after(&ts, timeout_ms);
  int err = 0;
  pthread_mutex_lock(&s->mu);
  while (s->n == 0 && !s->done && err == 0) {
    if (timeout_ms < 0) {
      pthread_cond_wait(&s->cv, &s->mu);
    } else if (pthread_cond_timedwait(&s->cv, &s->mu, &ts) == ETIMEDOUT) {
      err = STK_ETIMEDOUT;
    }
  }
  if (s->n > 0) {
    *ret_batch = s->q[s->head];
    s->head = (s->head + 1) % s->cap;
    s->n--;
    err = 0;
    pthread_cond_broadcast(&s->cv);
  } else if (s->done) {
    err = end_error(s);
  } else {
    client_set_error(4, "no batch within %lld ms", (long long)timeout_ms);
  }
  pthread_mutex_unlock(&s->mu);
  return err;
}

void stk_batch_stream_free(struct stk_batch_stream *s) {
  if (!s) return;
  if (s->assembled) {
    loader_parts_stream_free(s->assembled);
    free(s);
    return;
  }
  pthread_mutex_lock(&s->mu);
  s->closing = true;
  pthread_cond_broadcast(&s->cv);
  if (!s->done && s->call) {
    struct rpc_client_call *call = s->call;
    s->cancelling++;
    pthread_mutex_unlock(&s->mu);
    rpc_client_call_cancel(call);
    pthread_mutex_lock(&s->mu);
    s->cancelling--;
    pthread_cond_broadcast(&s->cv);
  }
  while (!s->done) pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  stream_destroy(s);
}
