/*
 * Scaling a job down must let the members it no longer needs go: after an
 * operator scale to fewer ranks the round closes with the cap, and a member
 * of the previous generation left without a seat is told it is not needed
 * (its heartbeat answers STOP, its Join fails FAILED_PRECONDITION at once)
 * instead of parking in Join until the join timeout. A newcomer beyond the
 * cap is a spare and still parks for the next round. Growing: while a
 * scale waits for its checkpoint (told with resizing), a newcomer's Join
 * parks for the scale's round instead of opening one without it. Every
 * close at a world unlike the last close's logs SHRUNK or GROWN once, with
 * the new world and the checkpoint step it restores, also across a restart.
 * A submitted job's shrink in place (ScaleJobRequest.in_place): the members
 * whose pods are deleted (terminating) checkpoint with the others and go,
 * no preemption; the kept ones rejoin at the target from that checkpoint.
 */
#include "coord_test.h"

#define ACT(x) STOKER__V1__HEARTBEAT_ACTION__HEARTBEAT_ACTION_##x

/* ScaleJob to ranks (in_place: a shrink in place); returns the error. */
static int scale_as(struct fx *f, const char *job, uint32_t ranks, bool in_place) {
  Stoker__V1__ScaleJobRequest req = STOKER__V1__SCALE_JOB_REQUEST__INIT;
  req.job = (char *)job;
  req.ranks = ranks;
  req.in_place = in_place;
  struct res *r = res_new();
  coord_scale_job(f->c, &req, on_done, r);
  int err = wait_res(f, r)->err;
  res_free(r);
  return err;
}

static int scale_to(struct fx *f, const char *job, uint32_t ranks) {
  return scale_as(f, job, ranks, false);
}

#define EV(x) STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_##x

/* What a job's stored events say of one type: how many, and the last. */
struct resized {
  int n;
  uint32_t world;
  int64_t step;
  char msg[160];
  int want;
};

static bool on_ev(void *arg, const Stoker__V1__JobEvent *ev) {
  struct resized *s = arg;
  if ((int)ev->type == s->want) {
    s->n++;
    s->world = ev->world_size;
    s->step = ev->step;
    snprintf(s->msg, sizeof(s->msg), "%s", ev->message);
  }
  return true;
}

static void ev_done(void *arg, int err, const char *msg, const ProtobufCMessage *resp) {
  (void)arg, (void)err, (void)msg, (void)resp;
}

static struct resized events_of(struct fx *f, const char *job, int type) {
  struct resized s = {.want = type};
  Stoker__V1__WatchJobRequest req = STOKER__V1__WATCH_JOB_REQUEST__INIT;
  req.job = (char *)job;
  struct coord_wait *w = coord_watch_job(f->c, &req, on_ev, ev_done, &s);
  run_for(f, 50);
  coord_cancel(f->c, w);
  run_for(f, 20);
  return s;
}

static void assert_resized(struct fx *f, const char *job, int type, int n, uint32_t world,
                           int64_t step, const char *msg) {
  struct resized s = events_of(f, job, type);
  assert_int_equal(s.n, n);
  if (!n) return;
  assert_int_equal(s.world, world);
  assert_int_equal(s.step, step);
  assert_string_equal(s.msg, msg);
}

static void assert_job(struct fx *f, const char *name, Stoker__V1__JobState state, uint32_t world) {
  struct res *g = get_job(f, name);
  assert_int_equal(g->err, 0);
  assert_int_equal(JOB(g)->state, state);
  assert_int_equal(JOB(g)->world_size, world);
  res_free(g);
}

static void assert_not_needed(const struct res *r) {
  assert_true(r->done);
  assert_int_equal(r->err, STK_ESTATE);
  if (!strstr(r->msg, "not needed")) fail_msg("unexpected message: %s", r->msg);
}

/* 3 -> 2 while running: checkpoint, new round, two rejoin and close it; the
 * third hears STOP from its heartbeat and is refused if it joins anyway. */
static void test_scale_down_running(void **state) {
  struct fx *f = *state;
  create(f, "sd", 1, 3);
  struct res *r[3];
  join_all(f, "sd", 3, r);
  for (int i = 0; i < 3; i++) res_free(r[i]);
  assert_int_equal(scale_to(f, "sd", 2), 0);
  for (int i = 0; i < 3; i++) {
    char id[8];
    snprintf(id, sizeof(id), "m%d", i);
    assert_int_equal(heartbeat(f, "sd", id, 1), ACT(CHECKPOINT_NOW));
  }
  say_stop(f, "sd", 1, 3, 7);
  assert_int_equal(report_ckpt(f, "sd", 7, 1), 0);
  assert_int_equal(heartbeat(f, "sd", "m2", 1), ACT(RESTART)); /* Round open: rejoin. */
  join_all(f, "sd", 2, r);                                     /* Cap 2: closes at once. */
  assert_int_equal(JOINR(r[0])->world_size, 2);
  assert_int_equal(JOINR(r[0])->latest_checkpoint->step, 7);
  res_free(r[0]);
  res_free(r[1]);
  assert_int_equal(heartbeat(f, "sd", "m2", 1), ACT(STOP));
  struct res *late = wait_res(f, join(f, "sd", "m2"));
  assert_not_needed(late);
  res_free(late);
  assert_job(f, "sd", STOKER__V1__JOB_STATE__JOB_STATE_RUNNING, 2);
  assert_resized(f, "sd", EV(SHRUNK), 1, 2, 7, "shrunk from 3 to 2 ranks at step 7");
  assert_resized(f, "sd", EV(GROWN), 0, 0, 0, NULL);
  assert_int_equal(heartbeat(f, "sd", "m0", 2), ACT(CONTINUE)); /* The others go on. */
  /* A newcomer is a spare, not surplus: it waits for the next round. */
  struct res *spare = join(f, "sd", "x9");
  run_for(f, 60);
  assert_false(spare->done);
  assert_int_equal(heartbeat(f, "sd", "x9", 2), ACT(RESTART));
  fx_close(f); /* Fails the parked spare. */
  assert_true(spare->done);
  res_free(spare);
}

/* Paused at 3, every member parked again, scaled to 2, resumed: the round
 * closes with two and the third, still parked, is refused at once. */
static void test_scale_down_parked(void **state) {
  struct fx *f = *state;
  create(f, "pz", 1, 3);
  struct res *r[3];
  join_all(f, "pz", 3, r);
  for (int i = 0; i < 3; i++) res_free(r[i]);
  assert_int_equal(job_action(f, coord_pause_job, "pz", true), 0);
  for (int i = 0; i < 3; i++) {
    char id[8];
    snprintf(id, sizeof(id), "m%d", i);
    assert_int_equal(heartbeat(f, "pz", id, 1), ACT(STOP));
  }
  assert_job(f, "pz", STOKER__V1__JOB_STATE__JOB_STATE_PAUSED, 0);
  for (int i = 0; i < 3; i++) {
    char id[8];
    snprintf(id, sizeof(id), "m%d", i);
    r[i] = join(f, "pz", id);
  }
  run_for(f, 30);
  assert_false(r[2]->done);
  assert_int_equal(scale_to(f, "pz", 2), 0);
  assert_int_equal(job_action(f, coord_resume_job, "pz", false), 0);
  run_until(f, &r[0]->done);
  run_until(f, &r[1]->done);
  run_until(f, &r[2]->done);
  assert_int_equal(r[0]->err, 0);
  assert_int_equal(JOINR(r[0])->rank, 0);
  assert_int_equal(JOINR(r[1])->rank, 1);
  assert_int_equal(JOINR(r[1])->world_size, 2);
  assert_not_needed(r[2]);
  for (int i = 0; i < 3; i++) res_free(r[i]);
  assert_job(f, "pz", STOKER__V1__JOB_STATE__JOB_STATE_RUNNING, 2);
}

static int beat_at(struct fx *f, const char *job, const char *member, uint64_t gen, uint64_t step,
                   int64_t stop_step, bool *ret_resizing);

/* A member merely late (the round closed below the cap) is not surplus:
 * its Join grows the job at a step boundary, as a ScaleJob up does (a
 * round opened at once would restore an older checkpoint). */
static void test_late_member_not_surplus(void **state) {
  struct fx *f = *state;
  create(f, "lt", 1, 3);
  struct res *r[3];
  join_all(f, "lt", 3, r);
  for (int i = 0; i < 3; i++) res_free(r[i]);
  Stoker__V1__LeaveRequest lr = STOKER__V1__LEAVE_REQUEST__INIT;
  lr.job = "lt", lr.member_id = "m2", lr.generation = 1;
  struct res *lv = res_new();
  coord_leave(f->c, &lr, on_done, lv);
  assert_int_equal(wait_res(f, lv)->err, 0);
  res_free(lv);
  join_all(f, "lt", 2, r);
  run_until(f, &r[0]->done); /* Closes after the last call with two. */
  res_free(r[0]);
  res_free(r[1]);
  assert_int_equal(heartbeat(f, "lt", "m2", 1), ACT(RESTART));
  struct res *back = join(f, "lt", "m2"); /* Parks; the job checkpoints first. */
  run_for(f, 60);
  assert_false(back->done);
  assert_job(f, "lt", STOKER__V1__JOB_STATE__JOB_STATE_RUNNING, 2);
  bool resizing = false;
  assert_int_equal(beat_at(f, "lt", "m0", 2, 0, 0, &resizing), ACT(CHECKPOINT_NOW));
  assert_true(resizing);
  assert_int_equal(beat_at(f, "lt", "m1", 2, 0, 0, &resizing), ACT(CHECKPOINT_NOW));
  say_stop(f, "lt", 2, 2, 4);
  assert_int_equal(report_ckpt(f, "lt", 4, 2), 0); /* Opens generation 3. */
  assert_job(f, "lt", STOKER__V1__JOB_STATE__JOB_STATE_WAITING, 0);
  join_all(f, "lt", 2, r);
  run_until(f, &back->done);
  assert_int_equal(back->err, 0);
  assert_int_equal(JOINR(back)->world_size, 3);
  assert_int_equal(JOINR(back)->latest_checkpoint->step, 4);
  res_free(back);
  /* A member gone is a smaller world too, and its return a larger one. */
  assert_resized(f, "lt", EV(SHRUNK), 1, 2, 0, "shrunk from 3 to 2 ranks at step 0");
  assert_resized(f, "lt", EV(GROWN), 1, 3, 4, "grown from 2 to 3 ranks at step 4");
  res_free(r[0]);
  res_free(r[1]);
}

/* A heartbeat in generation gen at step with the ranks' stop step (0:
 * none): the action, and the reply's resizing into *ret_resizing (or NULL). */
static int send_beat(struct fx *f, const char *job, const char *member, uint64_t gen, uint64_t step,
                     int64_t stop_step, bool terminating, bool *ret_resizing, bool *ret_pausing);

static int beat_at(struct fx *f, const char *job, const char *member, uint64_t gen, uint64_t step,
                   int64_t stop_step, bool *ret_resizing) {
  return send_beat(f, job, member, gen, step, stop_step, false, ret_resizing, NULL);
}

/* The heartbeat both above and beat_term send (terminating: the rank got
 * SIGTERM): the action; the reply's resizing and pausing (or NULL). */
static int send_beat(struct fx *f, const char *job, const char *member, uint64_t gen, uint64_t step,
                     int64_t stop_step, bool terminating, bool *ret_resizing, bool *ret_pausing) {
  Stoker__V1__HeartbeatRequest req = STOKER__V1__HEARTBEAT_REQUEST__INIT;
  req.job = (char *)job, req.member_id = (char *)member, req.generation = gen;
  req.step = step, req.stop_step = stop_step, req.terminating = terminating;
  req.health = STOKER__V1__RANK_HEALTH__RANK_HEALTH_OK;
  struct res *r = res_new();
  coord_heartbeat(f->c, &req, on_done, r);
  wait_res(f, r);
  assert_int_equal(r->err, 0);
  Stoker__V1__HeartbeatResponse *resp = (Stoker__V1__HeartbeatResponse *)r->resp;
  int action = (int)resp->action;
  if (ret_resizing) *ret_resizing = resp->resizing;
  if (ret_pausing) *ret_pausing = resp->pausing;
  res_free(r);
  return action;
}

static int beat_resizing(struct fx *f, const char *job, const char *member, uint64_t gen,
                         bool *ret_resizing) {
  return beat_at(f, job, member, gen, 0, 0, ret_resizing);
}

/* 2 -> 3: the members are told CHECKPOINT_NOW with resizing; a newcomer
 * joining before the checkpoint is reported parks (the job keeps running
 * at 2); the report opens the round, which closes at 3 with that
 * checkpoint. */
static void test_grow_waits_for_checkpoint(void **state) {
  struct fx *f = *state;
  create(f, "gr", 1, 3);
  struct res *r[3];
  join_all(f, "gr", 2, r);
  res_free(r[0]), res_free(r[1]);
  assert_int_equal(scale_to(f, "gr", 3), 0);
  bool resizing = false;
  assert_int_equal(beat_resizing(f, "gr", "m0", 1, &resizing), ACT(CHECKPOINT_NOW));
  assert_true(resizing);
  struct res *newcomer = join(f, "gr", "m2");
  run_for(f, 60);
  assert_false(newcomer->done);
  assert_job(f, "gr", STOKER__V1__JOB_STATE__JOB_STATE_RUNNING, 2); /* No round without it. */
  assert_int_equal(beat_resizing(f, "gr", "m1", 1, &resizing), ACT(CHECKPOINT_NOW));
  assert_true(resizing);
  say_stop(f, "gr", 1, 2, 12);
  assert_int_equal(report_ckpt(f, "gr", 12, 1), 0);
  assert_job(f, "gr", STOKER__V1__JOB_STATE__JOB_STATE_WAITING, 0);
  join_all(f, "gr", 2, r); /* With the newcomer: 3, the cap. */
  run_until(f, &newcomer->done);
  assert_int_equal(newcomer->err, 0);
  assert_int_equal(JOINR(newcomer)->world_size, 3);
  assert_int_equal(JOINR(newcomer)->latest_checkpoint->step, 12);
  res_free(newcomer), res_free(r[0]), res_free(r[1]);
  assert_resized(f, "gr", EV(GROWN), 1, 3, 12, "grown from 2 to 3 ranks at step 12");
  assert_resized(f, "gr", EV(SHRUNK), 0, 0, 0, NULL);
}

/* Only the resize's own checkpoint opens its round. The ranks had reported
 * step 9 when ScaleJob came; a periodic checkpoint of 8 (begun before) and
 * one of 10 (begun after their last report, before the step they agreed to
 * stop at, 11) are reported while they stop: neither opens the round, so
 * the ranks' checkpoint of 11 is not cut off ("generation ended") and the
 * new world restores 11, not a step they trained past. Seen on the real
 * cluster: a grow's round opened on the periodic checkpoint of 240 while
 * the ranks saved 241, which was trained twice. Nor does the resize's wait
 * run out while the ranks say they stop: a round opened then restores an
 * older checkpoint too. */
static void test_grow_takes_only_its_checkpoint(void **state) {
  struct fx *f = *state;
  Stoker__V1__JobSpec spec = short_lease_spec_of("gs", 1, 3);
  spec.heartbeat_misses = 40; /* A 2 s lease: no member lost while the test waits. */
  assert_int_equal(create_spec(f, &spec), 0);
  struct res *r[2];
  join_all(f, "gs", 2, r);
  res_free(r[0]), res_free(r[1]);
  assert_int_equal(report_ckpt(f, "gs", 5, 1), 0);
  assert_int_equal(beat_at(f, "gs", "m0", 1, 9, 0, NULL), ACT(CONTINUE));
  assert_int_equal(beat_at(f, "gs", "m1", 1, 9, 0, NULL), ACT(CONTINUE));
  assert_int_equal(scale_to(f, "gs", 3), 0);
  assert_int_equal(beat_at(f, "gs", "m0", 1, 9, 0, NULL), ACT(CHECKPOINT_NOW));
  assert_int_equal(beat_at(f, "gs", "m1", 1, 9, 0, NULL), ACT(CHECKPOINT_NOW));
  assert_int_equal(report_ckpt(f, "gs", 8, 1), 0); /* Begun before the ScaleJob. */
  assert_job(f, "gs", STOKER__V1__JOB_STATE__JOB_STATE_RUNNING, 2);
  assert_int_equal(beat_at(f, "gs", "m0", 1, 11, 11, NULL),
                   ACT(CONTINUE));                  /* Their vote: stop at 11. */
  assert_int_equal(report_ckpt(f, "gs", 10, 1), 0); /* Begun at 10. */
  assert_job(f, "gs", STOKER__V1__JOB_STATE__JOB_STATE_RUNNING, 2);
  run_for(f, 700); /* Past the resize's wait (10 intervals of 50 ms). */
  assert_int_equal(beat_at(f, "gs", "m0", 1, 11, 11, NULL), ACT(CONTINUE));
  assert_int_equal(beat_at(f, "gs", "m1", 1, 11, 11, NULL), ACT(CONTINUE));
  assert_job(f, "gs", STOKER__V1__JOB_STATE__JOB_STATE_RUNNING, 2);
  assert_int_equal(report_ckpt(f, "gs", 11, 1), 0); /* Theirs. */
  assert_job(f, "gs", STOKER__V1__JOB_STATE__JOB_STATE_WAITING, 0);
  struct res *nc = join(f, "gs", "m2");
  join_all(f, "gs", 2, r);
  run_until(f, &nc->done);
  assert_int_equal(nc->err, 0);
  assert_int_equal(JOINR(nc)->latest_checkpoint->step, 11);
  res_free(nc), res_free(r[0]), res_free(r[1]);
}

/* A checkpoint reported before any rank heard of the resize does not open
 * its round, though it is past every step the members had reported (9):
 * the periodic checkpoint of 10, begun after their last heartbeats, while
 * the ranks train on to their stop step (11). The round waits until every
 * member said its stop step and a checkpoint of at least it is there. On
 * the real cluster the checkpoint of 660 opened a grow's round so, 0.5 s
 * after the ScaleJob, with the ranks at 664. */
static void test_grow_waits_for_the_stop_steps(void **state) {
  struct fx *f = *state;
  create(f, "gt", 1, 3);
  struct res *r[2];
  join_all(f, "gt", 2, r);
  res_free(r[0]), res_free(r[1]);
  assert_int_equal(beat_at(f, "gt", "m0", 1, 9, 0, NULL), ACT(CONTINUE));
  assert_int_equal(beat_at(f, "gt", "m1", 1, 9, 0, NULL), ACT(CONTINUE));
  assert_int_equal(scale_to(f, "gt", 3), 0);
  assert_int_equal(report_ckpt(f, "gt", 10, 1), 0); /* Nobody heard of the resize yet. */
  assert_job(f, "gt", STOKER__V1__JOB_STATE__JOB_STATE_RUNNING, 2);
  assert_int_equal(beat_at(f, "gt", "m0", 1, 10, 0, NULL), ACT(CHECKPOINT_NOW));
  assert_int_equal(beat_at(f, "gt", "m1", 1, 10, 0, NULL), ACT(CHECKPOINT_NOW));
  assert_int_equal(beat_at(f, "gt", "m0", 1, 11, 11, NULL), ACT(CONTINUE));
  assert_int_equal(report_ckpt(f, "gt", 11, 1), 0); /* m1 has not said its stop step. */
  assert_job(f, "gt", STOKER__V1__JOB_STATE__JOB_STATE_RUNNING, 2);
  beat_at(f, "gt", "m1", 1, 11, 11, NULL); /* The last stop step said: the round opens. */
  assert_job(f, "gt", STOKER__V1__JOB_STATE__JOB_STATE_WAITING, 0);
  assert_int_equal(beat_at(f, "gt", "m0", 1, 11, 11, NULL), ACT(RESTART));
}

/* A grow's round does not close at its last call without a member of the
 * last generation that is slower to rejoin than the others: m1 (whose
 * lease, 2 s, still runs) comes 400 ms after m0 and the newcomer, past the
 * 100 ms last call, and the round closes with it, at 3. Closed without it,
 * m1's Join would open another round that restores the same checkpoint,
 * the steps trained in between trained twice (seen with a rank that heard
 * the resize late). */
static void test_grow_waits_for_a_slow_member(void **state) {
  struct fx *f = *state;
  create(f, "gl", 1, 3);
  struct res *r[2];
  join_all(f, "gl", 2, r);
  res_free(r[0]), res_free(r[1]);
  assert_int_equal(scale_to(f, "gl", 3), 0);
  struct res *nc = join(f, "gl", "m2");
  say_stop(f, "gl", 1, 2, 12);
  assert_int_equal(report_ckpt(f, "gl", 12, 1), 0);
  assert_job(f, "gl", STOKER__V1__JOB_STATE__JOB_STATE_WAITING, 0);
  struct res *m0 = join(f, "gl", "m0");
  run_for(f, 400);
  assert_false(m0->done);
  assert_job(f, "gl", STOKER__V1__JOB_STATE__JOB_STATE_WAITING, 0);
  struct res *m1 = join(f, "gl", "m1");
  run_until(f, &m1->done);
  assert_int_equal(m1->err, 0);
  assert_int_equal(JOINR(m1)->world_size, 3);
  assert_int_equal(JOINR(m1)->latest_checkpoint->step, 12);
  res_free(nc), res_free(m0), res_free(m1);
  assert_resized(f, "gl", EV(GROWN), 1, 3, 12, "grown from 2 to 3 ranks at step 12");
}

/* A member of the last generation that never comes back holds the round
 * only until its lease runs out (2 s after its last heartbeat), then the
 * round closes without it at its last call's world. */
static void test_a_round_waits_for_a_lost_member_only_its_lease(void **state) {
  struct fx *f = *state;
  create(f, "gm", 1, 2);
  struct res *r[2];
  join_all(f, "gm", 2, r);
  res_free(r[0]), res_free(r[1]);
  assert_int_equal(heartbeat(f, "gm", "m1", 1), ACT(CONTINUE));
  struct res *m0 = join(f, "gm", "m0"); /* A rejoin: a round opens. */
  run_for(f, 500);
  assert_false(m0->done);
  assert_job(f, "gm", STOKER__V1__JOB_STATE__JOB_STATE_WAITING, 0);
  run_until(f, &m0->done);
  assert_int_equal(m0->err, 0);
  assert_int_equal(JOINR(m0)->world_size, 1);
  res_free(m0);
}

/* A submitted job of max ranks (its pods are a queue controller's), with a
 * 1 s last call: the kept ranks of a shrink rejoin before it ends. */
static void create_submitted(struct fx *f, const char *name, uint32_t max) {
  Stoker__V1__Submission sub = STOKER__V1__SUBMISSION__INIT;
  sub.queue = "team-a";
  sub.template_ = "llm";
  Stoker__V1__JobSpec s = spec_of(name, 1, max);
  s.last_call_ms = 1000;
  s.submission = &sub;
  assert_int_equal(create_spec(f, &s), 0);
}

static int scale_in_place(struct fx *f, const char *job, uint32_t ranks) {
  return scale_as(f, job, ranks, true);
}

/* A heartbeat as a rank that got SIGTERM (terminating) sends it, at step
 * with its stop step: the action; the reply's resizing and pausing. */
static int beat_term(struct fx *f, const char *job, const char *member, uint64_t gen, uint64_t step,
                     int64_t stop_step, bool *ret_resizing, bool *ret_pausing) {
  return send_beat(f, job, member, gen, step, stop_step, true, ret_resizing, ret_pausing);
}

/* Leave after staging the checkpoint of step (LeaveRequest.checkpoint_step). */
static int leave_staged(struct fx *f, const char *job, const char *member, uint64_t gen,
                        int64_t step) {
  Stoker__V1__LeaveRequest req = STOKER__V1__LEAVE_REQUEST__INIT;
  req.job = (char *)job, req.member_id = (char *)member, req.generation = gen;
  req.checkpoint_step = step;
  struct res *r = res_new();
  coord_leave(f->c, &req, on_done, r);
  int err = wait_res(f, r)->err;
  res_free(r);
  return err;
}

/* A shrink in place (issue 23): a submitted job of 4 scaled to 2 with
 * in_place while its controller deletes the pods of m2 and m3. Their
 * SIGTERM (terminating) and their Leave with the checkpoint step are no
 * preemption notice: the job never pauses, every rank is told the
 * resize's CHECKPOINT_NOW (resizing, not pausing), the round opens on the
 * checkpoint of the stop step without waiting for m3 (which has not left
 * yet), m0 and m1 rejoin and the round closes at 2 restoring it, SHRUNK
 * "in place". m2 and m3 are refused a seat until the close (Join
 * FAILED_PRECONDITION, heartbeat STOP); after it a Join by their names is
 * a new pod's, a spare. Without in_place the first
 * terminating heartbeat paused the job (test_coord_preempt). */
static void shrink_in_place(struct fx *f, const char *sp, bool submitted);

static void test_shrink_in_place(void **state) {
  shrink_in_place(*state, "sp", true);
}

/* The same for a job that is not submitted (created with stokerctl job
 * create, as the example Job does) whose Kubernetes Job the queue
 * controller shrinks: on the cluster its in_place was ignored, a deleted
 * rank's SIGTERM paused the job and every pod restarted. */
static void test_shrink_in_place_not_submitted(void **state) {
  shrink_in_place(*state, "sn", false);
}

static void shrink_in_place(struct fx *f, const char *sp, bool submitted) {
  if (submitted) {
    create_submitted(f, sp, 4);
  } else { /* The example Job's, created with stokerctl job create. */
    Stoker__V1__JobSpec spec = spec_of(sp, 1, 4);
    spec.last_call_ms = 1000;
    assert_int_equal(create_spec(f, &spec), 0);
  }
  struct res *r[4];
  join_all(f, sp, 4, r);
  for (int i = 0; i < 4; i++) res_free(r[i]);
  const char *ids[4] = {"m0", "m1", "m2", "m3"};
  for (int i = 0; i < 4; i++)
    assert_int_equal(beat_at(f, sp, ids[i], 1, 9, 0, NULL), ACT(CONTINUE));
  assert_int_equal(scale_in_place(f, sp, 2), 0);
  bool resizing = false, pausing = true;
  for (int i = 2; i < 4; i++) { /* SIGTERM: their pods are being deleted. */
    assert_int_equal(beat_term(f, sp, ids[i], 1, 9, 0, &resizing, &pausing), ACT(CHECKPOINT_NOW));
    assert_true(resizing);
    assert_false(pausing);
  }
  for (int i = 0; i < 2; i++) {
    assert_int_equal(beat_at(f, sp, ids[i], 1, 9, 0, &resizing), ACT(CHECKPOINT_NOW));
    assert_true(resizing);
  }
  assert_job(f, sp, STOKER__V1__JOB_STATE__JOB_STATE_RUNNING, 4);
  for (int i = 0; i < 2; i++)
    assert_int_equal(beat_at(f, sp, ids[i], 1, 11, 11, NULL), ACT(CONTINUE));
  for (int i = 2; i < 4; i++)
    assert_int_equal(beat_term(f, sp, ids[i], 1, 11, 11, NULL, &pausing), ACT(CONTINUE));
  assert_false(pausing);
  assert_int_equal(leave_staged(f, sp, "m2", 1, 11), 0); /* Staged, gone: no notice. */
  assert_job(f, sp, STOKER__V1__JOB_STATE__JOB_STATE_RUNNING, 4);
  struct res *early = join(f, sp, "m2");
  run_until(f, &early->done);
  assert_int_equal(early->err, STK_ESTATE);
  res_free(early);
  assert_int_equal(report_ckpt(f, sp, 11, 1), 0); /* The resize's: the round opens. */
  assert_job(f, sp, STOKER__V1__JOB_STATE__JOB_STATE_WAITING, 0);
  assert_int_equal(beat_term(f, sp, "m3", 1, 11, 11, NULL, NULL), ACT(STOP));
  assert_int_equal(leave_staged(f, sp, "m3", 1, 11), 0);
  struct res *late = join(f, sp, "m3");
  run_until(f, &late->done);
  assert_int_equal(late->err, STK_ESTATE);
  res_free(late);
  assert_int_equal(beat_at(f, sp, "m0", 1, 11, 11, NULL), ACT(RESTART));
  join_all(f, sp, 2, r);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(r[i]->err, 0);
    assert_int_equal(JOINR(r[i])->world_size, 2);
    assert_int_equal(JOINR(r[i])->rank, (uint32_t)i); /* The kept ranks keep their order. */
    assert_int_equal(JOINR(r[i])->latest_checkpoint->step, 11);
    res_free(r[i]);
  }
  assert_job(f, sp, STOKER__V1__JOB_STATE__JOB_STATE_RUNNING, 2);
  assert_resized(f, sp, EV(SHRUNK), 1, 2, 11, "shrunk from 4 to 2 ranks at step 11 (in place)");
  assert_int_equal(events_of(f, sp, EV(PREEMPTED)).n, 0);
  assert_int_equal(events_of(f, sp, EV(PAUSED)).n, 0);
  /* A removed member's heartbeat after the close (a torchrun agent beats
   * until its workers stopped) is no notice: the shrink is forgotten, and
   * the job holds that member no more. It paused the job (a PyTorch test,
   * tests/python/test_elastic.py). */
  beat_term(f, sp, "m3", 1, 11, 11, NULL, NULL);
  assert_job(f, sp, STOKER__V1__JOB_STATE__JOB_STATE_RUNNING, 2);
  assert_int_equal(events_of(f, sp, EV(PREEMPTED)).n, 0);
  /* Once the round closed, a Join by a removed member's name is a new pod
   * (an Indexed Job grown back reuses index 2): a spare, not refused.
   * Refused, its trainer exited 0 and the Job counted the index completed
   * for good, so the grow never came (seen on the real cluster). */
  struct res *again = join(f, sp, "m2");
  run_for(f, 60);
  assert_false(again->done);
  assert_job(f, sp, STOKER__V1__JOB_STATE__JOB_STATE_RUNNING, 2);
  fx_close(f); /* Fails the parked spare. */
  assert_true(again->done);
  res_free(again);
}

/* A shrink of 4 to 2 removes two members: a third that reports
 * terminating is a real preemption notice (its pod is evicted too), and
 * the job pauses with a checkpoint first, as without in_place. */
static void test_shrink_in_place_then_notice(void **state) {
  struct fx *f = *state;
  create_submitted(f, "sn", 4);
  struct res *r[4];
  join_all(f, "sn", 4, r);
  for (int i = 0; i < 4; i++) res_free(r[i]);
  assert_int_equal(scale_in_place(f, "sn", 2), 0);
  bool pausing = true;
  assert_int_equal(beat_term(f, "sn", "m3", 1, 9, 0, NULL, &pausing), ACT(CHECKPOINT_NOW));
  assert_false(pausing);
  assert_int_equal(beat_term(f, "sn", "m2", 1, 9, 0, NULL, &pausing), ACT(CHECKPOINT_NOW));
  assert_false(pausing);
  assert_int_equal(events_of(f, "sn", EV(PREEMPTED)).n, 0);
  assert_job(f, "sn", STOKER__V1__JOB_STATE__JOB_STATE_RUNNING, 4);
  beat_term(f, "sn", "m1", 1, 9, 0, NULL, &pausing);
  assert_true(pausing);
  assert_job(f, "sn", STOKER__V1__JOB_STATE__JOB_STATE_PAUSING, 4);
  assert_int_equal(events_of(f, "sn", EV(PREEMPTED)).n, 1);
}

/* A shrink's round full at its target before the coordinator knows every
 * member it removes waits: m2, whose SIGTERM came after the kept ranks'
 * vote stopped it, rejoins before m1. Closing then would seat m2 (whose pod
 * is being deleted) and leave out m1 (kept by the Job). m2 then leaves with
 * the checkpoint step (its SIGTERM): its Join ends, it is removed, and the
 * round closes with m0 and m1 once m1 is back. */
static void test_shrink_in_place_waits_for_the_removed(void **state) {
  struct fx *f = *state;
  create_submitted(f, "sw", 4);
  struct res *r[4];
  join_all(f, "sw", 4, r);
  for (int i = 0; i < 4; i++) res_free(r[i]);
  assert_int_equal(scale_in_place(f, "sw", 2), 0);
  assert_int_equal(beat_term(f, "sw", "m3", 1, 9, 0, NULL, NULL), ACT(CHECKPOINT_NOW));
  say_stop(f, "sw", 1, 4, 11);
  assert_int_equal(report_ckpt(f, "sw", 11, 1), 0);
  assert_job(f, "sw", STOKER__V1__JOB_STATE__JOB_STATE_WAITING, 0);
  struct res *m2 = join(f, "sw", "m2");
  struct res *m0 = join(f, "sw", "m0");
  run_for(f, 100);
  assert_false(m0->done); /* Two joined, the target: not yet. */
  assert_job(f, "sw", STOKER__V1__JOB_STATE__JOB_STATE_WAITING, 0);
  assert_int_equal(leave_staged(f, "sw", "m2", 1, 11), 0);
  run_until(f, &m2->done);
  assert_int_not_equal(m2->err, 0);
  struct res *m1 = join(f, "sw", "m1");
  run_until(f, &m0->done);
  run_until(f, &m1->done);
  assert_int_equal(m0->err, 0);
  assert_int_equal(m1->err, 0);
  assert_int_equal(JOINR(m0)->rank, 0);
  assert_int_equal(JOINR(m1)->rank, 1);
  assert_int_equal(JOINR(m1)->world_size, 2);
  assert_int_equal(JOINR(m1)->latest_checkpoint->step, 11);
  res_free(m0), res_free(m1), res_free(m2);
  assert_int_equal(events_of(f, "sw", EV(PREEMPTED)).n, 0);
  assert_resized(f, "sw", EV(SHRUNK), 1, 2, 11, "shrunk from 4 to 2 ranks at step 11 (in place)");
}

/* A shrink in place survives a coordinator restart with the member it
 * learned it removes: after the restart m2's SIGTERM is still the shrink's
 * (not a notice), m3 (removed before it) is refused a Join, and a third
 * terminating member is a notice. */
static void test_shrink_in_place_across_restart(void **state) {
  struct fx *f = *state;
  create_submitted(f, "sr", 4);
  struct res *r[4];
  join_all(f, "sr", 4, r);
  for (int i = 0; i < 4; i++) res_free(r[i]);
  assert_int_equal(scale_in_place(f, "sr", 2), 0);
  bool pausing = true;
  assert_int_equal(beat_term(f, "sr", "m3", 1, 9, 0, NULL, &pausing), ACT(CHECKPOINT_NOW));
  assert_false(pausing);
  fx_close(f);
  fx_open(f);
  bool resizing = false;
  assert_int_equal(beat_term(f, "sr", "m2", 1, 9, 0, &resizing, &pausing), ACT(CHECKPOINT_NOW));
  assert_true(resizing);
  assert_false(pausing);
  assert_job(f, "sr", STOKER__V1__JOB_STATE__JOB_STATE_RUNNING, 4);
  struct res *m3 = join(f, "sr", "m3");
  run_until(f, &m3->done);
  assert_int_equal(m3->err, STK_ESTATE);
  res_free(m3);
  beat_term(f, "sr", "m1", 1, 9, 0, NULL, &pausing);
  assert_true(pausing);
  assert_job(f, "sr", STOKER__V1__JOB_STATE__JOB_STATE_PAUSING, 4);
}

/* A barrier of the last generation while a shrink in place removes m2 and
 * m3 (a trainer's "all staged" barrier before its commit): once both left
 * with the checkpoint step it answers the kept ranks, who arrived, instead
 * of waiting for a world of 4 that never comes until the round ends it. It
 * still waits for a removed member that is seated. */
static void test_shrink_in_place_barrier_counts_the_seated(void **state) {
  struct fx *f = *state;
  create_submitted(f, "sb", 4);
  struct res *r[4];
  join_all(f, "sb", 4, r);
  for (int i = 0; i < 4; i++) res_free(r[i]);
  assert_int_equal(scale_in_place(f, "sb", 2), 0);
  assert_int_equal(beat_term(f, "sb", "m2", 1, 9, 0, NULL, NULL), ACT(CHECKPOINT_NOW));
  assert_int_equal(beat_term(f, "sb", "m3", 1, 9, 0, NULL, NULL), ACT(CHECKPOINT_NOW));
  struct res *b0 = barrier_as(f, "sb", "m0", 1, "staged-11");
  struct res *b1 = barrier_as(f, "sb", "m1", 1, "staged-11");
  assert_int_equal(leave_staged(f, "sb", "m2", 1, 11), 0);
  run_for(f, 50);
  assert_false(b0->done); /* m3 is still seated. */
  assert_int_equal(leave_staged(f, "sb", "m3", 1, 11), 0);
  run_until(f, &b0->done);
  run_until(f, &b1->done);
  for (int i = 0; i < 2; i++) {
    struct res *b = i ? b1 : b0;
    assert_int_equal(b->err, 0);
    assert_int_equal(((Stoker__V1__BarrierResponse *)b->resp)->arrived, 2);
  }
  assert_job(f, "sb", STOKER__V1__JOB_STATE__JOB_STATE_RUNNING, 4); /* No round yet. */
  res_free(b0), res_free(b1);
}

/* Without in_place a submitted job's ScaleJob down only sets the target,
 * and a terminating member is a notice, as before: the controller's other
 * callers keep today's behaviour. Likewise in_place on a job that a notice
 * made PAUSING first changes nothing. */
static void test_shrink_not_in_place(void **state) {
  struct fx *f = *state;
  create_submitted(f, "so", 4);
  struct res *r[4];
  join_all(f, "so", 4, r);
  for (int i = 0; i < 4; i++) res_free(r[i]);
  assert_int_equal(scale_to(f, "so", 2), 0);
  assert_int_equal(beat_at(f, "so", "m0", 1, 9, 0, NULL), ACT(CONTINUE)); /* Nothing armed. */
  bool pausing = false;
  beat_term(f, "so", "m3", 1, 9, 0, NULL, &pausing);
  assert_true(pausing);
  assert_job(f, "so", STOKER__V1__JOB_STATE__JOB_STATE_PAUSING, 4);
  assert_int_equal(scale_in_place(f, "so", 2), 0);
  assert_job(f, "so", STOKER__V1__JOB_STATE__JOB_STATE_PAUSING, 4);
  bool resizing = true;
  assert_int_equal(beat_at(f, "so", "m0", 1, 9, 0, &resizing), ACT(CHECKPOINT_NOW));
  assert_false(resizing);
}

/* The last close's world survives a restart while the job is paused: 3 ranks
 * paused, the coordinator restarted, resumed with 2: SHRUNK from 3. The
 * same world again logs nothing. */
static void test_resize_across_restart(void **state) {
  struct fx *f = *state;
  create(f, "rr", 1, 3);
  struct res *r[3];
  join_all(f, "rr", 3, r);
  for (int i = 0; i < 3; i++) res_free(r[i]);
  assert_int_equal(report_ckpt(f, "rr", 5, 1), 0);
  assert_int_equal(job_action(f, coord_pause_job, "rr", true), 0);
  for (int i = 0; i < 3; i++) {
    char id[8];
    snprintf(id, sizeof(id), "m%d", i);
    assert_int_equal(heartbeat(f, "rr", id, 1), ACT(STOP));
  }
  assert_job(f, "rr", STOKER__V1__JOB_STATE__JOB_STATE_PAUSED, 0);
  fx_close(f);
  fx_open(f);
  assert_int_equal(scale_to(f, "rr", 2), 0);
  assert_int_equal(job_action(f, coord_resume_job, "rr", false), 0);
  join_all(f, "rr", 2, r);
  res_free(r[0]), res_free(r[1]);
  assert_job(f, "rr", STOKER__V1__JOB_STATE__JOB_STATE_RUNNING, 2);
  assert_resized(f, "rr", EV(SHRUNK), 1, 2, 5, "shrunk from 3 to 2 ranks at step 5");
  /* Paused and resumed at the same world: nothing more. */
  assert_int_equal(job_action(f, coord_pause_job, "rr", true), 0);
  assert_int_equal(heartbeat(f, "rr", "m0", 2), ACT(STOP));
  assert_int_equal(heartbeat(f, "rr", "m1", 2), ACT(STOP));
  assert_int_equal(job_action(f, coord_resume_job, "rr", false), 0);
  join_all(f, "rr", 2, r);
  res_free(r[0]), res_free(r[1]);
  assert_job(f, "rr", STOKER__V1__JOB_STATE__JOB_STATE_RUNNING, 2);
  assert_resized(f, "rr", EV(SHRUNK), 1, 2, 5, "shrunk from 3 to 2 ranks at step 5");
  assert_resized(f, "rr", EV(GROWN), 0, 0, 0, NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_scale_down_running, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_scale_down_parked, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_late_member_not_surplus, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_grow_waits_for_checkpoint, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_grow_takes_only_its_checkpoint, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_grow_waits_for_the_stop_steps, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_grow_waits_for_a_slow_member, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_a_round_waits_for_a_lost_member_only_its_lease, fx_setup,
                                      fx_teardown),
      cmocka_unit_test_setup_teardown(test_resize_across_restart, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_shrink_in_place, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_shrink_in_place_not_submitted, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_shrink_in_place_then_notice, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_shrink_in_place_waits_for_the_removed, fx_setup,
                                      fx_teardown),
      cmocka_unit_test_setup_teardown(test_shrink_in_place_across_restart, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_shrink_in_place_barrier_counts_the_seated, fx_setup,
                                      fx_teardown),
      cmocka_unit_test_setup_teardown(test_shrink_not_in_place, fx_setup, fx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
