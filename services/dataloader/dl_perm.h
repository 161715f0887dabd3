/*
 * dl_perm: keyed bijections on [0, n) with O(1) state, the dataloader's only
 * source of randomness. A balanced Feistel network on the smallest even
 * number of bits covering n, with cycle walking (re-encrypt until the value
 * falls below n), gives a different order for every key, needs no array,
 * and answers perm(i) in a few hash rounds.
 */
#ifndef STK_DL_PERM_H
#define STK_DL_PERM_H

#include <stddef.h>
#include <stdint.h>

/* A 64-bit mixing function (splitmix64's finalizer). */
static inline uint64_t dl_mix64(uint64_t x) {
  x += UINT64_C(0x9E3779B97F4A7C15);
  x = (x ^ (x >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
  x = (x ^ (x >> 27)) * UINT64_C(0x94D049BB133111EB);
  return x ^ (x >> 31);
}

/* Combines a key with one more value. */
static inline uint64_t dl_key(uint64_t key, uint64_t v) {
  return dl_mix64(key ^ dl_mix64(v + UINT64_C(0x632BE59BD9B4E019)));
}

/* Hash of a string (dataset names key their shuffles). */
uint64_t dl_hash_str(const char *s);

/* The image of i (< n) under the bijection of [0, n) chosen by key. */
uint64_t dl_perm(uint64_t key, uint64_t n, uint64_t i);

#endif
