/*
 * ckpt_orphan_attempts: when the service sweeps storage for orphaned
 * attempt directories (the work itself is ckpt_gc_orphan_attempts in
 * ckpt_gc.c). An attempt leaves objects behind without the journal knowing
 * when its A/ record is gone and its objects are not: an abort whose
 * deletes failed (the cleanup is best effort and drops the records anyway),
 * a journal lost or replaced under the same storage. The job's own
 * collection (ckpt__attempt_collect_run) runs only when an attempt of that job is
 * aborted; this sweep covers every job, whatever happens later.
 *
 * Every interval (a quarter of the grace period, between 100 ms and 10 min)
 * a run goes to the work pool, started from the sweep timer; one run at a
 * time. A directory is removed only once runs grace_ms apart both found it
 * orphaned: the store gives no object times to age keys by, so the grace
 * runs from the service's first sighting (and starts again after a
 * restart).
 */
#include <stdlib.h>

#include "ckpt_service_int.h"
#include "stk_error.h"

#define DEFAULT_GRACE_MS (3600 * 1000)
#define MIN_INTERVAL_MS  100
#define MAX_INTERVAL_MS  (600 * 1000)

static uint64_t grace_ms(const struct ckpt_service *s) {
  return s->o.orphan_attempt_grace_ms ? s->o.orphan_attempt_grace_ms : DEFAULT_GRACE_MS;
}

static uint64_t interval_ms(const struct ckpt_service *s) {
  uint64_t i = grace_ms(s) / 4;
  return i < MIN_INTERVAL_MS ? MIN_INTERVAL_MS : (i > MAX_INTERVAL_MS ? MAX_INTERVAL_MS : i);
}

struct sweep_job {
  struct ckpt_task t;
  struct ckpt_service *s;
  struct ckpt_orphan_sweep found;
  int err;
};

static void sweep_work(struct ckpt_task *t) {
  struct sweep_job *j = (struct sweep_job *)t;
  j->err = ckpt_gc_orphan_attempts(j->s, ckpt__svc_now_ms(), grace_ms(j->s), &j->found);
}

static void sweep_after(struct ckpt_task *t) {
  struct sweep_job *j = (struct sweep_job *)t;
  struct ckpt_service *s = j->s;
  s->orphan_attempts_running = false;
  s->stats.orphan_attempts_removed += j->found.attempts;
  s->stats.orphan_attempt_objects_removed += j->found.objects;
  s->orphan_attempts_next_ms = uv_now(s->loop) + interval_ms(s);
  free(j);
}

void ckpt_orphan_attempts_tick(struct ckpt_service *s) {
  if (s->closing || s->orphan_attempts_running || uv_now(s->loop) < s->orphan_attempts_next_ms)
    return;
  struct sweep_job *j = calloc(1, sizeof(*j));
  if (!j) return;
  j->t.work = sweep_work;
  j->t.after = sweep_after;
  j->s = s;
  s->orphan_attempts_running = true;
  ckpt_pool_submit(s->work, &j->t);
}
