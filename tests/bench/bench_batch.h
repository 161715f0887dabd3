/*
 * bench_batch: the synthetic token batches the trainer benches feed their
 * model. Deterministic (a xorshift stream seeded by the step and a stream
 * number), so every rank builds the same global batch of a step without
 * sending it, and a run repeats the previous run's batches.
 */
#ifndef STK_BENCH_BATCH_H
#define STK_BENCH_BATCH_H

#include <stddef.h>
#include <stdint.h>

/* Fills ret_tokens[0..n_tokens) and ret_targets[0..n_tokens) with ids below
 * vocab for step `step` of stream `stream` (0 where every rank shares the
 * batch; a rank's number where each rank draws its own). */
void bench_batch(int step, uint64_t stream, int vocab, size_t n_tokens, int32_t *ret_tokens,
                 int32_t *ret_targets);

#endif
