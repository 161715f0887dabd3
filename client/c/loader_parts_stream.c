/*
 * Batches of a scaled-out job: every part's partial batch fetched at once
 * and assembled into the rank's slice. A single batch is one GetBatch per
 * part in flight together (each part's client has its own completion
 * thread); the stream is one StreamBatches per part, each over its own
 * channel and prefetching on its own, so the parts generate in parallel and
 * next() only waits for the slowest one. A part whose batch arrived while
 * another timed out keeps it for the next call, so a timeout loses nothing.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "loader_internal.h"

/* ------------------------------------------------------- one batch */

struct gather {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint32_t left;
  struct stk_batch *got; /* [n] */
  bool *have;            /* [n] got[i] arrived */
  int err;               /* first failure */
  uint32_t err_part;
  int err_code;
  char err_msg[400];
};

struct gather_arg {
  struct gather *g;
  uint32_t part;
};

static void gathered(void *arg, int err, const char *msg, struct stk_batch *batch) {
  struct gather_arg *ga = arg;
  struct gather *g = ga->g;
  pthread_mutex_lock(&g->mu);
  if (err == 0) {
    g->got[ga->part] = *batch;
    g->have[ga->part] = true;
    free(batch);
  } else if (!g->err) {
    g->err = err;
    g->err_part = ga->part;
    g->err_code = stk_error_to_grpc(err);
    snprintf(g->err_msg, sizeof(g->err_msg), "%s", msg ? msg : stk_strerror(err));
  }
  g->left--;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

/* Starts every part's GetBatch and waits for all of them. */
static void gather_run(struct stk_loader *l, struct gather *g, struct gather_arg *args,
                       const char *job, int64_t step, uint32_t rank, uint32_t world,
                       int64_t timeout_ms) {
  for (uint32_t i = 0; i < l->n; i++) {
    args[i] = (struct gather_arg){.g = g, .part = i};
    int err = loader_get_batch_async(l->parts[i], job, step, rank, world, timeout_ms, true,
                                     gathered, &args[i]);
    if (err < 0) gathered(&args[i], err, stk_client_last_error(NULL), NULL);
  }
  pthread_mutex_lock(&g->mu);
  while (g->left > 0) pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

int stk_loader_batch_all(struct stk_loader *l, const char *job, int64_t step, uint32_t rank,
                         uint32_t world, int64_t timeout_ms, struct stk_batch *ret_batch) {
  if (!job || !ret_batch) return client_fail(STK_EINVAL, "get batch");
  if (l->n == 1)
    return stk_loader_get_batch(l->parts[0], job, step, rank, world, timeout_ms, ret_batch);
  int64_t deadline = client_now_ms() + client_timeout(l->parts[0], timeout_ms);
  struct gather g = {.left = l->n};
  struct gather_arg *args = calloc(l->n, sizeof(*args));
  g.got = calloc(l->n, sizeof(*g.got));
  g.have = calloc(l->n, sizeof(*g.have));
  if (!args || !g.got || !g.have) {
    free(args);
    free(g.got);
    free(g.have);
    return client_fail(STK_ENOMEM, "get batch");
  }
  pthread_mutex_init(&g.mu, NULL);
  client_cond_init(&g.cv);
  gather_run(l, &g, args, job, step, rank, world, timeout_ms);
  /* A part UNAVAILABLE (restarting, or back at a new address) or one that
   * cancelled the call as it shut down: the blocking call's retries for the
   * parts missing, within what is left of the time. */
  bool told = false; /* This thread's last error says why already. */
  if (client_retryable(g.err)) {
    g.err = 0;
    for (uint32_t i = 0; i < l->n && !g.err; i++) {
      int64_t left = deadline - client_now_ms();
      if (g.have[i]) continue;
      g.err = loader_get_batch(l->parts[i], job, step, rank, world, left > 1 ? left : 1, true,
                               &g.got[i]);
      g.have[i] = g.err == 0;
      if (g.err) told = loader_part_failed(l->n, i, g.err) < 0;
    }
  }
  int err = g.err;
  if (err) {
    for (uint32_t i = 0; i < l->n; i++) stk_batch_free(&g.got[i]);
    if (!told)
      client_set_error(g.err_code, "dataloader part %u of %u: %s", g.err_part, l->n, g.err_msg);
  } else {
    err = loader_assemble(g.got, l->n, ret_batch);
  }
  pthread_cond_destroy(&g.cv);
  pthread_mutex_destroy(&g.mu);
  free(g.got);
  free(g.have);
  free(args);
  return err;
}

/* ------------------------------------------------------- the stream */

struct parts_stream {
  uint32_t n;
  struct stk_batch_stream **subs; /* [n] part i's partial stream */
  struct stk_batch *held;         /* [n] taken for the next step */
  bool *have;                     /* [n] */
};

/* Accepts NULL. */
static void parts_stream_free(struct parts_stream *ps) {
  if (!ps) return;
  for (uint32_t i = 0; i < ps->n; i++) {
    stk_batch_stream_free(ps->subs[i]);
    if (ps->have[i]) stk_batch_free(&ps->held[i]);
  }
  free(ps->subs);
  free(ps->held);
  free(ps->have);
  free(ps);
}

static int parts_stream_open(struct stk_client *const *parts, uint32_t n, const char *job,
                             int64_t from_step, uint32_t rank, uint32_t world, uint32_t prefetch,
                             struct parts_stream **ret) {
  struct parts_stream *ps = calloc(1, sizeof(*ps));
  if (ps) {
    ps->subs = calloc(n, sizeof(*ps->subs));
    ps->held = calloc(n, sizeof(*ps->held));
    ps->have = calloc(n, sizeof(*ps->have));
  }
  if (!ps || !ps->subs || !ps->held || !ps->have) {
    parts_stream_free(ps);
    return client_fail(STK_ENOMEM, "stream batches");
  }
  int err = 0;
  for (uint32_t i = 0; err == 0 && i < n; i++) {
    struct stk_batch_stream_opts o = {.prefetch = prefetch};
    err = loader_stream_open(parts[i], job, from_step, rank, world, &o, true, &ps->subs[i]);
    if (err == 0) ps->n = i + 1;
    if (err < 0) err = loader_part_failed(n, i, err);
  }
  if (err < 0) {
    parts_stream_free(ps);
    return err;
  }
  *ret = ps;
  return 0;
}

static int parts_stream_next(void *impl, int64_t timeout_ms, struct stk_batch *ret_batch) {
  struct parts_stream *ps = impl;
  int64_t deadline = client_now_ms() + timeout_ms;
  for (uint32_t i = 0; i < ps->n; i++) {
    if (ps->have[i]) continue;
    int64_t left = timeout_ms < 0 ? -1 : deadline - client_now_ms();
    int err =
        stk_batch_stream_next(ps->subs[i], left < 0 && timeout_ms >= 0 ? 0 : left, &ps->held[i]);
    if (err < 0) return loader_part_failed(ps->n, i, err);
    ps->have[i] = true;
  }
  memset(ps->have, 0, ps->n * sizeof(*ps->have));
  return loader_assemble(ps->held, ps->n, ret_batch); /* takes held[] */
}

/* Whether a part's stream ended normally (stk_batch_stream_ended). */
static bool parts_stream_ended(void *impl) {
  struct parts_stream *ps = impl;
  for (uint32_t i = 0; i < ps->n; i++)
    if (stk_batch_stream_ended(ps->subs[i])) return true;
  return false;
}

static void parts_stream_free_impl(void *impl) {
  parts_stream_free(impl);
}

static const struct loader_stream_ops parts_stream_ops = {
    .next = parts_stream_next,
    .ended = parts_stream_ended,
    .free = parts_stream_free_impl,
};

int stk_loader_stream_all(struct stk_loader *l, const char *job, int64_t from_step, uint32_t rank,
                          uint32_t world, uint32_t prefetch, struct stk_batch_stream **ret_stream) {
  if (!job || !ret_stream) return client_fail(STK_EINVAL, "stream batches");
  if (l->n == 1)
    return stk_batch_stream_open(l->parts[0], job, from_step, rank, world, prefetch, ret_stream);
  struct parts_stream *ps = NULL;
  int err = parts_stream_open(l->parts, l->n, job, from_step, rank, world, prefetch, &ps);
  return err < 0 ? err : loader_stream_wrap(&parts_stream_ops, ps, ret_stream);
}
