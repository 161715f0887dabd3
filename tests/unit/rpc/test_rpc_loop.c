/*
 * The loop that drives the server's completion queue (rpc_loop.c) still
 * serves libuv: while the server is idle and the loop waits in gRPC's
 * queue, a threadpool completion, an async wakeup from another thread and
 * a timer each run promptly (the wait's own bound is 250 ms; each figure
 * below is the median of several, asserted well under it), an idle
 * server sleeps rather than spins, and calls are answered in between.
 */
#include "rpc_fixture.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* cmocka needs the headers above. */
#include <cmocka.h>

#define TRIES       7
#define PROMPT_MS   100.0 /* A median above it: the loop slept through libuv's event. */
#define TIMER_MS    30
#define IDLE_BEFORE 20000 /* us: let the loop settle into its wait first. */

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(double), cmp_double);
  return v[n / 2];
}

struct probe {
  uv_work_t work;
  uv_timer_t timer;
  int fired; /* Set on the loop thread; read with fx_wait_int. */
  double at_ms;
};

static void work_noop(uv_work_t *w) {
  (void)w;
}

static void work_done(uv_work_t *w, int status) {
  struct probe *p = w->data;
  (void)status;
  p->at_ms = now_ms();
  __atomic_store_n(&p->fired, 1, __ATOMIC_SEQ_CST);
}

static void queue_work(struct fixture *f, void *arg) {
  struct probe *p = arg;
  p->work.data = p;
  assert_int_equal(uv_queue_work(&f->loop, &p->work, work_noop, work_done), 0);
}

static void test_threadpool_completion_wakes_the_loop(void **state) {
  (void)state;
  struct fixture f = {0};
  fx_start(&f, NULL);
  double took[TRIES];
  for (int i = 0; i < TRIES; i++) {
    struct probe p = {0};
    usleep(IDLE_BEFORE);
    double t0 = now_ms();
    fx_on_loop(&f, queue_work, &p);
    assert_int_equal(fx_wait_int(&p.fired, 1, 5000), 1);
    took[i] = p.at_ms - t0;
  }
  double m = median(took, TRIES);
  print_message("threadpool round trip: median %.2f ms\n", m);
  assert_true(m < PROMPT_MS);
  fx_stop(&f, 1000);
}

static void noop_on_loop(struct fixture *f, void *arg) {
  (void)f;
  *(double *)arg = now_ms();
}

static void test_async_from_another_thread_wakes_the_loop(void **state) {
  (void)state;
  struct fixture f = {0};
  fx_start(&f, NULL);
  double took[TRIES];
  for (int i = 0; i < TRIES; i++) {
    double ran_at = 0;
    usleep(IDLE_BEFORE);
    double t0 = now_ms();
    fx_on_loop(&f, noop_on_loop, &ran_at); /* uv_async_send, then waits. */
    took[i] = ran_at - t0;
  }
  double m = median(took, TRIES);
  print_message("async wakeup: median %.2f ms\n", m);
  assert_true(m < PROMPT_MS);
  fx_stop(&f, 1000);
}

static void timer_fired(uv_timer_t *t) {
  struct probe *p = t->data;
  p->at_ms = now_ms();
  __atomic_store_n(&p->fired, 1, __ATOMIC_SEQ_CST);
  uv_close((uv_handle_t *)t, NULL);
}

static void start_timer(struct fixture *f, void *arg) {
  struct probe *p = arg;
  uv_timer_init(&f->loop, &p->timer);
  p->timer.data = p;
  uv_timer_start(&p->timer, timer_fired, TIMER_MS, 0);
}

static void test_timer_fires_on_time(void **state) {
  (void)state;
  struct fixture f = {0};
  fx_start(&f, NULL);
  double late[TRIES];
  for (int i = 0; i < TRIES; i++) {
    struct probe p = {0};
    double t0 = now_ms();
    fx_on_loop(&f, start_timer, &p);
    assert_int_equal(fx_wait_int(&p.fired, 1, 5000), 1);
    fx_on_loop(&f, noop_on_loop, &(double){0}); /* The close ran: p may go. */
    late[i] = p.at_ms - t0 - TIMER_MS;
  }
  double m = median(late, TRIES);
  print_message("timer of %d ms: median %.2f ms late\n", TIMER_MS, m);
  assert_true(m > -1.0);
  assert_true(m < PROMPT_MS);
  fx_stop(&f, 1000);
}

static double process_cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Waiting in the queue is a real wait: an idle server burns no CPU. */
static void test_idle_server_sleeps(void **state) {
  (void)state;
  struct fixture f = {0};
  fx_start(&f, NULL);
  usleep(IDLE_BEFORE);
  double cpu0 = process_cpu_s();
  usleep(1000000);
  double used = process_cpu_s() - cpu0;
  print_message("idle server: %.3f s of CPU in 1 s\n", used);
  assert_true(used < 0.2);
  fx_stop(&f, 1000);
}

static void test_calls_between_libuv_events(void **state) {
  (void)state;
  struct fixture f = {0};
  fx_start(&f, NULL);
  struct rpc_client *c = fx_client(&f, NULL);
  for (int i = 0; i < 50; i++) {
    struct probe p = {0};
    fx_on_loop(&f, queue_work, &p);
    int64_t got = 0;
    struct rpc_status st;
    assert_int_equal(fx_echo(c, i, &got, &st), 0);
    assert_int_equal(got, i);
    assert_int_equal(fx_wait_int(&p.fired, 1, 5000), 1);
  }
  rpc_client_free(c);
  fx_stop(&f, 1000);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_threadpool_completion_wakes_the_loop),
      cmocka_unit_test(test_async_from_another_thread_wakes_the_loop),
      cmocka_unit_test(test_timer_fires_on_time),
      cmocka_unit_test(test_idle_server_sleeps),
      cmocka_unit_test(test_calls_between_libuv_events),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
