/*
 * coord_job: the job and its members as records and messages, under the
 * store and every concern: a job's derived figures (cap, lease), members'
 * allocation, the Job view (Stoker__V1__Job, built on demand from the
 * model and pointing into it, with the first page of its members), pages
 * of members and their tokens (ListMembers), the stored JobRecord (the
 * same view without members, plus pending operator actions) and a
 * member's message. It calls only the base and the completions; a job's
 * create and free are the catalog's (coord_catalog.c).
 */
#include "coord_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "page.h"
#include "stk_error.h"

uint32_t coord_job_cap(const struct job *j) {
  return j->target ? j->target : j->spec->max_ranks;
}

bool coord_job_ended(const struct job *j) {
  return j->state == STOKER__V1__JOB_STATE__JOB_STATE_STOPPED ||
         j->state == STOKER__V1__JOB_STATE__JOB_STATE_FINISHED;
}

int64_t coord_job_lease_ms(const struct job *j) {
  return (int64_t)j->spec->heartbeat_interval_ms * j->spec->heartbeat_misses;
}

int64_t coord_job_ckpt_wait_ms(const struct job *j) {
  return (int64_t)j->c->opts.scale_timeout_beats * j->spec->heartbeat_interval_ms;
}

/* The highest step a member reported: where a notice or a resize found
 * the job. */
int64_t coord_job_members_step(const struct job *j) {
  uint64_t step = 0;
  for (uint32_t r = 0; r < j->world; r++)
    if (j->by_rank[r] && j->by_rank[r]->step > step) step = j->by_rank[r]->step;
  return (int64_t)step;
}

/* A member is one allocation: the record, then its id, address and host
 * (fixed for its life). The message, which heartbeats change, is the shared
 * empty string until a rank sends one. At 100,000 ranks this is about 190
 * bytes a member instead of 300 in five allocations. */
static char no_message[1];

struct member *coord_member_new(const char *id, const char *address, const char *host) {
  size_t li = strlen(id) + 1, la = strlen(address) + 1, lh = strlen(host) + 1;
  struct member *m = coord_xcalloc(1, sizeof(*m) + li + la + lh);
  char *s = (char *)(m + 1);
  m->id = memcpy(s, id, li);
  m->address = memcpy(s + li, address, la);
  m->host = memcpy(s + li + la, host, lh);
  m->message = no_message;
  list_init(&m->lease);
  list_init(&m->dirty);
  return m;
}

void coord_member_set_message(struct member *m, const char *message) {
  if (m->message != no_message) free(m->message);
  m->message = *message ? coord_xstrdup(message) : no_message;
}

void coord_member_free(struct member *m) {
  if (!m) return;
  list_del(&m->lease);
  list_del(&m->dirty);
  if (m->message != no_message) free(m->message);
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
  v->job.target_seq = j->target_seq;
  v->job.latest_checkpoint = &v->ck;
  v->job.created_at_ms = j->created_ms;
  v->job.updated_at_ms = j->updated_ms;
  v->job.last_event_seq = j->last_event_seq;
  v->job.reason = j->reason;
  v->job.queue = j->queue;
  if (!with_members) return;
  v->job.waiting = j->n_joiners;
  struct member_page p;
  coord_member_page(j, 0, 0, &p);
  v->mem = p.mem;
  v->ptrs = p.ptrs;
  v->token = p.token;
  v->job.n_members = p.n;
  v->job.members = v->ptrs;
  if (p.token) v->job.next_members_page_token = p.token;
  uint32_t count = 0;
  for (uint32_t r = 0; r < j->world; r++) count += j->by_rank[r] != NULL;
  v->job.member_count = count;
}

void coord_job_view_free(struct job_view *v) {
  free(v->mem);
  free(v->ptrs);
  free(v->token);
}

/* Bytes a member adds to the message holding it: its tag, its length and
 * itself. */
static size_t member_wire_bytes(const Stoker__V1__Member *m) {
  size_t n = stoker__v1__member__get_packed_size(m), len = 1;
  for (size_t x = n; x >= 0x80; x >>= 7) len++;
  return 1 + len + n;
}

/* A token's key: the generation and world size it belongs to and the last
 * rank given ("m.GEN.WORLD.RANK"), so that a page never continues another
 * generation's list. */
#define MEMBER_KEY_FMT "m.%" PRIu64 ".%" PRIu32 ".%" PRIu32

static char *member_token(const struct job *j, uint32_t last_rank) {
  char key[80], *token = NULL;
  snprintf(key, sizeof(key), MEMBER_KEY_FMT, j->generation, j->world, last_rank);
  if (page_token_encode(key, &token) < 0) abort(); /* Only when out of memory. */
  return token;
}

void coord_member_page(struct job *j, uint32_t from, uint32_t size, struct member_page *ret) {
  uint32_t bound = j->c->opts.members_per_page;
  if (!size || (bound && size > bound)) size = bound;
  size_t room = j->world > from ? j->world - from : 0;
  if (room > j->n_members) room = j->n_members;
  *ret = (struct member_page){.mem = coord_xcalloc(room + 1, sizeof(*ret->mem)),
                              .ptrs = coord_xcalloc(room + 1, sizeof(*ret->ptrs))};
  size_t used = 0;
  uint32_t last = 0;
  for (uint32_t r = from; r < j->world; r++) {
    if (!j->by_rank[r]) continue;
    Stoker__V1__Member m = STOKER__V1__MEMBER__INIT;
    coord_member_fill(j->by_rank[r], &m);
    size_t bytes = member_wire_bytes(&m);
    if (ret->n && ((size && ret->n >= size) || used + bytes > PAGE_MAX_BYTES || ret->n >= room)) {
      ret->token = member_token(j, last);
      return;
    }
    ret->mem[ret->n] = m;
    ret->ptrs[ret->n] = &ret->mem[ret->n];
    ret->n++;
    used += bytes;
    last = r;
  }
}

void coord_member_page_free(struct member_page *p) {
  free(p->mem);
  free(p->ptrs);
  free(p->token);
}

int coord_member_token_decode(const struct job *j, const char *token, uint32_t *ret_from) {
  char *key = NULL;
  int err = page_token_decode(token, &key);
  if (err) return err;
  if (!key) {
    *ret_from = 0;
    return 0;
  }
  uint64_t gen = 0;
  uint32_t world = 0, last = 0;
  int end = 0;
  char again[80];
  bool ok =
      sscanf(key, "m.%" SCNu64 ".%" SCNu32 ".%" SCNu32 "%n", &gen, &world, &last, &end) == 3 &&
      key[end] == '\0';
  if (ok) snprintf(again, sizeof(again), MEMBER_KEY_FMT, gen, world, last);
  ok = ok && strcmp(again, key) == 0 && last < world;
  free(key);
  if (!ok) {
    stk_set_detail("page_token is not a token this service gave");
    return STK_EINVAL;
  }
  if (gen != j->generation || world != j->world) {
    stk_set_detail("page_token lists generation %" PRIu64 " of %" PRIu32
                   " ranks; the job is at generation %" PRIu64 " of %" PRIu32
                   " now: read it again from GetJob",
                   gen, world, j->generation, j->world);
    return STK_EABORTED;
  }
  *ret_from = last + 1;
  return 0;
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
  rec.preempted = j->preempted ? j->preempted : "";
  rec.awaited_step = j->awaited_step;
  rec.last_world = j->last_world;
  rec.shrink_from = j->shrink_from;
  rec.n_removed = j->n_removed;
  rec.removed = j->removed;
  *ret_len = stoker__v1__job_record__get_packed_size(&rec);
  uint8_t *buf = coord_xmalloc(*ret_len);
  stoker__v1__job_record__pack(&rec, buf);
  return buf;
}
