/*
 * dl_take: the fused drop-delimiter copy (see dl_take.h). The portable
 * version moves one token at a time; on x86-64 CPUs with AVX2 runs of 32
 * tokens without a delimiter move with four compares and one test, then
 * runs of 8, and only the 8 around a delimiter (one per document,
 * thousands of tokens apart) take the token-at-a-time path. The copy has no
 * software prefetch: one 2 KiB ahead (against the hardware prefetchers
 * stopping at page edges) measured a few percent slower on random blocks of
 * a page-cached corpus (tests/bench/README.md, "dataloader"). The read-only
 * count (rare: snapshots) keeps its prefetch, as dl_scan.c does.
 */
#include "dl_take.h"

#include <stdbool.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define AHEAD 2048 /* bytes the count prefetches in front */

/* One token: kept (and maybe a document start) or dropped. */
static inline void take_one(uint32_t x, uint32_t delim, bool *after_delim, uint32_t *dst,
                            uint32_t *starts, size_t *n_starts, size_t *w) {
  if (x == delim) {
    *after_delim = true;
    return;
  }
  if (*after_delim && starts) starts[(*n_starts)++] = (uint32_t)*w;
  *after_delim = false;
  if (dst) dst[*w] = x;
  (*w)++;
}

size_t dl_take_u32_portable(const uint32_t *t, uint64_t *pos, uint64_t end, uint32_t delim,
                            size_t want, uint32_t *dst, uint32_t *starts, size_t *n_starts) {
  uint64_t i = *pos;
  bool after_delim = i == 0 || t[i - 1] == delim;
  size_t w = 0;
  while (i < end && w < want) take_one(t[i++], delim, &after_delim, dst, starts, n_starts, &w);
  *pos = i;
  return w;
}

uint64_t dl_take_count_u32_portable(const uint32_t *t, uint64_t pos, uint64_t end, uint32_t delim) {
  uint64_t n = 0;
  for (uint64_t i = pos; i < end; i++) n += t[i] != delim;
  return n;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) static size_t take_avx2(const uint32_t *t, uint64_t *pos,
                                                        uint64_t end, uint32_t delim, size_t want,
                                                        uint32_t *dst, uint32_t *starts,
                                                        size_t *n_starts) {
  const __m256i d = _mm256_set1_epi32((int)delim);
  uint64_t i = *pos;
  bool after_delim = i == 0 || t[i - 1] == delim;
  size_t w = 0;
  while (i < end && w < want) {
    /* 32 tokens (two cache lines) per step: four compares, one test. */
    while (!after_delim && end - i >= 32 && want - w >= 32) {
      const __m256i *p = (const __m256i *)(const void *)(t + i);
      __m256i x0 = _mm256_loadu_si256(p), x1 = _mm256_loadu_si256(p + 1);
      __m256i x2 = _mm256_loadu_si256(p + 2), x3 = _mm256_loadu_si256(p + 3);
      __m256i hit =
          _mm256_or_si256(_mm256_or_si256(_mm256_cmpeq_epi32(x0, d), _mm256_cmpeq_epi32(x1, d)),
                          _mm256_or_si256(_mm256_cmpeq_epi32(x2, d), _mm256_cmpeq_epi32(x3, d)));
      if (!_mm256_testz_si256(hit, hit)) break;
      if (dst) {
        __m256i *q = (__m256i *)(void *)(dst + w);
        _mm256_storeu_si256(q, x0);
        _mm256_storeu_si256(q + 1, x1);
        _mm256_storeu_si256(q + 2, x2);
        _mm256_storeu_si256(q + 3, x3);
      }
      i += 32;
      w += 32;
    }
    while (!after_delim && end - i >= 8 && want - w >= 8) {
      __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(t + i));
      if (_mm256_movemask_epi8(_mm256_cmpeq_epi32(x, d))) break;
      if (dst) _mm256_storeu_si256((__m256i *)(void *)(dst + w), x);
      i += 8;
      w += 8;
    }
    /* A delimiter ahead, a document start, or the tail: 8 tokens one by one. */
    for (int k = 0; k < 8 && i < end && w < want; k++)
      take_one(t[i++], delim, &after_delim, dst, starts, n_starts, &w);
  }
  *pos = i;
  return w;
}

__attribute__((target("avx2"))) static uint64_t count_avx2(const uint32_t *t, uint64_t i,
                                                           uint64_t end, uint32_t delim) {
  const __m256i d = _mm256_set1_epi32((int)delim);
  uint64_t delims = 0, begin = i;
  for (; end - i >= 8; i += 8) {
    __builtin_prefetch((const char *)(t + i) + AHEAD);
    __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(t + i));
    delims += (uint64_t)__builtin_popcount(
        (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(x, d))));
  }
  for (; i < end; i++) delims += t[i] == delim;
  return (i - begin) - delims;
}

static bool have_avx2(void) {
  static int known = -1; /* Racing first callers compute the same answer. */
  if (known < 0) known = __builtin_cpu_supports("avx2") ? 1 : 0;
  return known == 1;
}
#endif

size_t dl_take_u32(const uint32_t *t, uint64_t *pos, uint64_t end, uint32_t delim, size_t want,
                   uint32_t *dst, uint32_t *starts, size_t *n_starts) {
#if defined(__x86_64__)
  if (have_avx2()) return take_avx2(t, pos, end, delim, want, dst, starts, n_starts);
#endif
  return dl_take_u32_portable(t, pos, end, delim, want, dst, starts, n_starts);
}

uint64_t dl_take_count_u32(const uint32_t *t, uint64_t pos, uint64_t end, uint32_t delim) {
#if defined(__x86_64__)
  if (have_avx2()) return count_avx2(t, pos, end, delim);
#endif
  return dl_take_count_u32_portable(t, pos, end, delim);
}
