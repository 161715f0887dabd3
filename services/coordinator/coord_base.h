/*
 * coord_base: the bottom of the coordinator's ladder, the helpers every
 * other file uses and that call nothing above them: memory that aborts when
 * exhausted, the two clocks, the kick of the idle pass (coord_base.c), the
 * intrusive list and the string-keyed hash table (coord_table.c).
 */
#ifndef STK_COORD_BASE_H
#define STK_COORD_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct coord;

/* ---- Memory and clocks (coord_base.c) --------------------------------- */

void *coord_xmalloc(size_t n); /* Aborts when out of memory. */
void *coord_xcalloc(size_t n, size_t size);
void *coord_xrealloc(void *p, size_t n);
char *coord_xstrdup(const char *s);
int64_t coord_now(struct coord *c); /* Loop time, ms (leases, deadlines). */
int64_t coord_wall_ms(void);        /* Unix time, ms (records). */
/* Runs the idle pass (commit, release, watch; c->pass, set by coord_open)
 * at the end of this loop iteration. */
void coord_kick(struct coord *c);

/* ---- Intrusive circular doubly linked list ---------------------------- */

struct list {
  struct list *prev, *next;
};

#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

static inline void list_init(struct list *l) {
  l->prev = l->next = l;
}
static inline bool list_empty(const struct list *l) {
  return l->next == l;
}
static inline void list_del(struct list *n) {
  n->prev->next = n->next;
  n->next->prev = n->prev;
  n->prev = n->next = n;
}
static inline void list_push(struct list *head, struct list *n) {
  n->prev = head->prev;
  n->next = head;
  head->prev->next = n;
  head->prev = n;
}

/* ---- String-keyed chained hash table (coord_table.c) ------------------ */

struct hnode {
  struct hnode *next;
  uint64_t hash;
  const char *key; /* Owned by the containing object. */
};

struct htab {
  struct hnode **b;
  size_t nb, n;
};

void coord_tab_init(struct htab *t);
void coord_tab_free(struct htab *t); /* Frees buckets, not nodes. */
struct hnode *coord_tab_get(const struct htab *t, const char *key);
void coord_tab_put(struct htab *t, struct hnode *n, const char *key);
void coord_tab_del(struct htab *t, struct hnode *n);
/* Iteration: for (n = coord_tab_first(t, &i); n; n = coord_tab_next(t, n, &i)).
 * Deleting the current node is allowed if the next is fetched first. */
struct hnode *coord_tab_first(const struct htab *t, size_t *pos);
struct hnode *coord_tab_next(const struct htab *t, struct hnode *n, size_t *pos);

#endif
