/*
 * ckpt_admit: who may begin a checkpoint attempt. Attempts are the service's
 * scarcest slot (each may hold staging, segments and uploads), and one job
 * that begins and never writes must not take them from every other job.
 * Limits belong to the job first:
 *
 *   1. A job's Begin for a later step supersedes its own older attempts that
 *      are idle and unfinished (no stream attached, some rank not done):
 *      a trainer that gave up on a save, or restarted, does not hold the
 *      slot until the idle timeout. Attempts still being written, or whose
 *      ranks have all finished (uploading, committing), are left alone.
 *   2. A job holds at most max_open_attempts_per_job attempts (Begins in
 *      flight and its attempts still aborting included: that bounds its
 *      cleanup backlog), far below the service's cap, which counts the
 *      attempts open or committing and the Begins in flight.
 *   3. At the service cap (max_open_attempts), a job that holds fewer than
 *      the largest holder less one takes a slot from it: the largest
 *      holder's oldest attempt that is not committing is aborted, its reason
 *      naming the rule. So a job holding no attempt is refused only when
 *      every job holds at most one.
 *
 * Refusals are STK_EBUSY (RESOURCE_EXHAUSTED) with a detail naming the
 * limit. Runs on the loop; calls only the attempt table and its abort
 * (ckpt_attempt.c), below it.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "ckpt_service_int.h"
#include "stk_error.h"

/* Attempts of job not DONE, with its Begins in flight. */
static uint32_t held_by(const struct ckpt_service *s, const char *job) {
  uint32_t n = 0;
  for (const struct attempt *a = s->attempts; a; a = a->next)
    n += a->state != ATT_DONE && strcmp(a->job, job) == 0;
  for (const struct begin_pending *b = s->begins; b; b = b->next) n += strcmp(b->job, job) == 0;
  return n;
}

static bool idle_unfinished(const struct attempt *a) {
  bool unfinished = false;
  for (uint32_t r = 0; r < a->world; r++) {
    if (a->ranks[r].writer) return false;
    unfinished = unfinished || !a->ranks[r].last_fed;
  }
  return unfinished;
}

static void supersede_older(struct ckpt_service *s, const char *job, int64_t step) {
  for (struct attempt *a = s->attempts; a; a = a->next) {
    if (a->state != ATT_OPEN || a->step >= step || strcmp(a->job, job) != 0) continue;
    if (!idle_unfinished(a)) continue;
    char msg[200];
    snprintf(msg, sizeof msg, "attempt %s: superseded by the job's Begin for step %" PRId64, a->id,
             step);
    s->stats.superseded++;
    a->collect = true;
    ckpt__attempt_abort(a, STK_EABORTED, msg);
  }
}

/* The job holding the most open attempts, and how many. */
static const char *largest_holder(const struct ckpt_service *s, uint32_t *ret_held) {
  const char *best = NULL;
  uint32_t most = 0;
  for (const struct attempt *a = s->attempts; a; a = a->next) {
    if (a->state == ATT_DONE) continue;
    uint32_t n = held_by(s, a->job);
    if (n > most) most = n, best = a->job;
  }
  *ret_held = most;
  return best;
}

/* Aborts holder's oldest attempt that can still be aborted; false if none. */
static bool take_slot(struct ckpt_service *s, const char *holder, const char *job) {
  struct attempt *oldest = NULL;
  for (struct attempt *a = s->attempts; a; a = a->next)
    if (a->state == ATT_OPEN && !a->detach_started && strcmp(a->job, holder) == 0 &&
        (!oldest || a->created_at_ms <= oldest->created_at_ms))
      oldest = a;
  if (!oldest) return false;
  char msg[300];
  snprintf(msg, sizeof msg,
           "attempt %s: aborted to make room for job %s (the service's --max-open-attempts "
           "were taken, and job %s held the most)",
           oldest->id, job, holder);
  s->stats.preempted++;
  oldest->collect = true;
  ckpt__attempt_abort(oldest, STK_EABORTED, msg);
  return true;
}

int ckpt_admit(struct ckpt_service *s, const char *job, int64_t step) {
  supersede_older(s, job, step);
  uint32_t mine = held_by(s, job);
  if (mine >= s->o.max_open_attempts_per_job) {
    stk_set_detail("job %s has %u checkpoint attempts open (the most one job may hold, "
                   "--max-open-attempts-per-job); commit or abort one first",
                   job, mine);
    return STK_EBUSY;
  }
  /* Aborting attempts hold no staging (freed at the abort) and count only
   * against their own job: another job's cleanup never fills the service. */
  uint32_t live = 0;
  for (const struct attempt *a = s->attempts; a; a = a->next)
    live += a->state == ATT_OPEN || a->state == ATT_COMMITTING;
  for (const struct begin_pending *b = s->begins; b; b = b->next) live++;
  if (live < s->o.max_open_attempts) return 0;
  uint32_t most;
  const char *holder = largest_holder(s, &most);
  if (holder && most > mine + 1 && take_slot(s, holder, job)) return 0;
  stk_set_detail("%u checkpoint attempts are open (the most this service keeps, "
                 "--max-open-attempts) and no job holds more than one beyond job %s's %u; "
                 "commit or abort one first",
                 live, job, mine);
  return STK_EBUSY;
}
