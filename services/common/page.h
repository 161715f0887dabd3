/*
 * page: the pages every listing of the daemons answers in (AIP-158, as
 * Kubernetes' limit/continue): at most a page size of entries, and no more
 * bytes than fit a client's default 4 MiB message, in a stable order by
 * each listing's key (a name, or a step written as a number), resumed
 * after the last key returned. A token is that key, hex-encoded behind a
 * version tag: opaque to clients, and an entry created or deleted between
 * pages is listed at most once, the others exactly once.
 */
#ifndef STK_PAGE_H
#define STK_PAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PAGE_DEFAULT_SIZE 100u
#define PAGE_MAX_SIZE     1000u
/* Packed entry bytes a page stops before (a page always holds one entry,
 * whatever its size): under gRPC's default 4 MiB receive limit. */
#define PAGE_MAX_BYTES ((size_t)3 << 20)
/* Longest key a token carries. */
#define PAGE_MAX_KEY_BYTES 1024u

/* The page size to use for a request's page_size (0: the default). */
uint32_t page_size(uint32_t asked);

/* A page in progress: whether an entry of `bytes` packed bytes still fits
 * after `n` entries of `used` bytes in all, at most `size` entries. */
static inline bool page_fits(uint32_t size, size_t n, size_t used, size_t bytes) {
  return n == 0 || (n < size && used + bytes <= PAGE_MAX_BYTES);
}

/* The token resuming after `last_key` (malloc'd). STK_ENOMEM, STK_EINVAL
 * for a key longer than PAGE_MAX_KEY_BYTES. */
int page_token_encode(const char *last_key, char **ret_token);

/* The key a request's token resumes after (malloc'd), or NULL for an empty
 * or NULL token (the first page). STK_EINVAL with a detail for a string
 * that is not a token; STK_ENOMEM. */
int page_token_decode(const char *token, char **ret_key);

#endif
