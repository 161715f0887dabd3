/*
 * A submitted job (JobSpec.submission) and the queue controller's reports
 * (ReportQueue): CreateJob refuses a bad submission naming the field and
 * creates nothing; a report is Job.queue, a change of state logs QUEUED,
 * ADMITTED or REJECTED once (a new position or a repeated state logs
 * nothing), a bad report or a report on a job not submitted changes
 * nothing, and the last report survives a restart and a kill -9 right
 * after its answer. A user's resize of a submitted job sets the target and
 * leaves the reshape to the queue controller (test_resize_submitted), and
 * says which ScaleJob set it (Job.target_seq, the SCALED event's seq: new
 * at every ScaleJob, kept across a restart; test_target_seq).
 */
#include "coord_test.h"

#define Q(x)   STOKER__V1__QUEUE_STATE__QUEUE_STATE_##x
#define EV(x)  STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_##x
#define ACT(x) STOKER__V1__HEARTBEAT_ACTION__HEARTBEAT_ACTION_##x
#define JS(x)  STOKER__V1__JOB_STATE__JOB_STATE_##x

struct seen {
  int n, type[64];
  uint64_t seq[64];
  uint32_t world[64];
  char msg[64][160];
};

static bool on_ev(void *arg, const Stoker__V1__JobEvent *ev) {
  struct seen *s = arg;
  if (s->n < 64) {
    s->type[s->n] = ev->type;
    s->seq[s->n] = ev->seq;
    s->world[s->n] = ev->world_size;
    snprintf(s->msg[s->n], sizeof(s->msg[0]), "%s", ev->message);
    s->n++;
  }
  return true;
}

static void ev_done(void *arg, int err, const char *msg, const ProtobufCMessage *resp) {
  (void)arg, (void)err, (void)msg, (void)resp;
}

/* Every stored event of job (a watch run until it has caught up). */
static void events(struct fx *f, const char *job, struct seen *s) {
  memset(s, 0, sizeof(*s));
  Stoker__V1__WatchJobRequest req = STOKER__V1__WATCH_JOB_REQUEST__INIT;
  req.job = (char *)job;
  struct coord_wait *w = coord_watch_job(f->c, &req, on_ev, ev_done, s);
  run_for(f, 50);
  coord_cancel(f->c, w);
  run_for(f, 20);
}

static int count(const struct seen *s, int type) {
  int n = 0;
  for (int i = 0; i < s->n; i++) n += s->type[i] == type;
  return n;
}

static int last(const struct seen *s, int type) {
  for (int i = s->n - 1; i >= 0; i--)
    if (s->type[i] == type) return i;
  fail_msg("no event of type %d", type);
  return -1;
}

/* Creates job with a submission to queue "team-a", template "llm". */
static int submit(struct fx *f, const char *job, Stoker__V1__Submission *sub, char *ret_msg) {
  Stoker__V1__JobSpec s = spec_of(job, 1, 4);
  /* 1 s, not 100 ms: a resize's round must not close at its last call
   * before the rejoining members of a loaded machine's test are in. */
  s.last_call_ms = 1000;
  s.submission = sub;
  Stoker__V1__CreateJobRequest req = STOKER__V1__CREATE_JOB_REQUEST__INIT;
  req.spec = &s;
  struct res *r = res_new();
  coord_create_job(f->c, &req, on_done, r);
  int err = wait_res(f, r)->err;
  if (ret_msg) snprintf(ret_msg, 256, "%s", r->msg);
  if (!err) {
    const Stoker__V1__Submission *got = JOB(r)->spec->submission;
    assert_non_null(got); /* Kept as given. */
    assert_string_equal(got->template_, sub->template_);
    assert_int_equal(got->n_args, sub->n_args);
  }
  res_free(r);
  return err;
}

static Stoker__V1__Submission good_sub(void) {
  Stoker__V1__Submission sub = STOKER__V1__SUBMISSION__INIT;
  sub.queue = "team-a";
  sub.priority = "high";
  sub.template_ = "llm";
  return sub;
}

static int report(struct fx *f, const char *job, const Stoker__V1__QueueStatus *st, char *ret_msg) {
  Stoker__V1__ReportQueueRequest req = STOKER__V1__REPORT_QUEUE_REQUEST__INIT;
  req.job = (char *)job;
  req.status = (Stoker__V1__QueueStatus *)st;
  struct res *r = res_new();
  coord_report_queue(f->c, &req, on_done, r);
  int err = wait_res(f, r)->err;
  if (ret_msg) snprintf(ret_msg, 256, "%s", r->msg);
  if (!err) {
    assert_non_null(JOB(r)->queue); /* The answer shows the report. */
    assert_int_equal(JOB(r)->queue->state, st->state);
  }
  res_free(r);
  return err;
}

static Stoker__V1__QueueStatus status(Stoker__V1__QueueState state, int32_t position,
                                      uint32_t ranks) {
  Stoker__V1__QueueStatus st = STOKER__V1__QUEUE_STATUS__INIT;
  st.state = state;
  st.workload = "job-q1-abc12";
  st.cluster_queue = "cq-gpu";
  st.position = position;
  st.admitted_ranks = ranks;
  return st;
}

static void assert_no_job(struct fx *f, const char *job) {
  struct res *g = get_job(f, job);
  assert_int_equal(g->err, STK_ENOENT);
  res_free(g);
}

static void test_submit_refused(void **state) {
  struct fx *f = *state;
  char msg[256];
  struct {
    const char *queue, *priority, *template_, *field;
  } bad[] = {
      {"Team-A", "", "llm", "submission.queue"},  {"-a", "", "llm", "submission.queue"},
      {"a_b", "", "llm", "submission.queue"},     {"a", "x y", "llm", "submission.priority"},
      {"a", "", "", "submission.template"},       {"a", "", "LLM", "submission.template"},
      {"a", "", "a/../b", "submission.template"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    Stoker__V1__Submission sub = STOKER__V1__SUBMISSION__INIT;
    sub.queue = (char *)bad[i].queue;
    sub.priority = (char *)bad[i].priority;
    sub.template_ = (char *)bad[i].template_;
    assert_int_equal(submit(f, "s", &sub, msg), STK_EINVAL);
    if (!strstr(msg, bad[i].field)) fail_msg("case %zu: \"%s\" names no %s", i, msg, bad[i].field);
    assert_no_job(f, "s");
  }
  char name64[65];
  memset(name64, 'a', 64), name64[64] = 0;
  Stoker__V1__Submission sub = good_sub();
  sub.queue = name64;
  assert_int_equal(submit(f, "s", &sub, msg), STK_EINVAL);
  assert_non_null(strstr(msg, "submission.queue"));
  /* Args: 65 are too many, 64 pass; one of 1025 bytes is too long. */
  char *args[65];
  for (int i = 0; i < 65; i++) args[i] = "--x";
  sub = good_sub();
  sub.args = args;
  sub.n_args = 65;
  assert_int_equal(submit(f, "s", &sub, msg), STK_EINVAL);
  assert_non_null(strstr(msg, "submission.args"));
  assert_no_job(f, "s");
  char long_arg[1026];
  memset(long_arg, 'x', 1025), long_arg[1025] = 0;
  args[3] = long_arg;
  sub.n_args = 64;
  assert_int_equal(submit(f, "s", &sub, msg), STK_EINVAL);
  assert_non_null(strstr(msg, "submission.args[3]"));
  assert_no_job(f, "s");
  args[3] = "caf\xc3"; /* Cut UTF-8: Python clients could not read the job back. */
  assert_int_equal(submit(f, "s", &sub, msg), STK_EINVAL);
  assert_non_null(strstr(msg, "submission.args[3] not valid UTF-8"));
  args[3] = "\xed\xa0\x80"; /* A surrogate. */
  assert_int_equal(submit(f, "s", &sub, msg), STK_EINVAL);
  assert_no_job(f, "s");
  args[3] = long_arg;
  long_arg[1024] = 0;                       /* 1024 bytes: the limit itself passes. */
  args[5] = "caf\xc3\xa9 \xf0\x9f\x94\xa5"; /* Valid UTF-8 passes. */
  memset(name64, 'a', 63), name64[63] = 0;
  sub.queue = name64;
  sub.priority = "";
  assert_int_equal(submit(f, "s", &sub, msg), 0);
  struct seen s;
  events(f, "s", &s);
  assert_int_equal(s.n, 1); /* CREATED only: nothing queued before a report. */
}

static void test_queue_events(void **state) {
  struct fx *f = *state;
  Stoker__V1__Submission sub = good_sub();
  assert_int_equal(submit(f, "q", &sub, NULL), 0);
  struct res *g = get_job(f, "q");
  assert_null(JOB(g)->queue); /* Not yet seen by the controller. */
  res_free(g);
  Stoker__V1__QueueStatus st = status(Q(QUEUED), 3, 0);
  assert_int_equal(report(f, "q", &st, NULL), 0);
  st.position = 2; /* Moves up: no event, the position is recorded. */
  st.message = "waiting for quota";
  assert_int_equal(report(f, "q", &st, NULL), 0);
  g = get_job(f, "q");
  assert_int_equal(JOB(g)->queue->position, 2);
  assert_string_equal(JOB(g)->queue->message, "waiting for quota");
  assert_string_equal(JOB(g)->queue->workload, "job-q1-abc12");
  assert_true(JOB(g)->queue->updated_ms > 0); /* Filled in when not given. */
  assert_non_null(strstr(JOB(g)->reason, "queued in team-a at position 3"));
  res_free(g);
  struct seen s;
  events(f, "q", &s);
  assert_int_equal(count(&s, EV(QUEUED)), 1);
  assert_string_equal(s.msg[last(&s, EV(QUEUED))], "queued in team-a at position 3");

  st = status(Q(ADMITTED), -1, 4);
  st.updated_ms = 1234;
  assert_int_equal(report(f, "q", &st, NULL), 0);
  assert_int_equal(report(f, "q", &st, NULL), 0); /* Again: no second event. */
  events(f, "q", &s);
  assert_int_equal(count(&s, EV(ADMITTED)), 1);
  int a = last(&s, EV(ADMITTED));
  assert_int_equal(s.world[a], 4);
  assert_string_equal(s.msg[a], "admitted 4 ranks by cq-gpu");
  g = get_job(f, "q");
  assert_int_equal(JOB(g)->queue->updated_ms, 1234);
  assert_int_equal(JOB(g)->world_size, 0); /* The job's world is the ranks'. */
  res_free(g);

  /* Evicted: no event of its own (the controller's PreemptJob logs it);
   * queued again, then admitted again: each change logged once more. */
  st = status(Q(EVICTED), -1, 0);
  assert_int_equal(report(f, "q", &st, NULL), 0);
  st = status(Q(QUEUED), -1, 0);
  st.cluster_queue = "";
  assert_int_equal(report(f, "q", &st, NULL), 0);
  st = status(Q(ADMITTED), -1, 2);
  st.cluster_queue = "";
  assert_int_equal(report(f, "q", &st, NULL), 0);
  events(f, "q", &s);
  assert_int_equal(count(&s, EV(QUEUED)), 2);
  assert_int_equal(count(&s, EV(ADMITTED)), 2);
  assert_string_equal(s.msg[last(&s, EV(QUEUED))], "queued in team-a");
  assert_string_equal(s.msg[last(&s, EV(ADMITTED))], "admitted 2 ranks");
  /* Rejected: one REJECTED event saying why (not repeated by the same
   * report again); a waiting job's reason says why too. */
  int before = s.n;
  st = status(Q(REJECTED), -1, 0);
  st.message = "no template stoker-template-llm";
  assert_int_equal(report(f, "q", &st, NULL), 0);
  assert_int_equal(report(f, "q", &st, NULL), 0);
  g = get_job(f, "q");
  assert_string_equal(JOB(g)->reason,
                      "rejected by the queue controller: no template stoker-template-llm");
  res_free(g);
  events(f, "q", &s);
  assert_int_equal(s.n, before + 1);
  assert_int_equal(count(&s, EV(REJECTED)), 1);
  assert_string_equal(s.msg[last(&s, EV(REJECTED))],
                      "rejected by the queue controller: no template stoker-template-llm");
}

static void test_report_refused(void **state) {
  struct fx *f = *state;
  char msg[256];
  create(f, "plain", 1, 2);
  Stoker__V1__QueueStatus st = status(Q(QUEUED), 0, 0);
  assert_int_equal(report(f, "plain", &st, msg), STK_ESTATE);
  assert_non_null(strstr(msg, "submission"));
  assert_int_equal(report(f, "nope", &st, NULL), STK_ENOENT);

  Stoker__V1__Submission sub = good_sub();
  assert_int_equal(submit(f, "r", &sub, NULL), 0);
  char big[1100];
  memset(big, 'm', 1025), big[1025] = 0;
  struct {
    Stoker__V1__QueueStatus st;
    const char *field;
  } bad[] = {
      {status(Q(UNSPECIFIED), 0, 0), "status.state"},
      {status((Stoker__V1__QueueState)9, 0, 0), "status.state"},
      {status(Q(QUEUED), -2, 0), "status.position"},
      {status(Q(ADMITTED), 0, 5), "status.admitted_ranks"},
      {status(Q(QUEUED), 0, 0), "status.workload"},
      {status(Q(QUEUED), 0, 0), "status.cluster_queue"},
      {status(Q(QUEUED), 0, 0), "status.message"},
      {status(Q(QUEUED), 0, 0), "status.message not valid UTF-8"},
  };
  bad[4].st.workload = "Job_1";
  bad[5].st.cluster_queue = "cq gpu";
  bad[6].st.message = big;
  bad[7].st.message = "quota \xff";
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    assert_int_equal(report(f, "r", &bad[i].st, msg), STK_EINVAL);
    if (!strstr(msg, bad[i].field)) fail_msg("case %zu: \"%s\" names no %s", i, msg, bad[i].field);
  }
  Stoker__V1__ReportQueueRequest req = STOKER__V1__REPORT_QUEUE_REQUEST__INIT;
  req.job = "r"; /* No status at all. */
  struct res *r = res_new();
  coord_report_queue(f->c, &req, on_done, r);
  assert_int_equal(wait_res(f, r)->err, STK_EINVAL);
  assert_non_null(strstr(r->msg, "status"));
  res_free(r);
  struct res *g = get_job(f, "r");
  assert_null(JOB(g)->queue); /* Nothing changed. */
  res_free(g);
  struct seen s;
  events(f, "r", &s);
  assert_int_equal(s.n, 1);
}

static int scale_to(struct fx *f, const char *job, uint32_t ranks, char *ret_msg) {
  Stoker__V1__ScaleJobRequest req = STOKER__V1__SCALE_JOB_REQUEST__INIT;
  req.job = (char *)job;
  req.ranks = ranks;
  struct res *r = res_new();
  coord_scale_job(f->c, &req, on_done, r);
  int err = wait_res(f, r)->err;
  if (ret_msg) snprintf(ret_msg, 256, "%s", r->msg);
  res_free(r);
  return err;
}

static void assert_running(struct fx *f, const char *job, uint32_t world, uint64_t gen,
                           uint32_t target) {
  struct res *g = get_job(f, job);
  assert_int_equal(JOB(g)->state, JS(RUNNING));
  assert_int_equal(JOB(g)->world_size, world);
  assert_int_equal(JOB(g)->generation, gen);
  assert_int_equal(JOB(g)->target_ranks, target);
  res_free(g);
}

/* A user's resize of a submitted job (ScaleJob, stokerctl job resize):
 * beyond max_ranks or below min_ranks it is refused naming the field and
 * changes nothing; within, it sets the target (SCALED says the queue
 * controller resizes the workload). A shrink leaves the ranks running: the
 * controller's PreemptJob reshapes it, since its Job deletes the highest
 * indexes, not the last ranks. A grow waits until as many new ranks as it
 * lacks have joined (the controller grew the Job), then scales at a step
 * boundary: checkpoint first, one round, GROWN. */
static void test_resize_submitted(void **state) {
  struct fx *f = *state;
  Stoker__V1__Submission sub = good_sub();
  assert_int_equal(submit(f, "rs", &sub, NULL), 0); /* 1..4 ranks */
  struct res *r[2];
  join_all(f, "rs", 2, r); /* Closes at 2 after the last call. */
  res_free(r[0]), res_free(r[1]);
  char msg[256];
  assert_int_equal(scale_to(f, "rs", 5, msg), STK_EINVAL);
  assert_string_equal(msg, "ranks 5 is above the job's max_ranks 4");
  assert_int_equal(scale_to(f, "rs", 0, msg), STK_EINVAL);
  assert_string_equal(msg, "ranks 0 is below the job's min_ranks 1");
  struct seen s;
  events(f, "rs", &s);
  assert_int_equal(count(&s, EV(SCALED)), 0);
  assert_running(f, "rs", 2, 1, 0); /* Nothing changed. */

  assert_int_equal(scale_to(f, "rs", 1, NULL), 0);
  assert_int_equal(heartbeat(f, "rs", "m0", 1), ACT(CONTINUE)); /* No checkpoint, no round. */
  assert_running(f, "rs", 2, 1, 1);
  events(f, "rs", &s);
  assert_string_equal(s.msg[last(&s, EV(SCALED))],
                      "target 1 ranks (its queue controller resizes the workload)");

  assert_int_equal(scale_to(f, "rs", 4, NULL), 0);
  assert_int_equal(heartbeat(f, "rs", "m0", 1), ACT(CONTINUE));
  struct res *x2 = join(f, "rs", "m2"); /* One of the two it lacks: a spare. */
  run_for(f, 60);
  assert_false(x2->done);
  assert_int_equal(heartbeat(f, "rs", "m0", 1), ACT(CONTINUE));
  assert_running(f, "rs", 2, 1, 4);
  struct res *x3 = join(f, "rs", "m3"); /* Both there: checkpoint, then the round. */
  run_for(f, 60);
  assert_false(x3->done);
  assert_int_equal(heartbeat(f, "rs", "m0", 1), ACT(CHECKPOINT_NOW));
  assert_int_equal(heartbeat(f, "rs", "m1", 1), ACT(CHECKPOINT_NOW));
  assert_int_equal(report_ckpt(f, "rs", 9, 1), 0);
  join_all(f, "rs", 2, r); /* m0, m1 rejoin: 4, the cap. */
  run_until(f, &x2->done);
  run_until(f, &x3->done);
  assert_int_equal(x3->err, 0);
  assert_int_equal(JOINR(x3)->world_size, 4);
  assert_int_equal(JOINR(x3)->latest_checkpoint->step, 9);
  res_free(x2), res_free(x3), res_free(r[0]), res_free(r[1]);
  assert_running(f, "rs", 4, 2, 4);
  events(f, "rs", &s);
  assert_int_equal(count(&s, EV(GROWN)), 1);
  assert_string_equal(s.msg[last(&s, EV(GROWN))], "grown from 2 to 4 ranks at step 9");
  assert_int_equal(count(&s, EV(ROUND_CLOSED)), 2);
}

/* ScaleJob's answer's target_seq (0 when refused). */
static uint64_t scale_seq(struct fx *f, const char *job, uint32_t ranks) {
  Stoker__V1__ScaleJobRequest req = STOKER__V1__SCALE_JOB_REQUEST__INIT;
  req.job = (char *)job;
  req.ranks = ranks;
  struct res *r = res_new();
  coord_scale_job(f->c, &req, on_done, r);
  uint64_t seq = wait_res(f, r)->err ? 0 : JOB(r)->target_seq;
  res_free(r);
  return seq;
}

static uint64_t target_seq_of(struct fx *f, const char *job) {
  struct res *g = get_job(f, job);
  uint64_t seq = JOB(g)->target_seq;
  res_free(g);
  return seq;
}

/* Job.target_seq tells one setting of the target from another even at the
 * same ranks (a queue controller knows its own ScaleJob from a user's):
 * 0 before any ScaleJob; each ScaleJob's is the seq of the SCALED event it
 * logged, a new one each time; a refused ScaleJob changes nothing; a
 * restart keeps it. Submitted or not. */
static void test_target_seq(void **state) {
  struct fx *f = *state;
  Stoker__V1__Submission sub = good_sub();
  assert_int_equal(submit(f, "ts", &sub, NULL), 0); /* 1..4 ranks */
  create(f, "plain", 1, 4);
  const char *jobs[] = {"ts", "plain"};
  for (int i = 0; i < 2; i++) {
    const char *job = jobs[i];
    assert_int_equal(target_seq_of(f, job), 0);
    uint64_t first = scale_seq(f, job, 2);
    uint64_t second = scale_seq(f, job, 2); /* The same ranks: another setting. */
    struct seen s;
    events(f, job, &s);
    assert_int_equal(count(&s, EV(SCALED)), 2);
    assert_int_equal(second, s.seq[last(&s, EV(SCALED))]);
    assert_true(first > 0 && first < second);
    assert_int_equal(s.type[first - s.seq[0]], EV(SCALED));
    assert_int_equal(scale_seq(f, job, 5), 0);       /* Refused: */
    assert_int_equal(target_seq_of(f, job), second); /* unchanged. */
    fx_close(f);
    fx_open(f);
    assert_int_equal(target_seq_of(f, job), second);
    struct res *g = get_job(f, job);
    assert_int_equal(JOB(g)->target_ranks, 2);
    assert_true(JOB(g)->last_event_seq > second); /* COORDINATOR_RESTARTED came after. */
    res_free(g);
    assert_true(scale_seq(f, job, 3) > second);
  }
}

/* The child reports an admission and writes one byte once answered. */
static void admit_child(const char *dir, int fd) {
  struct fx f = {0};
  uv_loop_init(&f.loop);
  snprintf(f.dir, sizeof(f.dir), "%s", dir);
  f.opts.dir = f.dir;
  f.opts.tick_ms = 5;
  if (coord_open(&f.loop, &f.opts, &f.c)) _exit(2);
  Stoker__V1__QueueStatus st = status(Q(ADMITTED), -1, 3);
  if (report(&f, "k", &st, NULL)) _exit(3);
  char ok = 1;
  if (write(fd, &ok, 1) != 1) _exit(5);
  uv_run(&f.loop, UV_RUN_DEFAULT);
  _exit(0);
}

static void test_restart_keeps_report(void **state) {
  struct fx *f = *state;
  Stoker__V1__Submission sub = good_sub();
  char *args[] = {"--lr", "3e-4"};
  sub.args = args;
  sub.n_args = 2;
  assert_int_equal(submit(f, "k", &sub, NULL), 0);
  Stoker__V1__QueueStatus st = status(Q(QUEUED), 1, 0);
  st.message = "behind job-x";
  assert_int_equal(report(f, "k", &st, NULL), 0);
  fx_close(f);
  fx_open(f);
  struct res *g = get_job(f, "k");
  assert_int_equal(JOB(g)->queue->state, Q(QUEUED));
  assert_int_equal(JOB(g)->queue->position, 1);
  assert_string_equal(JOB(g)->queue->message, "behind job-x");
  assert_string_equal(JOB(g)->spec->submission->args[1], "3e-4");
  res_free(g);
  /* Same state after the restart: still no second event. */
  assert_int_equal(report(f, "k", &st, NULL), 0);
  fx_close(f);
  kill_after_ack(f->dir, admit_child);
  fx_open(f);
  g = get_job(f, "k");
  assert_int_equal(JOB(g)->queue->state, Q(ADMITTED));
  assert_int_equal(JOB(g)->queue->admitted_ranks, 3);
  res_free(g);
  struct seen s;
  events(f, "k", &s);
  assert_int_equal(count(&s, EV(QUEUED)), 1);
  assert_int_equal(count(&s, EV(ADMITTED)), 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_submit_refused, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_queue_events, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_report_refused, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_resize_submitted, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_restart_keeps_report, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_target_seq, fx_setup, fx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
