/*
 * dl_codec: the little-endian byte buffers the dataloader stores in RocksDB
 * and exports into checkpoints (job configuration, lane snapshots). A
 * writer grows as needed and remembers an allocation failure; a reader
 * checks every length against what is left and remembers an underrun, so
 * callers check once at the end.
 */
#ifndef STK_DL_CODEC_H
#define STK_DL_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct dl_wbuf {
  uint8_t *data; /* [len], malloc'd; the caller takes it or frees it */
  size_t len, cap;
  bool failed; /* An allocation failed: the contents are incomplete. */
};

void dl_w_bytes(struct dl_wbuf *w, const void *p, size_t n);
void dl_w_u8(struct dl_wbuf *w, uint8_t v);
void dl_w_u32(struct dl_wbuf *w, uint32_t v);
void dl_w_u64(struct dl_wbuf *w, uint64_t v);
void dl_w_f64(struct dl_wbuf *w, double v);
/* A u32 length then the bytes. */
void dl_w_blob(struct dl_wbuf *w, const void *p, size_t n);

struct dl_rbuf {
  const uint8_t *p;
  size_t left;
  bool failed; /* A read ran past the end: treat the input as corrupt. */
};

uint8_t dl_r_u8(struct dl_rbuf *r);
uint32_t dl_r_u32(struct dl_rbuf *r);
uint64_t dl_r_u64(struct dl_rbuf *r);
double dl_r_f64(struct dl_rbuf *r);
/* Points *ret into the buffer (not copied); NULL and failed on underrun. */
const uint8_t *dl_r_blob(struct dl_rbuf *r, size_t *ret_len);

#endif
