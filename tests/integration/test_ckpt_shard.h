/*
 * test_ckpt_shard: the model the libstoker-client checkpoint tests save
 * through stoker_ckpt.h (test_ckpt_shm.c, test_ckpt_rank_kill.c): each
 * rank's shard is rows of a float matrix "w" (rows per rank x cols f32) and
 * a blob "blob/rank-R" of blob + R bytes, every byte a function of (step,
 * tensor, index) given by the test; read back at any world size and
 * checked byte for byte.
 */
#ifndef STK_TEST_CKPT_SHARD_H
#define STK_TEST_CKPT_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "stoker_ckpt.h"

/* Most ranks a checkpoint of the model is written by. */
#define TCK_SHARD_MAX_WORLD 4

struct tck_model {
  uint64_t rows, cols; /* Of "w" per rank (f32 elements a row). */
  size_t blob;         /* Rank R's blob holds blob + R bytes. */
  /* Byte i of tensor 0 ("w", flat over every rank) or 1 + R (R's blob). */
  uint8_t (*byte_at)(int64_t step, int tensor, uint64_t i);
};

/* One rank's shard at step, in t[0] ("w") and t[1] (the blob). */
struct tck_shard {
  uint8_t *w, *blob;
  uint64_t shape[2], off[2], sz[2], blen, boff;
  char bname[32];
  struct stk_ckpt_tensor t[2];
};

/* A libstoker-client for checkpoints on addr (stk_ckpt_connect, 60 s
 * calls; asserted). */
struct stk_client *tck_shard_client(const char *addr);

void tck_shard_init(struct tck_shard *s, const struct tck_model *m, int64_t step, uint32_t rank,
                    uint32_t world);
void tck_shard_free(struct tck_shard *s);

/* Reads rank's share of "w" at world (rows split evenly) and every blob of
 * the write_world ranks and compares them: 0, or -1 with the reason in
 * msg. */
int tck_shard_restore(struct stk_client *c, const struct tck_model *m, const char *job,
                      int64_t step, uint32_t rank, uint32_t world, uint32_t write_world, char *msg,
                      size_t msg_len);

/* tck_shard_restore for every rank of world; a failure fails the test
 * (cmocka) with its reason. */
void tck_shard_restore_all(struct stk_client *c, const struct tck_model *m, const char *job,
                           int64_t step, uint32_t world, uint32_t write_world);

#endif
