/*
 * ckpt_crc: block CRC32C of checkpoint objects, on services/common's
 * crc32c (ISA-L).
 */
#include "ckpt_crc.h"

#include <stdlib.h>

#include "crc32c.h"
#include "stk_error.h"

uint32_t ckpt_crc32c(const void *data, size_t len) {
  return crc32c(data, len);
}

uint32_t ckpt_crc32c_extend(uint32_t crc, const void *data, size_t len) {
  return crc32c_extend(crc, data, len);
}

uint64_t ckpt_crc_block_count(uint64_t size_bytes) {
  return size_bytes / CKPT_CRC_BLOCK_BYTES + (size_bytes % CKPT_CRC_BLOCK_BYTES != 0);
}

void ckpt_crc_stream_init(struct ckpt_crc_stream *s) {
  *s = (struct ckpt_crc_stream){.state = 0};
}

/* Appends one finished block CRC. */
static int push_crc(struct ckpt_crc_stream *s, uint32_t crc) {
  if (s->count == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 64;
    uint32_t *v = realloc(s->crcs, cap * sizeof(*v));
    if (!v) return STK_ENOMEM;
    s->crcs = v;
    s->cap = cap;
  }
  s->crcs[s->count++] = crc;
  return 0;
}

int ckpt_crc_stream_feed(struct ckpt_crc_stream *s, const void *data, size_t len) {
  const unsigned char *p = data;
  while (len > 0) {
    uint64_t room = CKPT_CRC_BLOCK_BYTES - s->block_fill;
    size_t n = len < room ? len : (size_t)room;
    s->state = crc32c_extend(s->state, p, n);
    s->block_fill += n;
    s->total_bytes += n;
    p += n;
    len -= n;
    if (s->block_fill == CKPT_CRC_BLOCK_BYTES) {
      if (push_crc(s, s->state) != 0) return STK_ENOMEM;
      s->state = 0;
      s->block_fill = 0;
    }
  }
  return 0;
}

int ckpt_crc_stream_finish(struct ckpt_crc_stream *s, uint32_t **ret_crcs, size_t *ret_count) {
  if (s->block_fill > 0 && push_crc(s, s->state) != 0) return STK_ENOMEM;
  *ret_crcs = s->crcs;
  *ret_count = s->count;
  ckpt_crc_stream_init(s);
  return 0;
}

void ckpt_crc_stream_close(struct ckpt_crc_stream *s) {
  free(s->crcs);
  ckpt_crc_stream_init(s);
}

int ckpt_crc_fetch_range(uint64_t object_bytes, uint64_t offset, uint64_t len,
                         struct ckpt_crc_range *ret_range) {
  if (offset > object_bytes || len > object_bytes - offset) {
    stk_set_detail("range %llu+%llu outside an object of %llu bytes", (unsigned long long)offset,
                   (unsigned long long)len, (unsigned long long)object_bytes);
    return STK_ERANGE;
  }
  uint64_t first = offset / CKPT_CRC_BLOCK_BYTES;
  uint64_t end_block = len == 0 ? first : ckpt_crc_block_count(offset + len);
  uint64_t start = first * CKPT_CRC_BLOCK_BYTES;
  uint64_t end = end_block * CKPT_CRC_BLOCK_BYTES;
  if (end > object_bytes) end = object_bytes;
  if (end < start) end = start;
  *ret_range = (struct ckpt_crc_range){
      .offset = start, .len = end - start, .first_block = first, .blocks = end_block - first};
  return 0;
}

int ckpt_crc_verify(const uint32_t *crcs, size_t n_crcs, uint64_t object_bytes, uint64_t offset,
                    const void *data, uint64_t len) {
  uint64_t end = offset + len;
  if (n_crcs != ckpt_crc_block_count(object_bytes) || offset % CKPT_CRC_BLOCK_BYTES != 0 ||
      offset > object_bytes || len > object_bytes - offset ||
      (end % CKPT_CRC_BLOCK_BYTES != 0 && end != object_bytes)) {
    stk_set_detail(
        "verify %llu+%llu: not a block-aligned range of a %llu-byte object with %zu CRCs",
        (unsigned long long)offset, (unsigned long long)len, (unsigned long long)object_bytes,
        n_crcs);
    return STK_EINVAL;
  }
  const unsigned char *p = data;
  for (uint64_t at = offset; at < end; at += CKPT_CRC_BLOCK_BYTES) {
    uint64_t n = end - at < CKPT_CRC_BLOCK_BYTES ? end - at : CKPT_CRC_BLOCK_BYTES;
    uint64_t block = at / CKPT_CRC_BLOCK_BYTES;
    uint32_t got = ckpt_crc32c(p + (at - offset), (size_t)n);
    if (got != crcs[block]) {
      stk_set_detail("block %llu (bytes %llu..%llu): crc32c %08x, manifest says %08x",
                     (unsigned long long)block, (unsigned long long)at,
                     (unsigned long long)(at + n), got, crcs[block]);
      return STK_ECORRUPT;
    }
  }
  return 0;
}
