/*
 * dl_source_base: the base every reader stands on — the common fields of a
 * source (name, sorted strip ids, file names) and the growth, copy and free
 * of a unit. It calls nothing above it: dl_source.c dispatches to the
 * readers (dl_megatron.c, dl_llmc.c, dl_text.c) and they call down to here.
 */
#include "dl_source_internal.h"

#include <stdlib.h>
#include <string.h>

#include "stk_error.h"

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x > y) - (x < y);
}

int dl_source_base_init(struct dl_source *s, const struct dl_source_ops *ops,
                        const struct dl_source_opts *opts) {
  s->ops = ops;
  s->name = strdup(opts->name ? opts->name : (opts->path ? opts->path : "synthetic"));
  if (!s->name) return STK_ENOMEM;
  if (opts->n_strip_ids > 0) {
    s->strip_ids = malloc(opts->n_strip_ids * sizeof *s->strip_ids);
    if (!s->strip_ids) return STK_ENOMEM;
    memcpy(s->strip_ids, opts->strip_ids, opts->n_strip_ids * sizeof *s->strip_ids);
    qsort(s->strip_ids, opts->n_strip_ids, sizeof *s->strip_ids, cmp_u32);
    s->n_strip_ids = opts->n_strip_ids;
  }
  return 0;
}

int dl_source_set_files(struct dl_source *s, char *const *paths, size_t n,
                        const char *drop_suffix) {
  if (!(s->file_names = calloc(n + 1, sizeof *s->file_names))) return STK_ENOMEM;
  s->n_files = (uint32_t)n;
  for (size_t i = 0; i < n; i++) {
    const char *slash = strrchr(paths[i], '/');
    const char *name = slash ? slash + 1 : paths[i];
    size_t len = strlen(name), lx = drop_suffix ? strlen(drop_suffix) : 0;
    if (lx && len > lx && strcmp(name + len - lx, drop_suffix) == 0) len -= lx;
    if (!(s->file_names[i] = strndup(name, len))) return STK_ENOMEM;
  }
  return 0;
}

void dl_source_base_close(struct dl_source *s) {
  free(s->name);
  free(s->strip_ids);
  for (uint32_t i = 0; s->file_names && i < s->n_files; i++) free(s->file_names[i]);
  free(s->file_names);
}

bool dl_source_is_strip_id(const struct dl_source *s, uint32_t token) {
  if (s->n_strip_ids == 0) return false;
  return bsearch(&token, s->strip_ids, s->n_strip_ids, sizeof token, cmp_u32) != NULL;
}

int dl_unit_add_doc(struct dl_unit *unit, size_t *cap, uint32_t offset) {
  if (unit->n_docs == *cap) {
    size_t n = *cap ? *cap * 2 : 4;
    uint32_t *p = realloc(unit->doc_starts, n * sizeof *p);
    if (!p) return STK_ENOMEM;
    unit->doc_starts = p;
    *cap = n;
  }
  unit->doc_starts[unit->n_docs++] = offset;
  return 0;
}

int dl_unit_add_doc_rel(struct dl_unit *unit, size_t *cap, uint32_t offset, uint32_t rel) {
  if (unit->n_docs == *cap) {
    size_t n = *cap ? *cap * 2 : 4;
    uint32_t *p = realloc(unit->doc_starts, n * sizeof *p);
    if (p) unit->doc_starts = p;
    uint32_t *r = realloc(unit->doc_rel, n * sizeof *r);
    if (r) unit->doc_rel = r;
    if (!p || !r) return STK_ENOMEM;
    *cap = n;
  }
  unit->doc_rel[unit->n_docs] = rel;
  unit->doc_starts[unit->n_docs++] = offset;
  return 0;
}

/* Index of the run holding token off (borrowed form, n_runs > 0). */
static size_t run_of(const struct dl_unit *unit, size_t off) {
  size_t lo = 0, hi = unit->n_runs;
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (unit->run_at[mid] <= off)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

void dl_unit_copy(const struct dl_unit *unit, size_t off, size_t n, uint32_t *dst) {
  if (unit->tokens || n == 0) {
    if (n) memcpy(dst, unit->tokens + off, n * sizeof *dst);
    return;
  }
  for (size_t r = run_of(unit, off); n > 0; r++) {
    size_t in = off - unit->run_at[r], len = unit->run_at[r + 1] - off;
    if (len > n) len = n;
    memcpy(dst, unit->run_src[r] + in * 4, len * sizeof *dst);
    dst += len;
    off += len;
    n -= len;
  }
}

void dl_unit_free(struct dl_unit *unit) {
  if (!unit) return;
  free(unit->tokens);
  free(unit->doc_starts);
  free(unit->doc_rel);
  free(unit->run_src);
  free(unit->run_at);
  unit->tokens = NULL;
  unit->doc_starts = NULL;
  unit->doc_rel = NULL;
  unit->run_src = NULL;
  unit->run_at = NULL;
  unit->n_tokens = 0;
  unit->n_docs = 0;
  unit->n_runs = 0;
  unit->raw = NULL;
}
