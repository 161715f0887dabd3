/*
 * dl_scan: the delimiter scan. A portable version tests SCAN tokens at a
 * time with a branch-free OR that the compiler vectorises (a memchr for
 * token ids), then finds the exact position; on x86-64 CPUs with AVX2 the
 * uint32 scan compares 32 tokens with four 256-bit compares and one test
 * (chosen once, at run time). Blocks are random in a large map, so both
 * prefetch AHEAD bytes in front (hardware prefetchers stop at page edges).
 */
#include "dl_scan.h"

#include <stdbool.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define SCAN  32
#define AHEAD 2048

#define SCAN_PORTABLE(T)                                                                           \
  static uint64_t scan_##T(const T *t, uint64_t i, uint64_t end, T id) {                           \
    for (; i + SCAN <= end; i += SCAN) {                                                           \
      __builtin_prefetch((const char *)(t + i) + AHEAD);                                           \
      __builtin_prefetch((const char *)(t + i) + AHEAD + 64);                                      \
      unsigned hit = 0;                                                                            \
      for (int k = 0; k < SCAN; k++) hit |= t[i + k] == id;                                        \
      if (hit) break;                                                                              \
    }                                                                                              \
    for (; i < end; i++)                                                                           \
      if (t[i] == id) return i;                                                                    \
    return end;                                                                                    \
  }
SCAN_PORTABLE(uint16_t)
SCAN_PORTABLE(uint32_t)

#if defined(__x86_64__)
__attribute__((target("avx2"))) static uint64_t scan_u32_avx2(const uint32_t *t, uint64_t i,
                                                              uint64_t end, uint32_t id) {
  const __m256i want = _mm256_set1_epi32((int)id);
  for (; i + SCAN <= end; i += SCAN) {
    __builtin_prefetch((const char *)(t + i) + AHEAD);
    __builtin_prefetch((const char *)(t + i) + AHEAD + 64);
    const __m256i *p = (const __m256i *)(const void *)(t + i);
    __m256i lo = _mm256_or_si256(_mm256_cmpeq_epi32(_mm256_loadu_si256(p), want),
                                 _mm256_cmpeq_epi32(_mm256_loadu_si256(p + 1), want));
    __m256i hi = _mm256_or_si256(_mm256_cmpeq_epi32(_mm256_loadu_si256(p + 2), want),
                                 _mm256_cmpeq_epi32(_mm256_loadu_si256(p + 3), want));
    __m256i any = _mm256_or_si256(lo, hi);
    if (!_mm256_testz_si256(any, any)) break;
  }
  for (; i < end; i++)
    if (t[i] == id) return i;
  return end;
}

static bool have_avx2(void) {
  static int known = -1; /* Racing first callers compute the same answer. */
  if (known < 0) known = __builtin_cpu_supports("avx2") ? 1 : 0;
  return known == 1;
}
#endif

uint64_t dl_scan_u32(const uint32_t *t, uint64_t i, uint64_t end, uint32_t id) {
#if defined(__x86_64__)
  if (have_avx2()) return scan_u32_avx2(t, i, end, id);
#endif
  return scan_uint32_t(t, i, end, id);
}

uint64_t dl_scan_u32_portable(const uint32_t *t, uint64_t i, uint64_t end, uint32_t id) {
  return scan_uint32_t(t, i, end, id);
}

uint64_t dl_scan_u16(const uint16_t *t, uint64_t i, uint64_t end, uint16_t id) {
  return scan_uint16_t(t, i, end, id);
}
