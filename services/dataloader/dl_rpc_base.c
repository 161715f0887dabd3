/*
 * dl_rpc_base: the base the unary handlers (dl_rpc.c) and StreamBatches
 * (dl_rpc_stream.c) stand on: a dl_batch as a Batch message (the tokens
 * borrowed, encoded in place), its count in the metrics, the one-line
 * error text of a failed core call and the clock. It calls nothing of the
 * adapter above it.
 */
#include <stdio.h>
#include <time.h>

#include "dl_rpc_internal.h"
#include "stk_error.h"

double dl_rpc_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void dl_rpc_capture_error(int err, char *msg, size_t len) {
  const char *d = stk_detail();
  snprintf(msg, len, "%s", d && *d ? d : stk_strerror(err));
  for (char *p = msg; *p; p++)
    if (*p == '\n' || *p == '\r') *p = ' ';
}

void dl_rpc_batch_encode(struct dl_batch *b, Stoker__V1__Batch *msg) {
  size_t n = (size_t)b->lines * b->line_tokens;
  uint8_t *bytes = (uint8_t *)b->tokens;
  /* In place: element i owns bytes [4i, 4i+4). Nothing to do on a
   * little-endian host, where the array already is those bytes. */
  for (size_t i = 0; __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__ && i < n; i++) {
    uint32_t v = b->tokens[i];
    bytes[4 * i] = (uint8_t)v;
    bytes[4 * i + 1] = (uint8_t)(v >> 8);
    bytes[4 * i + 2] = (uint8_t)(v >> 16);
    bytes[4 * i + 3] = (uint8_t)(v >> 24);
  }
  dl_rpc_batch_msg(b, msg);
}

void dl_rpc_batch_msg(struct dl_batch *b, Stoker__V1__Batch *msg) {
  stoker__v1__batch__init(msg);
  msg->step = b->step;
  msg->lines = b->lines;
  msg->line_tokens = b->line_tokens;
  msg->tokens.data = (uint8_t *)b->tokens;
  msg->tokens.len = (size_t)b->lines * b->line_tokens * 4;
  msg->doc_starts = b->doc_starts;
  msg->n_doc_starts = b->n_doc_starts;
  if (b->parts > 1) { /* A partial batch; a whole one stays byte for byte as before. */
    msg->positions = b->positions;
    msg->n_positions = b->lines;
    msg->slice_lines = b->slice_lines;
    msg->part = b->part;
    msg->parts = b->parts;
  }
}

void dl_rpc_count_served(struct dl_rpc *a, const struct dl_batch *b) {
  if (a->batches) metric_counter_add(a->batches, 1);
  if (a->tokens) metric_counter_add(a->tokens, (uint64_t)b->lines * b->line_tokens);
}
