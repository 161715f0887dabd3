/*
 * dl_source: the format-independent half of a dataset source — dispatch to
 * the reader chosen by opts->format, and the accessors every reader shares.
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

int dl_source_open(const struct dl_source_opts *opts, struct dl_source **ret_source) {
  if (!opts || !opts->path || !ret_source) {
    stk_set_detail("dl_source_open: options and path are required");
    return STK_EINVAL;
  }
  if (opts->n_strip_ids > 0 && !opts->strip_ids) {
    stk_set_detail("dl_source_open: n_strip_ids > 0 without strip_ids");
    return STK_EINVAL;
  }
  switch (opts->format) {
  case DL_FORMAT_MEGATRON:
    return dl_megatron_open(opts, ret_source);
  case DL_FORMAT_LLMC:
    return dl_llmc_open(opts, ret_source);
  case DL_FORMAT_TEXT:
    return dl_text_open(opts, ret_source);
  }
  stk_set_detail("dl_source_open: %s: unknown format %d", opts->path, (int)opts->format);
  return STK_EINVAL;
}

void dl_source_free(struct dl_source *s) {
  if (s) s->ops->free(s);
}

const char *dl_source_name(const struct dl_source *s) {
  return s->name;
}

uint64_t dl_source_units(const struct dl_source *s) {
  return s->n_units;
}

uint64_t dl_source_unit_weight(const struct dl_source *s, uint64_t u) {
  return u < s->n_units ? s->ops->unit_weight(s, u) : 0;
}

uint64_t dl_source_total_weight(const struct dl_source *s) {
  return s->total_weight;
}

int dl_source_unit_docs(struct dl_source *s, uint64_t u, struct dl_unit_docs *ret_docs) {
  if (u >= s->n_units) {
    stk_set_detail("%s: unit %llu out of range (%llu units)", s->name, (unsigned long long)u,
                   (unsigned long long)s->n_units);
    return STK_ERANGE;
  }
  struct dl_unit_docs d = {0};
  int rc = s->ops->unit_docs(s, u, &d);
  if (rc == 0) *ret_docs = d;
  return rc;
}

uint32_t dl_source_files(const struct dl_source *s) {
  return s->n_files;
}

const char *dl_source_file_name(const struct dl_source *s, uint32_t file) {
  return file < s->n_files ? s->file_names[file] : "";
}

int dl_source_find_file(const struct dl_source *s, const char *name, uint32_t *ret_file) {
  for (uint32_t i = 0; name && i < s->n_files; i++)
    if (strcmp(s->file_names[i], name) == 0) {
      *ret_file = i;
      return 0;
    }
  stk_set_detail("%s: no file '%s' in the dataset", s->name, name ? name : "");
  return STK_ENOENT;
}

int dl_source_file_docs(struct dl_source *s, uint32_t file, uint64_t *ret_docs) {
  if (file >= s->n_files) {
    stk_set_detail("%s: file %u out of range (%u files)", s->name, file, s->n_files);
    return STK_ERANGE;
  }
  return s->ops->file_docs(s, file, ret_docs);
}

enum read_form { COPIED, BORROWED, DELIMITED };

/* The reader's op for a form, falling back to the next simpler form. */
static int (*read_op(const struct dl_source *s, enum read_form form))(struct dl_source *, uint64_t,
                                                                      struct dl_unit *) {
  if (form == DELIMITED && s->ops->read_delimited) return s->ops->read_delimited;
  if (form != COPIED && s->ops->read_runs) return s->ops->read_runs;
  return s->ops->read_unit;
}

static int read_with(struct dl_source *s, uint64_t u, struct dl_unit *ret_unit,
                     enum read_form form) {
  if (u >= s->n_units) {
    stk_set_detail("%s: unit %llu out of range (%llu units)", s->name, (unsigned long long)u,
                   (unsigned long long)s->n_units);
    return STK_ERANGE;
  }
  struct dl_unit unit = {0};
  int rc = read_op(s, form)(s, u, &unit);
  if (rc < 0) {
    dl_unit_free(&unit);
    return rc;
  }
  *ret_unit = unit;
  return 0;
}

int dl_source_read_unit(struct dl_source *s, uint64_t u, struct dl_unit *ret_unit) {
  return read_with(s, u, ret_unit, COPIED);
}

int dl_source_read_unit_runs(struct dl_source *s, uint64_t u, struct dl_unit *ret_unit) {
  return read_with(s, u, ret_unit, BORROWED);
}

int dl_source_read_unit_delimited(struct dl_source *s, uint64_t u, struct dl_unit *ret_unit) {
  return read_with(s, u, ret_unit, DELIMITED);
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
