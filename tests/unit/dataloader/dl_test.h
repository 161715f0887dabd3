/*
 * dl_test: helpers shared by the dataloader core tests — a store in a fresh
 * temporary directory, specs over synthetic corpora (tokens encode document
 * and position), and whole global batches gathered from every rank.
 */
#ifndef STK_DL_TEST_H
#define STK_DL_TEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dl_core.h"

struct tspec {
  const char *job;
  uint32_t seq_len, global_batch, shards, lanes;
  uint64_t seed;
  size_t n_ds;
  const char *names[4];
  const char *uris[4];
  double weights[4];
};

/* Writes an llm.c token file of n tokens of token_bytes (2 or 4) each. */
void t_write_llmc(const char *path, const void *tokens, uint32_t n, int token_bytes);
/* The next pseudo-random value of an LCG state (test data). */
uint32_t t_lcg(uint64_t *state);

/* A new temporary directory (malloc'd path). */
char *t_tmpdir(void);
struct dl *t_open(const char *dir, uint64_t max_batch_bytes);
int t_create(struct dl *dl, const struct tspec *t);
/* The global batch of a step gathered from `world` ranks: [B x T] (malloc'd). */
uint32_t *t_global(struct dl *dl, const char *job, int64_t step, uint32_t world, size_t *ret_n);
int t_update(struct dl *dl, const char *job, int64_t from, const struct tspec *mix,
             uint32_t seq_len, uint32_t global_batch);

/* Per-token coverage of a synthetic dataset by epoch. */
struct cover {
  uint64_t docs;
  uint32_t lo, hi;
  uint64_t seed;
  uint64_t *start; /* [docs + 1] prefix of document lengths */
  uint8_t *count;  /* [epochs x tokens] */
  uint32_t epochs;
};
void cover_init(struct cover *c, uint64_t docs, uint32_t lo, uint32_t hi, uint64_t seed,
                uint32_t epochs);
void cover_free(struct cover *c);
/* Checks the batch's tokens against explain (every token traced to its
 * unit and offset), marks the runs of names[i] in covers[i] (NULL: none),
 * failing on a token served twice in one epoch, and adds tokens per
 * dataset into tokens_by_ds[i] (may be NULL). */
void t_trace_step(struct dl *dl, const char *job, int64_t step, const char *const *names,
                  size_t n_names, struct cover **covers, uint64_t *tokens_by_ds);

#endif
