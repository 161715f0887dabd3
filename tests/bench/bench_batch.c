/*
 * bench_batch: the trainer benches' synthetic batches (bench_batch.h).
 */
#include "bench_batch.h"

void bench_batch(int step, uint64_t stream, int vocab, size_t n_tokens, int32_t *ret_tokens,
                 int32_t *ret_targets) {
  uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(step + 1) + stream;
  for (size_t i = 0; i < n_tokens; i++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    ret_tokens[i] = (int32_t)(s % (uint64_t)vocab);
    ret_targets[i] = (int32_t)((s >> 32) % (uint64_t)vocab);
  }
}
