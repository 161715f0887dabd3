/*
 * ckpt_copy: a large copy with non-temporal stores (see ckpt_copy.h). On
 * x86-64 the destination is brought to a 64-byte boundary with memcpy, the
 * body moves 64 bytes per step (four unaligned 16-byte loads, four
 * streaming stores: SSE2, present on every x86-64), the tail is memcpy'd,
 * and a store fence orders the streamed lines before anything the caller
 * does next (the segment's message to the service). Elsewhere it is memcpy.
 */
#include "ckpt_copy.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <emmintrin.h>

void ckpt_copy_stream(void *dst, const void *src, size_t n) {
  if (n < CKPT_COPY_STREAM_MIN) {
    memcpy(dst, src, n);
    return;
  }
  uint8_t *d = dst;
  const uint8_t *s = src;
  size_t head = (64 - ((uintptr_t)d & 63)) & 63;
  memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  for (; n >= 64; n -= 64, d += 64, s += 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)(const void *)s);
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + 32));
    __m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + 48));
    _mm_stream_si128((__m128i *)(void *)d, a);
    _mm_stream_si128((__m128i *)(void *)(d + 16), b);
    _mm_stream_si128((__m128i *)(void *)(d + 32), c);
    _mm_stream_si128((__m128i *)(void *)(d + 48), e);
  }
  memcpy(d, s, n);
  _mm_sfence();
}

#else

void ckpt_copy_stream(void *dst, const void *src, size_t n) {
  memcpy(dst, src, n);
}

#endif
