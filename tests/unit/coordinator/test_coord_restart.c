/*
 * What a coordinator restart must not forget: a pending scale or pause that
 * was acknowledged (re-armed with a fresh deadline, members asked to
 * checkpoint again), including after kill -9 right after the acknowledgement;
 * and the previous generation's rank order while a round is open or the job
 * is paused, so that survivors keep their relative order.
 */
#include <signal.h>
#include <sys/wait.h>

#include "coord_test.h"

#define ST(x)  STOKER__V1__JOB_STATE__JOB_STATE_##x
#define ACT(x) STOKER__V1__HEARTBEAT_ACTION__HEARTBEAT_ACTION_##x

static void restart(struct fx *f) {
  fx_close(f);
  fx_open(f);
}

static int scale(struct fx *f, const char *job, uint32_t ranks) {
  Stoker__V1__ScaleJobRequest req = STOKER__V1__SCALE_JOB_REQUEST__INIT;
  req.job = (char *)job;
  req.ranks = ranks;
  struct res *r = res_new();
  coord_scale_job(f->c, &req, on_done, r);
  int err = wait_res(f, r)->err;
  res_free(r);
  return err;
}

static int leave(struct fx *f, const char *job, const char *member, uint64_t gen) {
  Stoker__V1__LeaveRequest req = STOKER__V1__LEAVE_REQUEST__INIT;
  req.job = (char *)job;
  req.member_id = (char *)member;
  req.generation = gen;
  struct res *r = res_new();
  coord_leave(f->c, &req, on_done, r);
  int err = wait_res(f, r)->err;
  res_free(r);
  return err;
}

/* Heartbeats m0..m(n-1) every 10 ms until one answers want; returns the
 * loop ms that took, or -1 after limit_ms. */
static int64_t beat_until(struct fx *f, const char *job, int n, uint64_t gen, int want,
                          int64_t limit_ms) {
  uint64_t t0 = uv_now(&f->loop);
  while ((int64_t)(uv_now(&f->loop) - t0) < limit_ms) {
    for (int i = 0; i < n; i++) {
      char id[16];
      snprintf(id, sizeof(id), "m%d", i);
      if (heartbeat(f, job, id, gen) == want) return (int64_t)(uv_now(&f->loop) - t0);
    }
    run_for(f, 10);
  }
  return -1;
}

/* Two members joined to a fresh job of spec s, in generation 1. */
static void running_pair_of(struct fx *f, Stoker__V1__JobSpec *s) {
  const char *job = s->name;
  assert_int_equal(create_spec(f, s), 0);
  struct res *r[2];
  join_all(f, job, 2, r);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(r[i]->err, 0);
    assert_int_equal(JOINR(r[i])->world_size, 2);
    res_free(r[i]);
  }
}

static void running_pair(struct fx *f, const char *job, uint32_t min, uint32_t max) {
  Stoker__V1__JobSpec s = spec_of(job, min, max);
  running_pair_of(f, &s);
}

/* ---- Gap 1: pending scale and pause survive a restart -------------------- */

static void test_scale_pending_restart(void **state) {
  struct fx *f = *state;
  running_pair(f, "s", 1, 4);
  assert_int_equal(report_ckpt(f, "s", 5, 1), 0);
  assert_int_equal(scale(f, "s", 1), 0);
  assert_int_equal(heartbeat(f, "s", "m0", 1), ACT(CHECKPOINT_NOW));
  restart(f);
  /* Re-armed: both are told again, an old step does not count. */
  assert_int_equal(heartbeat(f, "s", "m0", 1), ACT(CHECKPOINT_NOW));
  assert_int_equal(heartbeat(f, "s", "m1", 1), ACT(CHECKPOINT_NOW));
  assert_int_equal(heartbeat(f, "s", "m0", 1), ACT(CONTINUE));
  say_stop(f, "s", 1, 2, 6);
  assert_int_equal(report_ckpt(f, "s", 5, 1), 0);
  assert_int_equal(heartbeat(f, "s", "m0", 1), ACT(CONTINUE));
  assert_int_equal(report_ckpt(f, "s", 6, 1), 0);
  assert_int_equal(heartbeat(f, "s", "m0", 1), ACT(RESTART));
  struct res *g = get_job(f, "s");
  assert_int_equal(JOB(g)->state, ST(WAITING));
  assert_int_equal(JOB(g)->target_ranks, 1);
  res_free(g);
}

static void test_scale_deadline_rearmed(void **state) {
  struct fx *f = *state;
  fx_close(f);
  f->opts.scale_timeout_beats = 4; /* 4 x 50 ms. */
  fx_open(f);
  Stoker__V1__JobSpec s = short_lease_spec_of("t", 1, 4);
  running_pair_of(f, &s);
  assert_int_equal(scale(f, "t", 1), 0);
  assert_int_equal(beat_until(f, "t", 2, 1, ACT(RESTART), 120), -1);
  restart(f);
  /* A fresh deadline from the restart, not the old one (80 ms left). */
  int64_t ms = beat_until(f, "t", 2, 1, ACT(RESTART), 2000);
  print_message("scale timed out %lld ms after the restart\n", (long long)ms);
  assert_true(ms >= 150);
  struct res *g = get_job(f, "t");
  assert_int_equal(JOB(g)->generation, 2);
  res_free(g);
}

static void test_pause_pending_restart(void **state) {
  struct fx *f = *state;
  fx_close(f);
  f->opts.scale_timeout_beats = 200; /* No forced pause while a slow run restarts. */
  fx_open(f);
  running_pair(f, "p", 2, 2);
  assert_int_equal(report_ckpt(f, "p", 5, 1), 0);
  assert_int_equal(job_action(f, coord_pause_job, "p", false), 0);
  assert_int_equal(heartbeat(f, "p", "m0", 1), ACT(CHECKPOINT_NOW));
  restart(f);
  struct res *g = get_job(f, "p");
  assert_int_equal(JOB(g)->state, ST(PAUSING));
  res_free(g);
  assert_int_equal(heartbeat(f, "p", "m0", 1), ACT(CHECKPOINT_NOW)); /* Told again. */
  assert_int_equal(report_ckpt(f, "p", 5, 1), 0);                    /* Not newer. */
  assert_int_equal(heartbeat(f, "p", "m0", 1), ACT(CONTINUE));
  assert_int_equal(report_ckpt(f, "p", 9, 1), 0);
  restart(f); /* The checkpoint seen is remembered too. */
  assert_int_equal(heartbeat(f, "p", "m0", 1), ACT(STOP));
  assert_int_equal(heartbeat(f, "p", "m1", 1), ACT(STOP));
  assert_int_equal(leave_as(f, "p", "m0", 1, false), 0); /* Seats kept until they leave. */
  assert_int_equal(leave_as(f, "p", "m1", 1, false), 0);
  g = get_job(f, "p");
  assert_int_equal(JOB(g)->state, ST(PAUSED));
  res_free(g);
}

static void test_pause_force_restart(void **state) {
  struct fx *f = *state;
  running_pair(f, "pf", 2, 2);
  assert_int_equal(job_action(f, coord_pause_job, "pf", true), 0);
  restart(f);
  assert_int_equal(heartbeat(f, "pf", "m0", 1), ACT(STOP));
  assert_int_equal(heartbeat(f, "pf", "m1", 1), ACT(STOP));
  struct res *g = get_job(f, "pf");
  assert_int_equal(JOB(g)->state, ST(PAUSED));
  res_free(g);
}

/* The child scales a running job, reports the acknowledgement, and runs on
 * until it is killed. */
static void scale_child(const char *dir, int fd) {
  struct fx f = {0};
  uv_loop_init(&f.loop);
  snprintf(f.dir, sizeof(f.dir), "%s", dir);
  f.opts.dir = f.dir;
  f.opts.tick_ms = 5;
  if (coord_open(&f.loop, &f.opts, &f.c)) _exit(2);
  Stoker__V1__JobSpec s = spec_of("k", 1, 2);
  s.heartbeat_interval_ms = 60000;
  if (create_spec(&f, &s)) _exit(3);
  struct res *r[2];
  join_all(&f, "k", 2, r);
  if (scale(&f, "k", 1)) _exit(4);
  char ok = 1;
  if (write(fd, &ok, 1) != 1) _exit(5);
  uv_run(&f.loop, UV_RUN_DEFAULT);
  _exit(0);
}

static void test_scale_pending_crash(void **state) {
  struct fx *f = *state;
  fx_close(f);
  kill_after_ack(f->dir, scale_child);
  fx_open(f);
  assert_int_equal(heartbeat(f, "k", "m1", 1), ACT(CHECKPOINT_NOW));
  say_stop(f, "k", 1, 2, 3);
  assert_int_equal(report_ckpt(f, "k", 3, 1), 0);
  assert_int_equal(heartbeat(f, "k", "m0", 1), ACT(RESTART));
}

/* ---- Gap 2: the previous generation's rank order survives a restart ------ */

/* m0, m1, m2 run generation 1 at ranks 0, 1, 2; then m0 leaves. */
static void three_then_leave(struct fx *f, const char *job) {
  create(f, job, 2, 3);
  struct res *r[3];
  join_all(f, job, 3, r);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(JOINR(r[i])->rank, i);
    res_free(r[i]);
  }
  assert_int_equal(leave(f, job, "m0", 1), 0);
}

/* m2 joins before m1; both must keep their old relative order. */
static void rejoin_reversed(struct fx *f, const char *job) {
  struct res *b = join(f, job, "m2");
  run_for(f, 5);
  struct res *a = join(f, job, "m1");
  run_until(f, &a->done);
  run_until(f, &b->done);
  assert_int_equal(a->err, 0);
  assert_int_equal(b->err, 0);
  assert_int_equal(JOINR(a)->world_size, 2);
  assert_int_equal(JOINR(a)->rank, 0);
  assert_int_equal(JOINR(b)->rank, 1);
  res_free(a);
  res_free(b);
}

static void test_rank_order_restart_mid_round(void **state) {
  struct fx *f = *state;
  three_then_leave(f, "ro");
  restart(f);
  struct res *g = get_job(f, "ro");
  assert_int_equal(JOB(g)->state, ST(WAITING));
  assert_int_equal(JOB(g)->n_members, 0);
  res_free(g);
  rejoin_reversed(f, "ro");
  /* The records of generation 2 replaced those of generation 1. */
  restart(f);
  g = get_job(f, "ro");
  assert_int_equal(JOB(g)->state, ST(RUNNING));
  assert_int_equal(JOB(g)->n_members, 2);
  assert_string_equal(JOB(g)->members[0]->member_id, "m1");
  assert_string_equal(JOB(g)->members[1]->member_id, "m2");
  res_free(g);
}

static void test_rank_order_across_pause(void **state) {
  struct fx *f = *state;
  three_then_leave(f, "rp");
  assert_int_equal(job_action(f, coord_pause_job, "rp", false), 0); /* From WAITING. */
  restart(f);
  assert_int_equal(job_action(f, coord_resume_job, "rp", false), 0);
  rejoin_reversed(f, "rp");
}

/* A member that finished stays finished across a restart: no grace lease,
 * STOP to its heartbeat, the job still finishing (a Join opens no round),
 * and FINISHED once the others finish. */
static void test_finished_member_restart(void **state) {
  struct fx *f = *state;
  create(f, "fr", 3, 3);
  struct res *r[3];
  join_all(f, "fr", 3, r);
  for (int i = 0; i < 3; i++) res_free(r[i]);
  assert_int_equal(leave_as(f, "fr", "m0", 1, true), 0);
  restart(f);
  assert_int_equal(heartbeat(f, "fr", "m0", 1), ACT(STOP));
  assert_int_equal(heartbeat(f, "fr", "m1", 1), ACT(CONTINUE));
  struct res *j = join(f, "fr", "m0");
  assert_int_equal(wait_res(f, j)->err, STK_ESTATE);
  res_free(j);
  assert_int_equal(leave_as(f, "fr", "m1", 1, true), 0);
  assert_int_equal(leave_as(f, "fr", "m2", 1, true), 0);
  struct res *g = get_job(f, "fr");
  assert_int_equal(JOB(g)->state, ST(FINISHED));
  assert_int_equal(JOB(g)->generation, 1);
  res_free(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_scale_pending_restart, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_scale_deadline_rearmed, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_pause_pending_restart, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_pause_force_restart, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_scale_pending_crash, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_rank_order_restart_mid_round, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_rank_order_across_pause, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_finished_member_restart, fx_setup, fx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
