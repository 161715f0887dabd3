/*
 * A small string-keyed chained hash table with intrusive nodes. The
 * coordinator needs O(1) lookups of jobs by name, members by id, parked
 * joins by member, barriers and KV entries by name; one table type serves
 * them all. Nodes and keys belong to the objects that embed them.
 */
#include "coord_internal.h"

#include <stdlib.h>
#include <string.h>

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

void coord_tab_init(struct htab *t) {
  t->nb = 16;
  t->n = 0;
  t->b = coord_xcalloc(t->nb, sizeof(*t->b));
}

void coord_tab_free(struct htab *t) {
  free(t->b);
  t->b = NULL;
  t->nb = t->n = 0;
}

static void grow(struct htab *t) {
  size_t nb = t->nb * 2;
  struct hnode **b = coord_xcalloc(nb, sizeof(*b));
  for (size_t i = 0; i < t->nb; i++) {
    struct hnode *n = t->b[i];
    while (n) {
      struct hnode *next = n->next;
      n->next = b[n->hash & (nb - 1)];
      b[n->hash & (nb - 1)] = n;
      n = next;
    }
  }
  free(t->b);
  t->b = b;
  t->nb = nb;
}

struct hnode *coord_tab_get(const struct htab *t, const char *key) {
  uint64_t h = hash_str(key);
  for (struct hnode *n = t->b[h & (t->nb - 1)]; n; n = n->next)
    if (n->hash == h && strcmp(n->key, key) == 0) return n;
  return NULL;
}

void coord_tab_put(struct htab *t, struct hnode *n, const char *key) {
  if (t->n + 1 > t->nb) grow(t);
  n->key = key;
  n->hash = hash_str(key);
  n->next = t->b[n->hash & (t->nb - 1)];
  t->b[n->hash & (t->nb - 1)] = n;
  t->n++;
}

void coord_tab_del(struct htab *t, struct hnode *n) {
  struct hnode **p = &t->b[n->hash & (t->nb - 1)];
  while (*p && *p != n) p = &(*p)->next;
  if (!*p) return;
  *p = n->next;
  n->next = NULL;
  t->n--;
}

struct hnode *coord_tab_first(const struct htab *t, size_t *pos) {
  for (size_t i = 0; i < t->nb; i++) {
    if (t->b[i]) {
      *pos = i;
      return t->b[i];
    }
  }
  return NULL;
}

struct hnode *coord_tab_next(const struct htab *t, struct hnode *n, size_t *pos) {
  if (n->next) return n->next;
  for (size_t i = *pos + 1; i < t->nb; i++) {
    if (t->b[i]) {
      *pos = i;
      return t->b[i];
    }
  }
  return NULL;
}
