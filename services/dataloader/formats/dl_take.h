/*
 * dl_take: reading a delimited run of uint32 tokens (an llm.c block) in the
 * same pass that copies it: the end-of-text delimiters are dropped and the
 * document starts found while the tokens move from the file's map into a
 * batch line, so every token is read from memory once. Scanning a block
 * first and copying it after read it twice; on random blocks of a large
 * page-cached corpus that second pass was a quarter of the serve time.
 */
#ifndef STK_DL_TAKE_H
#define STK_DL_TAKE_H

#include <stddef.h>
#include <stdint.h>

/* Takes the tokens of t[*pos, end) other than `delim`, in order, up to
 * `want` of them, into dst (NULL: they are only counted). A kept token
 * starts a document when it is t[0] or its predecessor is delim; its index
 * in the output goes to starts[(*n_starts)++] (starts NULL: not recorded;
 * the caller sizes starts for `want` entries). *pos ends right after the
 * last token taken (delimiters after it are left for the next call), or at
 * end. Returns the number of tokens taken. */
size_t dl_take_u32(const uint32_t *t, uint64_t *pos, uint64_t end, uint32_t delim, size_t want,
                   uint32_t *dst, uint32_t *starts, size_t *n_starts);

/* Tokens of t[pos, end) other than delim. */
uint64_t dl_take_count_u32(const uint32_t *t, uint64_t pos, uint64_t end, uint32_t delim);

/* The portable versions, whatever the CPU (tests compare them). */
size_t dl_take_u32_portable(const uint32_t *t, uint64_t *pos, uint64_t end, uint32_t delim,
                            size_t want, uint32_t *dst, uint32_t *starts, size_t *n_starts);
uint64_t dl_take_count_u32_portable(const uint32_t *t, uint64_t pos, uint64_t end, uint32_t delim);

#endif
