/*
 * test_ckpt_shard: the model of the libstoker-client checkpoint tests (see
 * test_ckpt_shard.h).
 */
#include "test_ckpt_shard.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

struct stk_client *tck_shard_client(const char *addr) {
  struct stk_client_opts o = {.address = addr, .default_timeout_ms = 60000};
  struct stk_client *c = NULL;
  assert_int_equal(stk_ckpt_connect(&o, &c), 0);
  return c;
}

void tck_shard_init(struct tck_shard *s, const struct tck_model *m, int64_t step, uint32_t rank,
                    uint32_t world) {
  size_t wlen = (size_t)(m->rows * m->cols * 4), base = (size_t)rank * wlen;
  s->w = malloc(wlen);
  s->blen = m->blob + rank;
  s->blob = malloc(s->blen);
  for (size_t i = 0; i < wlen; i++) s->w[i] = m->byte_at(step, 0, base + i);
  for (size_t i = 0; i < s->blen; i++) s->blob[i] = m->byte_at(step, 1 + (int)rank, i);
  s->shape[0] = m->rows * world;
  s->shape[1] = m->cols;
  s->off[0] = m->rows * rank;
  s->off[1] = 0;
  s->sz[0] = m->rows;
  s->sz[1] = m->cols;
  s->boff = 0;
  snprintf(s->bname, sizeof(s->bname), "blob/rank-%u", rank);
  s->t[0] = (struct stk_ckpt_tensor){"w", STK_DTYPE_F32, s->shape, {2, s->off, s->sz}, s->w, wlen};
  s->t[1] = (struct stk_ckpt_tensor){s->bname, STK_DTYPE_BYTES, &s->blen, {1, &s->boff, &s->blen},
                                     s->blob,  s->blen};
}

void tck_shard_free(struct tck_shard *s) {
  free(s->w);
  free(s->blob);
}

int tck_shard_restore(struct stk_client *c, const struct tck_model *m, const char *job,
                      int64_t step, uint32_t rank, uint32_t world, uint32_t write_world, char *msg,
                      size_t msg_len) {
  uint64_t rows = m->rows * write_world, row_bytes = m->cols * 4;
  uint64_t lo = rows * rank / world, hi = rows * (rank + 1) / world;
  uint64_t off[2] = {lo, 0}, sz[2] = {hi - lo, m->cols}, boff = 0, bsz[TCK_SHARD_MAX_WORLD];
  size_t len = (size_t)((hi - lo) * row_bytes);
  struct stk_ckpt_want want[1 + TCK_SHARD_MAX_WORLD];
  char names[TCK_SHARD_MAX_WORLD][32];
  uint8_t *buf = calloc(1, len + 1), *blobs[TCK_SHARD_MAX_WORLD];
  want[0] = (struct stk_ckpt_want){"w", {2, off, sz}, buf, len};
  for (uint32_t k = 0; k < write_world; k++) {
    bsz[k] = m->blob + k;
    blobs[k] = calloc(1, bsz[k]);
    snprintf(names[k], sizeof(names[k]), "blob/rank-%u", k);
    want[1 + k] = (struct stk_ckpt_want){names[k], {1, &boff, &bsz[k]}, blobs[k], bsz[k]};
  }
  int rc = 0;
  if (stk_ckpt_read(c, job, step, want, 1 + write_world, 60000, NULL) != 0) {
    snprintf(msg, msg_len, "read: %s", stk_client_last_error(NULL));
    rc = -1;
  }
  for (size_t i = 0; !rc && i < len; i++)
    if (buf[i] != m->byte_at(step, 0, lo * row_bytes + i)) {
      snprintf(msg, msg_len, "w byte %zu of rank %u/%u differs", i, rank, world);
      rc = -1;
    }
  for (uint32_t k = 0; k < write_world; k++) {
    for (size_t i = 0; !rc && i < bsz[k]; i++)
      if (blobs[k][i] != m->byte_at(step, 1 + (int)k, i)) {
        snprintf(msg, msg_len, "blob %u byte %zu differs", k, i);
        rc = -1;
      }
    free(blobs[k]);
  }
  free(buf);
  return rc;
}

void tck_shard_restore_all(struct stk_client *c, const struct tck_model *m, const char *job,
                           int64_t step, uint32_t world, uint32_t write_world) {
  char msg[240];
  for (uint32_t r = 0; r < world; r++)
    if (tck_shard_restore(c, m, job, step, r, world, write_world, msg, sizeof(msg)) != 0)
      fail_msg("%s", msg);
}
