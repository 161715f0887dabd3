/*
 * ckpt_mcache: the raw bytes of recently loaded manifests, so that the
 * ranks of one restore (each a Read, all at once) and a GetManifest before
 * them load a checkpoint's manifest from storage once, not once per call
 * (a HEAD and a GET each). See ckpt_mcache.c.
 */
#ifndef STK_CKPT_MCACHE_H
#define STK_CKPT_MCACHE_H

#include <stddef.h>
#include <stdint.h>

struct ckpt_mcache;

/* Loads the manifest at key: *ret_buf (malloc'ed) and *ret_len, or an
 * error (with stk_set_detail). */
typedef int (*ckpt_mcache_load_fn)(void *arg, const char *key, uint8_t **ret_buf, size_t *ret_len);

/* A cache holding at most max_bytes of manifests, each for at most ttl_ms
 * after it was loaded. */
int ckpt_mcache_new(size_t max_bytes, int64_t ttl_ms, struct ckpt_mcache **ret);
/* Accepts NULL. No call may be in ckpt_mcache_get. */
void ckpt_mcache_free(struct ckpt_mcache *c);

/* A copy of the manifest stored at key (*ret_buf malloc'ed, *ret_len).
 * Held and fresh: from memory. Being loaded by another thread: waits for
 * that load. Else this caller loads it with load(arg, key, ...), and keeps
 * it when it fits. A failed load is not kept (the next caller loads
 * again). Any thread; blocks while a load of the same key runs. */
int ckpt_mcache_get(struct ckpt_mcache *c, const char *key, ckpt_mcache_load_fn load, void *arg,
                    uint8_t **ret_buf, size_t *ret_len);

/* Drops what is held for key (nothing if none, or while it loads): bytes
 * a caller found not to be the manifest it wanted (they do not parse, or
 * name another checkpoint), so that the next get loads them again instead
 * of failing the same way for the entry's lifetime. Any thread. */
void ckpt_mcache_forget(struct ckpt_mcache *c, const char *key);

/* Manifests served from memory and loaded, since the cache was made. */
void ckpt_mcache_counts(struct ckpt_mcache *c, uint64_t *ret_hits, uint64_t *ret_loads);

#endif
