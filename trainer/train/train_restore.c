/*
 * Restoring a committed checkpoint at this generation's world size. The
 * shards were saved as 1-D boxes of each unit's padded flat buffer, and the
 * padding depends on the world size that saved them, so each rank reads
 * the unpadded part of its new box ([offset, min(offset+count, numel)))
 * and zero-fills the rest (the new padding). Rank 0 also imports the
 * dataloader state saved with the checkpoint into every dataloader part;
 * the blob may come from any number of parts (one process's export, or an
 * envelope of several): each part takes the lanes it serves.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

/* Reads one whole 1-D bytes tensor of len bytes into dst. */
static int read_blob(struct train *t, int64_t step, const char *name, void *dst, uint64_t len) {
  uint64_t off = 0, size = len;
  struct stk_ckpt_want w = {name, {1, &off, &size}, dst, len};
  return stk_ckpt_read(t->ckpt, t->o.data_job, step, &w, 1, 60000, NULL);
}

static int import_loader(struct train *t, int64_t step, uint64_t len) {
  uint8_t *blob = malloc(len ? len : 1);
  if (!blob) return STK_ENOMEM;
  int err = read_blob(t, step, "loader/state", blob, len);
  if (!err) err = stk_loader_import_all(t->loader, t->o.data_job, step - 1, blob, len, 30000, NULL);
  free(blob);
  return err;
}

/* Reads this rank's part of every unit (param, m, v) into bufs. */
static int read_shards(struct train *t, int64_t step, struct fsdp_shard *sh, int U) {
  struct stk_ckpt_want *w = calloc(3 * (size_t)U, sizeof(*w));
  uint64_t *box = calloc(2 * (size_t)U, sizeof(*box));
  char(*names)[32] = calloc(3 * (size_t)U, 32);
  int err = (!w || !box || !names) ? STK_ENOMEM : 0;
  size_t n = 0;
  for (int u = 0; !err && u < U; u++) {
    struct fsdp_shard *s = &sh[u];
    size_t end = s->offset + s->count < s->unit_numel ? s->offset + s->count : s->unit_numel;
    if (s->offset >= end) continue; /* All padding. */
    box[2 * u] = s->offset, box[2 * u + 1] = end - s->offset;
    float *dst[3] = {s->param, s->adam_m, s->adam_v};
    const char *kinds[3] = {"param", "m", "v"};
    for (int k = 0; k < 3; k++, n++) {
      train_tensor_name(u, kinds[k], names[n], sizeof(names[n]));
      w[n] = (struct stk_ckpt_want){
          names[n], {1, &box[2 * u], &box[2 * u + 1]}, dst[k], (end - s->offset) * sizeof(float)};
    }
  }
  if (!err && n) err = stk_ckpt_read(t->ckpt, t->o.data_job, step, w, n, 120000, NULL);
  free(w), free(box), free(names);
  return err;
}

int train_restore(struct train *t, int64_t step) {
  uint64_t state[4] = {0};
  int err = read_blob(t, step, "trainer/state", state, sizeof(state));
  if (!err && state[0] != (uint64_t)step) err = STK_ECORRUPT;
  if (!err && t->m.rank == 0) err = import_loader(t, step, state[3]);
  int U = fsdp_unit_count(t->fsdp);
  struct fsdp_shard *sh = calloc((size_t)U, sizeof(*sh));
  float *mem = NULL;
  size_t total = 0;
  for (int u = 0; !err && sh && u < U; u++) {
    fsdp_shard(t->fsdp, u, &sh[u]);
    total += 3 * sh[u].count;
  }
  if (!err) mem = calloc(total + 1, sizeof(float));
  if (!err && (!sh || !mem)) err = STK_ENOMEM;
  for (int u = 0, at = 0; !err && u < U; u++) { /* Point the copies into mem (zeroed). */
    sh[u].param = mem + at, sh[u].adam_m = sh[u].param + sh[u].count;
    sh[u].adam_v = sh[u].adam_m + sh[u].count;
    at += 3 * (int)sh[u].count;
  }
  if (!err) err = read_shards(t, step, sh, U);
  if (!err) err = fsdp_load_shards(t->fsdp, sh, U, (int64_t)state[1]);
  if (!err)
    printf("[%s] restored step %" PRId64 " at world size %u\n", t->o.member, step, t->m.world_size);
  free(mem), free(sh);
  return err;
}
