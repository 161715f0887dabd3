/*
 * coord_load: rebuilding the in-memory model from RocksDB at coord_open.
 * Jobs first (j/), then member records (m/): the current generation's
 * members, or, while a round is open or the job paused, the previous
 * generation's rank order; then KV entries (k/, older generations are
 * deleted) and the event log (e/). Then every job notes the restart: an
 * event, a grace lease for each member (heartbeat timeout plus one
 * interval), fresh deadlines for a pending scale or pause, and WAITING jobs
 * keep an empty open round (parked joins died with the old process; clients
 * retry).
 */
#include "coord_internal.h"

#include <stdlib.h>
#include <string.h>

#include "stk_error.h"

typedef int (*load_fn)(struct coord *c, const char *key, size_t kl, const uint8_t *v, size_t vl);

static int scan(struct coord *c, const char *prefix, load_fn fn) {
  struct kv_iter *it;
  int err = kv_iter_prefix(c->kv, NULL, prefix, strlen(prefix), &it);
  if (err) return err;
  for (; kv_iter_valid(it) && !err; kv_iter_next(it)) {
    size_t kl, vl;
    const char *k = kv_iter_key(it, &kl);
    const uint8_t *v = kv_iter_value(it, &vl);
    err = fn(c, k, kl, v, vl);
  }
  if (!err) err = kv_iter_error(it);
  kv_iter_free(it);
  return err;
}

/* Splits "<p>/<job>/<rest>" : finds the job and the rest. */
static struct job *job_of(struct coord *c, const char *k, size_t kl, const char **rest,
                          size_t *rest_len) {
  const char *s = k + 2, *end = k + kl;
  const char *slash = memchr(s, '/', (size_t)(end - s));
  if (!slash || slash - s > 63) return NULL;
  char name[64];
  memcpy(name, s, (size_t)(slash - s));
  name[slash - s] = 0;
  struct hnode *n = coord_tab_get(&c->jobs, name);
  *rest = slash + 1;
  *rest_len = (size_t)(end - slash - 1);
  return n ? container_of(n, struct job, hn) : NULL;
}

static int load_job(struct coord *c, const char *k, size_t kl, const uint8_t *v, size_t vl) {
  Stoker__V1__JobRecord *rec = stoker__v1__job_record__unpack(NULL, vl, v);
  if (!rec || !rec->job || !rec->job->spec) {
    stoker__v1__job_record__free_unpacked(rec, NULL);
    return STK_ECORRUPT;
  }
  Stoker__V1__Job *jb = rec->job;
  struct job *j = coord_job_new(c, jb->spec);
  jb->spec = NULL; /* Now owned by the job. */
  j->state = jb->state;
  j->generation = jb->generation;
  j->world = jb->world_size;
  j->target = jb->target_ranks;
  j->target_seq = jb->target_seq;
  j->by_rank = coord_xcalloc(j->world, sizeof(*j->by_rank));
  j->created_ms = jb->created_at_ms;
  j->updated_ms = jb->updated_at_ms;
  j->last_event_seq = jb->last_event_seq;
  j->first_event_seq = jb->last_event_seq + 1;
  free(j->reason);
  j->reason = coord_xstrdup(jb->reason);
  j->scale_pending = rec->scale_pending;
  j->scale_step = rec->scale_step;
  j->pause_step = rec->pause_step;
  j->pause_force = rec->pause_force;
  j->pause_ckpt_seen = rec->pause_ckpt_seen;
  free(j->preempted);
  j->preempted = rec->preempted && *rec->preempted ? coord_xstrdup(rec->preempted) : NULL;
  j->awaited_step = rec->awaited_step;
  j->queue = jb->queue; /* Now owned by the job. */
  jb->queue = NULL;
  j->last_world = rec->last_world ? rec->last_world : jb->world_size;
  j->shrink_from = rec->shrink_from;
  j->removed = coord_xcalloc(rec->n_removed, sizeof(char *));
  for (size_t i = 0; i < rec->n_removed; i++)
    j->removed[j->n_removed++] = coord_xstrdup(rec->removed[i]);
  if (jb->latest_checkpoint) {
    j->ckpt_step = jb->latest_checkpoint->step;
    j->ckpt_at_ms = jb->latest_checkpoint->committed_at_ms;
    j->ckpt_gen = jb->latest_checkpoint->generation;
    free(j->ckpt_uri);
    j->ckpt_uri = coord_xstrdup(jb->latest_checkpoint->uri);
  }
  stoker__v1__job_record__free_unpacked(rec, NULL);
  (void)k;
  (void)kl;
  return 0;
}

static struct member *member_of(const Stoker__V1__Member *mm, struct job *j) {
  struct member *m = coord_member_new(mm->member_id, mm->address, mm->host);
  m->job = j;
  m->rank = mm->rank;
  m->last_hb_ms = mm->last_heartbeat_ms;
  m->step = mm->step;
  m->tps = mm->tokens_per_s;
  m->loss = mm->loss;
  m->health = mm->health;
  coord_member_set_message(m, mm->message);
  return m;
}

/* A record is a current member (RUNNING, PAUSING, STOPPED: same
 * generation), the previous order (WAITING, PAUSED), or stale (deleted). */
static bool place_member(struct job *j, const Stoker__V1__MemberRecord *rec) {
  const Stoker__V1__Member *mm = rec->member;
  if (!coord_valid_member_id(mm->member_id)) return false;
  if (j->state == STOKER__V1__JOB_STATE__JOB_STATE_WAITING ||
      j->state == STOKER__V1__JOB_STATE__JOB_STATE_PAUSED) {
    if (coord_tab_get(&j->prev, mm->member_id)) return false;
    struct member *m = member_of(mm, j);
    coord_tab_put(&j->prev, &m->hn, m->id);
    return true;
  }
  if (rec->generation != j->generation || mm->rank >= j->world || j->by_rank[mm->rank] ||
      coord_tab_get(&j->members, mm->member_id))
    return false;
  struct member *m = member_of(mm, j);
  coord_tab_put(&j->members, &m->hn, m->id);
  j->by_rank[m->rank] = m;
  j->n_members++;
  m->finished = rec->finished;
  if (m->finished) j->n_finished++;
  return true;
}

static int load_member(struct coord *c, const char *k, size_t kl, const uint8_t *v, size_t vl) {
  const char *rest;
  size_t rl;
  struct job *j = job_of(c, k, kl, &rest, &rl);
  Stoker__V1__MemberRecord *rec = stoker__v1__member_record__unpack(NULL, vl, v);
  if (!rec || !rec->member) {
    stoker__v1__member_record__free_unpacked(rec, NULL);
    return STK_ECORRUPT;
  }
  if (!j || !place_member(j, rec)) {
    kv_batch_delete(c->batch, k, kl); /* Stale: an ended generation's member. */
    c->batch_any = true;
  }
  stoker__v1__member_record__free_unpacked(rec, NULL);
  (void)rl;
  return 0;
}

static int load_kv(struct coord *c, const char *k, size_t kl, const uint8_t *v, size_t vl) {
  const char *rest;
  size_t rl;
  struct job *j = job_of(c, k, kl, &rest, &rl);
  if (!j || rl < 10 || rest[8] != '/' || kv_get_u64be((const uint8_t *)rest) != j->generation) {
    kv_batch_delete(c->batch, k, kl); /* A stale generation's key. */
    c->batch_any = true;
    return 0;
  }
  coord_kv_restore(j, rest + 9, rl - 9, v, vl);
  return 0;
}

static int load_event(struct coord *c, const char *k, size_t kl, const uint8_t *v, size_t vl) {
  const char *rest;
  size_t rl;
  struct job *j = job_of(c, k, kl, &rest, &rl);
  if (!j || rl != 8) return 0;
  coord_event_restore(j, kv_get_u64be((const uint8_t *)rest), v, vl);
  return 0;
}

/* Grace leases in rank order (none for members that finished), the restart
 * event, and members lost while the coordinator was down are handled by the
 * sweep as usual. */
static void after_load(struct job *j) {
  /* The loop's cached time is from before the store was read: a slow load
   * (a loaded machine) cut the leases and waits armed here short. */
  uv_update_time(j->c->loop);
  int64_t grace = coord_now(j->c) + coord_job_lease_ms(j) + j->spec->heartbeat_interval_ms;
  for (uint32_t r = 0; r < j->world; r++) {
    struct member *m = j->by_rank[r];
    if (!m || m->finished) continue;
    m->deadline = grace;
    list_push(&j->leases, &m->lease);
  }
  j->c->stats.members += j->n_members;
  coord_ops_rearm(j);
  coord_event(j, STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_COORDINATOR_RESTARTED, NULL, 0,
              "coordinator restarted");
  if (j->state == STOKER__V1__JOB_STATE__JOB_STATE_RUNNING && j->n_members < j->world)
    coord_round_open(j, "members missing after restart");
}

int coord_store_load(struct coord *c) {
  int err = scan(c, "j/", load_job);
  if (!err) err = scan(c, "m/", load_member);
  if (!err) err = scan(c, "k/", load_kv);
  if (!err) err = scan(c, "e/", load_event);
  if (err) return err;
  size_t pos;
  for (struct hnode *n = coord_tab_first(&c->jobs, &pos); n; n = coord_tab_next(&c->jobs, n, &pos))
    after_load(container_of(n, struct job, hn));
  return 0;
}
