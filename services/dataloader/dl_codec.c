/*
 * dl_codec: little-endian writer and bounds-checked reader (see dl_codec.h).
 */
#include "dl_codec.h"

#include <stdlib.h>
#include <string.h>

void dl_w_bytes(struct dl_wbuf *w, const void *p, size_t n) {
  if (w->failed) return;
  if (w->len + n > w->cap) {
    size_t cap = w->cap ? w->cap : 64;
    while (cap < w->len + n) cap *= 2;
    uint8_t *d = realloc(w->data, cap);
    if (!d) {
      w->failed = true;
      return;
    }
    w->data = d;
    w->cap = cap;
  }
  if (n) memcpy(w->data + w->len, p, n);
  w->len += n;
}

void dl_w_u8(struct dl_wbuf *w, uint8_t v) {
  dl_w_bytes(w, &v, 1);
}

void dl_w_u32(struct dl_wbuf *w, uint32_t v) {
  uint8_t b[4];
  for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
  dl_w_bytes(w, b, 4);
}

void dl_w_u64(struct dl_wbuf *w, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
  dl_w_bytes(w, b, 8);
}

void dl_w_f64(struct dl_wbuf *w, double v) {
  uint64_t u;
  memcpy(&u, &v, 8);
  dl_w_u64(w, u);
}

void dl_w_blob(struct dl_wbuf *w, const void *p, size_t n) {
  dl_w_u32(w, (uint32_t)n);
  dl_w_bytes(w, p, n);
}

static const uint8_t *take(struct dl_rbuf *r, size_t n) {
  if (r->failed || r->left < n) {
    r->failed = true;
    return NULL;
  }
  const uint8_t *p = r->p;
  r->p += n;
  r->left -= n;
  return p;
}

uint8_t dl_r_u8(struct dl_rbuf *r) {
  const uint8_t *p = take(r, 1);
  return p ? p[0] : 0;
}

uint32_t dl_r_u32(struct dl_rbuf *r) {
  const uint8_t *p = take(r, 4);
  uint32_t v = 0;
  if (p)
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

uint64_t dl_r_u64(struct dl_rbuf *r) {
  const uint8_t *p = take(r, 8);
  uint64_t v = 0;
  if (p)
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

double dl_r_f64(struct dl_rbuf *r) {
  uint64_t u = dl_r_u64(r);
  double v;
  memcpy(&v, &u, 8);
  return v;
}

const uint8_t *dl_r_blob(struct dl_rbuf *r, size_t *ret_len) {
  uint32_t n = dl_r_u32(r);
  const uint8_t *p = take(r, n);
  *ret_len = p ? n : 0;
  return p;
}
