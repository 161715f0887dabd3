/*
 * --dump-params: every rank all-gathers each unit; rank 0 writes the whole
 * model (units in order, raw little-endian f32) to a file, so that two runs
 * (say, at different world sizes) can be compared bit for bit.
 */
#include <stdio.h>
#include <stdlib.h>

#include "train.h"

int train_dump_params(struct train *t, const char *path) {
  int U = fsdp_unit_count(t->fsdp), err = 0;
  FILE *f = t->m.rank == 0 ? fopen(path, "wb") : NULL;
  if (t->m.rank == 0 && !f) err = STK_EIO;
  for (int u = 0; !err && u < U; u++) {
    size_t n = model_unit_numel(&t->o.cfg, u);
    float *buf = malloc(n * sizeof(float));
    err = buf ? fsdp_gather_unit(t->fsdp, u, buf) : STK_ENOMEM;
    if (!err && f && fwrite(buf, sizeof(float), n, f) != n) err = STK_EIO;
    free(buf);
  }
  if (f && fclose(f) != 0 && !err) err = STK_EIO;
  return err;
}
