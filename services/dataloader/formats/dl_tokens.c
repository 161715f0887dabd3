/*
 * dl_tokens: the growable id array every tokenizer writes into (a leaf: it
 * calls only the C library). dl_tokenizer.c picks a tokenizer; dl_bpe.c,
 * below it, pushes ids here.
 */
#include <stdlib.h>

#include "dl_tokenizer.h"
#include "stk_error.h"

int dl_tokens_push(struct dl_tokens *t, uint32_t id) {
  if (t->n == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 256;
    uint32_t *p = realloc(t->ids, cap * sizeof *p);
    if (!p) return STK_ENOMEM;
    t->ids = p;
    t->cap = cap;
  }
  t->ids[t->n++] = id;
  return 0;
}

void dl_tokens_release(struct dl_tokens *t) {
  free(t->ids);
  *t = (struct dl_tokens){0};
}
