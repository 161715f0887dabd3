/*
 * The trainer's base: what every file of stoker-train shares and nothing
 * above it needs to own — what failed, in words (train_why, the first of a
 * generation wins), the SIGTERM flag, the clocks, the names of a unit's checkpoint tensors and
 * the split of a batch into inputs and targets. It calls no file of the
 * trainer: the loop, the checkpoint, the restore and the held-out loss call
 * down to it.
 */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "train.h"

volatile sig_atomic_t train_sigterm;
volatile sig_atomic_t train_sigterm_exits;

int64_t train_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t train_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int train_why(struct train *t, int err, const char *fmt, ...) {
  if (err == 0 || t->why[0]) return err;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->why, sizeof(t->why), fmt, ap);
  va_end(ap);
  return err;
}

const char *train_client_why(int err) {
  const char *m = stk_client_last_error(NULL);
  return m && m[0] ? m : stk_strerror(err);
}

void train_tensor_name(int unit, const char *kind, char *ret_name, size_t len) {
  snprintf(ret_name, len, "unit%d/%s", unit, kind);
}

void train_split_lines(const struct stk_batch *b, int32_t *inputs, int32_t *targets) {
  size_t T = b->line_tokens - 1;
  for (size_t l = 0; l < b->lines; l++)
    for (size_t i = 0; i < T; i++) {
      inputs[l * T + i] = (int32_t)b->tokens[l * (T + 1) + i];
      targets[l * T + i] = (int32_t)b->tokens[l * (T + 1) + i + 1];
    }
}
