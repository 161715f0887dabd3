/*
 * ckpt_orphans: when the service looks for orphaned multipart uploads (the
 * work itself is ckpt_gc_orphan_uploads in ckpt_gc.c). Once at open, right
 * after recovery and like it before serving, then every interval (a quarter
 * of the grace period, between 100 ms and 10 min) as a job on the work
 * pool, started from the sweep timer; one run at a time. A store that
 * cannot list uploads (s3rver) turns the periodic runs off.
 */
#include <stdlib.h>

#include "ckpt_service_int.h"
#include "stk_error.h"

#define DEFAULT_GRACE_MS (3600 * 1000)
#define MIN_INTERVAL_MS  100
#define MAX_INTERVAL_MS  (600 * 1000)

static uint64_t grace_ms(const struct ckpt_service *s) {
  return s->o.orphan_upload_grace_ms ? s->o.orphan_upload_grace_ms : DEFAULT_GRACE_MS;
}

static uint64_t interval_ms(const struct ckpt_service *s) {
  uint64_t i = grace_ms(s) / 4;
  return i < MIN_INTERVAL_MS ? MIN_INTERVAL_MS : (i > MAX_INTERVAL_MS ? MAX_INTERVAL_MS : i);
}

/* Books a run's outcome and schedules the next one (loop thread). */
static void ran(struct ckpt_service *s, int err, uint64_t aborted) {
  s->stats.orphan_uploads_aborted += aborted;
  s->orphans_off = err == STK_ENOTSUP;
  s->orphans_next_ms = uv_now(s->loop) + interval_ms(s);
}

void ckpt_orphans_open(struct ckpt_service *s) {
  uint64_t aborted = 0;
  int err = ckpt_gc_orphan_uploads(s, ckpt__svc_now_ms(), grace_ms(s), &aborted);
  ran(s, err, aborted);
}

struct orphans_job {
  struct ckpt_task t;
  struct ckpt_service *s;
  uint64_t aborted;
  int err;
};

static void orphans_work(struct ckpt_task *t) {
  struct orphans_job *j = (struct orphans_job *)t;
  j->err = ckpt_gc_orphan_uploads(j->s, ckpt__svc_now_ms(), grace_ms(j->s), &j->aborted);
}

static void orphans_after(struct ckpt_task *t) {
  struct orphans_job *j = (struct orphans_job *)t;
  j->s->orphans_running = false;
  ran(j->s, j->err, j->aborted);
  free(j);
}

void ckpt_orphans_tick(struct ckpt_service *s) {
  if (s->closing || s->orphans_off || s->orphans_running || uv_now(s->loop) < s->orphans_next_ms)
    return;
  struct orphans_job *j = calloc(1, sizeof(*j));
  if (!j) return;
  j->t.work = orphans_work;
  j->t.after = orphans_after;
  j->s = s;
  s->orphans_running = true;
  ckpt_pool_submit(s->work, &j->t);
}
