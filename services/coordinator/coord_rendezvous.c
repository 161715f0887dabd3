/*
 * coord_rendezvous: Join and the rendezvous round. Joins park in the job's
 * open round (FIFO by arrival, and by member id to supersede a repeated
 * join). When min_ranks have joined a last-call window opens; the round
 * closes when the joiners reach the cap (target_ranks, else max_ranks) or
 * the window ends (see coord_lease.c for the sweep). Closing assigns ranks
 * deterministically: members of the previous generation first, in their
 * old order, then newcomers by arrival. Opening a round ends the current
 * generation: barriers and KV waits abort, its KV keys are deleted and its
 * members are told RESTART by their next heartbeat. Their member records
 * (m/<job>/<id>, with rank and generation) stay until the round closes, so
 * that a restarted coordinator still knows the previous order. Failing all
 * of a job's parked calls (stop, delete, close) is here too, above the
 * barriers and KV of coord_sync.c that it ends with the joins.
 *
 * After a preemption (job.preempted) the first Join resumes the PAUSED job
 * (no ResumeJob); a round whose last generation's members left after
 * staging a checkpoint (job.awaited_step) closes only once that checkpoint
 * is reported or the wait ends (coord_ops.c), and the close of a
 * preempted job's round logs RESUMED with the step its members restore.
 * A close at a world unlike the last close's logs SHRUNK or GROWN with the
 * checkpoint step the new generation restores (job.last_world, kept in the
 * JobRecord).
 *
 * A new member of a running submitted job (its pods are its queue
 * controller's) parks as a spare until the target's ranks are there; then
 * the job scales at a step boundary as ScaleJob does (coord_scale_arm,
 * called by coord_ops.c too).
 *
 * A shrink in place (job.shrink_from, armed by ScaleJob in coord_ops.c)
 * knows the members it removes by their SIGTERM or their Leave
 * (coord_shrink_remove, from coord_lease.c): their Joins are refused, and
 * the close that ends it adds them to the surplus.
 */
#include "coord_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stk_error.h"

#define S(x) STOKER__V1__JOB_STATE__JOB_STATE_##x

static void resized_maybe(struct job *j);
static void resumed_maybe(struct job *j);

static void delete_record(struct job *j, const char *id) {
  char key[512];
  int kl = snprintf(key, sizeof(key), "m/%s/%s", j->name, id);
  coord_store_del(j->c, key, (size_t)kl);
}

/* Forgets the previous generation's order. A member of it that is not a
 * member now loses its record (a member's record was rewritten by seat()). */
static void clear_prev(struct job *j) {
  size_t pos;
  struct hnode *n = coord_tab_first(&j->prev, &pos);
  while (n) {
    struct hnode *next = coord_tab_next(&j->prev, n, &pos);
    struct member *m = container_of(n, struct member, hn);
    coord_tab_del(&j->prev, n);
    if (!coord_tab_get(&j->members, m->id)) delete_record(j, m->id);
    coord_member_free(m);
    n = next;
  }
}

void coord_members_clear(struct job *j) {
  if (j->world == 0) return; /* No generation ran since: its order stays. */
  clear_prev(j);
  j->n_finished = 0;
  for (uint32_t r = 0; r < j->world; r++) {
    struct member *m = j->by_rank[r];
    if (!m) continue;
    j->by_rank[r] = NULL;
    coord_tab_del(&j->members, &m->hn);
    list_del(&m->lease);
    list_del(&m->dirty);
    coord_tab_put(&j->prev, &m->hn, m->id);
  }
  if (j->c->stats.members >= j->n_members) j->c->stats.members -= j->n_members;
  j->n_members = 0;
}

void coord_member_remove(struct job *j, struct member *m) {
  coord_tab_del(&j->members, &m->hn);
  if (m->rank < j->world && j->by_rank[m->rank] == m) j->by_rank[m->rank] = NULL;
  j->n_members--;
  if (m->finished) j->n_finished--;
  if (j->c->stats.members) j->c->stats.members--;
  char key[512];
  int kl = snprintf(key, sizeof(key), "m/%s/%s", j->name, m->id);
  coord_store_del(j->c, key, (size_t)kl);
  coord_member_free(m);
}

void coord_round_open(struct job *j, const char *reason) {
  char key[300];
  coord_sync_end_generation(j, STK_EABORTED, "generation ended");
  coord_store_del_prefix(j->c, key, coord_key_kv_prefix(key, j->name, j->generation));
  coord_members_clear(j);
  j->generation++;
  j->state = S(WAITING);
  j->world = 0;
  j->scale_pending = false;
  j->last_call_at = 0;
  coord_job_touch(j, reason);
  coord_event(j, STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_ROUND_OPENED, NULL, 0, "%s", reason);
  coord_round_check(j);
}

void coord_fail_parked(struct job *j, bool with_joins, int err, const char *msg) {
  if (with_joins) {
    while (!list_empty(&j->joiners))
      coord_fail(container_of(j->joiners.next, struct coord_wait, link), err, "%s", msg);
    j->last_call_at = 0;
  }
  coord_sync_end_generation(j, err, msg);
}

bool coord_round_held(const struct job *j) {
  return j->awaited_step > j->ckpt_step && coord_now(j->c) < j->await_deadline;
}

bool coord_round_awaits_prev(const struct job *j, int64_t now) {
  uint32_t due = 0, back = 0;
  size_t pos;
  for (struct hnode *n = coord_tab_first(&j->prev, &pos); n;
       n = coord_tab_next(&j->prev, n, &pos)) {
    const struct member *m = container_of(n, struct member, hn);
    if (!m->finished && m->deadline > now) due++;
  }
  if (!due) return false;
  for (struct list *l = j->joiners.next; l != &j->joiners; l = l->next) {
    const struct coord_wait *w = container_of(l, struct coord_wait, link);
    struct hnode *p = coord_tab_get(&j->prev, w->u.join.member_id);
    if (!p) continue;
    const struct member *m = container_of(p, struct member, hn);
    if (!m->finished && m->deadline > now) back++;
  }
  return back < due;
}

static bool shrink_unsure(const struct job *j);

void coord_round_check(struct job *j) {
  if (j->state != S(WAITING)) return;
  if (j->n_joiners >= coord_job_cap(j)) {
    if (coord_round_held(j)) return; /* ReportCheckpoint or the sweep checks again. */
    if (shrink_unsure(j)) {          /* Until its last call: see shrink_unsure. */
      if (!j->last_call_at) j->last_call_at = coord_now(j->c) + j->spec->last_call_ms;
      return;
    }
    coord_round_close(j);
  } else if (j->n_joiners < j->spec->min_ranks) {
    j->last_call_at = 0;
  } else if (!j->last_call_at) {
    j->last_call_at = coord_now(j->c) + j->spec->last_call_ms;
  }
}

/* A shrink in place's round full at its target before it knows every member
 * it removes (a rank that stopped at the kept ranks' vote before its
 * SIGTERM, then rejoined): closing now could seat a rank whose pod is
 * being deleted and leave out one the Job keeps (a surplus rank exits 0,
 * its index completed for good). It closes once the last removed member
 * says so (terminating, or a Leave with the checkpoint step), or at the
 * round's last call. */
static bool shrink_unsure(const struct job *j) {
  uint32_t cap = coord_job_cap(j);
  return j->shrink_from > cap && j->n_removed < j->shrink_from - cap;
}

/* Sort key: previous rank for members of the previous generation, then
 * arrival order for newcomers. */
struct ranked {
  uint64_t key;
  struct coord_wait *w;
};

static int by_key(const void *a, const void *b) {
  uint64_t x = ((const struct ranked *)a)->key, y = ((const struct ranked *)b)->key;
  return x < y ? -1 : x > y;
}

static struct ranked *order_joiners(struct job *j) {
  struct ranked *r = coord_xcalloc(j->n_joiners, sizeof(*r));
  size_t i = 0;
  for (struct list *l = j->joiners.next; l != &j->joiners; l = l->next, i++) {
    struct coord_wait *w = container_of(l, struct coord_wait, link);
    struct hnode *p = coord_tab_get(&j->prev, w->u.join.member_id);
    r[i].w = w;
    r[i].key = p ? container_of(p, struct member, hn)->rank : (1ull << 32) + w->u.join.arrival;
  }
  qsort(r, j->n_joiners, sizeof(*r), by_key);
  return r;
}

static void seat(struct job *j, struct coord_wait *w, uint32_t rank, int64_t deadline) {
  struct member *m = coord_member_new(w->u.join.member_id, w->u.join.address, w->u.join.host);
  m->job = j;
  m->rank = rank;
  m->deadline = deadline;
  coord_tab_put(&j->members, &m->hn, m->id);
  list_push(&j->leases, &m->lease);
  j->by_rank[rank] = m;
  coord_store_member(j, m);
}

static void answer_joins(struct job *j, struct ranked *r, uint32_t k) {
  Stoker__V1__CheckpointRef ck = STOKER__V1__CHECKPOINT_REF__INIT;
  ck.step = j->ckpt_step;
  ck.uri = j->ckpt_uri;
  ck.committed_at_ms = j->ckpt_at_ms;
  ck.generation = j->ckpt_gen;
  Stoker__V1__JoinResponse resp = STOKER__V1__JOIN_RESPONSE__INIT;
  resp.generation = j->generation;
  resp.world_size = k;
  resp.heartbeat_interval_ms = j->spec->heartbeat_interval_ms;
  resp.heartbeat_timeout_ms = (uint32_t)coord_job_lease_ms(j);
  resp.latest_checkpoint = &ck;
  for (uint32_t i = 0; i < k; i++) {
    resp.rank = i;
    coord_answer(r[i].w, &resp.base);
  }
}

void coord_surplus_clear(struct job *j) {
  for (uint32_t i = 0; i < j->n_surplus; i++) free(j->surplus[i]);
  free(j->surplus);
  j->surplus = NULL;
  j->n_surplus = 0;
}

bool coord_surplus_has(const struct job *j, const char *id) {
  if (coord_tab_get(&j->members, id)) return false;
  for (uint32_t i = 0; i < j->n_surplus; i++)
    if (!strcmp(j->surplus[i], id)) return true;
  return false;
}

/* After seating k of cap: previous members without a seat are surplus
 * when the round closed full at an operator's target (a scale-down);
 * otherwise they are merely late, and their Join will open the next round
 * (or, at max_ranks, wait as a spare as before). */
static void note_surplus(struct job *j, uint32_t k, uint32_t cap) {
  coord_surplus_clear(j);
  if (k < cap || !j->target) return;
  j->surplus = coord_xcalloc(j->prev.n ? j->prev.n : 1, sizeof(char *));
  size_t pos;
  for (struct hnode *n = coord_tab_first(&j->prev, &pos); n; n = coord_tab_next(&j->prev, n, &pos))
    if (!coord_tab_get(&j->members, n->key)) j->surplus[j->n_surplus++] = coord_xstrdup(n->key);
}

bool coord_shrink_removes(const struct job *j, const char *id) {
  for (uint32_t i = 0; i < j->n_removed; i++)
    if (!strcmp(j->removed[i], id)) return true;
  return false;
}

bool coord_shrink_remove(struct job *j, const char *id) {
  if (coord_shrink_removes(j, id)) return true;
  uint32_t target = coord_job_cap(j);
  if (!j->shrink_from || j->shrink_from <= target || j->n_removed >= j->shrink_from - target)
    return false;
  if (!coord_tab_get(&j->members, id) && !coord_tab_get(&j->prev, id)) return false;
  j->removed = coord_xrealloc(j->removed, (j->n_removed + 1) * sizeof(char *));
  j->removed[j->n_removed++] = coord_xstrdup(id);
  char why[300];
  snprintf(why, sizeof(why), "shrinking in place: member %s is removed (%u of %u)", id,
           j->n_removed, j->shrink_from - target);
  coord_job_touch(j, why);
  coord_round_check(j); /* A round full at the target may wait for this (shrink_unsure). */
  return true;
}

void coord_shrink_clear(struct job *j) {
  for (uint32_t i = 0; i < j->n_removed; i++) free(j->removed[i]);
  free(j->removed);
  j->removed = NULL;
  j->n_removed = 0;
  j->shrink_from = 0;
}

/* Surplus members still parked in the round learn it at once. */
static void refuse_surplus(struct job *j, struct ranked *r, uint32_t from, uint32_t n) {
  for (uint32_t i = from; i < n; i++)
    if (coord_surplus_has(j, r[i].w->u.join.member_id))
      coord_fail(r[i].w, STK_ESTATE, "job %s was scaled to %u ranks: member %s is not needed",
                 j->name, coord_job_cap(j), r[i].w->u.join.member_id);
}

void coord_round_close(struct job *j) {
  uint32_t cap = coord_job_cap(j);
  uint32_t n = j->n_joiners, k = n < cap ? n : cap;
  struct ranked *r = order_joiners(j);
  free(j->by_rank);
  j->by_rank = coord_xcalloc(k ? k : 1, sizeof(*j->by_rank));
  int64_t deadline = coord_now(j->c) + coord_job_lease_ms(j);
  for (uint32_t i = 0; i < k; i++) seat(j, r[i].w, i, deadline);
  if (j->shrink_from)       /* Its removed members' pods are gone: a Join by one of */
    coord_surplus_clear(j); /* their names later is a new pod (a spare). */
  else
    note_surplus(j, k, cap);
  clear_prev(j);
  j->world = k;
  j->n_members = k;
  j->c->stats.members += k;
  j->state = S(RUNNING);
  j->last_call_at = 0;
  coord_job_touch(j, "round closed");
  coord_event(j, STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_ROUND_CLOSED, NULL, 0,
              "generation %llu: %u ranks", (unsigned long long)j->generation, k);
  resized_maybe(j);
  coord_shrink_clear(j);
  resumed_maybe(j);
  answer_joins(j, r, k);
  j->leases_dseq = j->c->change_seq; /* The answers' seq: leases start once it is durable. */
  refuse_surplus(j, r, k, n);
  free(r);
}

/* A world unlike the last round's: SHRUNK or GROWN, at the checkpoint step
 * the new generation restores. */
static void resized_maybe(struct job *j) {
  uint32_t was = j->last_world;
  j->last_world = j->world;
  if (!was || was == j->world) return;
  bool grown = j->world > was;
  coord_event(j,
              grown ? STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_GROWN
                    : STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_SHRUNK,
              NULL, j->ckpt_step, "%s from %u to %u rank%s at step %lld%s",
              grown ? "grown" : "shrunk", was, j->world, j->world == 1 ? "" : "s",
              (long long)j->ckpt_step, j->shrink_from && !grown ? " (in place)" : "");
}

/* A preempted job trains again: RESUMED at the step its members restore. */
static void resumed_maybe(struct job *j) {
  j->awaited_step = 0;
  if (!j->preempted) return;
  coord_event(j, STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_RESUMED, NULL, j->ckpt_step,
              "resumed after preemption (%s) at step %lld", j->preempted, (long long)j->ckpt_step);
  free(j->preempted);
  j->preempted = NULL;
}

void coord_readmit_maybe(struct job *j) {
  if (j->state != S(PAUSED) || !j->preempted) return;
  j->state = S(WAITING);
  j->await_deadline = coord_now(j->c) + coord_job_ckpt_wait_ms(j);
  coord_job_touch(j, "preempted job: ranks are back, resuming");
}

static int join_check(struct coord_wait *w, const Stoker__V1__JoinRequest *req) {
  if (!coord_valid_member_id(req->member_id)) {
    coord_fail(w, STK_EINVAL, "member_id must match [A-Za-z0-9._:@-]{1,128}");
    return -1;
  }
  if (strlen(req->address) > 256 || strlen(req->host) > 256) {
    coord_fail(w, STK_EINVAL, "address and host are at most 256 bytes");
    return -1;
  }
  if (!utf8_valid_str(req->address) || !utf8_valid_str(req->host)) {
    coord_fail(w, STK_EINVAL, "%s not valid UTF-8",
               utf8_valid_str(req->address) ? "host" : "address");
    return -1;
  }
  return 0;
}

/* A parked Join's unpark and dispose (see struct coord_wait). */
static void unpark_join(struct coord_wait *w) {
  coord_tab_del(&w->job->joiners_by_id, &w->hn);
  w->job->n_joiners--;
}

static void dispose_join(struct coord_wait *w) {
  free(w->u.join.member_id);
  free(w->u.join.address);
  free(w->u.join.host);
}

static void park(struct job *j, struct coord_wait *w, const Stoker__V1__JoinRequest *req) {
  struct hnode *old = coord_tab_get(&j->joiners_by_id, req->member_id);
  if (old)
    coord_fail(container_of(old, struct coord_wait, hn), STK_EABORTED,
               "superseded by a newer join of %s", req->member_id);
  w->job = j;
  w->u.join.member_id = coord_xstrdup(req->member_id);
  w->u.join.address = coord_xstrdup(req->address);
  w->u.join.host = coord_xstrdup(req->host);
  w->unpark = unpark_join;
  w->dispose = dispose_join;
  w->u.join.arrival = ++j->arrivals;
  w->u.join.deadline = coord_now(j->c) + j->spec->join_timeout_ms;
  list_push(&j->joiners, &w->link);
  coord_tab_put(&j->joiners_by_id, &w->hn, w->u.join.member_id);
  j->n_joiners++;
  w->parked = true;
  j->c->stats.parked++;
}

static void grow_for_newcomer(struct job *j);

struct coord_wait *coord_join(struct coord *c, const Stoker__V1__JoinRequest *req,
                              coord_done_fn done, void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_JOIN, done, arg);
  c->stats.joins++;
  struct job *j = coord_job_or_fail(c, req->job, w);
  if (!j || join_check(w, req)) return w;
  if (coord_job_ended(j)) {
    coord_fail(w, STK_ESTATE, "job %s is %s", j->name,
               j->state == S(STOPPED) ? "stopped" : "finished");
    return w;
  }
  if (j->state == S(RUNNING) && j->n_finished) { /* As torch's closed rendezvous. */
    coord_fail(w, STK_ESTATE, "job %s is finishing: %u of its %u members finished", j->name,
               j->n_finished, j->n_members);
    return w;
  }
  if (coord_shrink_removes(j, req->member_id)) {
    coord_fail(w, STK_ESTATE, "job %s is shrinking in place to %u ranks: member %s is removed",
               j->name, coord_job_cap(j), req->member_id);
    return w;
  }
  if (j->state == S(RUNNING) && j->world >= coord_job_cap(j) &&
      coord_surplus_has(j, req->member_id)) {
    coord_fail(w, STK_ESTATE, "job %s was scaled to %u ranks: member %s is not needed", j->name,
               coord_job_cap(j), req->member_id);
    return w;
  }
  coord_readmit_maybe(j);
  park(j, w, req);
  /* Unsynced: this Join's reply waits for the round's synced close, so a
   * rendezvous of N joins is one synced write. */
  coord_event_lazy(j, STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_MEMBER_JOINED, req->member_id, 0,
                   "joined");
  if (j->state == S(RUNNING)) {
    if (coord_tab_get(&j->members, req->member_id))
      coord_round_open(j, "a member rejoined");
    else if (j->spec->submission) /* A spare until the target's ranks are there. */
      coord_scale_grow_maybe(j);
    else if (j->world < coord_job_cap(j) && !j->scale_pending) /* Else: the scale's round. */
      grow_for_newcomer(j);
  } else {
    coord_round_check(j);
  }
  return w;
}

/* A new member of a running job below its cap: the job grows at a step
 * boundary, as for ScaleJob up (coord_scale_arm): the members checkpoint,
 * and the round that seats the newcomer opens on that checkpoint (or at
 * the scale's deadline for members that never checkpoint). A round opened
 * at once restored the last periodic checkpoint: on the real cluster, a
 * job whose round had closed at its last call with 2 of its 4 pods trained
 * its first 15 steps twice when the other two came up. */
static void grow_for_newcomer(struct job *j) {
  coord_scale_arm(j);
  coord_job_touch(j, "a new member joined: growing at a step boundary");
}

/* A submitted job's pods are its queue controller's: ScaleJob down leaves
 * the reshape to it (PreemptJob, then fewer pods: the Job deletes its
 * highest indexes, which need not be the last ranks), and a grow waits for
 * its ranks. Once as many spares wait as the target lacks (the controller
 * grew the Job, their Joins parked), the job scales at a step boundary. */
void coord_scale_grow_maybe(struct job *j) {
  uint32_t cap = coord_job_cap(j);
  if (j->state != S(RUNNING) || j->scale_pending || j->world >= cap) return;
  if (j->world + j->n_joiners >= cap) coord_scale_arm(j);
}

void coord_scale_arm(struct job *j) {
  j->scale_pending = true;
  /* Only a checkpoint past every step a member reported is the resize's:
   * one begun before (an asynchronous periodic save) and reported after
   * holds none of the steps trained since (and the ranks' stop step raises
   * the bound further: coord_stop_floor). */
  int64_t trained = coord_job_members_step(j);
  j->scale_step = trained > j->ckpt_step ? trained : j->ckpt_step;
  j->scale_deadline = coord_now(j->c) + coord_job_ckpt_wait_ms(j);
  coord_members_reset_told(j);
}

void coord_members_reset_told(struct job *j) {
  for (uint32_t r = 0; r < j->world; r++)
    if (j->by_rank[r] && !j->by_rank[r]->finished) /* (one that finished never beats) */
      j->by_rank[r]->told_ckpt = j->by_rank[r]->told_stop = false;
}
