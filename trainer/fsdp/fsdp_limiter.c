/*
 * fsdp_limiter: the sliding window over unsharded parameters. The
 * communication thread acquires a unit's bytes before all-gathering it and
 * the compute side releases them when it frees the buffer, so at most K
 * units (and optionally a byte budget) are alive at once. Without it the
 * communication thread would gather every unit ahead of compute, and memory
 * would grow with the model (the problem PyTorch's limit_all_gathers fixes).
 * The root unit (unit 0, which the tied head reads; opts.root_unit, always
 * at K = 1) is held for the whole step outside the unit count, as PyTorch
 * FSDP keeps its root module's parameters; it still counts against the
 * byte budget.
 */
#include <time.h>

#include "fsdp_internal.h"
#include "stk_error.h"

int64_t fsdp_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int fsdp_limiter_init(struct fsdp_limiter *l, int max_units, size_t max_bytes) {
  *l = (struct fsdp_limiter){.max_units = max_units, .max_bytes = max_bytes};
  if (pthread_mutex_init(&l->mu, NULL)) return STK_ENOMEM;
  if (pthread_cond_init(&l->cv, NULL)) {
    pthread_mutex_destroy(&l->mu);
    return STK_ENOMEM;
  }
  return 0;
}

void fsdp_limiter_close(struct fsdp_limiter *l) {
  pthread_cond_destroy(&l->cv);
  pthread_mutex_destroy(&l->mu);
}

static int allowed(const struct fsdp_limiter *l, size_t bytes, int counted) {
  if (counted && l->max_units > 0 && l->units >= l->max_units) return 0;
  if (l->max_bytes > 0 && l->bytes + bytes > l->max_bytes) return 0;
  return 1;
}

/* counted: a unit under max_units; otherwise the root buffer (bytes only). */
static int acquire(struct fsdp_limiter *l, size_t bytes, int counted) {
  pthread_mutex_lock(&l->mu);
  int64_t t0 = fsdp_now_ns();
  int waited = 0;
  while (!l->aborted && !allowed(l, bytes, counted)) {
    waited = 1;
    pthread_cond_wait(&l->cv, &l->mu);
  }
  if (waited) l->wait_ns += fsdp_now_ns() - t0;
  int rc = l->aborted ? STK_ECANCELED : 0;
  if (!rc) {
    l->units += counted;
    l->roots += !counted;
    l->bytes += bytes;
    if (l->units + l->roots > l->peak_units) l->peak_units = l->units + l->roots;
    if (l->bytes > l->peak_bytes) l->peak_bytes = l->bytes;
  }
  pthread_mutex_unlock(&l->mu);
  return rc;
}

static void release(struct fsdp_limiter *l, size_t bytes, int counted) {
  pthread_mutex_lock(&l->mu);
  l->units -= counted;
  l->roots -= !counted;
  l->bytes -= bytes;
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
}

int fsdp_limiter_acquire(struct fsdp_limiter *l, size_t bytes) {
  return acquire(l, bytes, 1);
}

void fsdp_limiter_release(struct fsdp_limiter *l, size_t bytes) {
  release(l, bytes, 1);
}

int fsdp_limiter_acquire_root(struct fsdp_limiter *l, size_t bytes) {
  return acquire(l, bytes, 0);
}

void fsdp_limiter_release_root(struct fsdp_limiter *l, size_t bytes) {
  release(l, bytes, 0);
}

void fsdp_limiter_abort(struct fsdp_limiter *l) {
  pthread_mutex_lock(&l->mu);
  l->aborted = 1;
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
}

void fsdp_limiter_rearm(struct fsdp_limiter *l) {
  pthread_mutex_lock(&l->mu);
  l->aborted = 0;
  l->units = 0;
  l->roots = 0;
  l->bytes = 0;
  pthread_mutex_unlock(&l->mu);
}
