/*
 * The inside of a dl_source, shared by the format readers: every reader
 * embeds `struct dl_source` as its first member and fills in the ops table,
 * so dl_source.c can dispatch and answer the O(1) accessors in one place.
 */
#ifndef STK_DL_SOURCE_INTERNAL_H
#define STK_DL_SOURCE_INTERNAL_H

#include "dl_source.h"

struct dl_source_ops {
  /* Weight of unit u (u < n_units, checked by the caller). */
  uint64_t (*unit_weight)(const struct dl_source *s, uint64_t u);
  /* Fills *ret_unit (zeroed by the caller) or returns an error with detail. */
  int (*read_unit)(struct dl_source *s, uint64_t u, struct dl_unit *ret_unit);
  /* Frees the reader's own state and the struct itself. */
  void (*free)(struct dl_source *s);
  /* Optional (NULL: read_unit): may fill the borrowed form of *ret_unit. */
  int (*read_runs)(struct dl_source *s, uint64_t u, struct dl_unit *ret_unit);
  /* Optional (NULL: read_runs): may fill the delimited form of *ret_unit. */
  int (*read_delimited)(struct dl_source *s, uint64_t u, struct dl_unit *ret_unit);
  /* dl_source_unit_docs for a unit in range. */
  int (*unit_docs)(struct dl_source *s, uint64_t u, struct dl_unit_docs *ret_docs);
  /* dl_source_file_docs for a file in range. */
  int (*file_docs)(struct dl_source *s, uint32_t file, uint64_t *ret_docs);
  /* Optional (readers that tokenize text): dl_source_read_unit_from and
   * dl_source_token_bytes for a unit in range. */
  int (*read_from)(struct dl_source *s, uint64_t u, uint32_t doc_rel, uint64_t byte, bool lead,
                   struct dl_unit *ret_unit);
  size_t (*token_bytes)(const struct dl_source *s, uint32_t id);
};

struct dl_source {
  const struct dl_source_ops *ops;
  char *name;
  uint64_t n_units;
  uint64_t total_weight;
  uint32_t *strip_ids; /* sorted copy of opts->strip_ids */
  size_t n_strip_ids;
  char **file_names; /* [n_files] */
  uint32_t n_files;
};

/* The readers' base (dl_source_base.c, below every reader; it calls none of
 * them). Sets the common fields (copies name and strip ids). */
int dl_source_base_init(struct dl_source *s, const struct dl_source_ops *ops,
                        const struct dl_source_opts *opts);
/* Sets the file names from the files' paths (their last component, less
 * `drop_suffix` when it ends them; NULL: none). */
int dl_source_set_files(struct dl_source *s, char *const *paths, size_t n, const char *drop_suffix);
/* Frees what dl_source_base_init and dl_source_set_files allocated (not s itself). */
void dl_source_base_close(struct dl_source *s);
bool dl_source_is_strip_id(const struct dl_source *s, uint32_t token);

/* Readers behind dl_source_open (dl_source.c, above them). */
int dl_megatron_open(const struct dl_source_opts *opts, struct dl_source **ret_source);
int dl_llmc_open(const struct dl_source_opts *opts, struct dl_source **ret_source);
int dl_text_open(const struct dl_source_opts *opts, struct dl_source **ret_source);

/* Grows a unit's doc_starts by one entry; 0 or STK_ENOMEM (dl_source_base.c). */
int dl_unit_add_doc(struct dl_unit *unit, size_t *cap, uint32_t offset);
/* The same with its doc_rel entry (the unit's doc_rel kept at n_docs entries). */
int dl_unit_add_doc_rel(struct dl_unit *unit, size_t *cap, uint32_t offset, uint32_t rel);

#endif
