/*
 * coord_lease: heartbeats, leaves and the sweep. A member's lease runs for
 * heartbeat_interval_ms * heartbeat_misses from the first sweep after the
 * round's close is durable (its Joins answered) or from its last
 * heartbeat. Each job keeps its members in a list ordered by lease deadline
 * (a heartbeat moves the member to the tail, O(1)), so one coordinator
 * timer finds expired leases by looking at list heads only. Heartbeats
 * write nothing synchronously: statistics are persisted lazily, except a
 * health change, which is an event and is synced with the member's record.
 * A heartbeat with terminating (the rank got SIGTERM) is a preemption
 * notice (coord_ops.c), unless the job shrinks in place and the member is
 * one of those it removes (coord_shrink_remove): that member checkpoints
 * with the others and leaves, and neither its Leave nor the loss of its
 * lease opens a round; replies while the job pauses carry pausing. A
 * heartbeat's stop_step (the step its ranks agreed to stop at) bounds the
 * pause's checkpoint from below (coord_stop_floor); a pause's STOP names
 * its checkpoint (checkpoint_step) and leaves the member its seat until it
 * leaves, since the reply may cross steps the member trained meanwhile.
 */
#include "coord_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stk_error.h"

#define S(x) STOKER__V1__JOB_STATE__JOB_STATE_##x
#define A(x) STOKER__V1__HEARTBEAT_ACTION__HEARTBEAT_ACTION_##x

/* flags: the reply's pausing and resizing. */
enum { HB_PAUSING = 1, HB_RESIZING = 2 };

/* ckpt_step: HeartbeatResponse.checkpoint_step (a pause's STOP, not forced). */
static void answer_hb_gen(struct coord_wait *w, uint64_t gen, int action, const char *reason,
                          int flags, int64_t ckpt_step) {
  Stoker__V1__HeartbeatResponse resp = STOKER__V1__HEARTBEAT_RESPONSE__INIT;
  resp.action = action;
  resp.generation = gen;
  resp.reason = (char *)reason;
  resp.pausing = (flags & HB_PAUSING) != 0;
  resp.resizing = (flags & HB_RESIZING) != 0;
  resp.checkpoint_step = ckpt_step;
  coord_answer(w, &resp.base);
}

static bool pausing(const struct job *j) {
  return j->state == S(PAUSING) || j->state == S(PAUSED);
}

static void answer_hb(struct coord_wait *w, struct job *j, int action, const char *reason) {
  answer_hb_gen(w, j->generation, action, reason, pausing(j) ? HB_PAUSING : 0, 0);
}

/* A rank got SIGTERM: a preemption notice for the whole job, first wins,
 * unless a shrink in place removes it (its pod is the one deleted), or the
 * job holds it no more: neither a member nor one of the generation whose
 * round is open (a removed rank's heartbeat after the shrink's round
 * closed, the shrink forgotten: under torchrun the agent heartbeats until
 * its workers stopped, and that heartbeat paused the job it had left). */
static void terminating(struct job *j, const Stoker__V1__HeartbeatRequest *req) {
  if (!req->terminating || coord_job_ended(j) || pausing(j)) return;
  if (coord_shrink_remove(j, req->member_id)) return;
  if (!coord_tab_get(&j->members, req->member_id) && !coord_tab_get(&j->prev, req->member_id))
    return;
  char why[1200];
  snprintf(why, sizeof(why), "member %s is terminating%s%s", req->member_id,
           *req->message ? ": " : "", req->message);
  coord_preempt(j, why);
}

static const char *health_name(Stoker__V1__RankHealth h) {
  switch (h) {
  case STOKER__V1__RANK_HEALTH__RANK_HEALTH_OK:
    return "OK";
  case STOKER__V1__RANK_HEALTH__RANK_HEALTH_DEGRADED:
    return "DEGRADED";
  case STOKER__V1__RANK_HEALTH__RANK_HEALTH_FAILING:
    return "FAILING";
  default:
    return "UNSPECIFIED";
  }
}

static void record_stats(struct job *j, struct member *m, const Stoker__V1__HeartbeatRequest *req) {
  m->deadline = coord_now(j->c) + coord_job_lease_ms(j);
  list_del(&m->lease);
  list_push(&j->leases, &m->lease);
  m->last_hb_ms = coord_wall_ms();
  m->step = req->step;
  if (req->stop_step > m->stop_step) { /* Its ranks' vote: the pause's or resize's bound. */
    m->stop_step = req->stop_step;
    coord_stop_floor(j, req->stop_step);
  }
  m->tps = req->tokens_per_s;
  m->loss = req->loss;
  if (req->health != m->health || strcmp(req->message, m->message) != 0) {
    bool health_changed =
        req->health != m->health &&
        !(m->health == 0 && req->health == STOKER__V1__RANK_HEALTH__RANK_HEALTH_OK);
    m->health = req->health;
    coord_member_set_message(m, req->message);
    if (health_changed) { /* The event carries the rank's message in full. */
      coord_event(j, STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_HEALTH, m->id, (int64_t)m->step,
                  "%s%s%s", health_name(m->health), *m->message ? ": " : "", m->message);
      coord_store_member(j, m); /* GetJob after a crash agrees with the event. */
      return;
    }
  }
  coord_store_member_lazy(m);
}

/* Periodic checkpoints: ask once per threshold of checkpoint_every_steps. */
static bool periodic_ckpt_due(struct job *j, struct member *m) {
  uint64_t every = j->spec->checkpoint_every_steps;
  if (!every) return false;
  uint64_t base = j->ckpt_step > 0 ? (uint64_t)j->ckpt_step : 0;
  uint64_t threshold = (base / every + 1) * every;
  if (m->step < threshold || m->asked_threshold >= threshold) return false;
  m->asked_threshold = threshold;
  return true;
}

/* *ret_ckpt: the reply's checkpoint_step (a pause's STOP, not forced). */
static int decide(struct job *j, struct member *m, const char **reason, int *flags,
                  int64_t *ret_ckpt) {
  if (j->state == S(PAUSING)) {
    if (j->pause_force) { /* The wait is over: the seat ends with the STOP. */
      m->told_stop = true;
      *reason = "job pausing";
      return A(STOP);
    }
    /* After the pause's checkpoint, STOP only a member with no step past
     * it, reported or agreed (stop_step): one that trained on stops by
     * itself after its own (it was told CHECKPOINT_NOW with pausing). The
     * reply may still cross steps the member finishes meanwhile, so it
     * names the checkpoint (a member past it checkpoints, then stops) and
     * the member keeps its seat until it leaves: not told_stop. */
    int64_t last = (int64_t)m->step > m->stop_step ? (int64_t)m->step : m->stop_step;
    if (j->pause_ckpt_seen && last <= j->ckpt_step) {
      *ret_ckpt = j->ckpt_step;
      m->told_ckpt = true; /* A member past it checkpoints, then stops: told. */
      *reason = "job pausing: its checkpoint is taken";
      return A(STOP);
    }
    if (!m->told_ckpt) {
      m->told_ckpt = true;
      *reason = "checkpoint before pause";
      return A(CHECKPOINT_NOW);
    }
    return A(CONTINUE);
  }
  if (j->scale_pending && !m->told_ckpt) {
    m->told_ckpt = true;
    *reason = "checkpoint before scaling";
    *flags |= HB_RESIZING;
    return A(CHECKPOINT_NOW);
  }
  if (periodic_ckpt_due(j, m)) {
    *reason = "checkpoint_every_steps reached";
    return A(CHECKPOINT_NOW);
  }
  return A(CONTINUE);
}

void coord_heartbeat(struct coord *c, const Stoker__V1__HeartbeatRequest *req, coord_done_fn done,
                     void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_PLAIN, done, arg);
  c->stats.heartbeats++;
  struct job *j = coord_job_or_fail(c, req->job, w);
  if (!j) return;
  if (!coord_valid_member_id(req->member_id) || strlen(req->message) > 1024)
    return coord_fail(w, STK_EINVAL, "bad member_id or message over 1024 bytes");
  if (!utf8_valid_str(req->message)) return coord_fail(w, STK_EINVAL, "message not valid UTF-8");
  if (req->generation > j->generation)
    return coord_fail(w, STK_ESTALE, "generation %llu is newer than the job's %llu",
                      (unsigned long long)req->generation, (unsigned long long)j->generation);
  if (coord_job_ended(j) || j->state == S(PAUSED))
    return answer_hb(w, j, A(STOP),
                     j->state == S(STOPPED)    ? "job stopped"
                     : j->state == S(FINISHED) ? "job finished"
                                               : "job paused");
  terminating(j, req);
  if (j->state == S(PAUSED)) return answer_hb(w, j, A(STOP), "job paused");
  struct hnode *n = coord_tab_get(&j->members, req->member_id);
  if (n && req->generation == j->generation && container_of(n, struct member, hn)->finished)
    return answer_hb(w, j, A(STOP), "this member finished");
  if (j->state == S(RUNNING) && coord_surplus_has(j, req->member_id))
    return answer_hb(w, j, A(STOP), "job scaled down: this member is not needed");
  bool seated = n && req->generation == j->generation && j->state != S(WAITING);
  if (!seated && coord_shrink_removes(j, req->member_id))
    return answer_hb(w, j, A(STOP), "job shrunk in place: this member is removed");
  if (!seated) return answer_hb(w, j, A(RESTART), "rejoin: a new round is open");
  struct member *m = container_of(n, struct member, hn);
  record_stats(j, m, req);
  const char *reason = "";
  uint64_t gen = j->generation;
  int flags = pausing(j) ? HB_PAUSING : 0;
  int64_t ckpt = 0;
  int action = decide(j, m, &reason, &flags, &ckpt);
  /* The last STOP of a pause completes it: answer after that change. */
  if (action == A(STOP)) coord_pause_maybe_done(j);
  answer_hb_gen(w, gen, action, reason, flags, ckpt);
}

/* A finishing job (a member left finished) ends once every member left of
 * its generation finished: FINISHED, terminal, parked calls refused. */
static void finish_maybe(struct job *j) {
  if (j->state != S(RUNNING) || !j->n_finished) return;
  if (j->n_finished < j->n_members) {
    char reason[96];
    snprintf(reason, sizeof(reason), "finishing: %u of %u members finished", j->n_finished,
             j->n_members);
    coord_job_touch(j, reason);
    return;
  }
  j->state = S(FINISHED);
  coord_fail_parked(j, true, STK_ESTATE, "job finished");
  j->scale_pending = false;
  char reason[96];
  snprintf(reason, sizeof(reason), "finished: %u members of generation %llu finished",
           j->n_finished, (unsigned long long)j->generation);
  coord_job_touch(j, reason);
  coord_event(j, STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_FINISHED, NULL, 0,
              "generation %llu: %u members finished", (unsigned long long)j->generation,
              j->n_finished);
}

/* A member of a running generation is done: it keeps its seat (rank, KV
 * and barriers stay for the others) but holds no lease. */
static void finish(struct job *j, struct member *m) {
  coord_event(j, STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_MEMBER_LEFT, m->id, (int64_t)m->step,
              "finished");
  m->finished = true;
  m->told_stop = true;
  list_del(&m->lease);
  j->n_finished++;
  coord_store_member(j, m);
  coord_sync_members_gone(j);
  finish_maybe(j);
}

/* A member leaves (clean exit) or is lost (lease expired). In a finishing
 * job neither opens a round: the member is gone, the others finish. */
static void depart(struct job *j, struct member *m, bool lost) {
  char id[130];
  snprintf(id, sizeof(id), "%s", m->id);
  coord_event(j,
              lost ? STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_MEMBER_LOST
                   : STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_MEMBER_LEFT,
              id, (int64_t)m->step, lost ? "lease expired" : "left");
  bool removed = j->shrink_from && coord_shrink_removes(j, id); /* Not coming back. */
  if (j->state == S(RUNNING) && !j->n_finished && !removed) {
    coord_round_open(j, lost ? "a member was lost" : "a member left");
    return;
  }
  coord_member_remove(j, m);
  coord_job_touch(j, NULL);
  if (removed) coord_scale_open_maybe(j); /* It may have been the last to say its stop. */
  coord_pause_maybe_done(j);
  if (j->n_finished || removed) coord_sync_members_gone(j); /* Its peers' barriers. */
  finish_maybe(j);
}

void coord_leave(struct coord *c, const Stoker__V1__LeaveRequest *req, coord_done_fn done,
                 void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_PLAIN, done, arg);
  struct job *j = coord_job_or_fail(c, req->job, w);
  if (!j) return;
  if (!coord_valid_member_id(req->member_id)) return coord_fail(w, STK_EINVAL, "bad member_id");
  if (req->generation > j->generation)
    return coord_fail(w, STK_ESTALE, "generation %llu is newer than the job's",
                      (unsigned long long)req->generation);
  struct hnode *jn = coord_tab_get(&j->joiners_by_id, req->member_id);
  if (jn) coord_fail(container_of(jn, struct coord_wait, hn), STK_EABORTED, "member left");
  struct hnode *n = coord_tab_get(&j->members, req->member_id);
  struct member *m =
      n && req->generation == j->generation ? container_of(n, struct member, hn) : NULL;
  /* One a shrink in place removes (also once its round opened: a member of
   * the last generation) is no notice, and its round need not wait for it. */
  bool removed = req->checkpoint_step > 0 && coord_shrink_remove(j, req->member_id);
  if (m && req->checkpoint_step > 0 && j->state == S(RUNNING) && !j->n_finished && !removed) {
    /* It stopped after a checkpoint its peers voted for before the notice
     * that made them (a peer's SIGTERM) reached the coordinator (one that
     * a shrink in place removes is no notice). */
    char why[300];
    snprintf(why, sizeof(why), "member %s stopped after staging the checkpoint of step %lld", m->id,
             (long long)req->checkpoint_step);
    coord_preempt(j, why);
  }
  if (req->checkpoint_step > 0) {
    coord_pause_await(j, req->checkpoint_step);
    /* Its stop floor may let a shrink's round open (coord_stop_floor): then
     * the member is the previous generation's, not a member to depart. */
    n = coord_tab_get(&j->members, req->member_id);
    if (!n || req->generation != j->generation) m = NULL;
  }
  if (m && req->finished && j->state == S(RUNNING) && !m->finished)
    finish(j, m);
  else if (m && !m->finished)
    depart(j, m, false);
  if (jn) coord_round_check(j);
  Stoker__V1__Empty resp = STOKER__V1__EMPTY__INIT;
  coord_answer(w, &resp.base);
}

static void sweep_leases(struct job *j, int64_t now) {
  if (j->leases_dseq) {
    /* A member learns its seat when the round's close is durable and its
     * Join answered: until then no lease runs out, and from then each
     * lease is whole. Before 2026-11-29 leases began at the close, so a
     * synced write slower than the lease (a loaded disk, 100 ms test
     * leases) lost every member of a round before it was told it had one. */
    if (j->c->durable_seq < j->leases_dseq) return;
    j->leases_dseq = 0;
    for (struct list *l = j->leases.next; l != &j->leases; l = l->next)
      container_of(l, struct member, lease)->deadline = now + coord_job_lease_ms(j);
  }
  while (!list_empty(&j->leases)) {
    struct member *m = container_of(j->leases.next, struct member, lease);
    if (m->deadline > now) break;
    depart(j, m, true); /* RUNNING: opens a round, which empties the list. */
  }
}

static void sweep_joins(struct job *j, int64_t now) {
  bool changed = false;
  while (!list_empty(&j->joiners)) {
    struct coord_wait *w = container_of(j->joiners.next, struct coord_wait, link);
    if (w->u.join.deadline > now) break;
    coord_fail(w, STK_ETIMEDOUT, "no round closed within join_timeout_ms");
    changed = true;
  }
  if (changed) coord_round_check(j);
  if (j->state == S(WAITING) && j->last_call_at && now >= j->last_call_at &&
      j->n_joiners >= j->spec->min_ranks && !coord_round_held(j) &&
      !coord_round_awaits_prev(j, now))
    coord_round_close(j);
}

void coord_lease_sweep(struct coord *c) {
  int64_t now = coord_now(c);
  size_t pos;
  for (struct hnode *n = coord_tab_first(&c->jobs, &pos); n;
       n = coord_tab_next(&c->jobs, n, &pos)) {
    struct job *j = container_of(n, struct job, hn);
    sweep_leases(j, now);
    sweep_joins(j, now);
    coord_ops_sweep(j, now);
  }
}
