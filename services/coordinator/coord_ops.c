/*
 * coord_ops: operator actions that move a job between states (pause,
 * resume, stop, scale) and ReportCheckpoint, which may let a pending scale
 * or pause go on. Scale and pause ask members for a checkpoint first
 * (CHECKPOINT_NOW in their heartbeat replies) and wait for a newer one to
 * be reported (a pause: newer than every step the members reported, and
 * at least the step they said they stop at: coord_stop_floor), at most
 * scale_timeout_beats heartbeat intervals. What they wait for is in
 * the JobRecord; a restart re-arms it with a fresh deadline (and members,
 * new in memory, are asked to checkpoint again).
 *
 * A preemption notice (PreemptJob, or a rank's heartbeat with terminating,
 * whichever comes first) is a pause without force that remembers its
 * reason (j->preempted): a PREEMPTED event, the members told to checkpoint
 * and then stop (HeartbeatResponse.pausing), and, once they are gone, a
 * PAUSED job that resumes by itself when its ranks Join again
 * (coord_rendezvous.c). Members that stop after staging their last
 * checkpoint leave with its step (coord_pause_await); the next round waits
 * for that checkpoint to be reported (at most the same scale_timeout_beats
 * intervals), so every rank restores it. The step the ranks agreed to stop
 * at (a heartbeat's stop_step, a Leave's checkpoint_step) bounds the
 * pause's checkpoint from below (coord_stop_floor). A pause's STOP that is
 * not forced leaves the member its seat (coord_lease.c): the job is PAUSED
 * once every member left, was lost or was told a forced STOP.
 *
 * A submitted job's pods are its queue controller's, so its ScaleJob only
 * sets the target, except a shrink in place (ScaleJobRequest.in_place, of
 * any job whose pods a queue controller deletes, submitted or not): the
 * controller deletes the pods of the ranks above the target, and the job
 * resizes as a non-submitted one does (coord_scale_arm), every rank
 * checkpointing at the stop step; up to world - target members that report
 * terminating or leave with that step meanwhile are the ones removed
 * (job.removed), not a notice, and the round opens without waiting for
 * them (coord_lease.c, coord_rendezvous.c).
 */
#include "coord_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stk_error.h"

#define S(x) STOKER__V1__JOB_STATE__JOB_STATE_##x
#define E(x) STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_##x

static void go_pausing(struct job *j, bool force);
static void start_scale(struct job *j, bool skip_checkpoint);
static bool members_stopping(const struct job *j);

static int64_t ckpt_wait_ms(const struct job *j) {
  return coord_job_ckpt_wait_ms(j);
}

static void ended(struct coord_wait *w, struct job *j) {
  coord_fail(w, STK_ESTATE, "job %s is %s", j->name,
             j->state == S(STOPPED) ? "stopped" : "finished");
}

/* Ends the generation; parked joins stay parked until ResumeJob (or, after
 * a preemption, until the next Join resumes the job). */
static void go_paused(struct job *j) {
  char key[300];
  coord_sync_end_generation(j, STK_EABORTED, "job paused");
  coord_store_del_prefix(j->c, key, coord_key_kv_prefix(key, j->name, j->generation));
  coord_members_clear(j);
  j->generation++;
  j->state = S(PAUSED);
  j->world = 0;
  j->last_call_at = 0;
  j->scale_pending = false;
  if (j->preempted) {
    char reason[1100], staged[120] = "";
    int64_t ms = j->preempt_notice_ms ? coord_now(j->c) - j->preempt_notice_ms : -1;
    j->preempt_notice_ms = 0;
    if (ms >= 0) /* What terminationGracePeriodSeconds must cover (deploy/k8s/README.md). */
      snprintf(staged, sizeof(staged),
               "; every rank staged its checkpoint and left %lld ms after the notice",
               (long long)ms);
    snprintf(reason, sizeof(reason), "preempted (%s): paused, resumes when its ranks join",
             j->preempted);
    coord_job_touch(j, reason);
    coord_event(j, E(PAUSED), NULL, j->awaited_step > j->ckpt_step ? j->awaited_step : j->ckpt_step,
                "%s%s", reason, staged);
    if (ms >= 0 && j->c->opts.preempt_staged)
      j->c->opts.preempt_staged(j->c->opts.preempt_staged_arg, j->name, (double)ms / 1000.0);
    return;
  }
  coord_job_touch(j, "paused");
  coord_event(j, E(PAUSED), NULL, 0, "paused");
}

/* PAUSED once no member holds a seat: each left, was lost, or was told a
 * forced STOP (told_stop); a STOP naming the pause's checkpoint leaves the
 * seat, since its member may checkpoint first (coord_lease.c, decide). */
void coord_pause_maybe_done(struct job *j) {
  if (j->state != S(PAUSING)) return;
  for (uint32_t r = 0; r < j->world; r++)
    if (j->by_rank[r] && !j->by_rank[r]->told_stop) return;
  go_paused(j);
  if (j->preempted && j->n_joiners) { /* Ranks came back while it paused: they resume it. */
    coord_readmit_maybe(j);
    coord_round_check(j);
  }
}

void coord_pause_job(struct coord *c, const Stoker__V1__JobActionRequest *req, coord_done_fn done,
                     void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_PLAIN, done, arg);
  struct job *j = coord_job_or_fail(c, req->job, w);
  if (!j) return;
  if (coord_job_ended(j)) return ended(w, j);
  if (j->state == S(WAITING) || (j->state == S(RUNNING) && j->n_members == 0)) {
    go_paused(j);
  } else if (j->state == S(RUNNING)) {
    go_pausing(j, req->force);
    coord_job_touch(j, req->force ? "pausing (forced)" : "pausing: checkpoint first");
  }
  coord_answer_job(w, j);
}

static void go_pausing(struct job *j, bool force) {
  j->state = S(PAUSING);
  j->pause_force = force;
  j->pause_ckpt_seen = false;
  /* Only a checkpoint past every step a member reported is the pause's: one
   * begun before the notice (an asynchronous periodic save) and reported
   * after it holds none of the steps trained since. */
  int64_t trained = coord_job_members_step(j);
  j->pause_step = trained > j->ckpt_step ? trained : j->ckpt_step;
  for (uint32_t r = 0; r < j->world; r++) /* A stop step said before (coord_stop_floor). */
    if (j->by_rank[r] && j->by_rank[r]->stop_step - 1 > j->pause_step)
      j->pause_step = j->by_rank[r]->stop_step - 1;
  j->pause_deadline = coord_now(j->c) + ckpt_wait_ms(j);
  j->scale_pending = false;
  j->shrink_from = 0; /* A notice won: a shrink's removed members stay refused. */
  j->awaited_step = 0;
  coord_members_reset_told(j);
}

int coord_preempt(struct job *j, const char *reason) {
  if (coord_job_ended(j)) return STK_ESTATE;
  if (j->state == S(PAUSING) || j->state == S(PAUSED)) return 0; /* Once. */
  free(j->preempted); /* A preemption's, if its round has not closed yet. */
  j->preempted = coord_xstrdup(reason && *reason ? reason : "preempted");
  coord_event(j, E(PREEMPTED), NULL, coord_job_members_step(j), "%s", j->preempted);
  if (j->state == S(RUNNING) && j->n_members > 0) {
    go_pausing(j, false);
    j->preempt_notice_ms = coord_now(j->c);
    char why[1100];
    snprintf(why, sizeof(why), "preempted (%s): checkpoint, then stop", j->preempted);
    coord_job_touch(j, why);
  } else {
    go_paused(j);
  }
  return 0;
}

void coord_preempt_job(struct coord *c, const Stoker__V1__PreemptJobRequest *req,
                       coord_done_fn done, void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_PLAIN, done, arg);
  if (strlen(req->reason) > 1024) return coord_fail(w, STK_EINVAL, "reason over 1024 bytes");
  if (!utf8_valid_str(req->reason)) return coord_fail(w, STK_EINVAL, "reason not valid UTF-8");
  struct job *j = coord_job_or_fail(c, req->job, w);
  if (!j) return;
  if (coord_preempt(j, req->reason)) return ended(w, j);
  coord_answer_job(w, j);
}

void coord_pause_await(struct job *j, int64_t step) {
  coord_stop_floor(j, step);
  if ((j->state != S(PAUSING) && j->state != S(PAUSED)) || step <= j->awaited_step) return;
  j->awaited_step = step; /* The deadline runs from the resume. */
  coord_store_job(j);
}

/* The ranks agreed to stop at stop_step (their vote): every rank leaves
 * (a pause) or waits for the resize's round (a scale) with it, so the
 * pause's or the resize's checkpoint is one of at least that step. The
 * steps the members had reported at the notice or the ScaleJob are up to a
 * heartbeat interval old, and a periodic checkpoint begun after them but
 * before the ranks' stop step, committed meanwhile, passed that bound: it
 * was taken as the pause's (the ranks told STOP with steps past it) or the
 * resize's (the round opened and the ranks' own checkpoint failed with
 * "generation ended": on the real cluster a grow trained a step twice).
 * One seen already below stop_step is not the pause's any more. */
void coord_stop_floor(struct job *j, int64_t stop_step) {
  bool changed = false;
  if (j->scale_pending && stop_step - 1 > j->scale_step) {
    j->scale_step = stop_step - 1;
    changed = true;
  }
  if (j->state == S(PAUSING) && stop_step - 1 > j->pause_step) {
    j->pause_step = stop_step - 1;
    if (j->ckpt_step <= j->pause_step) j->pause_ckpt_seen = false;
    changed = true;
  }
  if (changed) coord_store_job(j);
  coord_scale_open_maybe(j); /* The last stop step said, over a checkpoint reported already. */
}

static bool members_all_said_stop(const struct job *j);

/* A pending resize's round opens on its checkpoint: one past scale_step,
 * once every member said the step it stops at. Before the last said it, a
 * checkpoint reported may have been begun before a rank heard of the
 * resize (heartbeats lag the steps): on the real cluster a periodic
 * checkpoint of 660, reported 0.5 s after the ScaleJob, before any rank
 * had heard it, opened the round while the ranks were at 664. A client that
 * never says a stop step gets its round at the scale's deadline. */
void coord_scale_open_maybe(struct job *j) {
  if (j->scale_pending && j->ckpt_step > j->scale_step && members_all_said_stop(j))
    coord_round_open(j, j->shrink_from ? "shrunk in place" : "scaled");
}

static bool members_all_said_stop(const struct job *j) {
  bool any = false;
  for (uint32_t r = 0; r < j->world; r++) {
    const struct member *m = j->by_rank[r];
    if (!m || m->finished) continue;
    if (m->stop_step <= 0) return false;
    any = true;
  }
  return any;
}

/* An operator's resume, or StopJob: the job is no longer a preemption's. */
static void forget_preemption(struct job *j) {
  j->preempt_notice_ms = 0;
  free(j->preempted);
  j->preempted = NULL;
}

void coord_resume_job(struct coord *c, const Stoker__V1__JobActionRequest *req, coord_done_fn done,
                      void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_PLAIN, done, arg);
  struct job *j = coord_job_or_fail(c, req->job, w);
  if (!j) return;
  if (coord_job_ended(j)) return ended(w, j);
  forget_preemption(j);
  j->await_deadline = coord_now(c) + ckpt_wait_ms(j);
  if (j->state == S(PAUSED)) {
    /* The step the ranks restore: the one they staged before leaving. */
    int64_t step = j->awaited_step > j->ckpt_step ? j->awaited_step : j->ckpt_step;
    j->state = S(WAITING);
    coord_job_touch(j, "resumed");
    coord_event(j, E(RESUMED), NULL, step, "resumed from step %lld", (long long)step);
    coord_round_check(j);
  } else if (j->state == S(PAUSING)) {
    coord_event(j, E(RESUMED), NULL, 0, "resumed");
    coord_round_open(j, "resumed");
  }
  coord_answer_job(w, j);
}

void coord_stop_job(struct coord *c, const Stoker__V1__JobActionRequest *req, coord_done_fn done,
                    void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_PLAIN, done, arg);
  struct job *j = coord_job_or_fail(c, req->job, w);
  if (!j) return;
  if (!coord_job_ended(j)) { /* A finished job stays finished. */
    j->state = S(STOPPED);
    forget_preemption(j);
    j->awaited_step = 0;
    coord_fail_parked(j, true, STK_ESTATE, "job stopped");
    j->scale_pending = false;
    coord_job_touch(j, "stopped");
    coord_event(j, E(STOPPED), NULL, 0, "stopped");
  }
  coord_answer_job(w, j);
}

void coord_scale_job(struct coord *c, const Stoker__V1__ScaleJobRequest *req, coord_done_fn done,
                     void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_PLAIN, done, arg);
  struct job *j = coord_job_or_fail(c, req->job, w);
  if (!j) return;
  if (req->ranks < j->spec->min_ranks)
    return coord_fail(w, STK_EINVAL, "ranks %u is below the job's min_ranks %u", req->ranks,
                      j->spec->min_ranks);
  if (req->ranks > j->spec->max_ranks)
    return coord_fail(w, STK_EINVAL, "ranks %u is above the job's max_ranks %u", req->ranks,
                      j->spec->max_ranks);
  if (coord_job_ended(j)) return ended(w, j);
  j->target = req->ranks;
  j->target_seq = j->last_event_seq + 1; /* The SCALED event's, logged next. */
  coord_job_touch(j, "scaled");
  coord_shrink_clear(j);
  if (req->in_place && j->state == S(RUNNING) && req->ranks < j->world) {
    coord_event(j, E(SCALED), NULL, 0,
                "target %u ranks: shrinking in place from %u (the pods of the ranks removed are "
                "deleted; the kept ranks checkpoint and rejoin)",
                req->ranks, j->world);
    coord_scale_arm(j);
    j->shrink_from = j->world;
    coord_job_touch(j, "shrinking in place: checkpoint, then the kept ranks rejoin");
    return coord_answer_job(w, j);
  }
  if (j->spec->submission) {
    coord_event(j, E(SCALED), NULL, 0,
                "target %u ranks (its queue controller resizes the workload)", req->ranks);
    if (j->state != S(RUNNING))
      coord_round_check(j);
    else if (j->world < req->ranks)
      coord_scale_grow_maybe(j);
    return coord_answer_job(w, j);
  }
  coord_event(j, E(SCALED), NULL, 0, "target %u ranks", req->ranks);
  if (j->state == S(RUNNING) && j->world != req->ranks)
    start_scale(j, req->skip_checkpoint);
  else
    coord_round_check(j);
  coord_answer_job(w, j);
}

static void start_scale(struct job *j, bool skip_checkpoint) {
  if (skip_checkpoint)
    coord_round_open(j, "scaled");
  else
    coord_scale_arm(j);
}

static void record_ckpt(struct job *j, const Stoker__V1__ReportCheckpointRequest *req) {
  if (req->step > j->ckpt_step) {
    j->ckpt_step = req->step;
    free(j->ckpt_uri);
    j->ckpt_uri = coord_xstrdup(req->uri);
    j->ckpt_at_ms = coord_wall_ms();
    j->ckpt_gen = req->generation ? req->generation : j->generation;
    coord_job_touch(j, NULL);
  }
  coord_event(j, E(CHECKPOINT), NULL, req->step, "%s", req->uri);
}

void coord_report_checkpoint(struct coord *c, const Stoker__V1__ReportCheckpointRequest *req,
                             coord_done_fn done, void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_PLAIN, done, arg);
  if (req->step < 0 || strlen(req->uri) > 1024)
    return coord_fail(w, STK_EINVAL, "step must be >= 0 and uri at most 1024 bytes");
  if (!utf8_valid_str(req->uri)) return coord_fail(w, STK_EINVAL, "uri not valid UTF-8");
  struct job *j = coord_job_or_fail(c, req->job, w);
  if (!j) return;
  if (req->generation && req->generation != j->generation)
    return coord_fail(w, STK_ESTALE, "generation %llu is not the current %llu",
                      (unsigned long long)req->generation, (unsigned long long)j->generation);
  record_ckpt(j, req);
  coord_scale_open_maybe(j);
  if (j->state == S(PAUSING) && req->step > j->pause_step && !j->pause_ckpt_seen) {
    j->pause_ckpt_seen = true;
    coord_store_job(j);
  }
  coord_round_check(j); /* A round held for this checkpoint may close. */
  Stoker__V1__Empty resp = STOKER__V1__EMPTY__INIT;
  coord_answer(w, &resp.base);
}

void coord_ops_sweep(struct job *j, int64_t now) {
  /* Not while the ranks stage the checkpoint they stopped at (their leases
   * bound the wait): a round opened now would restore an older one. */
  if (j->scale_pending && now >= j->scale_deadline && !members_stopping(j))
    coord_round_open(j, "scaled (no checkpoint in time)");
  if (j->state == S(PAUSING) && !j->pause_force && !j->pause_ckpt_seen &&
      now >= j->pause_deadline && !members_stopping(j)) {
    j->pause_force = true;
    coord_store_job(j);
  }
  if (j->awaited_step > j->ckpt_step && now >= j->await_deadline && j->state != S(PAUSING) &&
      j->state != S(PAUSED)) {
    j->awaited_step = 0; /* Gave up waiting: the round restores what there is. */
    coord_store_job(j);
    coord_round_check(j);
  }
}

/* Whether a member said the step its ranks stop at (stop_step): they
 * stage their own checkpoint, whose commit is reported after they leave
 * (detached), so the pause's wait for a checkpoint does not force them; a
 * forced STOP ended the generation while a slow stage still needed its
 * barrier and keys. Their leases bound the wait (an operator's forced
 * PauseJob still stops them at once). */
static bool members_stopping(const struct job *j) {
  for (uint32_t r = 0; r < j->world; r++)
    if (j->by_rank[r] && j->by_rank[r]->stop_step > 0 && !j->by_rank[r]->told_stop) return true;
  return false;
}

void coord_ops_rearm(struct job *j) {
  int64_t deadline = coord_now(j->c) + ckpt_wait_ms(j);
  if (j->state != S(RUNNING)) j->scale_pending = false;
  if (j->scale_pending) j->scale_deadline = deadline;
  if (j->state == S(PAUSING)) j->pause_deadline = deadline;
  j->await_deadline = deadline;
}
