/*
 * Two small open-addressing hash maps for the tokenizers: byte strings to a
 * 64-bit value (vocabulary, encode cache) and 64-bit keys to 64-bit values
 * (BPE merge pairs). Not thread safe; callers lock.
 */
#ifndef STK_DL_HASH_H
#define STK_DL_HASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct dl_strmap_entry {
  char *key; /* owned copy, NULL: empty slot */
  size_t len;
  uint64_t hash;
  uint64_t val;
};

struct dl_strmap {
  struct dl_strmap_entry *slots;
  size_t cap, n; /* cap is a power of two */
};

/* Looks key up; NULL when absent. */
uint64_t *dl_strmap_get(const struct dl_strmap *m, const char *key, size_t len);
/* Inserts or overwrites. 0 or STK_ENOMEM. */
int dl_strmap_put(struct dl_strmap *m, const char *key, size_t len, uint64_t val);
/* Empties the map, calling free_val (if not NULL) on every value. */
void dl_strmap_clear(struct dl_strmap *m, void (*free_val)(uint64_t val));

struct dl_u64map {
  uint64_t *keys, *vals; /* key UINT64_MAX marks an empty slot */
  size_t cap, n;
};

bool dl_u64map_get(const struct dl_u64map *m, uint64_t key, uint64_t *ret_val);
/* key must not be UINT64_MAX. 0 or STK_ENOMEM. */
int dl_u64map_put(struct dl_u64map *m, uint64_t key, uint64_t val);
void dl_u64map_clear(struct dl_u64map *m);

#endif
