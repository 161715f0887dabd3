/*
 * ckpt_mcache: recently loaded manifests, by storage key. Every Read loaded
 * its checkpoint's manifest from storage before fetching any data (a HEAD
 * and a GET, then the parse), so a restore's ranks, all reading at once,
 * loaded it once each: in the restore bench that was a fifth of the time of
 * a restore whose data took one GET per object (issue 26, part 2).
 *
 * A manifest's key names its attempt, and an attempt's manifest is written
 * once and never changed, so what is held is never wrong while the
 * manifest exists; the journal is consulted before the cache, so a
 * checkpoint deleted through this service is not found as before. One
 * deleted through another replica over shared storage is served from here
 * for at most the entry's lifetime; its objects are gone, so the read fails
 * at their GETs instead of at the manifest's. Concurrent loads of one key
 * are one load: later callers wait for the first. Bytes that turn out not
 * to be the manifest (a store that answered a damaged object) are dropped
 * by the caller that finds it (ckpt_mcache_forget), so a repaired object
 * is read again at once.
 *
 * Raw bytes are held, not the parsed manifest: each caller parses its own
 * copy and frees it as before. Bounded by bytes (least recently used out
 * first); a manifest larger than the bound is loaded and not held.
 */
#include "ckpt_mcache.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stk_error.h"

struct entry {
  struct entry *next;
  char *key;
  uint8_t *buf;
  size_t len;
  bool loading;
  int64_t loaded_ms;
  uint64_t used; /* c->tick when last served. */
};

struct ckpt_mcache {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* A load ended. */
  struct entry *entries;
  size_t max_bytes, bytes;
  int64_t ttl_ms;
  uint64_t tick, hits, loads;
};

static int64_t now_ms(void);
static struct entry *find(struct ckpt_mcache *c, const char *key);
static void unlink_entry(struct ckpt_mcache *c, struct entry *e);
static void evict(struct ckpt_mcache *c, const struct entry *keep);
static int copy_out(const struct entry *e, uint8_t **ret_buf, size_t *ret_len);

int ckpt_mcache_new(size_t max_bytes, int64_t ttl_ms, struct ckpt_mcache **ret) {
  struct ckpt_mcache *c = calloc(1, sizeof(*c));
  if (!c) return STK_ENOMEM;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  c->max_bytes = max_bytes;
  c->ttl_ms = ttl_ms;
  *ret = c;
  return 0;
}

void ckpt_mcache_free(struct ckpt_mcache *c) {
  if (!c) return;
  while (c->entries) unlink_entry(c, c->entries);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

int ckpt_mcache_get(struct ckpt_mcache *c, const char *key, ckpt_mcache_load_fn load, void *arg,
                    uint8_t **ret_buf, size_t *ret_len) {
  pthread_mutex_lock(&c->mu);
  struct entry *e;
  for (;;) {
    e = find(c, key);
    if (e && e->loading) {
      pthread_cond_wait(&c->cv, &c->mu);
      continue;
    }
    if (e && now_ms() - e->loaded_ms <= c->ttl_ms) {
      e->used = ++c->tick;
      c->hits++;
      int err = copy_out(e, ret_buf, ret_len);
      pthread_mutex_unlock(&c->mu);
      return err;
    }
    if (e) unlink_entry(c, e); /* Stale. */
    break;
  }
  e = calloc(1, sizeof(*e));
  if (e) e->key = strdup(key);
  if (e && e->key) {
    e->loading = true;
    e->next = c->entries;
    c->entries = e;
  } else if (e) {
    free(e);
    e = NULL;
  }
  c->loads++;
  pthread_mutex_unlock(&c->mu);

  uint8_t *buf = NULL;
  size_t len = 0;
  int err = load(arg, key, &buf, &len);

  pthread_mutex_lock(&c->mu);
  if (e && (err || len > c->max_bytes)) {
    unlink_entry(c, e);
  } else if (e) {
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy) {
      unlink_entry(c, e); /* Not held: the caller takes buf. */
    } else {
      memcpy(copy, buf, len);
      e->buf = buf;
      e->len = len;
      e->loading = false;
      e->loaded_ms = now_ms();
      e->used = ++c->tick;
      c->bytes += len;
      *ret_buf = copy;
      *ret_len = len;
      buf = NULL;
      evict(c, e);
    }
  }
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  if (buf) { /* Not held: the caller takes it. */
    *ret_buf = buf;
    *ret_len = len;
  }
  return err;
}

void ckpt_mcache_forget(struct ckpt_mcache *c, const char *key) {
  pthread_mutex_lock(&c->mu);
  struct entry *e = find(c, key);
  if (e && !e->loading) unlink_entry(c, e);
  pthread_mutex_unlock(&c->mu);
}

void ckpt_mcache_counts(struct ckpt_mcache *c, uint64_t *ret_hits, uint64_t *ret_loads) {
  pthread_mutex_lock(&c->mu);
  *ret_hits = c->hits;
  *ret_loads = c->loads;
  pthread_mutex_unlock(&c->mu);
}

static int64_t now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static struct entry *find(struct ckpt_mcache *c, const char *key) {
  for (struct entry *e = c->entries; e; e = e->next)
    if (strcmp(e->key, key) == 0) return e;
  return NULL;
}

static void unlink_entry(struct ckpt_mcache *c, struct entry *e) {
  for (struct entry **p = &c->entries; *p; p = &(*p)->next) {
    if (*p != e) continue;
    *p = e->next;
    break;
  }
  c->bytes -= e->len;
  free(e->key);
  free(e->buf);
  free(e);
}

/* Drops the least recently served entries (never one loading, nor keep)
 * until the held bytes fit. */
static void evict(struct ckpt_mcache *c, const struct entry *keep) {
  while (c->bytes > c->max_bytes) {
    struct entry *old = NULL;
    for (struct entry *e = c->entries; e; e = e->next)
      if (!e->loading && e != keep && (!old || e->used < old->used)) old = e;
    if (!old) return;
    unlink_entry(c, old);
  }
}

/* A malloc'ed copy of e's bytes. */
static int copy_out(const struct entry *e, uint8_t **ret_buf, size_t *ret_len) {
  uint8_t *b = malloc(e->len ? e->len : 1);
  if (!b) return STK_ENOMEM;
  memcpy(b, e->buf, e->len);
  *ret_buf = b;
  *ret_len = e->len;
  return 0;
}
