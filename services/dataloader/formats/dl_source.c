/*
 * dl_source: the top of the formats ladder — dispatch to the reader chosen
 * by opts->format, and the accessors and reads every reader answers through
 * its ops table. The readers' shared base (common fields, unit growth, copy
 * and free) is dl_source_base.c, below the readers.
 */
#include "dl_source_internal.h"

#include <stdlib.h>
#include <string.h>

#include "stk_error.h"

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

bool dl_source_tokenizes(const struct dl_source *s) {
  return s->ops->read_from && s->ops->token_bytes;
}

size_t dl_source_token_bytes(const struct dl_source *s, uint32_t id) {
  return s->ops->token_bytes ? s->ops->token_bytes(s, id) : 0;
}

int dl_source_read_unit_from(struct dl_source *s, uint64_t u, uint32_t doc_rel, uint64_t byte,
                             bool lead, struct dl_unit *ret_unit) {
  if (!dl_source_tokenizes(s)) {
    stk_set_detail("%s: its format is read as tokens, never from a byte", s->name);
    return STK_EINVAL;
  }
  if (u >= s->n_units) {
    stk_set_detail("%s: unit %llu out of range (%llu units)", s->name, (unsigned long long)u,
                   (unsigned long long)s->n_units);
    return STK_ERANGE;
  }
  struct dl_unit unit = {0};
  int rc = s->ops->read_from(s, u, doc_rel, byte, lead, &unit);
  if (rc < 0) {
    dl_unit_free(&unit);
    return rc;
  }
  *ret_unit = unit;
  return 0;
}
