/*
 * ckpt_fetch: ranged GETs of checkpoint objects shared by the reads that
 * want the same bytes at once (issue 26). A restore at another world size
 * is one Read per rank, all arriving together, and the boxes of
 * neighbouring ranks cross the same saved rank's object: with small
 * tensors (FSDP's row-blocks) each rank's span of that object is the
 * whole object, so every object but the first and last was fetched twice.
 * Here a span's GET is a fetch held in a table by its object's storage key
 * (which names job, step, attempt and object: a job's bytes answer only
 * claims for that job's objects, whose callers passed the job's access
 * checks), and a claim whose range lies inside a fetch of the same key
 * uses its bytes: at once when they passed their CRC check, or once its
 * GET ends (the claiming task parks meanwhile, holding no thread).
 *
 * The CRCs stay checked per block for every reader: a fetch keeps the
 * CRCs its bytes were checked against, and a claim shares it only when its
 * own manifest gives the same CRCs for its blocks (and the same object
 * size), so the bytes it gets are the ones its manifest vouches for.
 * Nothing unchecked is shared: a claim that finds a GET out waits for its
 * check; a fetch that fails (the GET, or a CRC) is dropped from the table
 * at once and its waiters fail with its error and text; the next claim
 * fetches again.
 *
 * Memory: a fetch lives while a read holds it (its GET out, or its bytes
 * not yet assembled into the read's pieces) and is freed at its last
 * release; what the holders hold is bounded by the reads' budgets
 * (ckpt_restore.c reserves every span's batch). Nothing is kept after:
 * a later Read, or the next restore of the same checkpoint, fetches again,
 * so a repaired object is read at once and memory is what the open reads
 * reserved. A claim that only overlaps a fetch fetches its own range:
 * ranges cut to blocks apart differ by their edges, and sharing part of a
 * span would split its bytes over two buffers.
 *
 * The table is a hash of keys with one mutex (claims, ends and releases
 * run on the restore pool's workers; releases also on the loop).
 */
#include "ckpt_fetch.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stk_error.h"

#define BUCKETS 256

enum state { FETCHING, FETCHED, FAILED };

struct ckpt_fetch {
  char *key;
  uint64_t offset, len, object_bytes;
  uint32_t *crcs; /* Of the blocks from offset / block_bytes on. */
  size_t n_crcs;
  uint8_t *bytes;
  enum state state;
  int err;
  char msg[320];
  unsigned holds;
  bool in_table;
  struct ckpt_task **waiters;
  size_t n_waiters, cap_waiters;
  struct ckpt_fetch *next; /* In its bucket. */
};

struct ckpt_fetches {
  pthread_mutex_t mu;
  uint64_t block_bytes;
  struct ckpt_fetch *buckets[BUCKETS];
  struct ckpt_fetch_counts counts;
};

static size_t bucket_of(const char *key) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (const unsigned char *p = (const unsigned char *)key; *p; p++)
    h = (h ^ *p) * 1099511628211ull;
  return (size_t)(h % BUCKETS);
}

int ckpt_fetches_new(uint64_t block_bytes, struct ckpt_fetches **ret) {
  if (block_bytes == 0) return STK_EINVAL;
  struct ckpt_fetches *c = calloc(1, sizeof(*c));
  if (!c) return STK_ENOMEM;
  pthread_mutex_init(&c->mu, NULL);
  c->block_bytes = block_bytes;
  *ret = c;
  return 0;
}

static void fetch_free(struct ckpt_fetch *f) {
  free(f->key);
  free(f->crcs);
  free(f->bytes);
  free(f->waiters);
  free(f);
}

void ckpt_fetches_free(struct ckpt_fetches *c) {
  if (!c) return;
  for (size_t i = 0; i < BUCKETS; i++)
    for (struct ckpt_fetch *f = c->buckets[i], *next; f; f = next) {
      next = f->next;
      fetch_free(f);
    }
  pthread_mutex_destroy(&c->mu);
  free(c);
}

/* ---- Under the lock ---- */

static void unlink_table(struct ckpt_fetches *c, struct ckpt_fetch *f) {
  if (!f->in_table) return;
  struct ckpt_fetch **pp = &c->buckets[bucket_of(f->key)];
  while (*pp != f) pp = &(*pp)->next;
  *pp = f->next;
  f->next = NULL;
  f->in_table = false;
}

/* Whether f can answer w: the same key, a range covering w's, the same
 * object size and the same CRCs of w's blocks. */
static bool covers(const struct ckpt_fetches *c, const struct ckpt_fetch *f,
                   const struct ckpt_fetch_want *w) {
  if (f->state == FAILED || f->object_bytes != w->object_bytes || w->offset < f->offset ||
      w->offset + w->len > f->offset + f->len || strcmp(f->key, w->key) != 0)
    return false;
  uint64_t first = w->offset / c->block_bytes - f->offset / c->block_bytes;
  if (first + w->n_crcs > f->n_crcs) return false;
  return memcmp(f->crcs + first, w->crcs, w->n_crcs * sizeof(*w->crcs)) == 0;
}

static struct ckpt_fetch *find(const struct ckpt_fetches *c, const struct ckpt_fetch_want *w) {
  struct ckpt_fetch *waiting = NULL;
  for (struct ckpt_fetch *f = c->buckets[bucket_of(w->key)]; f; f = f->next) {
    if (!covers(c, f, w)) continue;
    if (f->state == FETCHED) return f;
    if (!waiting) waiting = f;
  }
  return waiting;
}

static struct ckpt_fetch *fetch_new(const struct ckpt_fetch_want *w) {
  struct ckpt_fetch *f = calloc(1, sizeof(*f));
  if (!f) return NULL;
  f->key = strdup(w->key);
  f->crcs = malloc((w->n_crcs ? w->n_crcs : 1) * sizeof(*f->crcs));
  f->bytes = malloc(w->len ? w->len : 1);
  if (!f->key || !f->crcs || !f->bytes) {
    fetch_free(f);
    return NULL;
  }
  if (w->n_crcs) memcpy(f->crcs, w->crcs, w->n_crcs * sizeof(*f->crcs));
  f->n_crcs = w->n_crcs;
  f->offset = w->offset;
  f->len = w->len;
  f->object_bytes = w->object_bytes;
  f->state = FETCHING;
  return f;
}

/* ---- Calls ---- */

int ckpt_fetch_claim(struct ckpt_fetches *c, const struct ckpt_fetch_want *w,
                     struct ckpt_task *waiter, struct ckpt_fetch **ret,
                     enum ckpt_fetch_how *ret_how) {
  pthread_mutex_lock(&c->mu);
  struct ckpt_fetch *f = find(c, w);
  if (f && f->state == FETCHING && f->n_waiters == f->cap_waiters) {
    size_t cap = f->cap_waiters ? 2 * f->cap_waiters : 4;
    struct ckpt_task **v = realloc(f->waiters, cap * sizeof(*v));
    if (v) {
      f->waiters = v;
      f->cap_waiters = cap;
    } else {
      f = NULL; /* Fetches its own instead. */
    }
  }
  if (f) {
    f->holds++;
    c->counts.shared++;
    *ret = f;
    *ret_how = f->state == FETCHED ? CKPT_FETCH_READY : CKPT_FETCH_WAIT;
    if (f->state == FETCHING) f->waiters[f->n_waiters++] = waiter;
    pthread_mutex_unlock(&c->mu);
    return 0;
  }
  f = fetch_new(w);
  if (!f) {
    pthread_mutex_unlock(&c->mu);
    return STK_ENOMEM;
  }
  f->holds = 1;
  f->in_table = true;
  size_t b = bucket_of(f->key);
  f->next = c->buckets[b];
  c->buckets[b] = f;
  c->counts.gets++;
  c->counts.held_bytes += f->len;
  *ret = f;
  *ret_how = CKPT_FETCH_GET;
  pthread_mutex_unlock(&c->mu);
  return 0;
}

uint8_t *ckpt_fetch_bytes(struct ckpt_fetch *f, uint64_t offset) {
  return f->bytes + (offset - f->offset);
}

void ckpt_fetch_end(struct ckpt_fetches *c, struct ckpt_fetch *f, int err, const char *msg,
                    struct ckpt_pool *pool) {
  pthread_mutex_lock(&c->mu);
  f->err = err;
  snprintf(f->msg, sizeof(f->msg), "%s", err ? (msg && msg[0] ? msg : stk_strerror(err)) : "");
  f->state = err ? FAILED : FETCHED;
  if (err) unlink_table(c, f);
  struct ckpt_task **waiters = f->waiters;
  size_t n = f->n_waiters;
  f->waiters = NULL;
  f->n_waiters = f->cap_waiters = 0;
  pthread_mutex_unlock(&c->mu);
  /* Each waiter holds f: it stays until they let go. */
  for (size_t i = 0; i < n; i++) ckpt_pool_resume(pool, waiters[i]);
  free(waiters);
}

int ckpt_fetch_error(const struct ckpt_fetch *f, char *msg, size_t len) {
  /* Ended before the waiter was resumed (the pool's lock orders them). */
  if (f->err) snprintf(msg, len, "%s", f->msg);
  return f->err;
}

void ckpt_fetch_release(struct ckpt_fetches *c, struct ckpt_fetch *f) {
  if (!f) return;
  pthread_mutex_lock(&c->mu);
  if (--f->holds > 0) {
    pthread_mutex_unlock(&c->mu);
    return;
  }
  c->counts.held_bytes -= f->len;
  unlink_table(c, f);
  pthread_mutex_unlock(&c->mu);
  fetch_free(f);
}

void ckpt_fetches_get_counts(struct ckpt_fetches *c, struct ckpt_fetch_counts *ret) {
  pthread_mutex_lock(&c->mu);
  *ret = c->counts;
  pthread_mutex_unlock(&c->mu);
}
