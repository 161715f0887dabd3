/*
 * The manifest cache (services/checkpoint/ckpt_mcache.c): concurrent gets
 * of one key load it once and all get its bytes; repeated gets are served
 * from memory; a failed load is not kept; a manifest larger than the bound
 * is loaded and not held; the least recently served go first when the
 * bound is passed; an entry past its lifetime is loaded again.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
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

static void get_ok(struct ckpt_mcache *c, struct loader *l, const char *key) {
  uint8_t *b = NULL;
  size_t n = 0;
  assert_int_equal(ckpt_mcache_get(c, key, load, l, &b, &n), 0);
  assert_int_equal(n, l->len);
  for (size_t i = 0; i < n; i++) assert_int_equal(b[i], (uint8_t)key[i % strlen(key)]);
  free(b);
}

struct getter {
  struct ckpt_mcache *c;
  struct loader *l;
};

static void *getter_main(void *arg) {
  struct getter *g = arg;
  get_ok(g->c, g->l, "job/7/attempt-a/manifest.pb");
  return NULL;
}

static void test_concurrent_gets_load_once(void **state) {
  (void)state;
  struct ckpt_mcache *c;
  assert_int_equal(ckpt_mcache_new(1 << 20, 60000, &c), 0);
  struct loader l = {.mu = PTHREAD_MUTEX_INITIALIZER, .len = 1000, .sleep_ms = 200};
  struct getter g = {c, &l};
  pthread_t th[4];
  for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, getter_main, &g);
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  assert_int_equal(l.loads, 1);
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
  struct ckpt_mcache *c;
  assert_int_equal(ckpt_mcache_new(1 << 20, 60000, &c), 0);
  struct loader l = {.mu = PTHREAD_MUTEX_INITIALIZER, .len = 100, .fail = STK_EIO};
  uint8_t *b = NULL;
  size_t n = 0;
  assert_int_equal(ckpt_mcache_get(c, "k", load, &l, &b, &n), STK_EIO);
  get_ok(c, &l, "k"); /* Loaded again, and kept. */
  get_ok(c, &l, "k");
  assert_int_equal(l.loads, 2);
  ckpt_mcache_free(c);
}

/* Forgotten bytes (a caller found them damaged) are loaded again; other
 * keys stay held. */
static void test_forget(void **state) {
  (void)state;
  struct ckpt_mcache *c;
  assert_int_equal(ckpt_mcache_new(1 << 20, 60000, &c), 0);
  struct loader l = {.mu = PTHREAD_MUTEX_INITIALIZER, .len = 100};
  get_ok(c, &l, "a");
  get_ok(c, &l, "b");
  ckpt_mcache_forget(c, "a");
  ckpt_mcache_forget(c, "never-loaded");
  get_ok(c, &l, "a");
  get_ok(c, &l, "b");
  assert_int_equal(l.loads, 3);
  ckpt_mcache_free(c);
}

static void test_bounded(void **state) {
  (void)state;
  struct ckpt_mcache *c;
  assert_int_equal(ckpt_mcache_new(2500, 60000, &c), 0);
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
  struct ckpt_mcache *c;
  assert_int_equal(ckpt_mcache_new(1 << 20, 100, &c), 0);
  struct loader l = {.mu = PTHREAD_MUTEX_INITIALIZER, .len = 10};
  get_ok(c, &l, "k");
  get_ok(c, &l, "k");
  assert_int_equal(l.loads, 1);
  usleep(250 * 1000);
  get_ok(c, &l, "k");
  assert_int_equal(l.loads, 2);
  ckpt_mcache_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_concurrent_gets_load_once),
      cmocka_unit_test(test_failure_not_kept),
      cmocka_unit_test(test_forget),
      cmocka_unit_test(test_bounded),
      cmocka_unit_test(test_lifetime),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
