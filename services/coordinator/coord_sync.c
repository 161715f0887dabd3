/*
 * coord_sync: synchronisation within a generation. Barriers are memory
 * only: a group per name collects one parked call per member and answers
 * all of them once world_size members arrived. The KV store is persisted
 * (k/<job>/<gen>/<key>) and scoped to the generation; KvGet with wait parks
 * on the key's entry until a KvSet wakes it. When the generation ends,
 * every parked call answers STK_EABORTED.
 */
#include "coord_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stk_error.h"

#define S(x) STOKER__V1__JOB_STATE__JOB_STATE_##x

void coord_barrier_free(struct job *j, struct barrier *b) {
  coord_tab_del(&j->barriers, &b->hn);
  coord_tab_free(&b->arrived);
  free(b->name);
  free(b);
}

static void free_kv_entry(struct job *j, struct kv_entry *e) {
  coord_tab_del(&j->kv, &e->hn);
  free(e->key);
  free(e->value);
  free(e);
}

void coord_sync_end_generation(struct job *j, int err, const char *msg) {
  size_t pos;
  struct hnode *n = coord_tab_first(&j->barriers, &pos);
  while (n) {
    struct hnode *next = coord_tab_next(&j->barriers, n, &pos);
    struct barrier *b = container_of(n, struct barrier, hn);
    for (uint32_t k = b->n; k > 0; k--) /* The last answer frees b. */
      coord_fail(container_of(b->waits.next, struct coord_wait, link), err, "%s", msg);
    n = next;
  }
  n = coord_tab_first(&j->kv, &pos);
  while (n) {
    struct hnode *next = coord_tab_next(&j->kv, n, &pos);
    struct kv_entry *e = container_of(n, struct kv_entry, hn);
    while (!list_empty(&e->waiters))
      coord_fail(container_of(e->waiters.next, struct coord_wait, link), err, "%s", msg);
    free_kv_entry(j, e);
    n = next;
  }
}

/* The job for a generation-scoped call, or NULL after failing w. */
static struct job *current(struct coord *c, struct coord_wait *w, const char *job, uint64_t gen) {
  struct job *j = coord_job_or_fail(c, job, w);
  if (!j) return NULL;
  if (j->state == S(STOPPED)) {
    coord_fail(w, STK_ESTATE, "job %s is stopped", j->name);
    return NULL;
  }
  if (gen != j->generation) {
    coord_fail(w, STK_ESTALE, "generation %llu is not the current %llu", (unsigned long long)gen,
               (unsigned long long)j->generation);
    return NULL;
  }
  return j;
}

static struct barrier *barrier_get(struct job *j, const char *name) {
  struct hnode *n = coord_tab_get(&j->barriers, name);
  if (n) return container_of(n, struct barrier, hn);
  struct barrier *b = coord_xcalloc(1, sizeof(*b));
  b->name = coord_xstrdup(name);
  coord_tab_init(&b->arrived);
  list_init(&b->waits);
  coord_tab_put(&j->barriers, &b->hn, b->name);
  return b;
}

static void barrier_arrive(struct job *j, struct coord_wait *w, const char *member,
                           const char *name) {
  struct barrier *b = barrier_get(j, name);
  struct hnode *old = coord_tab_get(&b->arrived, member);
  if (old) { /* Cannot free b: this member's new call is about to join. */
    b->n++;
    coord_fail(container_of(old, struct coord_wait, hn), STK_EABORTED,
               "superseded by a newer call");
    b->n--;
  }
  w->job = j;
  w->u.barrier.group = b;
  w->u.barrier.member_id = coord_xstrdup(member);
  list_push(&b->waits, &w->link);
  coord_tab_put(&b->arrived, &w->hn, w->u.barrier.member_id);
  b->n++;
  w->parked = true;
  j->c->stats.parked++;
  if (b->n < j->world) return;
  Stoker__V1__BarrierResponse resp = STOKER__V1__BARRIER_RESPONSE__INIT;
  resp.arrived = b->n;
  for (uint32_t k = b->n; k > 0; k--) /* The last answer frees b. */
    coord_answer(container_of(b->waits.next, struct coord_wait, link), &resp.base);
}

struct coord_wait *coord_barrier(struct coord *c, const Stoker__V1__BarrierRequest *req,
                                 coord_done_fn done, void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_BARRIER, done, arg);
  if (!coord_valid_member_id(req->member_id) || !coord_valid_key(req->name)) {
    coord_fail(w, STK_EINVAL, "bad member_id or barrier name");
    return w;
  }
  struct job *j = current(c, w, req->job, req->generation);
  if (!j) return w;
  if (!coord_tab_get(&j->members, req->member_id) || j->state == S(WAITING)) {
    coord_fail(w, STK_ESTALE, "%s is not a member of generation %llu", req->member_id,
               (unsigned long long)j->generation);
    return w;
  }
  barrier_arrive(j, w, req->member_id, req->name);
  return w;
}

static struct kv_entry *entry_get(struct job *j, const char *key) {
  struct hnode *n = coord_tab_get(&j->kv, key);
  if (n) return container_of(n, struct kv_entry, hn);
  struct kv_entry *e = coord_xcalloc(1, sizeof(*e));
  e->key = coord_xstrdup(key);
  list_init(&e->waiters);
  coord_tab_put(&j->kv, &e->hn, e->key);
  return e;
}

static void answer_value(struct coord_wait *w, const struct kv_entry *e) {
  Stoker__V1__KvGetResponse resp = STOKER__V1__KV_GET_RESPONSE__INIT;
  resp.value.data = e->value;
  resp.value.len = e->len;
  coord_answer(w, &resp.base);
}

void coord_kv_set(struct coord *c, const Stoker__V1__KvSetRequest *req, coord_done_fn done,
                  void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_PLAIN, done, arg);
  if (!coord_valid_key(req->key) || req->value.len > 65536)
    return coord_fail(w, STK_EINVAL, "key must match [A-Za-z0-9._:/-]{1,256}, value <= 64 KiB");
  struct job *j = current(c, w, req->job, req->generation);
  if (!j) return;
  struct kv_entry *e = entry_get(j, req->key);
  free(e->value);
  e->value = coord_xmalloc(req->value.len);
  if (req->value.len) memcpy(e->value, req->value.data, req->value.len);
  e->len = req->value.len;
  e->present = true;
  char key[600];
  size_t kl = coord_key_kv_prefix(key, j->name, j->generation);
  memcpy(key + kl, req->key, strlen(req->key));
  coord_store_put(c, key, kl + strlen(req->key), e->value, e->len);
  while (!list_empty(&e->waiters))
    answer_value(container_of(e->waiters.next, struct coord_wait, link), e);
  Stoker__V1__Empty resp = STOKER__V1__EMPTY__INIT;
  coord_answer(w, &resp.base);
}

struct coord_wait *coord_kv_get(struct coord *c, const Stoker__V1__KvGetRequest *req,
                                coord_done_fn done, void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_KVGET, done, arg);
  if (!coord_valid_key(req->key)) {
    coord_fail(w, STK_EINVAL, "key must match [A-Za-z0-9._:/-]{1,256}");
    return w;
  }
  struct job *j = current(c, w, req->job, req->generation);
  if (!j) return w;
  struct hnode *n = coord_tab_get(&j->kv, req->key);
  struct kv_entry *e = n ? container_of(n, struct kv_entry, hn) : NULL;
  if (e && e->present) {
    answer_value(w, e);
  } else if (!req->wait) {
    coord_fail(w, STK_ENOENT, "no key %s in generation %llu", req->key,
               (unsigned long long)j->generation);
  } else {
    e = entry_get(j, req->key);
    w->job = j;
    w->u.kvget.entry = e;
    list_push(&e->waiters, &w->link);
    w->parked = true;
    c->stats.parked++;
  }
  return w;
}
