/*
 * Batches that arrive asynchronously: GetBatch with a completion callback,
 * and the trainer's batch iterator over StreamBatches. The iterator owns a
 * channel (and so a completion thread) of its own: when its bounded queue
 * is full the completion thread simply waits for the trainer, no further
 * message is read, and HTTP/2 flow control holds the server back. Blocking
 * the shared client thread instead would stall (or deadlock) the rank's
 * other calls, such as a Commit issued while the queue is full.
 *
 * Shared memory: unless STOKER_DL_SHM=off, the iterator asks for delivery
 * through the daemon's ring (a random nonce in the request). Once a batch
 * names the ring, the iterator maps it (loader_ring.c) and later batches
 * view their slots in place. Where the ring cannot be opened (the daemon
 * is on another host, or another user's), the iterator ends that call and
 * reopens it from the next step without shared memory, once (or, opened
 * with STK_SHM_REQUIRE, ends the stream with STK_ESTATE, as it does when
 * the stream's first batch comes inline: the daemon made no ring).
 *
 * Reconnecting: a stream the dataloader ends with UNAVAILABLE (it shuts
 * down and says from which step to resume, a rolling update replaces its
 * pod, the connection is lost or closed at the server's max-connection-age)
 * is opened again from the next step it has not delivered, on the same
 * channel: gRPC asks DNS again after the failed connection, so a part that
 * came back at a new address under its name is found there. A batch is a
 * pure function of (step, rank, world), so the reopened stream carries the
 * same batches. Attempts back off from STREAM_RETRY_FIRST_MS to
 * STREAM_RETRY_MAX_MS, run only while the trainer waits in next() (whose
 * timeout it keeps), and stop STREAM_RECONNECT_MS after the last batch came
 * with no new one: the stream then ends with the last failure. The ring of
 * the old call is let go (batches still viewing it keep it mapped); the
 * new call names its own.
 *
 * A stream made elsewhere (a scaled-out job's, assembled from one stream per
 * part in loader_parts_stream.c, above this file) is wrapped with the ops
 * its maker hands loader_stream_wrap, so this file never calls up.
 *
 * Token width: a stream opened with token_bytes 8 asks the daemon to write
 * int64 tokens into its ring (StreamBatchesRequest.shm_token_bytes), so a
 * trainer that wants int64 (PyTorch's token ids) views them in place;
 * inline batches of such a stream are widened here.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "client_internal.h"
#include "loader_internal.h"

#define DEFAULT_PREFETCH      4
#define STREAM_RETRY_FIRST_MS 50
#define STREAM_RETRY_MAX_MS   1000
/* How long a stream keeps reconnecting with no batch coming: a part's pod
 * replaced by a rolling update is back in seconds to a minute (its volume
 * attached, RocksDB opened); the trainer's next() timeout bounds it too. */
#define STREAM_RECONNECT_MS 120000

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
  int err = rpc_client_unary_async(client_rpc(c), DL_METHOD(get_batch, &req), &req.base,
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
  const struct loader_stream_ops *ops; /* Set: a stream made elsewhere (loader_stream_wrap). */
  void *impl;                          /* Its state; with ops, nothing below is used. */
  bool partial_ok;                     /* Part of an assembled stream: partial batches expected. */
  struct rpc_client *rpc;              /* This stream's own channel. */
  pthread_mutex_t mu;
  pthread_cond_t cv; /* Queue changes, end of the stream, cancellers leaving. */
  struct stk_batch *q;
  size_t cap, head, n; /* Ring of n batches from q[head]. */
  int64_t next_step;   /* Step the next arriving batch must carry. */
  bool closing;        /* stk_batch_stream_free: stop waiting for room. */
  bool done;           /* The call ended; st holds its status. */
  int local_err;       /* A bad batch ended the stream. */
  bool end_reported;   /* stk_batch_stream_next returned the OK end. */
  char local_msg[256]; /* Why (the completion thread's last error). */
  int cancelling;      /* Threads inside rpc_client_call_cancel. */
  struct rpc_client_call *call;
  struct rpc_status st;
  /* What reopening needs. */
  char *job;
  uint32_t rank, world, prefetch;
  /* Shared-memory delivery. */
  int shm_mode;         /* enum stk_shm_mode. */
  uint32_t token_bytes; /* 4 or 8: of the tokens in the ring and of the batches. */
  bool shm;             /* Asked for on the current call. */
  bool reopen;          /* The call ended to fall back to gRPC bytes. */
  bool reconnect;       /* The call ended UNAVAILABLE: open it again from next_step. */
  int64_t failed_ms;    /* When the first failure since the last batch came (0: none). */
  int64_t retry_ms;     /* The next reconnect not before this time. */
  int64_t delay_ms;     /* The backoff after the next failed attempt. */
  uint8_t nonce[16];    /* This call's. */
  struct loader_ring *ring;
  uint64_t last_seq; /* shm_seq of the last ring batch: the next one's is higher. */
};

/* Maps the ring a batch names (s->mu held). 0, or an error that makes the
 * stream fall back to bytes over gRPC. */
static int take_ring(struct stk_batch_stream *s, const Stoker__V1__Batch *m) {
  if (!m->shm_path || !m->shm_path[0]) return 0;
  if (!s->shm || s->ring) {
    client_set_error(15, "dataloader sent %s",
                     s->ring ? "a second shared-memory ring"
                             : "a shared-memory ring not asked for");
    return STK_ECORRUPT;
  }
  int err = loader_ring_attach(m->shm_path, s->nonce, &s->ring);
  if (err == 0) s->last_seq = 0;
  return err;
}

/* Converts one batch (s->mu held): its ring is mapped first, and ring
 * batches come in growing sequences (the daemon passes over slots a batch
 * still views, so they may skip); a coalesced one (from `more`) must be a
 * plain ring batch. */
static int take_batch(struct stk_batch_stream *s, ProtobufCMessage *msg, bool coalesced,
                      struct stk_batch *b) {
  const Stoker__V1__Batch *m = (const void *)msg;
  if (m->n_more || (coalesced && (!m->shm_seq || (m->shm_path && m->shm_path[0])))) {
    protobuf_c_message_free_unpacked(msg, NULL);
    client_set_error(15, "malformed coalesced batch from the dataloader");
    return STK_ECORRUPT;
  }
  int err = take_ring(s, m);
  if (err < 0 && err != STK_ECORRUPT && s->shm_mode == STK_SHM_REQUIRE) {
    client_set_error(9, "shared-memory transport required, but the ring %s cannot be opened: %s",
                     m->shm_path, stk_strerror(err));
    protobuf_c_message_free_unpacked(msg, NULL);
    return STK_ESTATE;
  }
  if (err < 0 && err != STK_ECORRUPT) {
    s->reopen = true; /* Not this host's ring: fall back, from this step. */
    protobuf_c_message_free_unpacked(msg, NULL);
    return err;
  }
  if (err == 0 && !m->shm_seq && !s->ring && s->shm_mode == STK_SHM_REQUIRE) {
    /* The daemon names its ring with a stream's first batch: none, no ring. */
    client_set_error(9,
                     "shared-memory transport required, but the dataloader sent step %lld inline "
                     "(its shm-dir is off, the batch is over its shm-ring-max, or its tmpfs is "
                     "full)",
                     (long long)m->step);
    protobuf_c_message_free_unpacked(msg, NULL);
    return STK_ESTATE;
  }
  if (err == 0 && m->shm_seq && (!s->ring || m->shm_seq <= s->last_seq)) {
    if (s->ring)
      client_set_error(15, "dataloader sent shared-memory sequence %llu after %llu",
                       (unsigned long long)m->shm_seq, (unsigned long long)s->last_seq);
    else
      client_set_error(15, "dataloader sent a shared-memory batch before any ring");
    err = STK_ECORRUPT;
  }
  if (err < 0) {
    protobuf_c_message_free_unpacked(msg, NULL);
    return err;
  }
  if (m->shm_seq) s->last_seq = m->shm_seq;
  return loader_batch_from_ring(msg, s->partial_ok, s->ring, s->token_bytes, b);
}

/* Queues one batch, waiting for room (s->mu held); false once the stream
 * stops taking batches (msg is freed in every case). */
static bool queue_one(struct stk_batch_stream *s, ProtobufCMessage *msg, bool coalesced) {
  struct stk_batch b;
  int err = take_batch(s, msg, coalesced, &b);
  if (err == 0 && b.step != s->next_step) {
    client_set_error(15, "dataloader sent step %lld, expected step %lld", (long long)b.step,
                     (long long)s->next_step);
    stk_batch_free(&b);
    err = STK_ECORRUPT;
  }
  while (err == 0 && s->n == s->cap && !s->closing) pthread_cond_wait(&s->cv, &s->mu);
  if (err < 0 || s->closing) {
    if (err == 0) stk_batch_free(&b);
    if (err < 0 && !s->local_err && !s->reopen) {
      s->local_err = err; /* The last error is this thread's: keep it for the trainer's. */
      snprintf(s->local_msg, sizeof(s->local_msg), "%s", stk_client_last_error(NULL));
    }
    if (s->call) rpc_client_call_cancel(s->call); /* The handle is alive: we run on it. */
    return false;
  }
  s->q[(s->head + s->n) % s->cap] = b;
  s->n++;
  s->next_step++;
  s->failed_ms = 0; /* A batch came: a later failure starts a new window. */
  s->delay_ms = STREAM_RETRY_FIRST_MS;
  pthread_cond_broadcast(&s->cv);
  return true;
}

/* Completion thread: queue the message's batch and those coalesced with
 * it; each coalesced batch becomes a message of its own (its owner). */
static void stream_msg(void *arg, ProtobufCMessage *msg) {
  struct stk_batch_stream *s = arg;
  Stoker__V1__Batch *m = (Stoker__V1__Batch *)msg;
  Stoker__V1__Batch **more = m->more;
  size_t n_more = m->n_more;
  m->more = NULL;
  m->n_more = 0;
  pthread_mutex_lock(&s->mu);
  bool taking = queue_one(s, msg, false);
  for (size_t i = 0; i < n_more; i++) {
    if (taking)
      taking = queue_one(s, &more[i]->base, true);
    else
      protobuf_c_message_free_unpacked(&more[i]->base, NULL);
  }
  pthread_mutex_unlock(&s->mu);
  free(more);
}

static void stream_done(void *arg, const struct rpc_status *st) {
  struct stk_batch_stream *s = arg;
  pthread_mutex_lock(&s->mu);
  while (s->cancelling > 0) pthread_cond_wait(&s->cv, &s->mu);
  s->st = *st;
  s->reconnect = st->code == RPC_UNAVAILABLE && !s->local_err && !s->reopen && !s->closing;
  if (s->reconnect) {
    int64_t now = client_now_ms();
    if (!s->failed_ms) s->failed_ms = now;
    s->retry_ms = now + s->delay_ms;
    s->delay_ms = s->delay_ms * 2 < STREAM_RETRY_MAX_MS ? s->delay_ms * 2 : STREAM_RETRY_MAX_MS;
    if (now - s->failed_ms >= STREAM_RECONNECT_MS) s->reconnect = false; /* Give up. */
  }
  /* Else stk_batch_stream_next reopens or reconnects. */
  s->done = !(s->reopen || s->reconnect) || s->closing;
  s->call = NULL;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static void stream_destroy(struct stk_batch_stream *s) {
  rpc_client_free(s->rpc);
  for (size_t i = 0; i < s->n; i++) stk_batch_free(&s->q[(s->head + i) % s->cap]);
  loader_ring_unref(s->ring);
  free(s->job);
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
  client_cond_init(&s->cv);
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
  struct stk_batch_stream_opts o = {.prefetch = prefetch};
  return loader_stream_open(c, job, from_step, rank, world, &o, false, ret_stream);
}

int stk_batch_stream_open_opts(struct stk_client *c, const char *job, int64_t from_step,
                               uint32_t rank, uint32_t world,
                               const struct stk_batch_stream_opts *opts,
                               struct stk_batch_stream **ret_stream) {
  struct stk_batch_stream_opts o = {0};
  if (opts) o = *opts;
  return loader_stream_open(c, job, from_step, rank, world, &o, false, ret_stream);
}

int loader_stream_wrap(const struct loader_stream_ops *ops, void *impl,
                       struct stk_batch_stream **ret_stream) {
  struct stk_batch_stream *s = calloc(1, sizeof(*s));
  if (!s) {
    ops->free(impl);
    return client_fail(STK_ENOMEM, "stream batches");
  }
  s->ops = ops;
  s->impl = impl;
  *ret_stream = s;
  return 0;
}

/* Asks for shared-memory delivery unless the mode or STOKER_DL_SHM=off
 * says not to (STK_SHM_REQUIRE: always). */
static bool want_shm(struct stk_batch_stream *s) {
  const char *env = getenv("STOKER_DL_SHM");
  if (s->shm_mode == STK_SHM_OFF) return false;
  if (s->shm_mode == STK_SHM_AUTO && env && strcmp(env, "off") == 0) return false;
  return getrandom(s->nonce, sizeof(s->nonce), 0) == (ssize_t)sizeof(s->nonce);
}

/* Starts the call from s->next_step (s->mu held, so that callbacks wait). */
static int start_call(struct stk_batch_stream *s) {
  Stoker__V1__StreamBatchesRequest req = STOKER__V1__STREAM_BATCHES_REQUEST__INIT;
  req.job = s->job;
  req.from_step = s->next_step;
  req.rank = s->rank;
  req.world = s->world;
  req.prefetch = s->prefetch;
  if (s->shm) {
    req.shm_nonce.data = s->nonce;
    req.shm_nonce.len = sizeof(s->nonce);
    req.shm_token_bytes = s->token_bytes;
  }
  struct rpc_client_call *call = NULL;
  s->done = false;
  int err =
      rpc_client_stream_async(s->rpc, DL_METHOD(stream_batches, &req), &req.base,
                              &stoker__v1__batch__descriptor, 0, stream_msg, stream_done, s, &call);
  if (err == 0 && !s->done) s->call = call;
  return err;
}

int loader_stream_open(struct stk_client *c, const char *job, int64_t from_step, uint32_t rank,
                       uint32_t world, const struct stk_batch_stream_opts *opts, bool partial_ok,
                       struct stk_batch_stream **ret_stream) {
  if (!c || !job || !ret_stream || world == 0 || rank >= world || from_step < 0 ||
      (opts->token_bytes != 0 && opts->token_bytes != 4 && opts->token_bytes != 8) ||
      opts->shm < STK_SHM_AUTO || opts->shm > STK_SHM_REQUIRE)
    return client_fail(STK_EINVAL, "stream batches");
  uint32_t prefetch = opts->prefetch ? opts->prefetch : DEFAULT_PREFETCH;
  struct stk_batch_stream *s;
  int err = stream_new(c, prefetch, &s);
  if (err < 0) return client_fail(err, "stream batches");
  s->next_step = from_step;
  s->partial_ok = partial_ok;
  s->rank = rank;
  s->world = world;
  s->prefetch = prefetch;
  s->shm_mode = opts->shm;
  s->token_bytes = opts->token_bytes == 8 ? 8 : 4;
  s->shm = want_shm(s);
  s->delay_ms = STREAM_RETRY_FIRST_MS;
  if (!(s->job = strdup(job))) {
    stream_destroy(s);
    return client_fail(STK_ENOMEM, "stream batches");
  }
  pthread_mutex_lock(&s->mu);
  err = start_call(s);
  pthread_mutex_unlock(&s->mu);
  if (err < 0) {
    stream_destroy(s);
    return client_fail(err, "stream batches");
  }
  *ret_stream = s;
  return 0;
}

/* The error an ended, drained stream reports (call with s->mu held). */
static int end_error(struct stk_batch_stream *s) {
  if (s->local_err) {
    client_set_error(stk_error_to_grpc(s->local_err), "stream batches: %s", s->local_msg);
    return s->local_err;
  }
  if (s->st.code == RPC_OK) {
    s->end_reported = true;
    client_set_error(11, "the dataloader ended the stream");
    return STK_ERANGE;
  }
  client_set_error(s->st.code, "%s", s->st.message);
  return stk_error_from_grpc(s->st.code);
}

/* The call ended to fall back from shared memory: the same stream again
 * from the next step, with the bytes in the messages (s->mu held). */
static int reopen(struct stk_batch_stream *s) {
  s->reopen = false;
  s->shm = false;
  s->local_err = 0;
  int err = start_call(s);
  if (err < 0) client_fail(err, "stream batches");
  return err;
}

/* The call ended UNAVAILABLE: once its backoff passed, the same stream
 * again from the next step, asking for a ring anew (s->mu held). 0 with
 * *ret_wait_ms > 0: not yet, wait that long first. */
static int reconnect(struct stk_batch_stream *s, int64_t *ret_wait_ms) {
  *ret_wait_ms = s->retry_ms - client_now_ms();
  if (*ret_wait_ms > 0) return 0;
  s->reconnect = false;
  loader_ring_unref(s->ring); /* Batches still viewing it hold it. */
  s->ring = NULL;
  s->last_seq = 0;
  if (s->shm) s->shm = want_shm(s); /* A new nonce for the new call's ring. */
  int err = start_call(s);
  if (err < 0) client_fail(err, "stream batches");
  return err;
}

int stk_batch_stream_next(struct stk_batch_stream *s, int64_t timeout_ms,
                          struct stk_batch *ret_batch) {
  if (s->ops) return s->ops->next(s->impl, timeout_ms, ret_batch);
  struct timespec ts;
  int64_t deadline_ms = client_now_ms() + timeout_ms;
  if (timeout_ms >= 0) client_deadline_after(&ts, timeout_ms);
  int err = 0;
  pthread_mutex_lock(&s->mu);
  while (s->n == 0 && !s->done && err == 0) {
    bool idle = s->call == NULL && !s->closing;
    int64_t wait_ms = 0;
    if (s->reopen && idle) {
      err = reopen(s);
    } else if (s->reconnect && idle) {
      err = reconnect(s, &wait_ms);
      if (err == 0 && wait_ms > 0) { /* Its backoff, within the caller's time. */
        int64_t left = timeout_ms < 0 ? wait_ms : deadline_ms - client_now_ms();
        struct timespec until;
        client_deadline_after(&until, wait_ms < left ? wait_ms : left);
        if (left > 0) pthread_cond_timedwait(&s->cv, &s->mu, &until);
        if (timeout_ms >= 0 && left <= wait_ms) err = STK_ETIMEDOUT;
      }
    } else if (timeout_ms < 0) {
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
  } else if (err == STK_ETIMEDOUT) {
    client_set_error(4, "no batch within %lld ms", (long long)timeout_ms);
  }
  pthread_mutex_unlock(&s->mu);
  return err;
}

bool stk_batch_stream_ended(struct stk_batch_stream *s) {
  if (!s) return false;
  if (s->ops) return s->ops->ended(s->impl);
  pthread_mutex_lock(&s->mu);
  bool ended = s->end_reported;
  pthread_mutex_unlock(&s->mu);
  return ended;
}

void stk_batch_stream_free(struct stk_batch_stream *s) {
  if (!s) return;
  if (s->ops) {
    s->ops->free(s->impl);
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
  while (!s->done && s->call) pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  stream_destroy(s);
}
