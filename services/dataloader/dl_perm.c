/*
 * dl_perm: the Feistel permutation with cycle walking (see dl_perm.h).
 */
#include "dl_perm.h"

#define ROUNDS 6

uint64_t dl_hash_str(const char *s) {
  uint64_t h = UINT64_C(0xCBF29CE484222325);
  for (; *s; s++) h = (h ^ (uint8_t)*s) * UINT64_C(0x100000001B3);
  return dl_mix64(h);
}

static uint64_t encrypt(uint64_t key, unsigned half, uint64_t x) {
  uint64_t mask = (UINT64_C(1) << half) - 1;
  uint64_t l = x >> half, r = x & mask;
  for (unsigned round = 0; round < ROUNDS; round++) {
    uint64_t f = dl_mix64(key ^ (round * UINT64_C(0xA24BAED4963EE407)) ^ r) & mask;
    uint64_t t = l ^ f;
    l = r;
    r = t;
  }
  return (l << half) | r;
}

uint64_t dl_perm(uint64_t key, uint64_t n, uint64_t i) {
  if (n <= 1) return 0;
  unsigned bits = 64 - (unsigned)__builtin_clzll(n - 1);
  if (bits & 1) bits++;
  if (bits < 2) bits = 2;
  unsigned half = bits / 2;
  uint64_t x = i;
  do {
    x = encrypt(key, half, x);
  } while (x >= n);
  return x;
}
