/*
 * ckpt_mcache: recently loaded manifests, by storage key, held parsed.
 * Every Read loaded its checkpoint's manifest from storage before fetching
 * any data (a HEAD and a GET, then the parse), so a restore's ranks, all
 * reading at once, loaded it once each: in the restore bench that was a
 * fifth of the time of a restore whose data took one GET per object (issue
 * 26, part 2). Holding only the bytes still left each Read its own parse
 * and check of the manifest (and a lookup of every wanted tensor), about
 * half of the service's instructions for a restore of 160 small tensors
 * (callgrind, tests/bench/README.md): so the value made from the bytes
 * (the parsed, checked and indexed manifest) is held and shared, read-only,
 * by every caller until it lets go.
 *
 * A manifest's key names its attempt, and an attempt's manifest is written
 * once and never changed, so what is held is never wrong while the
 * manifest exists; the journal is consulted before the cache, so a
 * checkpoint deleted through this service is not found as before. One
 * deleted through another replica over shared storage is served from here
 * for at most the entry's lifetime; its objects are gone, so the read fails
 * at their GETs instead of at the manifest's. Concurrent loads of one key
 * are one load: later callers wait for the first. Bytes that turn out not
 * to be the manifest (a store that answered a damaged object) are not
 * kept: those that do not parse fail the make, those that name another
 * checkpoint are dropped by the caller that finds it (ckpt_mcache_forget),
 * so a repaired object is read again at once.
 *
 * Bounded by bytes (what the value takes, least recently used out first);
 * a manifest larger than the bound is loaded and not held. An entry the
 * cache lets go of (evicted, expired) while callers hold it is freed at
 * the last release.
 */
#include "ckpt_mcache.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stk_error.h"

struct ckpt_mcache_entry {
  struct ckpt_mcache_entry *next;
  char *key;
  uint8_t *buf;
  size_t len;
  void *value;
  size_t bytes; /* What it counts against the bound while listed. */
  bool loading;
  bool listed; /* In c->entries; else freed at the last release. */
  unsigned refs;
  int64_t loaded_ms;
  uint64_t used; /* c->tick when last served. */
};

struct ckpt_mcache {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* A load ended. */
  struct ckpt_mcache_entry *entries;
  size_t max_bytes, bytes;
  int64_t ttl_ms;
  ckpt_mcache_make_fn make;
  ckpt_mcache_drop_fn drop;
  uint64_t tick, hits, loads;
};

static int64_t now_ms(void);
static struct ckpt_mcache_entry *find(struct ckpt_mcache *c, const char *key);
static void unlink_entry(struct ckpt_mcache *c, struct ckpt_mcache_entry *e);
static void evict(struct ckpt_mcache *c, const struct ckpt_mcache_entry *keep);
static void free_entry(struct ckpt_mcache *c, struct ckpt_mcache_entry *e);
static void hold(struct ckpt_mcache_entry *e, struct ckpt_mcache_hold *ret);

int ckpt_mcache_new(size_t max_bytes, int64_t ttl_ms, ckpt_mcache_make_fn make,
                    ckpt_mcache_drop_fn drop, struct ckpt_mcache **ret) {
  struct ckpt_mcache *c = calloc(1, sizeof(*c));
  if (!c) return STK_ENOMEM;
  c->make = make;
  c->drop = drop;
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
                    struct ckpt_mcache_hold *ret) {
  *ret = (struct ckpt_mcache_hold){0};
  pthread_mutex_lock(&c->mu);
  struct ckpt_mcache_entry *e;
  for (;;) {
    e = find(c, key);
    if (e && e->loading) {
      pthread_cond_wait(&c->cv, &c->mu);
      continue;
    }
    if (e && now_ms() - e->loaded_ms <= c->ttl_ms) {
      e->used = ++c->tick;
      c->hits++;
      hold(e, ret);
      pthread_mutex_unlock(&c->mu);
      return 0;
    }
    if (e) unlink_entry(c, e); /* Stale. */
    break;
  }
  e = calloc(1, sizeof(*e));
  if (e && !(e->key = strdup(key))) {
    free(e);
    e = NULL;
  }
  if (!e) {
    pthread_mutex_unlock(&c->mu);
    return STK_ENOMEM;
  }
  e->loading = e->listed = true;
  e->next = c->entries;
  c->entries = e;
  c->loads++;
  pthread_mutex_unlock(&c->mu);

  uint8_t *buf = NULL;
  size_t len = 0, bytes = 0;
  void *value = NULL;
  int err = load(arg, key, &buf, &len);
  if (!err) err = c->make(buf, len, &value, &bytes);

  pthread_mutex_lock(&c->mu);
  e->loading = false;
  if (err) {
    free(buf);
    unlink_entry(c, e); /* Not kept: the next caller loads again. */
  } else {
    e->buf = buf;
    e->len = len;
    e->value = value;
    e->loaded_ms = now_ms();
    e->used = ++c->tick;
    hold(e, ret);
    if (bytes > c->max_bytes) {
      unlink_entry(c, e); /* Not kept: freed at the caller's release. */
    } else {
      e->bytes = bytes;
      c->bytes += bytes;
      evict(c, e);
    }
  }
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  return err;
}

void ckpt_mcache_release(struct ckpt_mcache *c, struct ckpt_mcache_hold *h) {
  struct ckpt_mcache_entry *e = h->e;
  *h = (struct ckpt_mcache_hold){0};
  if (!e) return;
  pthread_mutex_lock(&c->mu);
  if (--e->refs == 0 && !e->listed) free_entry(c, e);
  pthread_mutex_unlock(&c->mu);
}

void ckpt_mcache_forget(struct ckpt_mcache *c, const char *key) {
  pthread_mutex_lock(&c->mu);
  struct ckpt_mcache_entry *e = find(c, key);
  if (e && !e->loading) unlink_entry(c, e); /* Held ones live on until released. */
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

static struct ckpt_mcache_entry *find(struct ckpt_mcache *c, const char *key) {
  for (struct ckpt_mcache_entry *e = c->entries; e; e = e->next)
    if (strcmp(e->key, key) == 0) return e;
  return NULL;
}

/* Takes e off the list; frees it unless someone holds it. */
static void unlink_entry(struct ckpt_mcache *c, struct ckpt_mcache_entry *e) {
  for (struct ckpt_mcache_entry **p = &c->entries; *p; p = &(*p)->next) {
    if (*p != e) continue;
    *p = e->next;
    break;
  }
  c->bytes -= e->bytes;
  e->bytes = 0;
  e->listed = false;
  if (e->refs == 0) free_entry(c, e);
}

/* Drops the least recently served entries (never one loading, nor keep)
 * until the held bytes fit. */
static void evict(struct ckpt_mcache *c, const struct ckpt_mcache_entry *keep) {
  while (c->bytes > c->max_bytes) {
    struct ckpt_mcache_entry *old = NULL;
    for (struct ckpt_mcache_entry *e = c->entries; e; e = e->next)
      if (!e->loading && e != keep && (!old || e->used < old->used)) old = e;
    if (!old) return;
    unlink_entry(c, old);
  }
}

static void free_entry(struct ckpt_mcache *c, struct ckpt_mcache_entry *e) {
  if (e->value) c->drop(e->value);
  free(e->key);
  free(e->buf);
  free(e);
}

static void hold(struct ckpt_mcache_entry *e, struct ckpt_mcache_hold *ret) {
  e->refs++;
  *ret = (struct ckpt_mcache_hold){.buf = e->buf, .len = e->len, .value = e->value, .e = e};
}
