/*
 * ring_reduce.c: the element-wise sums the ring's reduce-scatter applies to
 * each received segment. f32 adds directly; bf16 widens both operands to f32
 * (exact), adds, and rounds back to bf16 to nearest, ties to even, as NCCL
 * and PyTorch do. Plain loops the compiler vectorizes.
 */
#include <stdint.h>
#include <string.h>

#include "ring_internal.h"

static inline float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* Quiet NaN. */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static void add_f32(float *out, const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

static void add_bf16(uint16_t *out, const uint16_t *a, const uint16_t *b, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

void ring_reduce(enum coll_dtype dt, void *out, const void *a, const void *b, size_t bytes) {
  if (dt == COLL_F32)
    add_f32(out, a, b, bytes / 4);
  else
    add_bf16(out, a, b, bytes / 2);
}
