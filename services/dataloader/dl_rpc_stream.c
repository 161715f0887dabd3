/*
 * StreamBatches: batches from `from_step` on, generated on the threadpool
 * ahead of the client and sent one at a time. The stream is a small state
 * machine driven by pump() on the loop after every event (generation done,
 * send done, cancel, drain):
 *
 *   generating  one threadpool job in flight generating steps next_gen, ...
 *               in order (at most one job, so lanes keep their live state);
 *               a job makes up to GEN_GROUP batches, as many as there is
 *               room for, so that the hand-offs between the loop and the
 *               worker are paid per group rather than per batch;
 *   ready       generated, not yet sent: a FIFO of at most `prefetch`
 *               (ready + generating <= prefetch: the bound on work ahead);
 *   sending     one rpc_send outstanding (gRPC flow control holds it while
 *               the client does not read).
 *
 * With shared-memory delivery (dl_rpc_ring.c) a generation also needs a
 * free ring slot: while the client holds them all, a 1 ms timer retries.
 *
 * Budgets: what a stream holds ahead of its client (ready batches whose
 * tokens are inline, and its ring's reserved pages) counts against the
 * daemon's stream_bytes and its job's stream_bytes_per_job. Past either, a
 * stream generates ahead only while it has nothing ready (one batch: every
 * stream still moves), a group is cut to what is left of the budgets, and a
 * new stream answers RESOURCE_EXHAUSTED naming the flag: a client that
 * opens streams and never reads holds at most its job's budget.
 *
 * The stream ends once nothing is in flight: after `count` batches (OK), on
 * a core error once the ready batches were sent (the error's status), on
 * cancel (nothing more is sent), or on drain (UNAVAILABLE naming the step
 * to resume from).
 */
#include <stdlib.h>
#include <string.h>

#include "dl_rpc_internal.h"
#include "shm_ring.h"
#include "stk_error.h"

#define RING_POLL_MS 1
#define GEN_GROUP    8
#define SEND_GROUP   16 /* Ring batches coalesced into one message at most. */

/* A generated batch and its ring sequence (0: its tokens are inline). */
struct ready {
  struct dl_batch b;
  uint64_t seq;
};

struct dl_stream {
  struct dl_rpc *a;
  struct rpc_call *call;
  const Stoker__V1__StreamBatchesRequest *req; /* Valid until the call finishes. */
  struct dl_stream *prev, *next;
  uint32_t prefetch;
  uint64_t left;     /* Batches still to generate (UINT64_MAX: unbounded). */
  int64_t next_gen;  /* Step of the next generation. */
  int64_t next_send; /* Step the client gets next. */
  struct ready *ready;
  uint32_t head, n_ready; /* FIFO in ready[prefetch]. */
  uint64_t inline_bytes;  /* Token bytes of the ready batches that go inline. */
  uint64_t batch_bytes;   /* Of the last batch generated (0: none yet), to size groups. */
  uv_work_t work;
  bool generating, sending, stopping;
  struct dl_stream_ring shm;
  uv_timer_t poll; /* Retries a generation while the ring is full. */
  bool poll_open;  /* poll initialized (closed before s is freed). */
  /* The job in flight: gen_want steps from next_gen, batch j into ring
   * slot gen_dest[j] (NULL: a fresh buffer); the worker made gen_n. */
  uint32_t gen_want, gen_n;
  uint32_t *gen_dest[GEN_GROUP];
  uint64_t gen_seq[GEN_GROUP]; /* The ring sequence of gen_dest[j]. */
  size_t gen_dest_bytes;
  struct dl_batch gen_out[GEN_GROUP];
  double gen_seconds[GEN_GROUP];
  int gen_err;
  char gen_msg[DL_RPC_MSG_LEN]; /* Worker's error text. */
  int end_code;                 /* Status once stopping. */
  char end_msg[DL_RPC_MSG_LEN];
};

static void pump(struct dl_stream *s);

static uint64_t token_bytes(const struct dl_batch *b) {
  return (uint64_t)b->lines * b->line_tokens * sizeof(uint32_t);
}

/* What s holds ahead of its client. */
static uint64_t held(const struct dl_stream *s) {
  return s->inline_bytes + (s->shm.ring ? shm_ring_reserved_bytes(s->shm.ring) : 0);
}

/* What the streams of job hold (*ret_job) and those of every job (*ret_all),
 * in one pass. */
static void held_by(const struct dl_rpc *a, const char *job, uint64_t *ret_job, uint64_t *ret_all) {
  *ret_job = *ret_all = 0;
  for (const struct dl_stream *s = a->streams; s; s = s->next) {
    uint64_t n = held(s);
    *ret_all += n;
    if (strcmp(s->req->job, job) == 0) *ret_job += n;
  }
}

/* Bytes s may still take before its job's or the daemon's budget. */
static uint64_t budget_left(const struct dl_stream *s) {
  uint64_t job, all;
  held_by(s->a, s->req->job, &job, &all);
  uint64_t left_all = all < s->a->stream_bytes ? s->a->stream_bytes - all : 0;
  uint64_t left_job = job < s->a->stream_bytes_per_job ? s->a->stream_bytes_per_job - job : 0;
  return left_all < left_job ? left_all : left_job;
}

static void stop(struct dl_stream *s, int code, const char *msg) {
  if (s->stopping) return;
  s->stopping = true;
  s->end_code = code;
  snprintf(s->end_msg, sizeof(s->end_msg), "%s", msg);
}

static void unlink_stream(struct dl_stream *s) {
  struct dl_rpc *a = s->a;
  if (s->prev)
    s->prev->next = s->next;
  else
    a->streams = s->next;
  if (s->next) s->next->prev = s->prev;
}

static void free_stream(uv_handle_t *h) {
  struct dl_stream *s = h->data;
  free(s->ready);
  free(s);
}

/* Finishes the call and frees everything; nothing may be in flight. */
static void end(struct dl_stream *s) {
  unlink_stream(s);
  for (uint32_t i = 0; i < s->n_ready; i++) dl_batch_free(&s->ready[(s->head + i) % s->prefetch].b);
  if (s->a->prefetched) metric_gauge_add(s->a->prefetched, -(double)s->n_ready);
  rpc_finish(s->call, s->end_code, "%s", s->end_msg);
  dl_stream_ring_close(&s->shm); /* After the batches that point into it. */
  if (s->poll_open) {
    uv_close((uv_handle_t *)&s->poll, free_stream);
  } else {
    free(s->ready);
    free(s);
  }
}

/* ------------------------------------------------------------ generate */

static void gen_work(uv_work_t *w) {
  struct dl_stream *s = w->data;
  const Stoker__V1__StreamBatchesRequest *r = s->req;
  stk_clear_detail();
  s->gen_n = 0;
  s->gen_err = 0;
  for (uint32_t j = 0; j < s->gen_want; j++) {
    double t0 = dl_rpc_now();
    struct dl_batch *b = &s->gen_out[j];
    s->gen_err = dl_get_batch_into(s->a->dl, r->job, s->next_gen + j, r->rank, r->world,
                                   s->gen_dest[j], s->gen_dest_bytes, b);
    s->gen_seconds[j] = dl_rpc_now() - t0;
    if (s->gen_err == DL_YIELDED) return; /* A slice of a long replay: gen_done queues the rest. */
    if (s->gen_err) {
      dl_rpc_capture_error(s->gen_err, s->gen_msg, sizeof(s->gen_msg));
      return;
    }
    Stoker__V1__Batch unused;
    dl_rpc_batch_encode(b, &unused); /* Little-endian bytes, off the loop. */
    if (b->tokens_borrowed) dl_stream_ring_widen(&s->shm, b);
    s->gen_n++;
    /* Too big for its slot: it goes inline, and so would the later ones
     * (a new shape from this step on); their slots stay free. */
    if (s->gen_dest[j] && !b->tokens_borrowed) return;
  }
}

/* Queues batch j of the finished job. */
static void take_generated(struct dl_stream *s, uint32_t j) {
  struct dl_batch *b = &s->gen_out[j];
  uint64_t seq = b->tokens_borrowed ? s->gen_seq[j] : 0;
  if (!seq && !s->shm.ring) {
    /* The stream's first batch sizes the ring, then goes through it too. */
    dl_stream_ring_setup(&s->shm, s->a, s->prefetch, b);
    if (s->shm.ring) seq = dl_stream_ring_adopt(&s->shm, b);
  }
  if (seq) dl_stream_ring_written(&s->shm, seq);
  s->ready[(s->head + s->n_ready) % s->prefetch] = (struct ready){.b = *b, .seq = seq};
  if (!seq) s->inline_bytes += token_bytes(b);
  s->batch_bytes = token_bytes(b);
  s->n_ready++;
  s->next_gen++;
  s->left--;
  if (s->a->gen_seconds) metric_histogram_observe(s->a->gen_seconds, s->gen_seconds[j]);
  if (s->a->prefetched) metric_gauge_add(s->a->prefetched, 1);
}

static void gen_done(uv_work_t *w, int status) {
  struct dl_stream *s = w->data;
  s->generating = false;
  for (uint32_t j = 0; j < s->gen_n; j++) {
    if (s->stopping || status < 0)
      dl_batch_free(&s->gen_out[j]);
    else
      take_generated(s, j);
  }
  if (status == 0 && s->gen_err == DL_YIELDED) {
    if (s->a->replay_yields) metric_counter_add(s->a->replay_yields, 1);
    s->gen_err = 0; /* pump() queues the next slice behind the work waiting. */
  }
  if (status < 0 || s->gen_err) {
    int err = status < 0 ? STK_ECANCELED : s->gen_err;
    stop(s, stk_error_to_grpc(err), s->gen_err ? s->gen_msg : "cancelled"); /* pump() flushes. */
  }
  pump(s);
}

static void poll_fired(uv_timer_t *t) {
  pump(t->data);
}

/* The ring is full: try again shortly (the client releases slots through
 * shared memory, which raises no event here). */
static void wait_for_slot(struct dl_stream *s) {
  if (!s->poll_open) {
    if (uv_timer_init(s->a->loop, &s->poll) != 0) {
      stop(s, RPC_INTERNAL, "cannot start a timer");
      return;
    }
    s->poll.data = s;
    s->poll_open = true;
  }
  if (!uv_is_active((uv_handle_t *)&s->poll)) uv_timer_start(&s->poll, poll_fired, RING_POLL_MS, 0);
}

static void start_generation(struct dl_stream *s) {
  uint64_t room = s->prefetch - s->n_ready;
  if (room > s->left) room = s->left;
  if (room > GEN_GROUP) room = GEN_GROUP;
  /* No further than the budgets let (a batch's size is known after the
   * first); with nothing ready, one batch whatever they say. */
  uint64_t fits = s->batch_bytes ? budget_left(s) / s->batch_bytes : 1;
  if (room > fits) room = fits > 0 || s->n_ready > 0 ? fits : 1;
  if (room == 0) return; /* Pumped again when a send completes. */
  uint32_t want = 0;
  bool full = false;
  s->gen_dest_bytes = 0;
  while (want < room) {
    /* A probe that finds the ring full answers 0 bytes: it must not
     * overwrite the slot size of the batches already given a slot (they
     * would go inline). */
    size_t bytes = 0;
    uint64_t after = want ? s->gen_seq[want - 1] : 0; /* Probes go on from the last answer. */
    uint32_t *dest = dl_stream_ring_dest(&s->shm, after, &s->gen_seq[want], &bytes, &full);
    if (full) break;
    s->gen_dest[want] = dest;
    if (dest) s->gen_dest_bytes = bytes;
    want++;
  }
  if (want == 0) {
    wait_for_slot(s);
    return;
  }
  s->gen_want = want;
  s->work.data = s;
  int rc = dl_sched_submit(s->a->sched, rpc_call_scope(s->call), s->req->job, &s->work, gen_work,
                           gen_done);
  if (rc)
    stop(s, RPC_INTERNAL, stk_strerror(rc));
  else
    s->generating = true;
}

/* ---------------------------------------------------------------- send */

static void sent(struct rpc_call *call, int err, void *arg) {
  struct dl_stream *s = arg;
  (void)call;
  s->sending = false;
  if (err) stop(s, RPC_CANCELLED, "cancelled");
  pump(s);
}

/* The token bytes go to gRPC in place (no copy): gRPC frees them when it
 * has written them to the socket, on whichever thread that happens. */
static void release_tokens(void *tokens) {
  free(tokens);
}

/* Ring batches: only metadata goes over gRPC, for the front batch and up
 * to SEND_GROUP - 1 ring batches after it in one message; *ret_n gets how
 * many it carries. */
static int send_shm(struct dl_stream *s, uint32_t *ret_n) {
  Stoker__V1__Batch msgs[SEND_GROUP], *more[SEND_GROUP];
  uint32_t n = 0;
  while (n < SEND_GROUP && n < s->n_ready) {
    struct ready *e = &s->ready[(s->head + n) % s->prefetch];
    if (!e->seq) break;
    dl_rpc_batch_msg(&e->b, &msgs[n]); /* Tokens encoded in the slot by gen_work. */
    dl_stream_ring_msg(&s->shm, e->seq, &msgs[n]);
    more[n] = &msgs[n];
    n++;
  }
  msgs[0].more = more + 1;
  msgs[0].n_more = n - 1;
  *ret_n = n;
  return rpc_send(s->call, &msgs[0].base, sent, s);
}

/* A batch with its tokens in the message: gRPC takes the buffer. */
static int send_inline(struct dl_stream *s, struct dl_batch *b) {
  Stoker__V1__Batch msg;
  dl_rpc_batch_msg(b, &msg); /* Tokens encoded by gen_work. */
  const void *tokens = msg.tokens.data;
  size_t tokens_len = msg.tokens.len;
  msg.tokens.data = NULL;
  msg.tokens.len = 0;
  b->tokens = NULL; /* Owned by the send from here on. */
  return rpc_send_borrowed(s->call, &msg.base, s->a->tokens_field, tokens, tokens_len,
                           release_tokens, (void *)tokens, sent, s);
}

/* Sends the front batch (and, from the ring, those ready after it). */
static void send_front(struct dl_stream *s) {
  uint32_t n = 1;
  bool shm = s->ready[s->head].seq != 0;
  int rc = shm ? send_shm(s, &n) : send_inline(s, &s->ready[s->head].b);
  if (rc == 0)
    s->sending = true;
  else
    stop(s, RPC_CANCELLED, "cancelled");
  for (uint32_t i = 0; i < n; i++) {
    struct ready *e = &s->ready[s->head];
    if (rc == 0) {
      s->next_send++;
      dl_rpc_count_served(s->a, &e->b);
      if (shm && s->a->shm_batches) metric_counter_add(s->a->shm_batches, 1);
    }
    if (!e->seq) s->inline_bytes -= token_bytes(&e->b);
    dl_batch_free(&e->b);
    s->head = (s->head + 1) % s->prefetch;
    s->n_ready--;
    if (s->a->prefetched) metric_gauge_add(s->a->prefetched, -1);
  }
}

/* ---------------------------------------------------------------- pump */

/* A core error ends the stream after the batches generated before it. */
static bool error_pending(const struct dl_stream *s) {
  return s->stopping && s->end_code != RPC_CANCELLED && s->end_code != RPC_UNAVAILABLE &&
         s->end_code != RPC_OK && !rpc_cancelled(s->call);
}

static void pump(struct dl_stream *s) {
  bool flush = !s->stopping || error_pending(s);
  if (flush && !s->sending && s->n_ready > 0) send_front(s);
  if (!s->stopping && !s->generating && s->left > 0 && s->n_ready < s->prefetch &&
      (s->n_ready == 0 || budget_left(s) > 0))
    start_generation(s);
  if (!s->stopping && s->left == 0 && s->n_ready == 0 && !s->sending && !s->generating)
    stop(s, RPC_OK, "");
  if (s->stopping && !s->generating && !s->sending && (s->n_ready == 0 || !flush)) end(s);
}

static void on_cancel(struct rpc_call *call, void *arg) {
  struct dl_stream *s = rpc_call_data(call);
  (void)arg;
  if (!s) return;
  s->stopping = true; /* Overrides a pending error: nothing more is sent. */
  s->end_code = RPC_CANCELLED;
  snprintf(s->end_msg, sizeof(s->end_msg), "cancelled");
  pump(s);
}

void dl_rpc_stream_drain(struct dl_rpc *a) {
  for (struct dl_stream *s = a->streams, *next; s; s = next) {
    next = s->next;
    if (s->stopping) continue;
    char msg[128];
    snprintf(msg, sizeof(msg), "dataloader is shutting down; resume from step %lld",
             (long long)s->next_send);
    stop(s, RPC_UNAVAILABLE, msg);
    pump(s); /* May end s. */
  }
}

size_t dl_rpc_stream_queues(const struct dl_rpc *a, struct dl_stream_queue *ret, size_t cap) {
  size_t n = 0;
  for (const struct dl_stream *s = a->streams; s; s = s->next, n++)
    if (n < cap)
      ret[n] =
          (struct dl_stream_queue){.job = s->req->job, .ready = s->n_ready, .held_bytes = held(s)};
  return n;
}

void dl_rpc_stream(struct rpc_call *call, struct dl_rpc *a,
                   const Stoker__V1__StreamBatchesRequest *r) {
  if (r->shm_nonce.len != 0 && r->shm_nonce.len != SHM_RING_NONCE_BYTES) {
    rpc_finish(call, RPC_INVALID_ARGUMENT, "shm_nonce must be %d bytes, got %zu",
               SHM_RING_NONCE_BYTES, r->shm_nonce.len);
    return;
  }
  if (r->shm_token_bytes != 0 && r->shm_token_bytes != 4 && r->shm_token_bytes != 8) {
    rpc_finish(call, RPC_INVALID_ARGUMENT, "shm_token_bytes must be 4 or 8 (0: 4), got %u",
               r->shm_token_bytes);
    return;
  }
  if (r->prefetch > a->max_prefetch) {
    rpc_finish(call, RPC_INVALID_ARGUMENT, "prefetch %u is over the daemon's limit %u", r->prefetch,
               a->max_prefetch);
    return;
  }
  if (a->draining) {
    rpc_finish(call, RPC_UNAVAILABLE, "dataloader is shutting down; retry");
    return;
  }
  uint64_t job_held, all_held;
  held_by(a, r->job, &job_held, &all_held);
  if (job_held >= a->stream_bytes_per_job || all_held >= a->stream_bytes) {
    bool job = job_held >= a->stream_bytes_per_job;
    rpc_finish(call, RPC_RESOURCE_EXHAUSTED,
               "%s hold %llu bytes ahead of their clients, the most %s (%s); read or cancel "
               "them first",
               job ? "the streams of this job" : "the streams of every job",
               (unsigned long long)(job ? job_held : all_held),
               job ? "one job's may hold" : "this dataloader keeps",
               job ? "--stream-bytes-per-job" : "--stream-bytes");
    return;
  }
  struct dl_stream *s = calloc(1, sizeof(*s));
  uint32_t prefetch = r->prefetch ? r->prefetch : a->default_prefetch;
  if (s) s->ready = calloc(prefetch, sizeof(*s->ready));
  if (!s || !s->ready) {
    if (s) free(s);
    rpc_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  *s = (struct dl_stream){.a = a,
                          .call = call,
                          .req = r,
                          .prefetch = prefetch,
                          .left = r->count ? r->count : UINT64_MAX,
                          .next_gen = r->from_step,
                          .next_send = r->from_step,
                          .ready = s->ready};
  if (r->shm_nonce.len == SHM_RING_NONCE_BYTES && a->shm_dirfd >= 0) {
    s->shm.wanted = true;
    s->shm.token_bytes = r->shm_token_bytes ? r->shm_token_bytes : 4;
    memcpy(s->shm.nonce, r->shm_nonce.data, SHM_RING_NONCE_BYTES);
  }
  s->next = a->streams;
  if (a->streams) a->streams->prev = s;
  a->streams = s;
  rpc_call_set_data(call, s);
  rpc_on_cancel(call, on_cancel, NULL);
  pump(s);
}
