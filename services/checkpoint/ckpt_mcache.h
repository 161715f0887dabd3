/*
 * ckpt_mcache: recently loaded manifests, held parsed, so that the ranks
 * of one restore (each a Read, all at once) and a GetManifest before them
 * load, parse and check a checkpoint's manifest once, not once per call
 * (a HEAD, a GET and a parse each). See ckpt_mcache.c.
 */
#ifndef STK_CKPT_MCACHE_H
#define STK_CKPT_MCACHE_H

#include <stddef.h>
#include <stdint.h>

struct ckpt_mcache;
struct ckpt_mcache_entry;

/* Loads the manifest at key: *ret_buf (malloc'ed) and *ret_len, or an
 * error (with stk_set_detail). */
typedef int (*ckpt_mcache_load_fn)(void *arg, const char *key, uint8_t **ret_buf, size_t *ret_len);
/* Makes the value held for a manifest's bytes (its parse), read-only from
 * then on and shared by every holder: *ret_value and what it and the bytes
 * take in memory (*ret_bytes), or an error (with stk_set_detail). */
typedef int (*ckpt_mcache_make_fn)(const uint8_t *buf, size_t len, void **ret_value,
                                   size_t *ret_bytes);
typedef void (*ckpt_mcache_drop_fn)(void *value);

/* A manifest held by its caller until ckpt_mcache_release: its bytes and
 * its value, both read-only, valid while held (also once the cache let it
 * go: it is freed at the last release). */
struct ckpt_mcache_hold {
  const uint8_t *buf;
  size_t len;
  const void *value;
  struct ckpt_mcache_entry *e; /* Private. */
};

/* A cache holding at most max_bytes of manifests (by what make says they
 * take), each for at most ttl_ms after it was loaded; make and drop build
 * and free the values. */
int ckpt_mcache_new(size_t max_bytes, int64_t ttl_ms, ckpt_mcache_make_fn make,
                    ckpt_mcache_drop_fn drop, struct ckpt_mcache **ret);
/* Accepts NULL. No call may be in ckpt_mcache_get, and nothing held. */
void ckpt_mcache_free(struct ckpt_mcache *c);

/* The manifest stored at key, held (*ret). Held and fresh: from memory.
 * Being loaded by another thread: waits for that load. Else this caller
 * loads it with load(arg, key, ...) and makes its value, and the cache
 * keeps it when it fits. A failed load or make is not kept (the next
 * caller loads again). Any thread; blocks while a load of the same key
 * runs. */
int ckpt_mcache_get(struct ckpt_mcache *c, const char *key, ckpt_mcache_load_fn load, void *arg,
                    struct ckpt_mcache_hold *ret);
/* Lets go of what ckpt_mcache_get held (a zeroed hold: nothing). Any thread. */
void ckpt_mcache_release(struct ckpt_mcache *c, struct ckpt_mcache_hold *h);

/* Drops what is held for key (nothing if none, or while it loads; a
 * caller holding it keeps it until its release): a manifest a caller found
 * not to be the one it wanted (it names another checkpoint; bytes that do
 * not parse are never kept), so that the next get loads it again instead
 * of failing the same way for the entry's lifetime. Any thread. */
void ckpt_mcache_forget(struct ckpt_mcache *c, const char *key);

/* Manifests served from memory and loaded, since the cache was made. */
void ckpt_mcache_counts(struct ckpt_mcache *c, uint64_t *ret_hits, uint64_t *ret_loads);

#endif
