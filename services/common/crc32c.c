/*
 * crc32c over ISA-L (crc32c.h). ISA-L's crc32_iscsi(buf, len, init) neither
 * inverts its input nor its output, and takes an int length: the standard
 * CRC32C is ~crc32_iscsi(buf, len, ~0), fed in pieces below 2 GiB.
 */
#include "crc32c.h"

#include <isa-l/crc.h>

/* Largest piece handed to ISA-L at once (its length is an int). */
#define PIECE_BYTES ((size_t)1 << 30)

uint32_t crc32c_extend(uint32_t crc, const void *data, size_t len) {
  const unsigned char *p = data;
  uint32_t state = ~crc;
  while (len > 0) {
    size_t n = len < PIECE_BYTES ? len : PIECE_BYTES;
    state = crc32_iscsi((unsigned char *)p, (int)n, state);
    p += n;
    len -= n;
  }
  return ~state;
}

uint32_t crc32c(const void *data, size_t len) {
  return crc32c_extend(0, data, len);
}
