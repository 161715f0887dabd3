/*
 * Aligned text tables: stokerctl's default output is read by people in a
 * terminal, so columns line up however long a job or member name is.
 */
#include <stdlib.h>
#include <string.h>

#include "cli_format.h"
#include "stk_error.h"

struct table {
  int n_cols;
  size_t n_rows, cap_rows;
  char **cells; /* n_rows x n_cols, row-major; row 0 is the header if any. */
};

static char *dup_cell(const char *s) {
  return strdup(s && s[0] ? s : "-");
}

struct table *table_new(int n_cols, const char *const *headers) {
  struct table *t = calloc(1, sizeof(*t));
  if (!t) return NULL;
  t->n_cols = n_cols;
  if (headers && table_add(t, headers) < 0) {
    table_free(t);
    return NULL;
  }
  return t;
}

int table_add(struct table *t, const char *const *cells) {
  if (t->n_rows == t->cap_rows) {
    size_t cap = t->cap_rows ? t->cap_rows * 2 : 8;
    char **grown = realloc(t->cells, cap * (size_t)t->n_cols * sizeof(char *));
    if (!grown) return STK_ENOMEM;
    t->cells = grown;
    t->cap_rows = cap;
  }
  char **row = t->cells + t->n_rows * (size_t)t->n_cols;
  for (int i = 0; i < t->n_cols; i++) {
    row[i] = dup_cell(cells[i]);
    if (!row[i]) {
      while (i-- > 0) free(row[i]);
      return STK_ENOMEM;
    }
  }
  t->n_rows++;
  return 0;
}

void table_print(const struct table *t, FILE *out) {
  size_t width[64] = {0};
  int n_cols = t->n_cols < 64 ? t->n_cols : 64;
  for (size_t r = 0; r < t->n_rows; r++) {
    for (int c = 0; c < n_cols; c++) {
      size_t w = strlen(t->cells[r * (size_t)t->n_cols + c]);
      if (w > width[c]) width[c] = w;
    }
  }
  for (size_t r = 0; r < t->n_rows; r++) {
    for (int c = 0; c < n_cols; c++) {
      const char *cell = t->cells[r * (size_t)t->n_cols + c];
      if (c == n_cols - 1) {
        fprintf(out, "%s\n", cell); /* No trailing padding. */
      } else {
        fprintf(out, "%-*s  ", (int)width[c], cell);
      }
    }
  }
}

void table_free(struct table *t) {
  if (!t) return;
  for (size_t i = 0; i < t->n_rows * (size_t)t->n_cols; i++) free(t->cells[i]);
  free(t->cells);
  free(t);
}
