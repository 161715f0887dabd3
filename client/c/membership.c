/*
 * A rank's membership in a job: Join (retried while the coordinator
 * restarts), the heartbeat thread that carries the rank's figures and
 * brings back the coordinator's orders, and Leave.
 *
 * The heartbeat thread is the only thread the library starts besides the
 * rpc layer's completion thread. It ends when the membership does: on
 * leave, rejoin, free, or when the coordinator answers RESTART or STOP (the
 * generation it served is over; a rejoin starts a new thread).
 *
 * A rank about to be terminated (SIGTERM) says so with
 * stk_notify_terminating: the heartbeat thread beats at once with
 * terminating set (and in every later beat), which the coordinator takes as
 * a preemption notice for the whole job. Replies while the job pauses carry
 * pausing (stk_job_pausing): checkpoint, then stop; leave with the step
 * staged (stk_leave_checkpointed). A CHECKPOINT_NOW of a resize carries
 * resizing (stk_job_resizing): checkpoint, then wait for RESTART. The step
 * the ranks agreed to stop at goes with every heartbeat once told
 * (stk_report_stop). A pause's STOP that names its checkpoint
 * (stk_stop_checkpoint_step) does not end the heartbeats: the member keeps
 * its seat until it leaves, since it may checkpoint first.
 */
#include "client_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define JOIN_BACKOFF_FIRST_MS 100
#define JOIN_BACKOFF_MAX_MS   2000
#define HEARTBEAT_CALL_MAX_MS 5000

void membership_init(struct membership *m) {
  memset(m, 0, sizeof(*m));
  client_cond_init(&m->hb_cv);
}

void membership_close(struct membership *m) {
  pthread_cond_destroy(&m->hb_cv);
}

void stk_on_action(struct stk_client *c, stk_action_fn fn, void *arg) {
  pthread_mutex_lock(&c->mu);
  c->m.on_action = fn;
  c->m.on_action_arg = arg;
  pthread_mutex_unlock(&c->mu);
}

_Static_assert((int)STK_RANK_HEALTH_OK == (int)STOKER__V1__RANK_HEALTH__RANK_HEALTH_OK &&
                   (int)STK_RANK_HEALTH_DEGRADED ==
                       (int)STOKER__V1__RANK_HEALTH__RANK_HEALTH_DEGRADED &&
                   (int)STK_RANK_HEALTH_FAILING ==
                       (int)STOKER__V1__RANK_HEALTH__RANK_HEALTH_FAILING,
               "enum stk_rank_health is the proto's RankHealth");

void stk_report(struct stk_client *c, uint64_t step, double tokens_per_s, double loss,
                enum stk_rank_health health) {
  pthread_mutex_lock(&c->mu);
  c->m.step = step;
  c->m.tokens_per_s = tokens_per_s;
  c->m.loss = loss;
  c->m.health = health;
  pthread_mutex_unlock(&c->mu);
}

/* STOP over RESTART over CHECKPOINT_NOW over NONE. */
static int severity(enum stk_action a) {
  switch (a) {
  case STK_ACTION_STOP:
    return 3;
  case STK_ACTION_RESTART:
    return 2;
  case STK_ACTION_CHECKPOINT_NOW:
    return 1;
  default:
    return 0;
  }
}

enum stk_action stk_poll_action(struct stk_client *c) {
  pthread_mutex_lock(&c->mu);
  enum stk_action a = c->m.pending;
  c->m.pending = STK_ACTION_NONE;
  pthread_mutex_unlock(&c->mu);
  return a;
}

uint64_t stk_generation(struct stk_client *c) {
  pthread_mutex_lock(&c->mu);
  uint64_t g = c->m.joined ? c->m.generation : 0;
  pthread_mutex_unlock(&c->mu);
  return g;
}

/* Records an action and tells the callback, with c->mu held on entry and
 * on return (released around the callback). */
static void deliver(struct stk_client *c, enum stk_action a, uint64_t gen, const char *reason) {
  if (severity(a) > severity(c->m.pending)) c->m.pending = a;
  stk_action_fn fn = c->m.on_action;
  void *arg = c->m.on_action_arg;
  if (!fn) return;
  pthread_mutex_unlock(&c->mu);
  fn(arg, a, gen, reason);
  pthread_mutex_lock(&c->mu);
}

/* Sleeps on hb_cv until the deadline or a stop; c->mu held. */
static void sleep_until(struct stk_client *c, int64_t ms) {
  struct timespec ts;
  client_deadline_after(&ts, ms);
  while (!c->m.hb_stop && !c->m.beat_now) {
    if (pthread_cond_timedwait(&c->m.hb_cv, &c->mu, &ts) == ETIMEDOUT) break;
  }
  c->m.beat_now = false;
}

void stk_notify_terminating(struct stk_client *c) {
  pthread_mutex_lock(&c->mu);
  c->m.terminating = true;
  c->m.beat_now = true;
  pthread_cond_broadcast(&c->m.hb_cv);
  pthread_mutex_unlock(&c->mu);
}

void stk_report_stop(struct stk_client *c, int64_t step) {
  pthread_mutex_lock(&c->mu);
  if (step > c->m.stop_step) {
    c->m.stop_step = step;
    c->m.beat_now = true;
    pthread_cond_broadcast(&c->m.hb_cv);
  }
  pthread_mutex_unlock(&c->mu);
}

int64_t stk_stop_checkpoint_step(struct stk_client *c) {
  pthread_mutex_lock(&c->mu);
  int64_t step = c->m.stop_ckpt_step;
  pthread_mutex_unlock(&c->mu);
  return step;
}

bool stk_job_pausing(struct stk_client *c) {
  pthread_mutex_lock(&c->mu);
  bool p = c->m.pausing;
  pthread_mutex_unlock(&c->mu);
  return p;
}

bool stk_job_resizing(struct stk_client *c) {
  pthread_mutex_lock(&c->mu);
  bool r = c->m.resizing;
  pthread_mutex_unlock(&c->mu);
  return r;
}

/* Sends one heartbeat (c->mu released during the call). Returns the
 * action, or NONE on failure; *ret_gen is the job's generation. */
static enum stk_action beat(struct stk_client *c, struct waiter *w, uint64_t *ret_gen, char *reason,
                            size_t reason_len) {
  Stoker__V1__HeartbeatRequest req = STOKER__V1__HEARTBEAT_REQUEST__INIT;
  char job[sizeof(c->m.job)], member[sizeof(c->m.member_id)];
  memcpy(job, c->m.job, sizeof(job));
  memcpy(member, c->m.member_id, sizeof(member));
  req.job = job;
  req.member_id = member;
  req.generation = c->m.generation;
  req.step = c->m.step;
  req.tokens_per_s = c->m.tokens_per_s;
  req.loss = c->m.loss;
  req.health = (Stoker__V1__RankHealth)c->m.health; /* Same numbers. */
  req.terminating = c->m.terminating;
  req.stop_step = c->m.stop_step;
  int64_t timeout =
      c->m.interval_ms < HEARTBEAT_CALL_MAX_MS ? c->m.interval_ms : HEARTBEAT_CALL_MAX_MS;
  if (timeout < 1000) timeout = 1000;
  waiter_init(w);
  c->m.hb_waiter = w;
  pthread_mutex_unlock(&c->mu);
  waiter_start(w, c, COORD_METHOD(heartbeat, &req), &req.base,
               &stoker__v1__heartbeat_response__descriptor, timeout);
  int err = waiter_wait(w);
  pthread_mutex_lock(&c->mu);
  c->m.hb_waiter = NULL;
  enum stk_action a = STK_ACTION_NONE;
  if (err == 0) {
    Stoker__V1__HeartbeatResponse *r = (Stoker__V1__HeartbeatResponse *)w->resp;
    a = (enum stk_action)r->action;
    if (a != STK_ACTION_NONE) c->m.pausing = r->pausing, c->m.resizing = r->resizing;
    if (a == STK_ACTION_STOP) c->m.stop_ckpt_step = r->pausing ? r->checkpoint_step : 0;
    *ret_gen = r->generation;
    snprintf(reason, reason_len, "%s", r->reason ? r->reason : "");
  } else if (err == STK_ENOENT) {
    /* The job (or this member) is gone: nothing left to train for. */
    a = STK_ACTION_STOP;
    *ret_gen = c->m.generation;
    snprintf(reason, reason_len, "%s", w->st.message);
  }
  /* Anything else (UNAVAILABLE while the coordinator restarts, a timeout)
   * is retried at the next interval; the coordinator grants a grace period. */
  waiter_close(w);
  return a;
}

static void *heartbeat_main(void *arg) {
  struct stk_client *c = arg;
  pthread_mutex_lock(&c->mu);
  while (!c->m.hb_stop) {
    sleep_until(c, c->m.interval_ms);
    if (c->m.hb_stop) break;
    struct waiter w;
    uint64_t gen = 0;
    char reason[sizeof(w.st.message)] = "";
    enum stk_action a = beat(c, &w, &gen, reason, sizeof(reason));
    if (c->m.hb_stop || a == STK_ACTION_NONE || a > STK_ACTION_STOP) continue;
    deliver(c, a, gen, reason);
    /* A pause's STOP naming its checkpoint keeps the seat: this rank may
     * checkpoint first (stk_stop_checkpoint_step), and beats on. */
    if (a == STK_ACTION_RESTART || (a == STK_ACTION_STOP && !c->m.stop_ckpt_step)) break;
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

void membership_stop_heartbeat(struct stk_client *c) {
  pthread_mutex_lock(&c->mu);
  if (!c->m.hb_started) {
    pthread_mutex_unlock(&c->mu);
    return;
  }
  c->m.hb_stop = true;
  pthread_cond_broadcast(&c->m.hb_cv);
  if (c->m.hb_waiter) waiter_cancel(c->m.hb_waiter);
  pthread_t t = c->m.hb_thread;
  c->m.hb_started = false;
  pthread_mutex_unlock(&c->mu);
  pthread_join(t, NULL);
}

/* One Join attempt bounded by the time left. */
static int join_once(struct stk_client *c, const Stoker__V1__JoinRequest *req, int64_t left_ms,
                     Stoker__V1__JoinResponse **ret_resp) {
  return COORD_CALL(c, join, req, left_ms, ret_resp);
}

/* Records why a join gave up: the last server message, kept. */
static int join_gave_up(const char *last) {
  char msg[512];
  snprintf(msg, sizeof(msg), "%s", last);
  client_set_error(4, "join: coordinator unavailable until the timeout (last: %s)",
                   msg[0] ? msg : "none");
  return STK_ETIMEDOUT;
}

/* Joins, retrying UNAVAILABLE with doubling backoff until deadline. */
static int join_retry(struct stk_client *c, const Stoker__V1__JoinRequest *req, int64_t timeout_ms,
                      Stoker__V1__JoinResponse **ret_resp) {
  int64_t deadline = client_now_ms() + timeout_ms;
  int64_t backoff = JOIN_BACKOFF_FIRST_MS;
  for (;;) {
    int err = join_once(c, req, deadline - client_now_ms(), ret_resp);
    if (err != STK_EUNAVAIL) return err;
    int64_t left = deadline - client_now_ms();
    if (left <= 0) return join_gave_up(stk_client_last_error(NULL));
    int64_t nap = backoff < left ? backoff : left;
    struct timespec ts = {nap / 1000, (nap % 1000) * 1000000};
    nanosleep(&ts, NULL);
    backoff = backoff * 2 > JOIN_BACKOFF_MAX_MS ? JOIN_BACKOFF_MAX_MS : backoff * 2;
    if (deadline - client_now_ms() <= 0) return join_gave_up(stk_client_last_error(NULL));
  }
}

static void fill_membership(const Stoker__V1__JoinResponse *r, struct stk_membership *out) {
  memset(out, 0, sizeof(*out));
  out->generation = r->generation;
  out->rank = r->rank;
  out->world_size = r->world_size;
  out->heartbeat_interval_ms = r->heartbeat_interval_ms;
  out->heartbeat_timeout_ms = r->heartbeat_timeout_ms;
  if (r->latest_checkpoint) {
    out->checkpoint_step = r->latest_checkpoint->step;
    snprintf(out->checkpoint_uri, sizeof(out->checkpoint_uri), "%s",
             r->latest_checkpoint->uri ? r->latest_checkpoint->uri : "");
  }
}

/* Records the membership and starts its heartbeat thread. */
static int start_membership(struct stk_client *c, const char *job, const char *member_id,
                            const Stoker__V1__JoinResponse *r) {
  pthread_mutex_lock(&c->mu);
  struct membership *m = &c->m;
  snprintf(m->job, sizeof(m->job), "%s", job);
  snprintf(m->member_id, sizeof(m->member_id), "%s", member_id);
  m->generation = r->generation;
  m->interval_ms = r->heartbeat_interval_ms ? r->heartbeat_interval_ms : 5000;
  m->joined = true;
  m->pending = STK_ACTION_NONE;
  m->pausing = m->resizing = false;
  m->stop_step = m->stop_ckpt_step = 0;
  m->hb_stop = false;
  m->beat_now = m->terminating; /* A rank terminating says so at once. */
  int rc = pthread_create(&m->hb_thread, NULL, heartbeat_main, c);
  m->hb_started = rc == 0;
  pthread_mutex_unlock(&c->mu);
  return rc == 0 ? 0 : client_fail(STK_ENOMEM, "heartbeat thread");
}

int stk_join(struct stk_client *c, const char *job, const char *member_id, const char *address,
             const char *host, int64_t timeout_ms, struct stk_membership *ret_membership) {
  if (!job || !member_id || strlen(job) >= sizeof(c->m.job) ||
      strlen(member_id) >= sizeof(c->m.member_id))
    return client_fail(STK_EINVAL, "join");
  membership_stop_heartbeat(c);
  pthread_mutex_lock(&c->mu);
  c->m.joined = false;
  pthread_mutex_unlock(&c->mu);
  Stoker__V1__JoinRequest req = STOKER__V1__JOIN_REQUEST__INIT;
  req.job = (char *)job;
  req.member_id = (char *)member_id;
  req.address = (char *)(address ? address : "");
  req.host = (char *)(host ? host : "");
  Stoker__V1__JoinResponse *r = NULL;
  int err = join_retry(c, &req, client_timeout(c, timeout_ms), &r);
  if (err < 0) return err;
  if (ret_membership) fill_membership(r, ret_membership);
  err = start_membership(c, job, member_id, r);
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return err;
}

static int leave(struct stk_client *c, bool finished, int64_t checkpoint_step) {
  membership_stop_heartbeat(c);
  Stoker__V1__LeaveRequest req = STOKER__V1__LEAVE_REQUEST__INIT;
  req.finished = finished;
  req.checkpoint_step = checkpoint_step;
  char job[sizeof(c->m.job)], member[sizeof(c->m.member_id)];
  pthread_mutex_lock(&c->mu);
  bool joined = c->m.joined;
  memcpy(job, c->m.job, sizeof(job));
  memcpy(member, c->m.member_id, sizeof(member));
  req.generation = c->m.generation;
  c->m.joined = false;
  pthread_mutex_unlock(&c->mu);
  if (!joined) return client_fail(STK_ESTATE, "leave: not joined");
  req.job = job;
  req.member_id = member;
  return COORD_CALL(c, leave, &req, 0, (Stoker__V1__Empty **)NULL);
}

int stk_leave(struct stk_client *c) {
  return leave(c, false, 0);
}

int stk_leave_finished(struct stk_client *c) {
  return leave(c, true, 0);
}

int stk_leave_checkpointed(struct stk_client *c, int64_t step) {
  if (step <= 0) return client_fail(STK_EINVAL, "leave: checkpoint step must be > 0");
  return leave(c, false, step);
}
