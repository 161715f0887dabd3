/*
 * coll.c: the backend-independent part of the collective interface: the
 * element sizes, which both backends and the FSDP layer need to turn
 * element counts into byte counts, the bf16 conversions FSDP's mixed
 * precision uses around bf16 collectives, and the record of what broke a
 * group.
 */
#include "coll.h"

#include <stdio.h>
#include <string.h>

#include "stk_error.h"

int coll_failed(struct coll_group *g, const char *op, int rc) {
  if (g->why[0]) return rc; /* Later failures follow from the first. */
  int n = g->size, r = g->rank;
  const char *detail = stk_detail();
  snprintf(g->why, sizeof(g->why), "%s %s: %s (this is rank %d of %d; previous rank %d, next %d)",
           g->ops->name, op, detail[0] ? detail : stk_strerror(rc), r, n, (r + n - 1) % n,
           (r + 1) % n);
  return rc;
}

const char *coll_why(const struct coll_group *g) {
  return g->why;
}

size_t coll_dtype_size(enum coll_dtype dt) {
  switch (dt) {
  case COLL_F32:
    return 4;
  case COLL_BF16:
    return 2;
  }
  return 0;
}

void coll_bf16_from_f32(uint16_t *dst, const float *src, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &src[i], sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      dst[i] = (uint16_t)((u >> 16) | 0x40); /* Quiet NaN. */
      continue;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    dst[i] = (uint16_t)(u >> 16);
  }
}

void coll_f32_from_bf16(float *dst, const uint16_t *src, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t u = (uint32_t)src[i] << 16;
    memcpy(&dst[i], &u, sizeof(u));
  }
}
