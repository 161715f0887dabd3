/* The hash maps of dl_hash.h: linear probing, load factor at most 1/2. */
#include "dl_hash.h"

#include <stdlib.h>
#include <string.h>

#include "stk_error.h"

static uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= UINT64_C(0xff51afd7ed558ccd);
  h ^= h >> 33;
  return h;
}

static uint64_t hash_bytes(const char *s, size_t len) {
  uint64_t h = UINT64_C(0xcbf29ce484222325) ^ len;
  for (; len >= 8; s += 8, len -= 8) {
    uint64_t w;
    memcpy(&w, s, 8);
    h = (h ^ w) * UINT64_C(0x100000001b3) + (h >> 29);
  }
  for (; len > 0; s++, len--) h = (h ^ (uint8_t)*s) * UINT64_C(0x100000001b3);
  return mix(h);
}

static size_t str_find(const struct dl_strmap *m, const char *key, size_t len, uint64_t h) {
  size_t mask = m->cap - 1, i = h & mask;
  for (; m->slots[i].key; i = (i + 1) & mask) {
    const struct dl_strmap_entry *e = &m->slots[i];
    if (e->hash == h && e->len == len && memcmp(e->key, key, len) == 0) break;
  }
  return i;
}

uint64_t *dl_strmap_get(const struct dl_strmap *m, const char *key, size_t len) {
  if (m->n == 0) return NULL;
  size_t i = str_find(m, key, len, hash_bytes(key, len));
  return m->slots[i].key ? &m->slots[i].val : NULL;
}

static int str_grow(struct dl_strmap *m) {
  size_t cap = m->cap ? m->cap * 2 : 64;
  struct dl_strmap_entry *old = m->slots, *slots = calloc(cap, sizeof *slots);
  if (!slots) return STK_ENOMEM;
  size_t old_cap = m->cap;
  m->slots = slots;
  m->cap = cap;
  for (size_t i = 0; i < old_cap; i++)
    if (old[i].key) m->slots[str_find(m, old[i].key, old[i].len, old[i].hash)] = old[i];
  free(old);
  return 0;
}

int dl_strmap_put(struct dl_strmap *m, const char *key, size_t len, uint64_t val) {
  if ((m->n + 1) * 2 > m->cap && str_grow(m) < 0) return STK_ENOMEM;
  uint64_t h = hash_bytes(key, len);
  struct dl_strmap_entry *e = &m->slots[str_find(m, key, len, h)];
  if (!e->key) {
    char *k = malloc(len + 1);
    if (!k) return STK_ENOMEM;
    memcpy(k, key, len);
    k[len] = '\0';
    *e = (struct dl_strmap_entry){k, len, h, 0};
    m->n++;
  }
  e->val = val;
  return 0;
}

void dl_strmap_clear(struct dl_strmap *m, void (*free_val)(uint64_t val)) {
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->slots[i].key) continue;
    if (free_val) free_val(m->slots[i].val);
    free(m->slots[i].key);
  }
  free(m->slots);
  *m = (struct dl_strmap){0};
}

static size_t u64_find(const struct dl_u64map *m, uint64_t key) {
  size_t mask = m->cap - 1, i = mix(key) & mask;
  while (m->keys[i] != UINT64_MAX && m->keys[i] != key) i = (i + 1) & mask;
  return i;
}

bool dl_u64map_get(const struct dl_u64map *m, uint64_t key, uint64_t *ret_val) {
  if (m->n == 0) return false;
  size_t i = u64_find(m, key);
  if (m->keys[i] == UINT64_MAX) return false;
  *ret_val = m->vals[i];
  return true;
}

static int u64_grow(struct dl_u64map *m) {
  size_t cap = m->cap ? m->cap * 2 : 64, old_cap = m->cap;
  uint64_t *keys = malloc(cap * sizeof *keys), *vals = malloc(cap * sizeof *vals);
  if (!keys || !vals) {
    free(keys);
    free(vals);
    return STK_ENOMEM;
  }
  memset(keys, 0xff, cap * sizeof *keys);
  uint64_t *ok = m->keys, *ov = m->vals;
  m->keys = keys;
  m->vals = vals;
  m->cap = cap;
  for (size_t i = 0; i < old_cap; i++) {
    if (ok[i] == UINT64_MAX) continue;
    size_t j = u64_find(m, ok[i]);
    keys[j] = ok[i];
    vals[j] = ov[i];
  }
  free(ok);
  free(ov);
  return 0;
}

int dl_u64map_put(struct dl_u64map *m, uint64_t key, uint64_t val) {
  if ((m->n + 1) * 2 > m->cap && u64_grow(m) < 0) return STK_ENOMEM;
  size_t i = u64_find(m, key);
  if (m->keys[i] == UINT64_MAX) m->n++;
  m->keys[i] = key;
  m->vals[i] = val;
  return 0;
}

void dl_u64map_clear(struct dl_u64map *m) {
  free(m->keys);
  free(m->vals);
  *m = (struct dl_u64map){0};
}
