/*
 * ckpt_pool's parked tasks: a task whose work parks gives its worker back
 * (one thread holds several tasks out at once), runs again when resumed
 * from another thread, and finishes (its after on the loop) only then; the
 * pool keeps at most its limit of tasks out, parked ones included, and
 * counts them pending until they finish.
 */
#include "ckpt_pool.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

struct job {
  struct ckpt_task t;
  struct ckpt_pool *p;
  int runs;
};

static atomic_int out, most_out, afters;
static int want_out;  /* The engine answers once this many tasks were out... */
static atomic_int go; /* ...which sets this. */

/* Stands for a storage engine: answers a parked task from a thread of its
 * own once want_out tasks were out at once (or 5 s passed: the test then
 * fails on most_out), so that the count does not hang on the machine's
 * speed. */
static void *answer_later(void *arg) {
  struct job *j = arg;
  for (int i = 0; i < 5000 && !atomic_load(&go); i++) usleep(1000);
  ckpt_pool_resume(j->p, &j->t);
  return NULL;
}

static void work(struct ckpt_task *t) {
  struct job *j = (struct job *)t;
  if (j->runs++ > 0) {
    atomic_fetch_sub(&out, 1);
    return;
  }
  int now = atomic_fetch_add(&out, 1) + 1;
  int m = atomic_load(&most_out);
  while (now > m && !atomic_compare_exchange_weak(&most_out, &m, now)) {
  }
  if (now >= want_out) atomic_store(&go, 1);
  ckpt_pool_park();
  pthread_t th;
  pthread_create(&th, NULL, answer_later, j);
  pthread_detach(th);
}

static void after(struct ckpt_task *t) {
  struct job *j = (struct job *)t;
  assert_int_equal(j->runs, 2); /* Never before its second run. */
  atomic_fetch_add(&afters, 1);
}

/* Runs n jobs on a pool of `threads` threads and limit `limit`; returns the
 * most tasks out at once. */
static int run_jobs(unsigned threads, unsigned limit, int n) {
  want_out = (int)(limit ? limit : threads);
  atomic_store(&go, 0);
  atomic_store(&out, 0);
  atomic_store(&most_out, 0);
  atomic_store(&afters, 0);
  uv_loop_t loop;
  uv_loop_init(&loop);
  struct ckpt_pool *p;
  assert_int_equal(ckpt_pool_new(&loop, threads, 0, &p), 0);
  if (limit) ckpt_pool_set_limit(p, limit);
  struct job *jobs = calloc((size_t)n, sizeof(*jobs));
  for (int i = 0; i < n; i++) {
    jobs[i] = (struct job){.t = {.work = work, .after = after}, .p = p};
    ckpt_pool_submit(p, &jobs[i].t);
  }
  assert_int_equal(ckpt_pool_pending(p), (size_t)n);
  while (atomic_load(&afters) < n) uv_run(&loop, UV_RUN_ONCE);
  assert_int_equal(ckpt_pool_pending(p), 0);
  ckpt_pool_free(p, NULL, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  for (int i = 0; i < n; i++) assert_int_equal(jobs[i].runs, 2);
  free(jobs);
  return atomic_load(&most_out);
}

/* One thread, four tasks out: a parked task does not hold its worker. */
static void test_park_frees_the_worker(void **state) {
  (void)state;
  assert_int_equal(run_jobs(1, 4, 4), 4);
}

/* Four threads, limit two: never more than two out, parked ones counted. */
static void test_limit_counts_parked(void **state) {
  (void)state;
  assert_int_equal(run_jobs(4, 2, 8), 2);
}

/* The default limit is the thread count. */
static void test_default_limit(void **state) {
  (void)state;
  assert_int_equal(run_jobs(3, 0, 9), 3);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_park_frees_the_worker),
      cmocka_unit_test(test_limit_counts_parked),
      cmocka_unit_test(test_default_limit),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
