/*
 * coord_job: the job object and the tooling calls that create, read, list
 * and delete jobs. A job's view (Stoker__V1__Job) is built on demand from
 * the model; the stored JobRecord is the same view without members.
 */
#include "coord_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stk_error.h"

#define S(x) STOKER__V1__JOB_STATE__JOB_STATE_##x

struct job *coord_job_new(struct coord *c, Stoker__V1__JobSpec *spec) {
  struct job *j = coord_xcalloc(1, sizeof(*j));
  j->c = c;
  j->spec = spec;
  j->name = coord_xstrdup(spec->name);
  j->reason = coord_xstrdup("");
  j->ckpt_uri = coord_xstrdup("");
  j->first_event_seq = 1;
  j->events = coord_xcalloc(c->opts.max_events_per_job, sizeof(*j->events));
  coord_tab_init(&j->members);
  coord_tab_init(&j->prev);
  coord_tab_init(&j->joiners_by_id);
  coord_tab_init(&j->barriers);
  coord_tab_init(&j->kv);
  list_init(&j->leases);
  list_init(&j->joiners);
  list_init(&j->dirty_link);
  coord_tab_put(&c->jobs, &j->hn, j->name);
  return j;
}

static void free_member_tab(struct htab *t) {
  size_t pos;
  struct hnode *n = coord_tab_first(t, &pos);
  while (n) {
    struct hnode *next = coord_tab_next(t, n, &pos);
    coord_member_free(container_of(n, struct member, hn));
    n = next;
  }
  coord_tab_free(t);
}

void coord_job_free(struct job *j) {
  if (!j) return;
  coord_fail_parked(j, true, STK_ENOENT, "job deleted");
  free_member_tab(&j->members);
  free_member_tab(&j->prev);
  coord_tab_free(&j->joiners_by_id);
  coord_tab_free(&j->barriers);
  coord_tab_free(&j->kv);
  coord_events_free(j);
  coord_surplus_clear(j);
  list_del(&j->dirty_link);
  protobuf_c_message_free_unpacked(&j->spec->base, NULL);
  free(j->by_rank);
  free(j->name);
  free(j->reason);
  free(j->ckpt_uri);
  free(j);
}

void coord_job_touch(struct job *j, const char *reason) {
  j->updated_ms = coord_wall_ms();
  if (reason) {
    free(j->reason);
    j->reason = coord_xstrdup(reason);
  }
  coord_store_job(j);
}

uint32_t coord_job_cap(const struct job *j) {
  return j->target ? j->target : j->spec->max_ranks;
}

int64_t coord_job_lease_ms(const struct job *j) {
  return (int64_t)j->spec->heartbeat_interval_ms * j->spec->heartbeat_misses;
}

struct member *coord_member_new(const char *id, const char *address, const char *host) {
  struct member *m = coord_xcalloc(1, sizeof(*m));
  m->id = coord_xstrdup(id);
  m->address = coord_xstrdup(address);
  m->host = coord_xstrdup(host);
  m->message = coord_xstrdup("");
  list_init(&m->lease);
  list_init(&m->dirty);
  return m;
}

void coord_member_free(struct member *m) {
  if (!m) return;
  list_del(&m->lease);
  list_del(&m->dirty);
  free(m->id);
  free(m->address);
  free(m->host);
  free(m->message);
  free(m);
}

void coord_member_fill(const struct member *m, Stoker__V1__Member *out) {
  out->member_id = m->id;
  out->rank = m->rank;
  out->address = m->address;
  out->host = m->host;
  out->last_heartbeat_ms = m->last_hb_ms;
  out->step = m->step;
  out->tokens_per_s = m->tps;
  out->loss = m->loss;
  out->health = m->health;
  out->message = m->message;
}

void coord_job_view_init(struct job_view *v, struct job *j, bool with_members) {
  *v = (struct job_view){.job = STOKER__V1__JOB__INIT, .ck = STOKER__V1__CHECKPOINT_REF__INIT};
  v->ck.step = j->ckpt_step;
  v->ck.uri = j->ckpt_uri;
  v->ck.committed_at_ms = j->ckpt_at_ms;
  v->ck.generation = j->ckpt_gen;
  v->job.spec = j->spec;
  v->job.state = j->state;
  v->job.generation = j->generation;
  v->job.world_size = j->world;
  v->job.target_ranks = j->target;
  v->job.latest_checkpoint = &v->ck;
  v->job.created_at_ms = j->created_ms;
  v->job.updated_at_ms = j->updated_ms;
  v->job.last_event_seq = j->last_event_seq;
  v->job.reason = j->reason;
  if (!with_members) return;
  v->job.waiting = j->n_joiners;
  v->mem = coord_xcalloc(j->n_members, sizeof(*v->mem));
  v->ptrs = coord_xcalloc(j->n_members, sizeof(*v->ptrs));
  size_t k = 0;
  for (uint32_t r = 0; r < j->world && k < j->n_members; r++) {
    if (!j->by_rank[r]) continue;
    v->mem[k] = (Stoker__V1__Member)STOKER__V1__MEMBER__INIT;
    coord_member_fill(j->by_rank[r], &v->mem[k]);
    v->ptrs[k] = &v->mem[k];
    k++;
  }
  v->job.n_members = k;
  v->job.members = v->ptrs;
}

void coord_job_view_free(struct job_view *v) {
  free(v->mem);
  free(v->ptrs);
}

void coord_answer_job(struct coord_wait *w, struct job *j) {
  struct job_view v;
  coord_job_view_init(&v, j, true);
  coord_answer(w, &v.job.base);
  coord_job_view_free(&v);
}

uint8_t *coord_job_record_pack(struct job *j, size_t *ret_len) {
  struct job_view v;
  coord_job_view_init(&v, j, false);
  Stoker__V1__JobRecord rec = STOKER__V1__JOB_RECORD__INIT;
  rec.job = &v.job;
  rec.scale_pending = j->scale_pending;
  rec.scale_step = j->scale_step;
  rec.pause_step = j->pause_step;
  rec.pause_force = j->pause_force;
  rec.pause_ckpt_seen = j->pause_ckpt_seen;
  *ret_len = stoker__v1__job_record__get_packed_size(&rec);
  uint8_t *buf = coord_xmalloc(*ret_len);
  stoker__v1__job_record__pack(&rec, buf);
  return buf;
}

static Stoker__V1__JobSpec *spec_copy(const Stoker__V1__JobSpec *in) {
  size_t n = stoker__v1__job_spec__get_packed_size(in);
  uint8_t *buf = coord_xmalloc(n);
  stoker__v1__job_spec__pack(in, buf);
  Stoker__V1__JobSpec *out = stoker__v1__job_spec__unpack(NULL, n, buf);
  free(buf);
  return out;
}

void coord_create_job(struct coord *c, const Stoker__V1__CreateJobRequest *req, coord_done_fn done,
                      void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_PLAIN, done, arg);
  if (c->closing || c->broken) return coord_fail(w, STK_EUNAVAIL, "coordinator unavailable");
  if (!req->spec) return coord_fail(w, STK_EINVAL, "spec missing");
  Stoker__V1__JobSpec *spec = spec_copy(req->spec);
  char msg[160];
  int err = spec ? coord_spec_check(spec, msg, sizeof(msg)) : STK_ENOMEM;
  if (!err && coord_tab_get(&c->jobs, spec->name)) {
    err = STK_EEXIST;
    snprintf(msg, sizeof(msg), "job %s exists", spec->name);
  }
  if (err) {
    if (spec) protobuf_c_message_free_unpacked(&spec->base, NULL);
    return coord_fail(w, err, "%s", msg);
  }
  struct job *j = coord_job_new(c, spec);
  j->state = S(WAITING);
  j->generation = 1;
  j->by_rank = coord_xcalloc(1, sizeof(*j->by_rank));
  j->created_ms = coord_wall_ms();
  coord_job_touch(j, "created");
  coord_event(j, STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_CREATED, NULL, 0, "created");
  coord_answer_job(w, j);
}

void coord_get_job(struct coord *c, const Stoker__V1__GetJobRequest *req, coord_done_fn done,
                   void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_PLAIN, done, arg);
  struct job *j = coord_job_or_fail(c, req->job, w);
  if (j) coord_answer_job(w, j);
}
