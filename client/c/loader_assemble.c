/*
 * Assembly of a rank's slice from the partial batches of a scaled-out job.
 * Each dataloader process (part i of P) returns only the lines of its lanes,
 * each with its position in the slice; placing every part's lines at their
 * positions and moving their document starts along gives exactly the bytes
 * one process serving the whole job returns. Everything a part says is
 * checked first (its part number, the step, the shape, positions in range
 * and covered exactly once), so a misconfigured address list fails loudly
 * instead of training on a wrong batch.
 */
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "loader_internal.h"

static int u32_cmp(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x > y) - (x < y);
}

/* Part i's reply agrees with part 0's and with being part i of n. */
static int check_part(const struct stk_batch *b, const struct stk_batch *first, uint32_t i,
                      uint32_t n) {
  const Stoker__V1__Batch *m = loader_batch_msg(b), *m0 = loader_batch_msg(first);
  if (!m || m->parts != n || m->part != i) {
    client_set_error(9, "address %u of the loader serves part %u of %u, expected part %u of %u", i,
                     m ? m->part : 0, m && m->parts ? m->parts : 1, i, n);
    return STK_EINVAL;
  }
  if (b->step != first->step || b->line_tokens != first->line_tokens ||
      m->slice_lines != m0->slice_lines || m->n_positions != b->lines) {
    client_set_error(15, "the dataloader parts disagree on step %lld's shape",
                     (long long)first->step);
    return STK_ECORRUPT;
  }
  return 0;
}

/* Every position of the slice is held by exactly one part. */
static int check_cover(const struct stk_batch *parts, uint32_t n, uint32_t slice) {
  uint64_t total = 0;
  for (uint32_t i = 0; i < n; i++) total += loader_batch_msg(&parts[i])->n_positions;
  int err = total == slice ? 0 : STK_ECORRUPT; /* bounds slice by what arrived */
  uint8_t *seen = err ? NULL : calloc((size_t)slice + 1, 1);
  if (!err && !seen) return client_fail(STK_ENOMEM, "batch");
  for (uint32_t i = 0; i < n && !err; i++) {
    const Stoker__V1__Batch *m = loader_batch_msg(&parts[i]);
    for (size_t k = 0; k < m->n_positions && !err; k++) {
      uint32_t p = m->positions[k];
      if (p >= slice || seen[p]) err = STK_ECORRUPT;
      if (!err) seen[p] = 1;
    }
  }
  free(seen);
  if (err) client_set_error(15, "the dataloader parts do not cover the slice exactly once");
  return err;
}

/* Copies part b's lines and document starts to their slice positions. */
static void place(const struct stk_batch *b, uint32_t *tokens, uint32_t *starts, size_t *n_starts) {
  const Stoker__V1__Batch *m = loader_batch_msg(b);
  size_t t = b->line_tokens;
  for (uint32_t k = 0; k < b->lines; k++)
    memcpy(tokens + m->positions[k] * t, b->tokens + k * t, t * sizeof(uint32_t));
  for (size_t d = 0; d < b->n_doc_starts; d++) {
    uint32_t line = b->doc_starts[d] / (uint32_t)t, off = b->doc_starts[d] % (uint32_t)t;
    starts[(*n_starts)++] = m->positions[line] * (uint32_t)t + off;
  }
}

static int build(struct stk_batch *parts, uint32_t n, struct stk_batch *ret_batch) {
  const Stoker__V1__Batch *m0 = loader_batch_msg(&parts[0]);
  uint32_t slice = m0->slice_lines, t = parts[0].line_tokens;
  size_t n_starts = 0, cap = 0;
  for (uint32_t i = 0; i < n; i++) cap += parts[i].n_doc_starts;
  uint32_t *tokens = malloc((size_t)slice * t * sizeof(uint32_t) + 1);
  uint32_t *starts = malloc(cap * sizeof(uint32_t) + 1);
  if (!tokens || !starts) {
    free(tokens);
    free(starts);
    return client_fail(STK_ENOMEM, "batch");
  }
  for (uint32_t i = 0; i < n; i++) place(&parts[i], tokens, starts, &n_starts);
  qsort(starts, n_starts, sizeof(uint32_t), u32_cmp);
  return loader_batch_own(parts[0].step, slice, t, tokens, starts, n_starts, ret_batch);
}

int loader_assemble(struct stk_batch *parts, uint32_t n, struct stk_batch *ret_batch) {
  int err = n > 0 ? 0 : client_fail(STK_EINVAL, "batch");
  for (uint32_t i = 0; i < n && !err; i++) err = check_part(&parts[i], &parts[0], i, n);
  if (!err) err = check_cover(parts, n, loader_batch_msg(&parts[0])->slice_lines);
  if (!err) err = build(parts, n, ret_batch);
  for (uint32_t i = 0; i < n; i++) stk_batch_free(&parts[i]);
  return err;
}
