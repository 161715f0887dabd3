/*
 * A preemption notice must cost no step: the first notice (PreemptJob or a
 * rank's heartbeat with terminating) pauses the job with a checkpoint first
 * (CHECKPOINT_NOW with pausing, a PREEMPTED event with the reason, once);
 * ranks that stop after staging their checkpoint leave with its step; the
 * paused job resumes by itself when ranks Join (an operator's pause still
 * waits for ResumeJob); the resumed round waits for that checkpoint to be
 * reported, so every rank restores it, and logs RESUMED at its step. A
 * restart keeps a preempted pause and what it waits for. The time from the
 * notice to every rank staged and gone is measured (the PAUSED event's
 * message, the preempt_staged hook behind stoker_preempt_stage_seconds).
 */
#include "coord_test.h"

#define ACT(x) STOKER__V1__HEARTBEAT_ACTION__HEARTBEAT_ACTION_##x
#define ST(x)  STOKER__V1__JOB_STATE__JOB_STATE_##x
#define EV(x)  STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_##x

static int preempt(struct fx *f, const char *job, const char *reason) {
  Stoker__V1__PreemptJobRequest req = STOKER__V1__PREEMPT_JOB_REQUEST__INIT;
  req.job = (char *)job;
  req.reason = (char *)reason;
  struct res *r = res_new();
  coord_preempt_job(f->c, &req, on_done, r);
  int err = wait_res(f, r)->err;
  res_free(r);
  return err;
}

/* A heartbeat at step; *ret_pausing gets the reply's pausing. */
static int beat(struct fx *f, const char *job, const char *member, uint64_t gen, uint64_t step,
                bool terminating, bool *ret_pausing) {
  Stoker__V1__HeartbeatRequest req = STOKER__V1__HEARTBEAT_REQUEST__INIT;
  req.job = (char *)job;
  req.member_id = (char *)member;
  req.generation = gen;
  req.step = step;
  req.terminating = terminating;
  req.health = STOKER__V1__RANK_HEALTH__RANK_HEALTH_OK;
  struct res *r = res_new();
  coord_heartbeat(f->c, &req, on_done, r);
  wait_res(f, r);
  int out = r->err;
  if (!out) {
    Stoker__V1__HeartbeatResponse *resp = (Stoker__V1__HeartbeatResponse *)r->resp;
    out = (int)resp->action;
    if (ret_pausing) *ret_pausing = resp->pausing;
  }
  res_free(r);
  return out;
}

/* A heartbeat in generation 1 of a rank whose ranks agreed to stop at
 * stop_step (0: not yet); *ret_ckpt gets the reply's checkpoint_step and
 * the reply must say pausing. */
static int beat_stop(struct fx *f, const char *job, const char *member, uint64_t step,
                     int64_t stop_step, int64_t *ret_ckpt) {
  Stoker__V1__HeartbeatRequest req = STOKER__V1__HEARTBEAT_REQUEST__INIT;
  req.job = (char *)job;
  req.member_id = (char *)member;
  req.generation = 1;
  req.step = step;
  req.stop_step = stop_step;
  req.health = STOKER__V1__RANK_HEALTH__RANK_HEALTH_OK;
  struct res *r = res_new();
  coord_heartbeat(f->c, &req, on_done, r);
  wait_res(f, r);
  int out = r->err;
  if (!out) {
    Stoker__V1__HeartbeatResponse *resp = (Stoker__V1__HeartbeatResponse *)r->resp;
    out = (int)resp->action;
    assert_true(resp->pausing);
    if (ret_ckpt) *ret_ckpt = resp->checkpoint_step;
  }
  res_free(r);
  return out;
}

static int leave_after(struct fx *f, const char *job, const char *member, uint64_t gen,
                       int64_t step) {
  Stoker__V1__LeaveRequest req = STOKER__V1__LEAVE_REQUEST__INIT;
  req.job = (char *)job;
  req.member_id = (char *)member;
  req.generation = gen;
  req.checkpoint_step = step;
  struct res *r = res_new();
  coord_leave(f->c, &req, on_done, r);
  int err = wait_res(f, r)->err;
  res_free(r);
  return err;
}

struct seen {
  int n, type[64];
  int64_t step[64];
  char msg[64][160];
};

static bool on_ev(void *arg, const Stoker__V1__JobEvent *ev) {
  struct seen *s = arg;
  if (s->n < 64) {
    s->type[s->n] = ev->type;
    s->step[s->n] = ev->step;
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

static int find(const struct seen *s, int type) {
  for (int i = 0; i < s->n; i++)
    if (s->type[i] == type) return i;
  fail_msg("no event of type %d", type);
  return -1;
}

static Stoker__V1__JobState state_of(struct fx *f, const char *job) {
  struct res *g = get_job(f, job);
  assert_int_equal(g->err, 0);
  Stoker__V1__JobState st = JOB(g)->state;
  res_free(g);
  return st;
}

/* Two ranks; m1's heartbeat says terminating: PAUSING at once, both told
 * CHECKPOINT_NOW with pausing; both leave after staging step 12, the job is
 * PAUSED before the commit is reported; a notice again changes nothing. */
static void test_sigterm_notice(void **state) {
  struct fx *f = *state;
  create(f, "pt", 2, 2);
  struct res *r[2];
  join_all(f, "pt", 2, r);
  res_free(r[0]), res_free(r[1]);
  assert_int_equal(beat(f, "pt", "m0", 1, 11, false, NULL), ACT(CONTINUE));
  bool pausing = false;
  assert_int_equal(beat(f, "pt", "m1", 1, 11, true, &pausing), ACT(CHECKPOINT_NOW));
  assert_true(pausing);
  assert_int_equal(state_of(f, "pt"), ST(PAUSING));
  pausing = false;
  assert_int_equal(beat(f, "pt", "m0", 1, 11, false, &pausing), ACT(CHECKPOINT_NOW));
  assert_true(pausing);
  assert_int_equal(preempt(f, "pt", "again"), 0); /* Changes nothing. */
  assert_int_equal(beat(f, "pt", "m1", 1, 12, true, NULL), ACT(CONTINUE));
  assert_int_equal(leave_after(f, "pt", "m0", 1, 12), 0);
  assert_int_equal(state_of(f, "pt"), ST(PAUSING));
  assert_int_equal(leave_after(f, "pt", "m1", 1, 12), 0);
  struct res *g = get_job(f, "pt");
  assert_int_equal(JOB(g)->state, ST(PAUSED));
  assert_non_null(strstr(JOB(g)->reason, "member m1 is terminating"));
  res_free(g);
  assert_int_equal(preempt(f, "pt", "again"), 0);
  struct seen s;
  events(f, "pt", &s);
  assert_int_equal(count(&s, EV(PREEMPTED)), 1);
  int i = find(&s, EV(PREEMPTED));
  assert_int_equal(s.step[i], 11);
  assert_non_null(strstr(s.msg[i], "member m1 is terminating"));
  assert_int_equal(count(&s, EV(PAUSED)), 1);
}

/* The same job comes back: the first Join resumes it (no ResumeJob); the
 * round, full, waits for the checkpoint the ranks staged (12) and closes
 * when it is reported, with RESUMED at 12. */
static void test_resume_on_join(void **state) {
  struct fx *f = *state;
  f->opts.scale_timeout_beats = 1000; /* Never gives up waiting here. */
  fx_close(f);
  fx_open(f);
  create(f, "pj", 2, 2);
  struct res *r[2];
  join_all(f, "pj", 2, r);
  res_free(r[0]), res_free(r[1]);
  assert_int_equal(report_ckpt(f, "pj", 5, 1), 0);
  assert_int_equal(preempt(f, "pj", "kueue: evicted"), 0);
  assert_int_equal(beat(f, "pj", "m0", 1, 9, false, NULL), ACT(CHECKPOINT_NOW));
  assert_int_equal(beat(f, "pj", "m1", 1, 9, false, NULL), ACT(CHECKPOINT_NOW));
  assert_int_equal(leave_after(f, "pj", "m0", 1, 10), 0);
  assert_int_equal(leave_after(f, "pj", "m1", 1, 10), 0);
  assert_int_equal(state_of(f, "pj"), ST(PAUSED));
  fx_close(f); /* A restart keeps the preemption and the awaited step. */
  fx_open(f);
  assert_int_equal(state_of(f, "pj"), ST(PAUSED));
  struct res *a = join(f, "pj", "m0"), *b = join(f, "pj", "m1");
  run_for(f, 200);
  assert_false(a->done || b->done); /* Held for step 10. */
  assert_int_equal(state_of(f, "pj"), ST(WAITING));
  assert_int_equal(report_ckpt(f, "pj", 10, 0), 0);
  run_until(f, &a->done);
  run_until(f, &b->done);
  assert_int_equal(a->err, 0);
  assert_int_equal(JOINR(a)->latest_checkpoint->step, 10);
  assert_int_equal(JOINR(b)->latest_checkpoint->step, 10);
  res_free(a), res_free(b);
  struct seen s;
  events(f, "pj", &s);
  int i = find(&s, EV(RESUMED));
  assert_int_equal(s.step[i], 10);
  assert_int_equal(count(&s, EV(RESUMED)), 1);
  assert_non_null(strstr(s.msg[find(&s, EV(PREEMPTED))], "kueue: evicted"));
  assert_int_equal(state_of(f, "pj"), ST(RUNNING));
}

/* An operator's pause still waits for ResumeJob; a checkpoint that never
 * comes holds the resumed round only scale_timeout_beats intervals. */
static void test_operator_pause_waits(void **state) {
  struct fx *f = *state;
  Stoker__V1__JobSpec spec = short_lease_spec_of("po", 1, 1); /* 50 ms intervals. */
  assert_int_equal(create_spec(f, &spec), 0);
  struct res *r[1];
  join_all(f, "po", 1, r);
  res_free(r[0]);
  assert_int_equal(job_action(f, coord_pause_job, "po", false), 0);
  bool pausing = false;
  assert_int_equal(beat(f, "po", "m0", 1, 3, false, &pausing), ACT(CHECKPOINT_NOW));
  assert_true(pausing);
  assert_int_equal(leave_after(f, "po", "m0", 1, 4), 0);
  assert_int_equal(state_of(f, "po"), ST(PAUSED));
  struct res *a = join(f, "po", "m0");
  run_for(f, 150);
  assert_false(a->done); /* Parked until ResumeJob. */
  assert_int_equal(state_of(f, "po"), ST(PAUSED));
  assert_int_equal(job_action(f, coord_resume_job, "po", false), 0);
  /* Checkpoint 4 is never reported: the round closes after the wait
   * (scale_timeout_beats, 10 intervals of 50 ms) with what there is. */
  run_until(f, &a->done);
  assert_int_equal(a->err, 0);
  assert_int_equal(JOINR(a)->latest_checkpoint->step, 0);
  res_free(a);
}

/* A job waiting for ranks pauses at once; a Join readmits it; evicted again
 * before its round closed, it pauses again (a second preemption, a second
 * event), and its ranks' Joins resume it once more. */
static void test_preempt_while_waiting(void **state) {
  struct fx *f = *state;
  create(f, "pw", 2, 2);
  assert_int_equal(preempt(f, "pw", "first"), 0);
  assert_int_equal(state_of(f, "pw"), ST(PAUSED));
  struct res *a = join(f, "pw", "m0");
  run_for(f, 30);
  assert_int_equal(state_of(f, "pw"), ST(WAITING));
  assert_int_equal(preempt(f, "pw", "second"), 0);
  assert_int_equal(state_of(f, "pw"), ST(PAUSED));
  struct res *b = join(f, "pw", "m1");
  run_until(f, &a->done);
  run_until(f, &b->done);
  assert_int_equal(a->err, 0);
  assert_int_equal(JOINR(b)->world_size, 2);
  res_free(a), res_free(b);
  struct seen s;
  events(f, "pw", &s);
  assert_int_equal(count(&s, EV(PREEMPTED)), 2);
  assert_non_null(strstr(s.msg[find(&s, EV(RESUMED))], "second"));
}

/* A rank back (a new pod) while the others still stage: its Join parks in
 * the pausing job, and the pause's end resumes the job for it. */
static void test_rank_back_while_pausing(void **state) {
  struct fx *f = *state;
  create(f, "pb", 1, 2);
  struct res *r[2];
  join_all(f, "pb", 2, r);
  res_free(r[0]), res_free(r[1]);
  assert_int_equal(preempt(f, "pb", "evicted"), 0);
  assert_int_equal(leave_after(f, "pb", "m0", 1, 6), 0);
  struct res *back = join(f, "pb", "m0");
  run_for(f, 30);
  assert_false(back->done);
  assert_int_equal(state_of(f, "pb"), ST(PAUSING));
  assert_int_equal(leave_after(f, "pb", "m1", 1, 6), 0); /* PAUSED, then resumed for m0. */
  assert_int_equal(state_of(f, "pb"), ST(WAITING));
  assert_int_equal(report_ckpt(f, "pb", 6, 0), 0);
  run_until(f, &back->done); /* min 1: closes after the last call. */
  assert_int_equal(back->err, 0);
  assert_int_equal(JOINR(back)->latest_checkpoint->step, 6);
  res_free(back);
}

/* A periodic checkpoint begun before the notice (an asynchronous save of
 * step 40, reported after it) is not the pause's: the ranks, at 43 by then,
 * are told CHECKPOINT_NOW, never STOP, so they save what they trained. A
 * checkpoint past the notice (45) stops only a member with no step past
 * it; one that trained on (47) stops by itself after its own (48). */
static void test_pause_keeps_steps_past_an_earlier_checkpoint(void **state) {
  struct fx *f = *state;
  create(f, "pk", 2, 2);
  struct res *r[2];
  join_all(f, "pk", 2, r);
  res_free(r[0]), res_free(r[1]);
  assert_int_equal(report_ckpt(f, "pk", 20, 1), 0);
  assert_int_equal(beat(f, "pk", "m0", 1, 40, false, NULL), ACT(CONTINUE));
  assert_int_equal(beat(f, "pk", "m1", 1, 40, false, NULL), ACT(CONTINUE));
  assert_int_equal(preempt(f, "pk", "evicted"), 0);
  assert_int_equal(report_ckpt(f, "pk", 40, 1), 0); /* Begun at 40, before the notice. */
  assert_int_equal(beat(f, "pk", "m0", 1, 43, false, NULL), ACT(CHECKPOINT_NOW));
  assert_int_equal(beat(f, "pk", "m1", 1, 43, false, NULL), ACT(CHECKPOINT_NOW));
  assert_int_equal(beat(f, "pk", "m0", 1, 44, false, NULL), ACT(CONTINUE));
  assert_int_equal(report_ckpt(f, "pk", 45, 1), 0);
  assert_int_equal(beat(f, "pk", "m0", 1, 47, false, NULL), ACT(CONTINUE));
  assert_int_equal(beat(f, "pk", "m1", 1, 45, false, NULL), ACT(STOP));
  assert_int_equal(state_of(f, "pk"), ST(PAUSING));
  assert_int_equal(leave_after(f, "pk", "m0", 1, 48), 0);
  assert_int_equal(state_of(f, "pk"), ST(PAUSING)); /* m1 keeps its seat until it leaves. */
  assert_int_equal(leave_after(f, "pk", "m1", 1, 0), 0);
  assert_int_equal(state_of(f, "pk"), ST(PAUSED));
  struct seen s;
  events(f, "pk", &s);
  assert_int_equal(s.step[find(&s, EV(PAUSED))], 48);
}

/* A periodic checkpoint begun before the notice (step 8, the ranks at 9)
 * commits while the job pauses: it is not the pause's checkpoint; the
 * ranks are not told STOP until the one they voted for (10) commits. */
static void test_older_commit_not_the_pause(void **state) {
  struct fx *f = *state;
  create(f, "pc", 2, 2);
  struct res *r[2];
  join_all(f, "pc", 2, r);
  res_free(r[0]), res_free(r[1]);
  assert_int_equal(report_ckpt(f, "pc", 5, 1), 0);
  assert_int_equal(beat(f, "pc", "m0", 1, 9, false, NULL), ACT(CONTINUE));
  assert_int_equal(beat(f, "pc", "m1", 1, 9, false, NULL), ACT(CONTINUE));
  assert_int_equal(preempt(f, "pc", "kueue: no yield possible"), 0);
  assert_int_equal(beat(f, "pc", "m0", 1, 9, false, NULL), ACT(CHECKPOINT_NOW));
  assert_int_equal(beat(f, "pc", "m1", 1, 9, false, NULL), ACT(CHECKPOINT_NOW));
  assert_int_equal(report_ckpt(f, "pc", 8, 1), 0);
  assert_int_equal(beat(f, "pc", "m0", 1, 10, false, NULL), ACT(CONTINUE));
  assert_int_equal(beat(f, "pc", "m1", 1, 10, false, NULL), ACT(CONTINUE));
  assert_int_equal(report_ckpt(f, "pc", 10, 1), 0);
  assert_int_equal(beat(f, "pc", "m0", 1, 10, false, NULL), ACT(STOP));
  assert_int_equal(leave_after(f, "pc", "m0", 1, 10), 0);
  assert_int_equal(leave_after(f, "pc", "m1", 1, 10), 0);
  assert_int_equal(state_of(f, "pc"), ST(PAUSED));
}

/* Heartbeats lag the ranks: at the notice they had reported 9; the ranks
 * heard CHECKPOINT_NOW at 10 and agreed to stop at 12, while a periodic
 * checkpoint of 11 (begun after their last report, before their stop step)
 * commits during the pause. It is past what they had reported, but not the
 * pause's: m0 said its ranks stop at 12, so m1, whose heartbeat left at 11
 * before it finished 12, is not told STOP. The ranks leave with 12, the
 * job PAUSED at 12. Before the stop step, m1 was told STOP at 11 and left
 * step 12 unsaved. */
static void test_pause_checkpoint_covers_the_stop_step(void **state) {
  struct fx *f = *state;
  create(f, "pv", 2, 2);
  struct res *r[2];
  join_all(f, "pv", 2, r);
  res_free(r[0]), res_free(r[1]);
  assert_int_equal(report_ckpt(f, "pv", 5, 1), 0);
  assert_int_equal(beat(f, "pv", "m0", 1, 9, false, NULL), ACT(CONTINUE));
  assert_int_equal(beat(f, "pv", "m1", 1, 9, false, NULL), ACT(CONTINUE));
  assert_int_equal(preempt(f, "pv", "kueue: evicted"), 0);
  assert_int_equal(beat_stop(f, "pv", "m0", 10, 0, NULL), ACT(CHECKPOINT_NOW));
  assert_int_equal(beat_stop(f, "pv", "m1", 10, 0, NULL), ACT(CHECKPOINT_NOW));
  assert_int_equal(beat_stop(f, "pv", "m0", 12, 12, NULL), ACT(CONTINUE)); /* Their vote. */
  assert_int_equal(report_ckpt(f, "pv", 11, 1), 0); /* The periodic one, begun at 11. */
  assert_int_equal(beat_stop(f, "pv", "m1", 11, 0, NULL), ACT(CONTINUE));
  assert_int_equal(state_of(f, "pv"), ST(PAUSING));
  assert_int_equal(report_ckpt(f, "pv", 12, 1), 0); /* Theirs: now m1 may be told. */
  int64_t ckpt = 0;
  assert_int_equal(beat_stop(f, "pv", "m1", 12, 12, &ckpt), ACT(STOP));
  assert_int_equal(ckpt, 12);
  assert_int_equal(leave_after(f, "pv", "m0", 1, 12), 0);
  assert_int_equal(leave_after(f, "pv", "m1", 1, 12), 0);
  assert_int_equal(state_of(f, "pv"), ST(PAUSED));
  struct seen s;
  events(f, "pv", &s);
  assert_int_equal(s.step[find(&s, EV(PAUSED))], 12);
  /* A stop step heard before the checkpoint under it was: the same. */
  create(f, "pw2", 2, 2);
  join_all(f, "pw2", 2, r);
  res_free(r[0]), res_free(r[1]);
  assert_int_equal(beat(f, "pw2", "m0", 1, 3, false, NULL), ACT(CONTINUE));
  assert_int_equal(preempt(f, "pw2", "kueue: evicted"), 0);
  assert_int_equal(report_ckpt(f, "pw2", 4, 1), 0); /* Seen: past 3... */
  assert_int_equal(beat_stop(f, "pw2", "m0", 6, 6, NULL), ACT(CHECKPOINT_NOW));
  /* ...not any more: m1 at 4 is told to checkpoint, not STOP. */
  assert_int_equal(beat_stop(f, "pw2", "m1", 4, 0, NULL), ACT(CHECKPOINT_NOW));
  /* A stop step said before the notice (the ranks' vote outran it): the same. */
  create(f, "pw3", 2, 2);
  join_all(f, "pw3", 2, r);
  res_free(r[0]), res_free(r[1]);
  assert_int_equal(beat(f, "pw3", "m1", 1, 3, false, NULL), ACT(CONTINUE));
  Stoker__V1__HeartbeatRequest req = STOKER__V1__HEARTBEAT_REQUEST__INIT;
  req.job = "pw3", req.member_id = "m0", req.generation = 1, req.step = 3, req.stop_step = 6;
  struct res *b = res_new();
  coord_heartbeat(f->c, &req, on_done, b);
  assert_int_equal(wait_res(f, b)->err, 0);
  res_free(b);
  assert_int_equal(preempt(f, "pw3", "kueue: evicted"), 0);
  assert_int_equal(report_ckpt(f, "pw3", 4, 1), 0);
  assert_int_equal(beat_stop(f, "pw3", "m1", 4, 0, NULL), ACT(CHECKPOINT_NOW)); /* Not STOP. */
}

/* A pause's STOP names its checkpoint and leaves the seat: m0's heartbeat
 * left at step 10, when the checkpoint of 10 was the pause's, and its STOP
 * crossed step 11, which m0 finished meanwhile. m0 then checkpoints, then
 * stops (its ranks agree on 12): the STOP says checkpoint_step 10, and the
 * generation (its barriers and keys) stays until the members leave, though
 * both were told STOP. Before, the second STOP ended the generation at once
 * (PAUSED, its keys gone), so the checkpoint of 12 could not be taken. */
static void test_pause_stop_keeps_the_seat(void **state) {
  struct fx *f = *state;
  create(f, "px", 2, 2);
  struct res *r[2];
  join_all(f, "px", 2, r);
  res_free(r[0]), res_free(r[1]);
  assert_int_equal(beat(f, "px", "m0", 1, 9, false, NULL), ACT(CONTINUE));
  assert_int_equal(beat(f, "px", "m1", 1, 9, false, NULL), ACT(CONTINUE));
  assert_int_equal(preempt(f, "px", "kueue: evicted"), 0);
  assert_int_equal(report_ckpt(f, "px", 10, 1), 0);
  int64_t ckpt = 0;
  assert_int_equal(beat_stop(f, "px", "m0", 10, 0, &ckpt), ACT(STOP));
  assert_int_equal(ckpt, 10);
  ckpt = 0;
  assert_int_equal(beat_stop(f, "px", "m1", 10, 0, &ckpt), ACT(STOP));
  assert_int_equal(ckpt, 10);
  assert_int_equal(state_of(f, "px"), ST(PAUSING));
  assert_int_equal(kv_set_(f, "px", 1, "ckpt/12", "attempt"), 0); /* Their checkpoint's key. */
  assert_int_equal(beat_stop(f, "px", "m0", 12, 12, NULL), ACT(CONTINUE));
  assert_int_equal(beat_stop(f, "px", "m1", 12, 12, NULL), ACT(CONTINUE));
  assert_int_equal(leave_after(f, "px", "m0", 1, 12), 0);
  assert_int_equal(state_of(f, "px"), ST(PAUSING));
  assert_int_equal(leave_after(f, "px", "m1", 1, 12), 0);
  assert_int_equal(state_of(f, "px"), ST(PAUSED));
  struct seen s;
  events(f, "px", &s);
  assert_int_equal(s.step[find(&s, EV(PAUSED))], 12);
  /* A forced pause's STOP carries no checkpoint and ends the seat at once. */
  create(f, "py", 1, 1);
  join_all(f, "py", 1, r);
  res_free(r[0]);
  assert_int_equal(job_action(f, coord_pause_job, "py", true), 0);
  ckpt = -1;
  assert_int_equal(beat_stop(f, "py", "m0", 3, 0, &ckpt), ACT(STOP));
  assert_int_equal(ckpt, 0);
  assert_int_equal(state_of(f, "py"), ST(PAUSED));
}

/* The ranks said their stop step (6): they stage their own checkpoint,
 * committed after they leave, so the pause's wait for a checkpoint
 * (scale_timeout_beats, 10 intervals of 50 ms) runs out without forcing
 * them: they are not told STOP and leave with 6. Before, the forced STOP
 * ended the generation under a stage slower than the wait. Members that
 * said none are forced as before (a STOP naming no checkpoint). */
static void test_wait_spares_ranks_that_stop(void **state) {
  struct fx *f = *state;
  const char *names[2] = {"pd", "pe"};
  for (int i = 0; i < 2; i++) {
    Stoker__V1__JobSpec spec = short_lease_spec_of(names[i], 2, 2);
    spec.heartbeat_misses = 40; /* A 2 s lease: no member lost while the test waits. */
    assert_int_equal(create_spec(f, &spec), 0);
    struct res *r[2];
    join_all(f, names[i], 2, r);
    res_free(r[0]), res_free(r[1]);
    assert_int_equal(preempt(f, names[i], "kueue: evicted"), 0);
    assert_int_equal(beat_stop(f, names[i], "m0", 5, 0, NULL), ACT(CHECKPOINT_NOW));
    assert_int_equal(beat_stop(f, names[i], "m1", 5, 0, NULL), ACT(CHECKPOINT_NOW));
  }
  assert_int_equal(beat_stop(f, "pd", "m0", 6, 6, NULL), ACT(CONTINUE));
  assert_int_equal(beat_stop(f, "pd", "m1", 6, 6, NULL), ACT(CONTINUE));
  run_for(f, 700); /* Past the wait. */
  assert_int_equal(beat_stop(f, "pd", "m0", 6, 6, NULL), ACT(CONTINUE));
  assert_int_equal(beat_stop(f, "pd", "m1", 6, 6, NULL), ACT(CONTINUE));
  assert_int_equal(state_of(f, "pd"), ST(PAUSING));
  assert_int_equal(kv_set_(f, "pd", 1, "ckpt/6", "attempt"), 0); /* Their generation lives. */
  assert_int_equal(leave_after(f, "pd", "m0", 1, 6), 0);
  assert_int_equal(leave_after(f, "pd", "m1", 1, 6), 0);
  assert_int_equal(state_of(f, "pd"), ST(PAUSED));
  int64_t ckpt = -1;
  assert_int_equal(beat_stop(f, "pe", "m0", 6, 0, &ckpt), ACT(STOP));
  assert_int_equal(ckpt, 0);
  assert_int_equal(beat_stop(f, "pe", "m1", 6, 0, &ckpt), ACT(STOP));
  assert_int_equal(state_of(f, "pe"), ST(PAUSED));
}

/* Bad input changes nothing; an ended job refuses the notice. */
static void test_preempt_refused(void **state) {
  struct fx *f = *state;
  assert_int_equal(preempt(f, "nope", ""), STK_ENOENT);
  create(f, "ps", 1, 1);
  char big[1100];
  memset(big, 'x', sizeof(big) - 1);
  big[sizeof(big) - 1] = '\0';
  assert_int_equal(preempt(f, "ps", big), STK_EINVAL);
  assert_int_equal(state_of(f, "ps"), ST(WAITING));
  assert_int_equal(job_action(f, coord_stop_job, "ps", false), 0);
  assert_int_equal(preempt(f, "ps", "late"), STK_ESTATE);
  struct seen s;
  events(f, "ps", &s);
  assert_int_equal(count(&s, EV(PREEMPTED)), 0);
}

struct staged {
  int calls;
  char job[32];
  double seconds;
};

static void on_staged(void *arg, const char *job, double seconds) {
  struct staged *st = arg;
  st->calls++;
  snprintf(st->job, sizeof st->job, "%s", job);
  st->seconds = seconds;
}

/* A notice, then the ranks leave 300 ms (loop time) later: PAUSED says how
 * long they took and the hook gets the same figure, once; a pause no notice
 * started (an operator's) measures nothing. */
static void test_time_to_stage(void **state) {
  struct fx *f = *state;
  struct staged st = {0};
  f->opts.preempt_staged = on_staged;
  f->opts.preempt_staged_arg = &st;
  fx_close(f);
  fx_open(f);
  create(f, "pm", 2, 2);
  struct res *r[2];
  join_all(f, "pm", 2, r);
  res_free(r[0]), res_free(r[1]);
  assert_int_equal(preempt(f, "pm", "kueue: evicted"), 0);
  uv_sleep(300);
  uv_update_time(&f->loop);
  assert_int_equal(leave_after(f, "pm", "m0", 1, 5), 0);
  assert_int_equal(st.calls, 0); /* m1 has not staged yet. */
  assert_int_equal(leave_after(f, "pm", "m1", 1, 5), 0);
  assert_int_equal(state_of(f, "pm"), ST(PAUSED));
  assert_int_equal(st.calls, 1);
  assert_string_equal(st.job, "pm");
  assert_true(st.seconds >= 0.3 && st.seconds < 30);
  struct seen s;
  events(f, "pm", &s);
  const char *msg = s.msg[find(&s, EV(PAUSED))];
  long long ms = -1;
  const char *at = strstr(msg, "every rank staged its checkpoint and left ");
  assert_non_null(at);
  assert_int_equal(sscanf(at, "every rank staged its checkpoint and left %lld ms", &ms), 1);
  assert_int_equal(ms, (long long)(st.seconds * 1000 + 0.5));
  create(f, "pn", 2, 2); /* An operator's pause: nothing measured. */
  join_all(f, "pn", 2, r);
  res_free(r[0]), res_free(r[1]);
  assert_int_equal(job_action(f, coord_pause_job, "pn", true), 0);
  bool pausing = false;
  beat(f, "pn", "m0", 1, 3, false, &pausing);
  beat(f, "pn", "m1", 1, 3, false, &pausing);
  assert_int_equal(leave_after(f, "pn", "m0", 1, 0), 0);
  assert_int_equal(leave_after(f, "pn", "m1", 1, 0), 0);
  assert_int_equal(state_of(f, "pn"), ST(PAUSED));
  assert_int_equal(st.calls, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_sigterm_notice, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_resume_on_join, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_operator_pause_waits, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_preempt_while_waiting, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_rank_back_while_pausing, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_pause_keeps_steps_past_an_earlier_checkpoint, fx_setup,
                                      fx_teardown),
      cmocka_unit_test_setup_teardown(test_older_commit_not_the_pause, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_pause_checkpoint_covers_the_stop_step, fx_setup,
                                      fx_teardown),
      cmocka_unit_test_setup_teardown(test_pause_stop_keeps_the_seat, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_wait_spares_ranks_that_stop, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_preempt_refused, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_time_to_stage, fx_setup, fx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
