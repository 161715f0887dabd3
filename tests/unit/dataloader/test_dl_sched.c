/*
 * test_dl_sched: the dataloader workers' fair scheduler (dl_sched.h) on a
 * real libuv loop and threadpool of 2 workers, with tasks that block until
 * the test releases them. A job that queued many tasks first does not make
 * a later job wait behind all of them (libuv's own FIFO would): the later
 * job takes the first worker that comes free, and two busy jobs alternate.
 * Tenants first: a tenant with four busy jobs gets no more workers than a
 * tenant with one.
 * Stuck: only when every worker has been on its task past the bound while
 * a task waits, and no longer once one comes free.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "dl_sched.h"

#define WORKERS   2
#define MAX_TASKS 16

struct task {
  uv_work_t req;
  char name[8];
  bool released;
  bool done;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static char started[MAX_TASKS][8]; /* Names in the order work began. */
static int n_started;

static void work(uv_work_t *req) {
  struct task *t = req->data;
  pthread_mutex_lock(&mu);
  snprintf(started[n_started++], sizeof(started[0]), "%s", t->name);
  pthread_cond_broadcast(&cv);
  while (!t->released) pthread_cond_wait(&cv, &mu);
  pthread_mutex_unlock(&mu);
}

static void done(uv_work_t *req, int status) {
  struct task *t = req->data;
  assert_int_equal(status, 0);
  t->done = true;
}

static void submit_as(struct dl_sched *s, struct task *t, const char *tenant, const char *job,
                      const char *name) {
  memset(t, 0, sizeof(*t));
  snprintf(t->name, sizeof(t->name), "%s", name);
  t->req.data = t;
  assert_int_equal(dl_sched_submit(s, tenant, job, &t->req, work, done), 0);
}

static void submit(struct dl_sched *s, struct task *t, const char *job, const char *name) {
  submit_as(s, t, NULL, job, name);
}

static int started_count(void) {
  pthread_mutex_lock(&mu);
  int n = n_started;
  pthread_mutex_unlock(&mu);
  return n;
}

/* Runs the loop until n tasks have started (workers report asynchronously). */
static void run_until_started(uv_loop_t *loop, int n) {
  for (int i = 0; i < 5000 && started_count() < n; i++) {
    uv_run(loop, UV_RUN_NOWAIT);
    usleep(1000);
  }
  assert_int_equal(started_count(), n);
}

static void run_until_done(uv_loop_t *loop, const struct task *t) {
  for (int i = 0; i < 5000 && !t->done; i++) {
    uv_run(loop, UV_RUN_NOWAIT);
    usleep(1000);
  }
  assert_true(t->done);
}

static void release(struct task *t) {
  pthread_mutex_lock(&mu);
  t->released = true;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
}

static void reset(void) {
  n_started = 0;
  memset(started, 0, sizeof(started));
}

static void test_later_job_not_behind_earlier(void **state) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  struct dl_sched *s;
  assert_int_equal(dl_sched_new(&loop, WORKERS, &s), 0);
  reset();
  struct task a[4], b[4];
  for (int i = 0; i < 4; i++) {
    char name[8];
    snprintf(name, sizeof(name), "a%d", i);
    submit(s, &a[i], "job-a", name);
  }
  run_until_started(&loop, 2); /* a0, a1 on the two workers; a2, a3 wait. */
  for (int i = 0; i < 4; i++) {
    char name[8];
    snprintf(name, sizeof(name), "b%d", i);
    submit(s, &b[i], "job-b", name);
  }
  assert_int_equal(dl_sched_waiting(s), 6);
  /* Release in start order; each freed worker goes to the job with fewer
   * running (share 1 each now): b0 before a2, then they alternate. */
  const char *want[] = {"a0", "a1", "b0", "a2", "b1", "a3", "b2", "b3"};
  struct task *by_name[8] = {&a[0], &a[1], &b[0], &a[2], &b[1], &a[3], &b[2], &b[3]};
  for (int k = 0; k < 8; k++) {
    if (k + 2 <= 8) run_until_started(&loop, k + 2 < 8 ? k + 2 : 8);
    release(by_name[k]);
    run_until_done(&loop, by_name[k]);
  }
  /* a0 and a1 start together on the two workers: either may record first. */
  assert_true((!strcmp(started[0], "a0") && !strcmp(started[1], "a1")) ||
              (!strcmp(started[0], "a1") && !strcmp(started[1], "a0")));
  for (int k = 2; k < 8; k++) assert_string_equal(started[k], want[k]);
  assert_int_equal(dl_sched_waiting(s), 0);
  dl_sched_free(s);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void test_stuck(void **state) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  struct dl_sched *s;
  assert_int_equal(dl_sched_new(&loop, WORKERS, &s), 0);
  reset();
  struct task t[3];
  submit(s, &t[0], "j", "t0");
  submit(s, &t[1], "j", "t1");
  run_until_started(&loop, 2);
  usleep(100 * 1000);
  assert_false(dl_sched_stuck(s, 50)); /* Busy, but nobody waits. */
  submit(s, &t[2], "other", "t2");
  assert_false(dl_sched_stuck(s, 1000)); /* Waiting, but not for long enough. */
  assert_true(dl_sched_stuck(s, 50));
  release(&t[0]);
  run_until_done(&loop, &t[0]);
  run_until_started(&loop, 3);
  assert_false(dl_sched_stuck(s, 50)); /* A worker came free: t2 runs. */
  release(&t[1]);
  release(&t[2]);
  run_until_done(&loop, &t[1]);
  run_until_done(&loop, &t[2]);
  dl_sched_free(s);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* Tenant "team-a-" queues two tasks in each of four jobs, then tenant
 * "team-b-" two in one job. Each worker that comes free goes to the tenant
 * with fewer running: team-b's tasks start 3rd and 5th (shared by job
 * alone, team-a's other three jobs would each come before team-b's second). */
static void test_tenants_share_before_jobs(void **state) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  struct dl_sched *s;
  assert_int_equal(dl_sched_new(&loop, WORKERS, &s), 0);
  reset();
  struct task a[8], b[2];
  for (int i = 0; i < 8; i++) {
    char job[16], name[8];
    snprintf(job, sizeof(job), "team-a-%d", i / 2);
    snprintf(name, sizeof(name), "a%d", i);
    submit_as(s, &a[i], "team-a-", job, name);
  }
  run_until_started(&loop, 2);
  submit_as(s, &b[0], "team-b-", "team-b-x", "b0");
  submit_as(s, &b[1], "team-b-", "team-b-x", "b1");
  for (int k = 0; k < 10; k++) {
    run_until_started(&loop, k + 2 < 10 ? k + 2 : 10);
    struct task *t = NULL;
    for (int i = 0; i < 8 && !t; i++)
      if (!strcmp(a[i].name, started[k])) t = &a[i];
    for (int i = 0; i < 2 && !t; i++)
      if (!strcmp(b[i].name, started[k])) t = &b[i];
    assert_non_null(t);
    release(t);
    run_until_done(&loop, t);
  }
  assert_string_equal(started[2], "b0");
  assert_string_equal(started[4], "b1");
  dl_sched_free(s);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
  /* libuv sizes its pool once, at the first work queued. */
  setenv("UV_THREADPOOL_SIZE", "2", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_later_job_not_behind_earlier),
      cmocka_unit_test(test_stuck),
      cmocka_unit_test(test_tenants_share_before_jobs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
