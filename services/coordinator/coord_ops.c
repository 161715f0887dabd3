/*
 * coord_ops: operator actions that move a job between states (pause,
 * resume, stop, scale) and ReportCheckpoint, which may let a pending scale
 * or pause go on. Scale and pause ask members for a checkpoint first
 * (CHECKPOINT_NOW in their heartbeat replies) and wait for a newer one to
 * be reported, at most scale_timeout_beats heartbeat intervals. What they
 * wait for is in the JobRecord; a restart re-arms it with a fresh deadline
 * (and members, new in memory, are asked to checkpoint again).
 */
#include "coord_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stk_error.h"

#define S(x) STOKER__V1__JOB_STATE__JOB_STATE_##x
#define E(x) STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_##x

static int64_t ckpt_wait_ms(const struct job *j) {
  return (int64_t)j->c->opts.scale_timeout_beats * j->spec->heartbeat_interval_ms;
}

static void ended(struct coord_wait *w, struct job *j) {
  coord_fail(w, STK_ESTATE, "job %s is %s", j->name,
             j->state == S(STOPPED) ? "stopped" : "finished");
}

static void reset_told(struct job *j) {
  for (uint32_t r = 0; r < j->world; r++)
    if (j->by_rank[r] && !j->by_rank[r]->finished) /* (one that finished never beats) */
      j->by_rank[r]->told_ckpt = j->by_rank[r]->told_stop = false;
}

/* Ends the generation; parked joins stay parked until ResumeJob. */
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
  coord_job_touch(j, "paused");
  coord_event(j, E(PAUSED), NULL, 0, "paused");
}

void coord_pause_maybe_done(struct job *j) {
  if (j->state != S(PAUSING)) return;
  for (uint32_t r = 0; r < j->world; r++)
    if (j->by_rank[r] && !j->by_rank[r]->told_stop) return;
  go_paused(j);
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
    j->state = S(PAUSING);
    j->pause_force = req->force;
    j->pause_ckpt_seen = false;
    j->pause_step = j->ckpt_step;
    j->pause_deadline = coord_now(c) + ckpt_wait_ms(j);
    j->scale_pending = false;
    reset_told(j);
    coord_job_touch(j, req->force ? "pausing (forced)" : "pausing: checkpoint first");
  }
  coord_answer_job(w, j);
}

void coord_resume_job(struct coord *c, const Stoker__V1__JobActionRequest *req, coord_done_fn done,
                      void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_PLAIN, done, arg);
  struct job *j = coord_job_or_fail(c, req->job, w);
  if (!j) return;
  if (coord_job_ended(j)) return ended(w, j);
  if (j->state == S(PAUSED)) {
    j->state = S(WAITING);
    coord_job_touch(j, "resumed");
    coord_event(j, E(RESUMED), NULL, 0, "resumed");
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
  if (req->ranks < j->spec->min_ranks || req->ranks > j->spec->max_ranks)
    return coord_fail(w, STK_EINVAL, "ranks must be within %u..%u", j->spec->min_ranks,
                      j->spec->max_ranks);
  if (coord_job_ended(j)) return ended(w, j);
  j->target = req->ranks;
  coord_job_touch(j, "scaled");
  coord_event(j, E(SCALED), NULL, 0, "target %u ranks", req->ranks);
  if (j->state == S(RUNNING) && j->world != req->ranks) {
    if (req->skip_checkpoint) {
      coord_round_open(j, "scaled");
    } else {
      j->scale_pending = true;
      j->scale_step = j->ckpt_step;
      j->scale_deadline = coord_now(c) + ckpt_wait_ms(j);
      reset_told(j);
    }
  } else {
    coord_round_check(j);
  }
  coord_answer_job(w, j);
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
  struct job *j = coord_job_or_fail(c, req->job, w);
  if (!j) return;
  if (req->generation && req->generation != j->generation)
    return coord_fail(w, STK_ESTALE, "generation %llu is not the current %llu",
                      (unsigned long long)req->generation, (unsigned long long)j->generation);
  record_ckpt(j, req);
  if (j->scale_pending && req->step > j->scale_step) coord_round_open(j, "scaled");
  if (j->state == S(PAUSING) && req->step > j->pause_step && !j->pause_ckpt_seen) {
    j->pause_ckpt_seen = true;
    coord_store_job(j);
  }
  Stoker__V1__Empty resp = STOKER__V1__EMPTY__INIT;
  coord_answer(w, &resp.base);
}

void coord_ops_sweep(struct job *j, int64_t now) {
  if (j->scale_pending && now >= j->scale_deadline)
    coord_round_open(j, "scaled (no checkpoint in time)");
  if (j->state == S(PAUSING) && !j->pause_force && !j->pause_ckpt_seen &&
      now >= j->pause_deadline) {
    j->pause_force = true;
    coord_store_job(j);
  }
}

void coord_ops_rearm(struct job *j) {
  int64_t deadline = coord_now(j->c) + ckpt_wait_ms(j);
  if (j->state != S(RUNNING)) j->scale_pending = false;
  if (j->scale_pending) j->scale_deadline = deadline;
  if (j->state == S(PAUSING)) j->pause_deadline = deadline;
}
