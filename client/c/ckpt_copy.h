/*
 * ckpt_copy: the copy of a rank's bytes into a shared-memory staging
 * segment, the whole of a rank's stall in the steady state. The segment is
 * read next by the service (CRCs, upload), not by this core, so the copy
 * uses non-temporal stores: the destination lines are written without
 * first being read into the cache (no read-for-ownership), which moves a
 * third less memory traffic than an ordinary copy and leaves the trainer's
 * cache alone. glibc's memcpy does the same, but only above its
 * non-temporal threshold (192 MiB on the build machine), far above a
 * 64 MiB segment: there the copy into segments ran 1.3-2x slower than one
 * memcpy of the whole shard.
 */
#ifndef STK_CKPT_COPY_H
#define STK_CKPT_COPY_H

#include <stddef.h>

/* Below this many bytes the copy is a plain memcpy. */
#define CKPT_COPY_STREAM_MIN ((size_t)256 << 10)

/* memcpy(dst, src, n) for buffers that do not overlap; the bytes are
 * globally visible (store fence) when it returns. */
void ckpt_copy_stream(void *dst, const void *src, size_t n);

#endif
