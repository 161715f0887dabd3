/*
 * ckpt_crc: CRC32C (Castagnoli) per 1 MiB block of every checkpoint object.
 *
 * Objects are checksummed while they stream in (a block CRC is final as soon
 * as its 1 MiB has been seen), and a restore that reads only part of an object
 * verifies just the blocks it touches. The arithmetic is services/common's
 * crc32c (ISA-L); ckpt_crc32c("123456789") is the standard 0xE3069283.
 *
 * Everything here is pure and thread-compatible: one stream per thread.
 */
#ifndef STK_CKPT_CRC_H
#define STK_CKPT_CRC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The block size every manifest's block_crc32c list is cut at. */
#define CKPT_CRC_BLOCK_BYTES ((uint64_t)1 << 20)

/* The CRC32C of len bytes (any length, including 0 -> 0). */
uint32_t ckpt_crc32c(const void *data, size_t len);

/* Extends a finished CRC32C with more bytes:
 * ckpt_crc32c_extend(ckpt_crc32c(a), b) == ckpt_crc32c(a || b). */
uint32_t ckpt_crc32c_extend(uint32_t crc, const void *data, size_t len);

/* Blocks an object of size_bytes is cut into (the last may be partial). */
uint64_t ckpt_crc_block_count(uint64_t size_bytes);

/*
 * A streaming per-block accumulator. Feed buffers of any size; every complete
 * 1 MiB block appends its CRC to crcs[]; finish adds the final partial block
 * (if any) and hands the list over. Embedded object: init/close.
 */
struct ckpt_crc_stream {
  uint32_t state;       /* CRC32C of the current block's bytes so far. */
  uint64_t block_fill;  /* Bytes of the current block seen so far. */
  uint64_t total_bytes; /* Bytes fed in all. */
  uint32_t *crcs;       /* CRCs of the completed blocks. */
  size_t count;         /* Completed blocks. */
  size_t cap;           /* Allocated entries of crcs. */
};

void ckpt_crc_stream_init(struct ckpt_crc_stream *s);
/* 0, or STK_ENOMEM (the stream is then unusable: close it). */
int ckpt_crc_stream_feed(struct ckpt_crc_stream *s, const void *data, size_t len);
/* Closes the last block and hands the CRC list to the caller (free() it; NULL
 * with count 0 for an empty object). The stream is left empty, as after init.
 * 0 or STK_ENOMEM. */
int ckpt_crc_stream_finish(struct ckpt_crc_stream *s, uint32_t **ret_crcs, size_t *ret_count);
/* Frees what the stream holds; accepts a stream that was finished. */
void ckpt_crc_stream_close(struct ckpt_crc_stream *s);

/*
 * Partial reads. To verify bytes [offset, offset + len) of an object, whole
 * blocks must be fetched: ckpt_crc_fetch_range widens the range to block
 * boundaries (the last block ends at the object's end). STK_ERANGE if the
 * range is not inside the object.
 */
struct ckpt_crc_range {
  uint64_t offset;      /* First byte to fetch (block aligned). */
  uint64_t len;         /* Bytes to fetch. */
  uint64_t first_block; /* Index of the first block covered. */
  uint64_t blocks;      /* Blocks covered. */
};

int ckpt_crc_fetch_range(uint64_t object_bytes, uint64_t offset, uint64_t len,
                         struct ckpt_crc_range *ret_range);

/*
 * Verifies fetched bytes [offset, offset + len) of an object of object_bytes
 * against its block CRCs (n_crcs must equal ckpt_crc_block_count). offset must
 * be block aligned and the range must end on a block boundary or at the
 * object's end, as ckpt_crc_fetch_range gives. 0, STK_EINVAL for a misaligned
 * range or a wrong CRC count, STK_ECORRUPT (detail names the block) on a
 * mismatch.
 */
int ckpt_crc_verify(const uint32_t *crcs, size_t n_crcs, uint64_t object_bytes, uint64_t offset,
                    const void *data, uint64_t len);

#endif
