/*
 * The attempt lifecycle (services/checkpoint/ckpt_attempt.c): every bad
 * write aborts its attempt at once with a clear error (a rank outside the
 * world, a chunk that switches rank, a stream reopened after "last"); the
 * Abort call (writers fail, staging freed, storage cleaned, the job's
 * orphaned attempt directories collected, idempotent, refused once
 * committed); an abandoned attempt is aborted and its staging freed after
 * attempt_idle_timeout_ms, and the abort hook (the daemon's log line) hears
 * of it once; admission (ckpt_admit.c): a later Begin of a job
 * supersedes its idle attempts, a per-job cap, and at the service cap the
 * largest holder gives way, so a greedy job cannot starve another. A
 * detached commit (ckpt_detach.c) of chunks that leave a hole is refused
 * and its attempt aborted; one that covers answers before the upload ends
 * and then commits by itself.
 * Throughout, the attempts' staging shares sum to the service's staging.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "ckpt_svc_fixture.h"
#include "stk_error.h"

struct ev {
  bool failed;
  int err;
  char msg[320];
};

static void on_ev(void *arg, enum ckpt_write_event e, int err, const char *msg) {
  struct ev *v = arg;
  if (e != CKPT_WRITE_FAILED) return;
  v->failed = true;
  v->err = err;
  snprintf(v->msg, sizeof(v->msg), "%s", msg);
}

/* 64 bytes of a 1-D f32 tensor [16] from rank, without "last". */
static int feed_some(struct ckpt_writer *w, const char *att, uint32_t rank, bool last) {
  char name[32];
  snprintf(name, sizeof(name), "w%u", rank);
  struct chunk_1d c = {.attempt = att,
                       .rank = rank,
                       .tensor = name,
                       .dtype = STOKER__V1__DTYPE__DTYPE_F32,
                       .dim = 16,
                       .off = 0,
                       .size = 16,
                       .data_len = 64,
                       .last = last};
  return fx_feed_1d(w, &c);
}

/* Ends rank's stream: a chunk with no tensor and "last". */
static int feed_last(struct ckpt_writer *w, const char *att, uint32_t rank) {
  Stoker__V1__WriteChunk c = STOKER__V1__WRITE_CHUNK__INIT;
  c.attempt = (char *)att;
  c.rank = rank;
  c.last = true;
  return ckpt_write_feed(w, &c);
}

/* The service's staging memory, checked against the attempts' shares (what
 * the per-job gauges sum) on every call: equal through every lifecycle. */
static uint64_t staged(struct fx *f) {
  struct ckpt_service_stats st;
  ckpt_service_get_stats(f->svc, &st);
  struct ckpt_attempt_staging a[64];
  size_t n = ckpt_service_attempt_staging(f->svc, a, 64);
  assert_true(n <= 64);
  uint64_t sum = 0;
  for (size_t i = 0; i < n; i++) sum += a[i].staged_bytes;
  assert_int_equal(sum, st.staged_bytes);
  return st.staged_bytes;
}

struct call {
  bool done;
  int err;
  char msg[320];
};

static void on_done(void *arg, int err, const char *msg, const ProtobufCMessage *resp) {
  struct call *c = arg;
  (void)resp;
  c->done = true;
  c->err = err;
  snprintf(c->msg, sizeof(c->msg), "%s", msg ? msg : "");
}

static int do_abort(struct fx *f, const char *att, char *ret_msg, size_t len) {
  struct call c = {0};
  Stoker__V1__AbortCheckpointRequest req = STOKER__V1__ABORT_CHECKPOINT_REQUEST__INIT;
  req.attempt = (char *)att;
  req.reason = "test";
  ckpt_abort(f->svc, &req, on_done, &c);
  fx_run_until(f, &c.done, 10000);
  if (ret_msg) snprintf(ret_msg, len, "%s", c.msg);
  return c.err;
}

/* Begin at world 2, rank 0 stages 64 bytes and stays attached. */
static void start(struct fx *f, char att[65], struct ckpt_writer **w0, struct ev *v) {
  assert_int_equal(fx_begin(f, "j", 1, 2, att), 0);
  assert_int_equal(ckpt_write_open(f->svc, att, 0, on_ev, v, w0), 0);
  assert_int_equal(feed_some(*w0, att, 0, false), 0);
  assert_true(staged(f) > 0);
}

/* The attempt was aborted: rank 0 failed with err, Commit answers the
 * same error (once cleaned up) and staging is free. */
static void check_aborted(struct fx *f, const char *att, struct ev *v, int err, const char *text) {
  fx_run_until(f, &v->failed, 5000);
  assert_int_equal(v->err, err);
  assert_non_null(strstr(v->msg, text));
  char msg[320];
  assert_int_equal(fx_commit(f, att, msg, sizeof(msg)), err);
  assert_non_null(strstr(msg, text));
  assert_int_equal(staged(f), 0);
}

static void test_rank_outside_world_aborts(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  assert_int_equal(fx_open(&f), 0);
  char att[65];
  struct ckpt_writer *w0, *w;
  struct ev v = {0}, v2 = {0};
  start(&f, att, &w0, &v);
  assert_int_equal(ckpt_write_open(f.svc, att, 2, on_ev, &v2, &w), STK_EINVAL);
  assert_non_null(strstr(stk_detail(), "outside a world of 2"));
  check_aborted(&f, att, &v, STK_EINVAL, "rank 2 outside a world of 2");
  ckpt_write_close(w0);
  fx_fini(&f);
}

static void test_switching_rank_aborts(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  assert_int_equal(fx_open(&f), 0);
  char att[65];
  struct ckpt_writer *w0;
  struct ev v = {0};
  start(&f, att, &w0, &v);
  assert_int_equal(feed_some(w0, att, 1, false), STK_EINVAL);
  check_aborted(&f, att, &v, STK_EINVAL, "on a stream of rank 0");
  ckpt_write_close(w0);
  fx_fini(&f);
}

static void test_reopen_after_last_aborts(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  assert_int_equal(fx_open(&f), 0);
  char att[65];
  struct ckpt_writer *w0, *w1, *again;
  struct ev v = {0}, v1 = {0};
  start(&f, att, &w0, &v);
  assert_int_equal(ckpt_write_open(f.svc, att, 1, on_ev, &v1, &w1), 0);
  assert_int_equal(feed_some(w1, att, 1, true), 0);
  ckpt_write_close(w1);
  assert_int_equal(ckpt_write_open(f.svc, att, 1, on_ev, &v1, &again), STK_EINVAL);
  check_aborted(&f, att, &v, STK_EINVAL, "rank 1: data after the last chunk");
  ckpt_write_close(w0);
  fx_fini(&f);
}

/* Rank r's box [off, off + size) of the f32 tensor "t" [16], with "last". */
static void feed_box(struct fx *f, const char *att, uint32_t r, uint64_t off, uint64_t size) {
  struct ckpt_writer *w;
  struct ev v = {0};
  assert_int_equal(ckpt_write_open(f->svc, att, r, on_ev, &v, &w), 0);
  struct chunk_1d c = {.attempt = att,
                       .rank = r,
                       .tensor = "t",
                       .dtype = STOKER__V1__DTYPE__DTYPE_F32,
                       .dim = 16,
                       .off = off,
                       .size = size,
                       .data_len = size * 4,
                       .last = true};
  assert_int_equal(fx_feed_1d(w, &c), 0);
  ckpt_write_close(w);
}

struct detached {
  struct call c;
  char uri[256];
  int64_t committed_at_ms;
};

static void on_detached(void *arg, int err, const char *msg, const ProtobufCMessage *resp) {
  struct detached *d = arg;
  on_done(&d->c, err, msg, resp);
  if (err) return;
  const Stoker__V1__CheckpointRef *ref = (const Stoker__V1__CheckpointRef *)resp;
  snprintf(d->uri, sizeof d->uri, "%s", ref->uri ? ref->uri : "");
  d->committed_at_ms = ref->committed_at_ms;
}

static void commit_detached(struct fx *f, const char *att, struct detached *d) {
  Stoker__V1__CommitCheckpointRequest req = STOKER__V1__COMMIT_CHECKPOINT_REQUEST__INIT;
  req.attempt = (char *)att;
  req.detach = true;
  ckpt_commit(f->svc, &req, on_detached, d);
}

static void test_detached_commit(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  assert_int_equal(fx_open(&f), 0);
  char att[65], msg[320];
  /* A hole ([8, 10) of t) is found before the answer: refused, aborted. */
  assert_int_equal(fx_begin(&f, "j", 1, 2, att), 0);
  struct detached d = {0};
  commit_detached(&f, att, &d); /* Asked before the ranks wrote: it waits. */
  fx_run_for(&f, 50);
  assert_false(d.c.done);
  feed_box(&f, att, 0, 0, 8);
  feed_box(&f, att, 1, 10, 6);
  fx_run_until(&f, &d.c.done, 10000);
  assert_int_not_equal(d.c.err, 0);
  assert_non_null(strstr(d.c.msg, "detached commit refused"));
  assert_int_not_equal(fx_commit(&f, att, msg, sizeof msg), 0);
  size_t n;
  int64_t steps[4];
  assert_int_equal(fx_list(&f, "j", steps, 4, &n), 0);
  assert_int_equal(n, 0);
  /* Covered: accepted with no uri (not yet committed), then committed. */
  assert_int_equal(fx_begin(&f, "j", 2, 2, att), 0);
  memset(&d, 0, sizeof d);
  commit_detached(&f, att, &d);
  feed_box(&f, att, 0, 0, 8);
  feed_box(&f, att, 1, 8, 8);
  fx_run_until(&f, &d.c.done, 10000);
  assert_int_equal(d.c.err, 0);
  assert_int_equal(fx_commit(&f, att, msg, sizeof msg), 0); /* Waits for the commit. */
  assert_int_equal(fx_list(&f, "j", steps, 4, &n), 0);
  assert_int_equal(n, 1);
  assert_int_equal(steps[0], 2);
  /* A detached commit of an attempt already committed answers in full. */
  memset(&d, 0, sizeof d);
  commit_detached(&f, att, &d);
  fx_run_until(&f, &d.c.done, 10000);
  assert_int_equal(d.c.err, 0);
  assert_non_null(strstr(d.uri, "manifest.pb"));
  assert_true(d.committed_at_ms > 0);
  fx_fini(&f);
}

static void test_abort_call(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  assert_int_equal(fx_open(&f), 0);
  /* An orphaned attempt directory of the job (a lost journal). */
  char orphan[512];
  snprintf(orphan, sizeof(orphan),
           "mkdir -p %s/j/step-000000000001/attempt-00000000000000000000000000000000 && "
           "echo x > %s/j/step-000000000001/attempt-00000000000000000000000000000000/"
           "rank-00000-0000.bin",
           f.data, f.data);
  assert_int_equal(system(orphan), 0);
  char att[65], msg[320];
  struct ckpt_writer *w0;
  struct ev v = {0};
  start(&f, att, &w0, &v);
  assert_int_equal(do_abort(&f, att, msg, sizeof(msg)), 0);
  check_aborted(&f, att, &v, STK_EABORTED, "aborted by request: test");
  snprintf(orphan, sizeof(orphan), "%s/j/step-000000000001", f.data);
  struct stat sb;
  char obj[600];
  snprintf(obj, sizeof(obj), "%s/attempt-00000000000000000000000000000000/rank-00000-0000.bin",
           orphan);
  assert_int_not_equal(stat(obj, &sb), 0);         /* Collected. */
  assert_int_equal(do_abort(&f, att, NULL, 0), 0); /* Again: already aborted. */
  assert_int_equal(do_abort(&f, "0123456789abcdef0123456789abcdef", msg, sizeof(msg)), STK_ENOENT);
  /* A committed attempt cannot be aborted. */
  char att2[65];
  struct ckpt_writer *w;
  struct ev v2 = {0};
  assert_int_equal(fx_begin(&f, "j", 2, 1, att2), 0);
  assert_int_equal(ckpt_write_open(f.svc, att2, 0, on_ev, &v2, &w), 0);
  assert_int_equal(feed_some(w, att2, 0, true), 0);
  assert_int_equal(fx_commit(&f, att2, NULL, 0), 0);
  assert_int_equal(do_abort(&f, att2, msg, sizeof(msg)), STK_ESTATE);
  assert_non_null(strstr(msg, "committed"));
  ckpt_write_close(w);
  ckpt_write_close(w0);
  fx_fini(&f);
}

/* What the abort hook saw (the daemon logs each call). */
struct aborts {
  int n;
  char job[64];
  int64_t step;
  char attempt[65];
  char reason[320];
};

static void on_abort(void *arg, const char *job, int64_t step, const char *attempt,
                     const char *reason) {
  struct aborts *ab = arg;
  ab->n++;
  snprintf(ab->job, sizeof(ab->job), "%s", job);
  ab->step = step;
  snprintf(ab->attempt, sizeof(ab->attempt), "%s", attempt);
  snprintf(ab->reason, sizeof(ab->reason), "%s", reason);
}

static void test_abandoned_attempt_freed(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  struct aborts ab = {0};
  f.opts.abort_hook = on_abort;
  f.opts.abort_hook_arg = &ab;
  f.opts.attempt_idle_timeout_ms = 200; /* The attempt timeout stays 10 min. */
  assert_int_equal(fx_open(&f), 0);
  char att[65];
  struct ckpt_writer *w0;
  struct ev v = {0};
  start(&f, att, &w0, &v);
  ckpt_write_close(w0); /* The rank went away before "last". */
  assert_true(staged(&f) > 0);
  char msg[320];
  assert_int_equal(fx_commit(&f, att, msg, sizeof(msg)), STK_ETIMEDOUT); /* Within 60 s. */
  assert_non_null(strstr(msg, "abandoned"));
  assert_int_equal(staged(&f), 0);
  struct ckpt_service_stats st;
  ckpt_service_get_stats(f.svc, &st);
  assert_int_equal(st.abandoned, 1);
  /* The abort reached the hook once, with its job, step, id and reason,
   * and no later sweep repeats it. */
  fx_run_for(&f, 300);
  assert_int_equal(ab.n, 1);
  assert_string_equal(ab.job, "j");
  assert_int_equal(ab.step, 1);
  assert_string_equal(ab.attempt, att);
  assert_non_null(strstr(ab.reason, "abandoned"));
  fx_fini(&f);
}

static void test_attached_attempt_not_abandoned(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  f.opts.attempt_idle_timeout_ms = 100;
  assert_int_equal(fx_open(&f), 0);
  char att[65];
  struct ckpt_writer *w0, *w1;
  struct ev v = {0}, v1 = {0};
  start(&f, att, &w0, &v);
  for (int i = 0; i < 6; i++) { /* 600 ms idle, a stream attached. */
    usleep(100 * 1000);
    uv_run(&f.loop, UV_RUN_NOWAIT);
  }
  assert_false(v.failed); /* A stream is attached: not abandoned. */
  assert_int_equal(feed_last(w0, att, 0), 0);
  assert_int_equal(ckpt_write_open(f.svc, att, 1, on_ev, &v1, &w1), 0);
  assert_int_equal(feed_some(w1, att, 1, true), 0);
  assert_int_equal(fx_commit(&f, att, NULL, 0), 0);
  ckpt_write_close(w0);
  ckpt_write_close(w1);
  fx_fini(&f);
}

/* Begin of job at step with rank 0's stream attached (so the attempt is
 * neither idle nor superseded). */
static void begin_attached(struct fx *f, const char *job, int64_t step, char att[65],
                           struct ckpt_writer **w, struct ev *v) {
  assert_int_equal(fx_begin(f, job, step, 2, att), 0);
  assert_int_equal(ckpt_write_open(f->svc, att, 0, on_ev, v, w), 0);
}

/* The service cap holds when every job holds one: the refusal names it. */
static void test_open_attempts_capped(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  f.opts.max_open_attempts = 2;
  assert_int_equal(fx_open(&f), 0);
  char a1[65], a2[65], a3[65];
  assert_int_equal(fx_begin(&f, "a", 1, 4, a1), 0);
  assert_int_equal(fx_begin(&f, "b", 1, 4, a2), 0);
  assert_int_equal(fx_begin(&f, "c", 1, 4, a3), STK_EBUSY);
  assert_non_null(strstr(stk_detail(), "max-open-attempts"));
  assert_int_equal(do_abort(&f, a1, NULL, 0), 0);
  assert_int_equal(fx_begin(&f, "c", 1, 4, a3), 0); /* Room again. */
  fx_fini(&f);
}

/* A job's Begin for a later step aborts its own idle unfinished attempts
 * (Commit answers why), never one with a stream attached, nor another
 * job's. */
static void test_later_begin_supersedes_the_jobs_idle_attempts(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  assert_int_equal(fx_open(&f), 0);
  char idle[65], busy[65], other[65], later[65];
  struct ckpt_writer *w;
  struct ev v = {0};
  assert_int_equal(fx_begin(&f, "j", 1, 2, idle), 0);
  begin_attached(&f, "j", 2, busy, &w, &v);
  assert_int_equal(fx_begin(&f, "k", 1, 2, other), 0);
  assert_int_equal(fx_begin(&f, "j", 3, 2, later), 0);
  char msg[320];
  assert_int_equal(fx_commit(&f, idle, msg, sizeof msg), STK_EABORTED);
  assert_non_null(strstr(msg, "superseded by the job's Begin for step 2"));
  assert_false(v.failed);
  assert_int_equal(feed_some(w, busy, 0, true), 0);  /* Still open. */
  assert_int_equal(do_abort(&f, other, NULL, 0), 0); /* Open until now. */
  ckpt_write_close(w);
  fx_fini(&f);
}

/* One job holds at most max_open_attempts_per_job; another job still
 * begins. */
static void test_per_job_cap(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  f.opts.max_open_attempts_per_job = 2;
  assert_int_equal(fx_open(&f), 0);
  char a1[65], a2[65], a3[65], b1[65];
  struct ckpt_writer *w1, *w2;
  struct ev v1 = {0}, v2 = {0};
  begin_attached(&f, "a", 1, a1, &w1, &v1);
  begin_attached(&f, "a", 2, a2, &w2, &v2);
  assert_int_equal(fx_begin(&f, "a", 3, 2, a3), STK_EBUSY);
  assert_non_null(strstr(stk_detail(), "max-open-attempts-per-job"));
  assert_int_equal(fx_begin(&f, "b", 1, 2, b1), 0);
  ckpt_write_close(w1);
  ckpt_write_close(w2);
  fx_fini(&f);
}

/* The audit's greedy job: A fills the service cap with idle attempts for
 * one step (same step: nothing to supersede; a per-job cap as large as the
 * service's) and re-Begins after every call of B, a well-behaved job that
 * begins and finishes one attempt at a time. Every Begin of B gets through
 * (A, the largest holder, gives way); A's refusals, if any, name a limit. */
static void test_greedy_job_cannot_starve_another(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  f.opts.max_open_attempts = 4;
  f.opts.max_open_attempts_per_job = 4;
  assert_int_equal(fx_open(&f), 0);
  char att[65];
  for (int i = 0; i < 4; i++) assert_int_equal(fx_begin(&f, "a", 5, 2, att), 0);
  int b_ok = 0;
  for (int i = 0; i < 10; i++) {
    char b[65];
    if (fx_begin(&f, "b", 100 + i, 2, b) == 0) {
      b_ok++;
      assert_int_equal(do_abort(&f, b, NULL, 0), 0);
      /* Commit answers once the abort's cleanup is over: B holds nothing
       * (an aborting attempt still counts against its job). */
      assert_int_equal(fx_commit(&f, b, NULL, 0), STK_EABORTED);
    }
    int rc = fx_begin(&f, "a", 5, 2, att);
    if (rc == STK_EBUSY) {
      assert_non_null(strstr(stk_detail(), "--max-open-attempts"));
    } else {
      assert_int_equal(rc, 0);
    }
    fx_run_for(&f, 20);
  }
  assert_int_equal(b_ok, 10);
  struct ckpt_service_stats st;
  ckpt_service_get_stats(f.svc, &st);
  /* The first Begin of B found A's four open at the cap and took one; later
   * ones take one, or the room an aborted one of A left. */
  assert_true(st.preempted >= 1 && st.preempted <= 10);
  fx_fini(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_detached_commit),
      cmocka_unit_test(test_rank_outside_world_aborts),
      cmocka_unit_test(test_switching_rank_aborts),
      cmocka_unit_test(test_reopen_after_last_aborts),
      cmocka_unit_test(test_abort_call),
      cmocka_unit_test(test_abandoned_attempt_freed),
      cmocka_unit_test(test_attached_attempt_not_abandoned),
      cmocka_unit_test(test_open_attempts_capped),
      cmocka_unit_test(test_later_begin_supersedes_the_jobs_idle_attempts),
      cmocka_unit_test(test_per_job_cap),
      cmocka_unit_test(test_greedy_job_cannot_starve_another),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
