/*
 * ranks: simulated trainer ranks, one client and one join thread each
 * (see ranks.h).
 */
#include "ranks.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

int ranks_new(struct rank *r, size_t n, const struct harness_daemon *d, const char *job,
              const char *prefix) {
  for (size_t i = 0; i < n; i++) {
    memset(&r[i], 0, sizeof(r[i]));
    snprintf(r[i].member_id, sizeof(r[i].member_id), "%s-%zu", prefix, i);
    snprintf(r[i].job, sizeof(r[i].job), "%s", job);
    r[i].client = harness_client(d);
    if (!r[i].client) return STK_EIO;
  }
  return 0;
}

static void *join_main(void *arg) {
  struct rank *r = arg;
  r->err = stk_join(r->client, r->job, r->member_id, "127.0.0.1:29500", "localhost", r->timeout_ms,
                    &r->m);
  return NULL;
}

void ranks_join_start(struct rank *r, size_t n, int64_t timeout_ms) {
  for (size_t i = 0; i < n; i++) {
    r[i].timeout_ms = timeout_ms;
    r[i].err = 0;
    r[i].running = pthread_create(&r[i].thread, NULL, join_main, &r[i]) == 0;
    if (!r[i].running) r[i].err = STK_ENOMEM;
  }
}

size_t ranks_join_wait(struct rank *r, size_t n) {
  size_t failed = 0;
  for (size_t i = 0; i < n; i++) {
    if (r[i].running) pthread_join(r[i].thread, NULL);
    r[i].running = false;
    if (r[i].err) {
      fprintf(stderr, "ranks: %s join failed: %s\n", r[i].member_id, stk_strerror(r[i].err));
      failed++;
    }
  }
  return failed;
}

struct stk_client *ranks_operator(const struct harness_daemon *d, const char *job,
                                  uint32_t min_ranks, uint32_t max_ranks, uint32_t interval_ms,
                                  uint32_t last_call_ms) {
  struct stk_client *op = harness_client(d);
  assert_non_null(op);
  assert_int_equal(harness_create_job(op, job, min_ranks, max_ranks, interval_ms, last_call_ms), 0);
  return op;
}

void ranks_form(struct rank *r, size_t n, const struct harness_daemon *d, const char *job,
                const char *prefix, int64_t timeout_ms) {
  assert_int_equal(ranks_new(r, n, d, job, prefix), 0);
  ranks_join_start(r, n, timeout_ms);
  assert_int_equal(ranks_join_wait(r, n), 0);
}

void ranks_free(struct rank *r, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (r[i].running) pthread_join(r[i].thread, NULL);
    r[i].running = false;
    stk_client_free(r[i].client);
    r[i].client = NULL;
  }
}

enum stk_action ranks_wait_action(struct rank *r, enum stk_action want, int64_t timeout_ms) {
  int64_t deadline = harness_now_ms() + timeout_ms;
  enum stk_action last = STK_ACTION_NONE;
  while (harness_now_ms() < deadline) {
    enum stk_action a = stk_poll_action(r->client);
    if (a != STK_ACTION_NONE) last = a;
    if (a == want) return a;
    harness_sleep_ms(20);
  }
  return last;
}

void ranks_latch_init(struct ranks_latch *l) {
  memset(l, 0, sizeof(*l));
  pthread_mutex_init(&l->mu, NULL);
}

void ranks_latch_close(struct ranks_latch *l) {
  pthread_mutex_destroy(&l->mu);
}

void ranks_latch_kv_done(void *arg, int err, const char *msg, const uint8_t *value, size_t len) {
  struct ranks_latch *l = arg;
  pthread_mutex_lock(&l->mu);
  l->err = err;
  snprintf(l->msg, sizeof(l->msg), "%s", msg ? msg : "");
  l->len = len;
  size_t n = len < sizeof(l->value) - 1 ? len : sizeof(l->value) - 1;
  if (value && n) memcpy(l->value, value, n);
  l->value[n] = 0;
  l->done = true;
  pthread_mutex_unlock(&l->mu);
}

void ranks_latch_done(void *arg, int err, const char *msg) {
  ranks_latch_kv_done(arg, err, msg, NULL, 0);
}

bool ranks_latch_wait(struct ranks_latch *l, int64_t timeout_ms) {
  int64_t deadline = harness_now_ms() + timeout_ms;
  pthread_mutex_lock(&l->mu);
  while (!l->done && harness_now_ms() < deadline) {
    pthread_mutex_unlock(&l->mu);
    harness_sleep_ms(5);
    pthread_mutex_lock(&l->mu);
  }
  bool done = l->done;
  pthread_mutex_unlock(&l->mu);
  return done;
}
