/*
 * crc32c: the CRC32C (Castagnoli) of a buffer, the one checksum of the
 * daemons (checkpoint blocks, dataloader state blobs). The arithmetic is
 * ISA-L's crc32_iscsi(); this file owns its conventions (initial value and
 * final xor) so that crc32c("123456789") is the standard check value
 * 0xE3069283. Pure and thread-safe.
 */
#ifndef STK_CRC32C_H
#define STK_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* The CRC32C of len bytes (any length, including 0 -> 0). */
uint32_t crc32c(const void *data, size_t len);

/* Extends a finished CRC32C with more bytes:
 * crc32c_extend(crc32c(a), b) == crc32c(a || b); crc32c_extend(0, b) == crc32c(b). */
uint32_t crc32c_extend(uint32_t crc, const void *data, size_t len);

#endif
