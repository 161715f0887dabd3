/*
 * The manifest cache (services/checkpoint/ckpt_mcache.c): concurrent gets
 * of one key load it and make its value once and all share that value;
 * repeated gets are served from memory; a failed load or make is not kept;
 * a manifest larger than the bound is loaded and not held; the least
 * recently served go first when the bound is passed; an entry past its
 * lifetime is loaded again; a value the cache let go of while held is
 * freed only at its last release.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ckpt_mcache.h"
#include "stk_error.h"

struct loader {
  pthread_mutex_t mu;
  int loads;
  size_t len;   /* Bytes a load gives. */
  int fail;     /* Error the next load answers (once). */
  int sleep_ms; /* A slow store. */
};

/* The bytes of key: its characters repeated to len. */
static int load(void *arg, const char *key, uint8_t **ret_buf, size_t *ret_len) {
  struct loader *l = arg;
  pthread_mutex_lock(&l->mu);
  l->loads++;
  int fail = l->fail;
  l->fail = 0;
  size_t len = l->len;
  pthread_mutex_unlock(&l->mu);
  if (l->sleep_ms) usleep((useconds_t)l->sleep_ms * 1000);
  if (fail) return fail;
  uint8_t *b = malloc(len);
  for (size_t i = 0; i < len; i++) b[i] = (uint8_t)key[i % strlen(key)];
  *ret_buf = b;
  *ret_len = len;
  return 0;
}

/* The values made and dropped (all tests run on one thread but the
 * concurrent one, whose makes are one by the cache's promise). */
static int makes, drops, make_fail;

/* The value of some bytes: a copy of them; it takes len bytes. */
static int make(const uint8_t *buf, size_t len, void **ret_value, size_t *ret_bytes) {
  __atomic_add_fetch(&makes, 1, __ATOMIC_SEQ_CST);
  if (make_fail) {
    make_fail = 0;
    return STK_ECORRUPT;
  }
  uint8_t *v = malloc(len);
  memcpy(v, buf, len);
  *ret_value = v;
  *ret_bytes = len;
  return 0;
}

/* The values dropped, in order (the first 64). */
static const void *dropped_values[64];

static void drop(void *value) {
  int i = __atomic_fetch_add(&drops, 1, __ATOMIC_SEQ_CST);
  if (i < 64) dropped_values[i] = value;
  free(value);
}

static bool dropped(const void *value) {
  for (int i = 0; i < drops && i < 64; i++)
    if (dropped_values[i] == value) return true;
  return false;
}

static struct ckpt_mcache *cache(size_t max_bytes, int64_t ttl_ms) {
  struct ckpt_mcache *c;
  makes = drops = make_fail = 0;
  assert_int_equal(ckpt_mcache_new(max_bytes, ttl_ms, make, drop, &c), 0);
  return c;
}

/* Holds key's manifest, checks its bytes and value. */
static void get_held(struct ckpt_mcache *c, struct loader *l, const char *key,
                     struct ckpt_mcache_hold *h) {
  assert_int_equal(ckpt_mcache_get(c, key, load, l, h), 0);
  assert_int_equal(h->len, l->len);
  const uint8_t *v = h->value;
  for (size_t i = 0; i < h->len; i++) {
    assert_int_equal(h->buf[i], (uint8_t)key[i % strlen(key)]);
    assert_int_equal(v[i], (uint8_t)key[i % strlen(key)]);
  }
}

static void get_ok(struct ckpt_mcache *c, struct loader *l, const char *key) {
  struct ckpt_mcache_hold h;
  get_held(c, l, key, &h);
  ckpt_mcache_release(c, &h);
}

struct getter {
  struct ckpt_mcache *c;
  struct loader *l;
  const void *value;
};

static void *getter_main(void *arg) {
  struct getter *g = arg;
  struct ckpt_mcache_hold h;
  get_held(g->c, g->l, "job/7/attempt-a/manifest.pb", &h);
  g->value = h.value;
  ckpt_mcache_release(g->c, &h);
  return NULL;
}

static void test_concurrent_gets_load_once(void **state) {
  (void)state;
  struct ckpt_mcache *c = cache(1 << 20, 60000);
  struct loader l = {.mu = PTHREAD_MUTEX_INITIALIZER, .len = 1000, .sleep_ms = 200};
  struct getter g[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    g[i] = (struct getter){c, &l, NULL};
    pthread_create(&th[i], NULL, getter_main, &g[i]);
  }
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  assert_int_equal(l.loads, 1);
  assert_int_equal(makes, 1); /* One parse, shared: */
  for (int i = 1; i < 4; i++) assert_ptr_equal(g[i].value, g[0].value);
  get_ok(c, &l, "job/7/attempt-a/manifest.pb");
  assert_int_equal(l.loads, 1);
  uint64_t hits, loads;
  ckpt_mcache_counts(c, &hits, &loads);
  assert_int_equal(hits, 4);
  assert_int_equal(loads, 1);
  ckpt_mcache_free(c);
}

static void test_failure_not_kept(void **state) {
  (void)state;
  struct ckpt_mcache *c = cache(1 << 20, 60000);
  struct loader l = {.mu = PTHREAD_MUTEX_INITIALIZER, .len = 100, .fail = STK_EIO};
  struct ckpt_mcache_hold h;
  assert_int_equal(ckpt_mcache_get(c, "k", load, &l, &h), STK_EIO);
  assert_null(h.e);
  ckpt_mcache_release(c, &h); /* Nothing held: nothing happens. */
  get_ok(c, &l, "k");         /* Loaded again, and kept. */
  get_ok(c, &l, "k");
  assert_int_equal(l.loads, 2);
  make_fail = 1; /* A manifest that does not parse is not kept either. */
  assert_int_equal(ckpt_mcache_get(c, "m", load, &l, &h), STK_ECORRUPT);
  get_ok(c, &l, "m");
  get_ok(c, &l, "m");
  assert_int_equal(l.loads, 4);
  ckpt_mcache_free(c);
}

/* Forgotten bytes (a caller found them damaged) are loaded again; other
 * keys stay held. */
static void test_forget(void **state) {
  (void)state;
  struct ckpt_mcache *c = cache(1 << 20, 60000);
  struct loader l = {.mu = PTHREAD_MUTEX_INITIALIZER, .len = 100};
  get_ok(c, &l, "a");
  get_ok(c, &l, "b");
  ckpt_mcache_forget(c, "a");
  ckpt_mcache_forget(c, "never-loaded");
  get_ok(c, &l, "a");
  get_ok(c, &l, "b");
  assert_int_equal(l.loads, 3);
  /* Forgotten while held: the holder keeps it until its release. */
  struct ckpt_mcache_hold h;
  get_held(c, &l, "b", &h);
  const void *held = h.value;
  int before = drops;
  ckpt_mcache_forget(c, "b");
  assert_int_equal(drops, before);
  const uint8_t *v = held;
  for (size_t i = 0; i < h.len; i++) assert_int_equal(v[i], 'b');
  ckpt_mcache_release(c, &h);
  assert_int_equal(drops, before + 1);
  assert_ptr_equal(dropped_values[before], held);
  ckpt_mcache_free(c);
}

static void test_bounded(void **state) {
  (void)state;
  struct ckpt_mcache *c = cache(2500, 60000);
  struct loader l = {.mu = PTHREAD_MUTEX_INITIALIZER, .len = 3000};
  get_ok(c, &l, "big");
  get_ok(c, &l, "big"); /* Larger than the bound: never held. */
  assert_int_equal(l.loads, 2);
  l.len = 1000;
  get_ok(c, &l, "a");
  get_ok(c, &l, "b");
  get_ok(c, &l, "a"); /* Served: b is now the least recent. */
  assert_int_equal(l.loads, 4);
  get_ok(c, &l, "c"); /* 3000 bytes: b goes. */
  assert_int_equal(l.loads, 5);
  get_ok(c, &l, "a");
  get_ok(c, &l, "c");
  assert_int_equal(l.loads, 5);
  get_ok(c, &l, "b");
  assert_int_equal(l.loads, 6);
  ckpt_mcache_free(c);
}

static void test_lifetime(void **state) {
  (void)state;
  struct ckpt_mcache *c = cache(1 << 20, 100);
  struct loader l = {.mu = PTHREAD_MUTEX_INITIALIZER, .len = 10};
  get_ok(c, &l, "k");
  get_ok(c, &l, "k");
  assert_int_equal(l.loads, 1);
  usleep(250 * 1000);
  get_ok(c, &l, "k");
  assert_int_equal(l.loads, 2);
  ckpt_mcache_free(c);
}

/* What a reader holds stays valid when the cache lets it go (evicted,
 * expired, larger than the bound): dropped at the last release only. */
static void test_held_outlives_eviction(void **state) {
  (void)state;
  struct ckpt_mcache *c = cache(2500, 60000);
  struct loader l = {.mu = PTHREAD_MUTEX_INITIALIZER, .len = 1000};
  struct ckpt_mcache_hold a, a2, big;
  get_held(c, &l, "a", &a);
  get_held(c, &l, "a", &a2); /* Two holders of one value. */
  assert_ptr_equal(a.value, a2.value);
  get_ok(c, &l, "b");
  get_ok(c, &l, "c"); /* Over the bound: a, the least recent, goes. */
  get_ok(c, &l, "a"); /* Loaded again (and b evicted, dropped at once). */
  assert_int_equal(l.loads, 4);
  assert_false(dropped(a.value)); /* a's first value is still held twice. */
  const uint8_t *v = a.value;
  for (size_t i = 0; i < a.len; i++) assert_int_equal(v[i], 'a');
  const void *first_a = a.value;
  ckpt_mcache_release(c, &a);
  assert_false(dropped(first_a));
  int before = drops;
  ckpt_mcache_release(c, &a2);
  assert_int_equal(drops, before + 1); /* Freed at the last release. */
  assert_ptr_equal(dropped_values[before], first_a);
  l.len = 3000;
  get_held(c, &l, "big", &big); /* Never kept, but held. */
  const void *big_value = big.value;
  before = drops;
  ckpt_mcache_release(c, &big);
  assert_int_equal(drops, before + 1);
  assert_ptr_equal(dropped_values[before], big_value);
  ckpt_mcache_free(c);
  assert_int_equal(drops, makes); /* Everything made is freed. */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_concurrent_gets_load_once),
      cmocka_unit_test(test_held_outlives_eviction),
      cmocka_unit_test(test_failure_not_kept),
      cmocka_unit_test(test_forget),
      cmocka_unit_test(test_bounded),
      cmocka_unit_test(test_lifetime),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
