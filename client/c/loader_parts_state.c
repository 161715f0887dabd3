/*
 * The state of a scaled-out job as one blob, so that a trainer stores it in
 * its checkpoint exactly as it stores a single process's: every part's
 * ExportState at the step, in an envelope ("SLP1", count, then each blob
 * with its length). Import sends all the blobs to every part at once
 * (LoaderState.more_states): each process takes the lanes it serves, at any
 * number of processes, which is how an operator scales the loader out or
 * in. With one part the blob is the process's own, unwrapped, and a blob
 * without the envelope is imported as it is.
 */
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "loader_internal.h"

#define ENVELOPE_MAGIC 0x31504C53u /* "SLP1" */

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The envelope of blobs[0..n) (malloc'd). */
static int wrap(uint8_t **blobs, const size_t *lens, uint32_t n, uint8_t **ret, size_t *ret_len) {
  size_t total = 8;
  for (uint32_t i = 0; i < n; i++) {
    if (lens[i] > UINT32_MAX) return client_fail(STK_EINVAL, "export state");
    total += 4 + lens[i];
  }
  uint8_t *out = malloc(total), *p = out + 8;
  if (!out) return client_fail(STK_ENOMEM, "export state");
  put_u32(out, ENVELOPE_MAGIC);
  put_u32(out + 4, n);
  for (uint32_t i = 0; i < n; i++) {
    put_u32(p, (uint32_t)lens[i]);
    memcpy(p + 4, blobs[i], lens[i]);
    p += 4 + lens[i];
  }
  *ret = out;
  *ret_len = total;
  return 0;
}

int stk_loader_export_all(struct stk_loader *l, const char *job, int64_t step, int64_t timeout_ms,
                          uint8_t **ret_blob, size_t *ret_len) {
  if (l->n == 1) return stk_loader_export(l->parts[0], job, step, timeout_ms, ret_blob, ret_len);
  uint8_t **blobs = calloc(l->n, sizeof(*blobs));
  size_t *lens = calloc(l->n, sizeof(*lens));
  int err = blobs && lens ? 0 : client_fail(STK_ENOMEM, "export state");
  for (uint32_t i = 0; err == 0 && i < l->n; i++)
    err = stk_loader_export(l->parts[i], job, step, timeout_ms, &blobs[i], &lens[i]);
  if (err == 0) err = wrap(blobs, lens, l->n, ret_blob, ret_len);
  for (uint32_t i = 0; blobs && i < l->n; i++) free(blobs[i]);
  free(blobs);
  free(lens);
  return err;
}

/* Views the blobs of an envelope (or blob itself, unwrapped). */
static int unwrap(const uint8_t *blob, size_t len, const uint8_t ***ret_blobs, size_t **ret_lens,
                  size_t *ret_n) {
  bool env = len >= 8 && get_u32(blob) == ENVELOPE_MAGIC;
  size_t n = env ? get_u32(blob + 4) : 1;
  if (env && (n == 0 || n > (len - 8) / 4)) return client_fail(STK_EINVAL, "import state");
  const uint8_t **blobs = calloc(n, sizeof(*blobs));
  size_t *lens = calloc(n, sizeof(*lens));
  if (!blobs || !lens) {
    free(blobs);
    free(lens);
    return client_fail(STK_ENOMEM, "import state");
  }
  const uint8_t *p = blob + 8, *end = blob + len;
  for (size_t i = 0; env && i < n; i++) {
    size_t left = (size_t)(end - p);
    size_t k = left >= 4 ? get_u32(p) : 0;
    if (k == 0 || k > left - 4) break;
    blobs[i] = p + 4;
    lens[i] = k;
    p += 4 + k;
  }
  if (!env) {
    blobs[0] = blob;
    lens[0] = len;
  } else if (p != end || !blobs[n - 1]) {
    free(blobs);
    free(lens);
    client_set_error(3, "import state: a truncated or malformed state envelope");
    return STK_EINVAL;
  }
  *ret_blobs = blobs;
  *ret_lens = lens;
  *ret_n = n;
  return 0;
}

int stk_loader_import_all(struct stk_loader *l, const char *job, int64_t step, const uint8_t *blob,
                          size_t len, int64_t timeout_ms, int64_t *ret_committed_step) {
  if (!blob || !len) return client_fail(STK_EINVAL, "import state");
  const uint8_t **blobs = NULL;
  size_t *lens = NULL, n = 0;
  int err = unwrap(blob, len, &blobs, &lens, &n);
  if (err < 0) return err;
  int64_t committed = 0;
  for (uint32_t i = 0; err == 0 && i < l->n; i++) {
    err = loader_import_blobs(l->parts[i], job, step, blobs, lens, n, timeout_ms,
                              i == 0 ? &committed : NULL);
    if (err < 0) err = loader_part_failed(l->n, i, err);
  }
  free(blobs);
  free(lens);
  if (err == 0 && ret_committed_step) *ret_committed_step = committed;
  return err;
}
