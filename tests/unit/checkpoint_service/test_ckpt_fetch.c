/*
 * Shared fetches (services/checkpoint/ckpt_fetch.c) alone: a claim inside
 * a fetch whose GET is out waits (its task parked) and is resumed with the
 * fetch's bytes, or its error, when the fetch ends; a claim inside checked
 * bytes is answered at once; a claim of another key, of other CRCs, of
 * another object size or only overlapping fetches its own; a failed fetch
 * is shared with none after it; the last release frees.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <uv.h>

#include "ckpt_fetch.h"
#include "ckpt_pool.h"
#include "stk_error.h"

#define BLOCK 16

static const uint32_t crcs[4] = {11, 22, 33, 44};

static struct ckpt_fetch_want want(const char *key, uint64_t first_block, uint64_t blocks) {
  return (struct ckpt_fetch_want){.key = key,
                                  .offset = first_block * BLOCK,
                                  .len = blocks * BLOCK,
                                  .object_bytes = 4 * BLOCK,
                                  .crcs = crcs + first_block,
                                  .n_crcs = blocks};
}

/* A task that claims w's range as a restore's span does: parks when told
 * to wait, and once resumed takes the fetch's error and first byte. */
struct claimer {
  struct ckpt_task t;
  struct ckpt_fetches *c;
  struct ckpt_fetch_want w;
  struct ckpt_fetch *f;
  enum ckpt_fetch_how how;
  int runs;
  bool claimed; /* Atomic: the first run's claim answered. */
  int err;
  char msg[64];
  uint8_t first;
  bool after_ran;
};

static void claim_work(struct ckpt_task *t) {
  struct claimer *k = (struct claimer *)t;
  if (k->runs++ == 0) {
    enum ckpt_fetch_how how;
    assert_int_equal(ckpt_fetch_claim(k->c, &k->w, &k->t, &k->f, &how), 0);
    /* The test ends the fetch only after this: k is still the task's. */
    __atomic_store_n(&k->claimed, true, __ATOMIC_RELEASE);
    if (how == CKPT_FETCH_WAIT) {
      ckpt_pool_park(); /* k is the fetch's: untouched from here. */
      return;
    }
    k->how = how;
    return;
  }
  k->how = CKPT_FETCH_WAIT;
  k->err = ckpt_fetch_error(k->f, k->msg, sizeof(k->msg));
  if (!k->err) k->first = *ckpt_fetch_bytes(k->f, k->w.offset);
}

static void claim_after(struct ckpt_task *t) {
  ((struct claimer *)t)->after_ran = true;
}

static void run_until(uv_loop_t *loop, const bool *flag) {
  for (int i = 0; i < 2000 && !*flag; i++) {
    uv_run(loop, UV_RUN_NOWAIT);
    uv_sleep(1);
  }
  assert_true(*flag);
}

static void test_waiters_share_or_fail(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  struct ckpt_pool *pool;
  assert_int_equal(ckpt_pool_new(&loop, 2, 0, &pool), 0);
  struct ckpt_fetches *c;
  assert_int_equal(ckpt_fetches_new(BLOCK, &c), 0);
  for (int fail = 0; fail < 2; fail++) {
    /* The fetcher: blocks 0-3 of "job/a/rank-0". */
    struct ckpt_fetch_want w = want("job/a/rank-0", 0, 4);
    struct ckpt_fetch *f;
    enum ckpt_fetch_how how;
    assert_int_equal(ckpt_fetch_claim(c, &w, NULL, &f, &how), 0);
    assert_int_equal(how, CKPT_FETCH_GET);
    /* A span inside it (blocks 1-2) waits for its GET. */
    struct claimer k = {
        .t = {.work = claim_work, .after = claim_after}, .c = c, .w = want("job/a/rank-0", 1, 2)};
    ckpt_pool_submit(pool, &k.t);
    for (int i = 0; i < 5000 && !__atomic_load_n(&k.claimed, __ATOMIC_ACQUIRE); i++) uv_sleep(1);
    assert_true(__atomic_load_n(&k.claimed, __ATOMIC_ACQUIRE));
    uv_run(&loop, UV_RUN_NOWAIT);
    assert_false(k.after_ran); /* Parked. */
    memset(ckpt_fetch_bytes(f, 0), 0, 4 * BLOCK);
    *ckpt_fetch_bytes(f, BLOCK) = 0x5a; /* The first byte of block 1. */
    ckpt_fetch_end(c, f, fail ? STK_ECORRUPT : 0, fail ? "object rank-0: block 2 CRC" : "", pool);
    run_until(&loop, &k.after_ran);
    assert_int_equal(k.runs, 2);
    if (fail) {
      assert_int_equal(k.err, STK_ECORRUPT);
      assert_string_equal(k.msg, "object rank-0: block 2 CRC");
      /* Dropped from the table: the next claim fetches again. */
      struct ckpt_fetch *g;
      assert_int_equal(ckpt_fetch_claim(c, &w, NULL, &g, &how), 0);
      assert_int_equal(how, CKPT_FETCH_GET);
      ckpt_fetch_end(c, g, STK_EIO, "", pool);
      ckpt_fetch_release(c, g);
    } else {
      assert_int_equal(k.err, 0);
      assert_int_equal(k.first, 0x5a); /* The fetcher's bytes, at the span's offset. */
    }
    ckpt_fetch_release(c, k.f);
    ckpt_fetch_release(c, f);
  }
  struct ckpt_fetch_counts n;
  ckpt_fetches_get_counts(c, &n);
  assert_int_equal(n.gets, 3);
  assert_int_equal(n.shared, 2);
  assert_int_equal(n.held_bytes, 0);
  ckpt_fetches_free(c);
  ckpt_pool_free(pool, NULL, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void test_shared_only_when_same(void **state) {
  (void)state;
  struct ckpt_fetches *c;
  assert_int_equal(ckpt_fetches_new(BLOCK, &c), 0);
  struct ckpt_fetch_want w = want("job/a/rank-0", 1, 2);
  struct ckpt_fetch *f, *g;
  enum ckpt_fetch_how how;
  assert_int_equal(ckpt_fetch_claim(c, &w, NULL, &f, &how), 0);
  assert_int_equal(how, CKPT_FETCH_GET);
  ckpt_fetch_end(c, f, 0, "", NULL);
  /* Inside its checked bytes: at once. */
  struct ckpt_fetch_want in = want("job/a/rank-0", 2, 1);
  assert_int_equal(ckpt_fetch_claim(c, &in, NULL, &g, &how), 0);
  assert_int_equal(how, CKPT_FETCH_READY);
  assert_ptr_equal(g, f);
  assert_ptr_equal(ckpt_fetch_bytes(g, 2 * BLOCK), ckpt_fetch_bytes(f, 1 * BLOCK) + BLOCK);
  ckpt_fetch_release(c, g);
  /* Another job's object of the same name, the same range and CRCs. */
  struct ckpt_fetch_want other = want("job-b/a/rank-0", 1, 2);
  /* The same key with another CRC for block 2 (another manifest's bytes). */
  uint32_t crcs2[2] = {22, 99};
  struct ckpt_fetch_want crc = want("job/a/rank-0", 1, 2);
  crc.crcs = crcs2;
  /* Another object size; a range only overlapping (blocks 2-3). */
  struct ckpt_fetch_want size = want("job/a/rank-0", 1, 2);
  size.object_bytes = 5 * BLOCK;
  struct ckpt_fetch_want overlap = want("job/a/rank-0", 2, 2);
  const struct ckpt_fetch_want *own[4] = {&other, &crc, &size, &overlap};
  for (int i = 0; i < 4; i++) {
    assert_int_equal(ckpt_fetch_claim(c, own[i], NULL, &g, &how), 0);
    assert_int_equal(how, CKPT_FETCH_GET);
    assert_ptr_not_equal(g, f);
    ckpt_fetch_end(c, g, 0, "", NULL);
    ckpt_fetch_release(c, g);
  }
  struct ckpt_fetch_counts n;
  ckpt_fetches_get_counts(c, &n);
  assert_int_equal(n.gets, 5);
  assert_int_equal(n.shared, 1);
  assert_int_equal(n.held_bytes, 2 * BLOCK); /* f alone. */
  ckpt_fetch_release(c, f);
  /* Freed at its last release: nothing answers from it. */
  assert_int_equal(ckpt_fetch_claim(c, &in, NULL, &g, &how), 0);
  assert_int_equal(how, CKPT_FETCH_GET);
  ckpt_fetch_end(c, g, 0, "", NULL);
  ckpt_fetch_release(c, g);
  ckpt_fetches_get_counts(c, &n);
  assert_int_equal(n.held_bytes, 0);
  ckpt_fetches_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_waiters_share_or_fail),
      cmocka_unit_test(test_shared_only_when_same),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
