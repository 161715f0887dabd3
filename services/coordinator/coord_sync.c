/*
 * coord_sync: synchronisation within a generation. Barriers are memory
 * only: a group per name collects one parked call per member and answers
 * all of them once world_size members arrived (while the job is finishing
 * or shrinking in place, once every member still seated and not finished
 * arrived). The KV store is persisted (k/<job>/<gen>/<key>) and scoped to
 * the generation; KvGet with wait parks on the key's entry until a KvSet
 * wakes it. When the generation ends,
 * every parked call answers STK_EABORTED.
 */
#include "coord_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stk_error.h"

#define S(x) STOKER__V1__JOB_STATE__JOB_STATE_##x

/* Once the last parked call left it. */
static void barrier_free(struct job *j, struct barrier *b) {
  coord_tab_del(&j->barriers, &b->hn);
  coord_tab_free(&b->arrived);
  free(b->name);
  free(b);
}

/* What an entry costs the budgets (--kv-bytes-per-job, --kv-bytes): its
 * key and value and a fixed share for the record, the hash node and the
 * allocations; nothing while it only parks gets. */
#define KV_ENTRY_OVERHEAD 64
static uint64_t charge(const struct kv_entry *e) {
  return e->present ? strlen(e->key) + e->len + KV_ENTRY_OVERHEAD : 0;
}

static void account(struct job *j, uint64_t before, uint64_t after) {
  j->kv_bytes = j->kv_bytes - before + after;
  j->c->stats.kv_bytes = j->c->stats.kv_bytes - before + after;
}

static void free_kv_entry(struct job *j, struct kv_entry *e) {
  account(j, charge(e), 0);
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
  if (coord_job_ended(j)) {
    coord_fail(w, STK_ESTATE, "job %s is %s", j->name,
               j->state == S(STOPPED) ? "stopped" : "finished");
    return NULL;
  }
  if (gen != j->generation) {
    coord_fail(w, STK_ESTALE, "generation %llu is not the current %llu", (unsigned long long)gen,
               (unsigned long long)j->generation);
    return NULL;
  }
  return j;
}

/* A barrier call's unpark (see struct coord_wait). */
static void unpark_barrier(struct coord_wait *w) {
  struct barrier *b = w->u.barrier.group;
  coord_tab_del(&b->arrived, &w->hn);
  if (--b->n == 0) barrier_free(w->job, b);
}

static void dispose_barrier(struct coord_wait *w) {
  free(w->u.barrier.member_id);
}

/* Every member arrived: world_size of them, or while the job is finishing
 * or shrinking in place every member seated that has not finished (a
 * finished one never comes; one a shrink in place removed and that left
 * holds no seat any more, and its kept peers need not wait for the round). */
static bool barrier_full(const struct job *j, const struct barrier *b) {
  if (b->n >= j->world) return true;
  if ((!j->n_finished && !j->shrink_from) || !b->n) return false;
  for (uint32_t r = 0; r < j->world; r++) {
    const struct member *m = j->by_rank[r];
    if (m && !m->finished && !coord_tab_get(&b->arrived, m->id)) return false;
  }
  return true;
}

static void barrier_release_if_full(struct job *j, struct barrier *b) {
  if (!barrier_full(j, b)) return;
  Stoker__V1__BarrierResponse resp = STOKER__V1__BARRIER_RESPONSE__INIT;
  resp.arrived = b->n;
  for (uint32_t k = b->n; k > 0; k--) /* The last answer frees b. */
    coord_answer(container_of(b->waits.next, struct coord_wait, link), &resp.base);
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
  w->unpark = unpark_barrier;
  w->dispose = dispose_barrier;
  list_push(&b->waits, &w->link);
  coord_tab_put(&b->arrived, &w->hn, w->u.barrier.member_id);
  b->n++;
  w->parked = true;
  j->c->stats.parked++;
  barrier_release_if_full(j, b);
}

void coord_sync_members_gone(struct job *j) {
  size_t pos;
  struct hnode *n = coord_tab_first(&j->barriers, &pos);
  while (n) {
    struct hnode *next = coord_tab_next(&j->barriers, n, &pos);
    barrier_release_if_full(j, container_of(n, struct barrier, hn)); /* May free it. */
    n = next;
  }
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

/* The job of a generation-scoped KV call with a valid key, or NULL after
 * failing w. */
static struct job *kv_job(struct coord *c, struct coord_wait *w, const char *job, uint64_t gen,
                          const char *key) {
  if (!coord_valid_key(key)) {
    coord_fail(w, STK_EINVAL, "key must match [A-Za-z0-9._:/-]{1,256}");
    return NULL;
  }
  return current(c, w, job, gen);
}

static bool value_fits(struct coord_wait *w, size_t len) {
  if (len <= COORD_KV_VALUE_MAX) return true;
  coord_fail(w, STK_EINVAL, "value of %zu bytes: at most %d allowed", len, COORD_KV_VALUE_MAX);
  return false;
}

/* Whether key may hold len bytes within the job's and the service's KV
 * budgets (what it holds now is given back first); fails w if not. */
static bool kv_fits(struct job *j, struct coord_wait *w, const char *key, size_t len) {
  struct hnode *n = coord_tab_get(&j->kv, key);
  uint64_t now = n ? charge(container_of(n, struct kv_entry, hn)) : 0;
  uint64_t want = strlen(key) + len + KV_ENTRY_OVERHEAD;
  const struct coord_opts *o = &j->c->opts;
  if (j->kv_bytes - now + want > o->kv_bytes_per_job) {
    coord_fail(w, STK_EBUSY,
               "job %s: its key-value store would hold %llu bytes, over the %llu one job may "
               "hold (--kv-bytes-per-job); delete keys first",
               j->name, (unsigned long long)(j->kv_bytes - now + want),
               (unsigned long long)o->kv_bytes_per_job);
    return false;
  }
  if (j->c->stats.kv_bytes - now + want > o->kv_bytes) {
    coord_fail(w, STK_EBUSY,
               "the coordinator's key-value stores hold %llu bytes, the most all jobs may hold "
               "(--kv-bytes); delete keys first",
               (unsigned long long)j->c->stats.kv_bytes);
    return false;
  }
  return true;
}

/* Stores len bytes as the key's value (journaled in the next group commit,
 * which every answer after this one waits for) and wakes its parked gets. */
static void kv_store(struct job *j, struct kv_entry *e, const void *data, size_t len) {
  uint64_t before = charge(e);
  free(e->value);
  e->value = coord_xmalloc(len ? len : 1);
  if (len) memcpy(e->value, data, len);
  e->len = len;
  e->present = true;
  account(j, before, charge(e));
  char key[600];
  size_t kl = coord_key_kv_prefix(key, j->name, j->generation);
  memcpy(key + kl, e->key, strlen(e->key));
  coord_store_put(j->c, key, kl + strlen(e->key), e->value, e->len);
  while (!list_empty(&e->waiters))
    answer_value(container_of(e->waiters.next, struct coord_wait, link), e);
}

static struct kv_entry *kv_find(struct job *j, const char *key) {
  struct hnode *n = coord_tab_get(&j->kv, key);
  struct kv_entry *e = n ? container_of(n, struct kv_entry, hn) : NULL;
  return e && e->present ? e : NULL;
}

void coord_kv_set(struct coord *c, const Stoker__V1__KvSetRequest *req, coord_done_fn done,
                  void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_PLAIN, done, arg);
  struct job *j = kv_job(c, w, req->job, req->generation, req->key);
  if (!j || !value_fits(w, req->value.len) || !kv_fits(j, w, req->key, req->value.len)) return;
  kv_store(j, entry_get(j, req->key), req->value.data, req->value.len);
  Stoker__V1__Empty resp = STOKER__V1__EMPTY__INIT;
  coord_answer(w, &resp.base);
}

/* A decimal int64 of exactly len bytes (optional sign), as Store.add writes. */
static bool parse_counter(const uint8_t *v, size_t len, int64_t *ret) {
  char buf[24];
  if (len == 0 || len >= sizeof(buf)) return false;
  memcpy(buf, v, len);
  buf[len] = 0;
  char *end = NULL;
  errno = 0;
  long long x = strtoll(buf, &end, 10);
  if (errno || *end || end == buf || buf[0] == ' ' || buf[0] == '+') return false;
  *ret = x;
  return true;
}

void coord_kv_add(struct coord *c, const Stoker__V1__KvAddRequest *req, coord_done_fn done,
                  void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_PLAIN, done, arg);
  struct job *j = kv_job(c, w, req->job, req->generation, req->key);
  if (!j) return;
  struct kv_entry *e = kv_find(j, req->key);
  int64_t value = 0;
  if (e && !parse_counter(e->value, e->len, &value))
    return coord_fail(w, STK_EINVAL, "key %s holds a value that is not a decimal integer",
                      req->key);
  if (__builtin_add_overflow(value, req->delta, &value))
    return coord_fail(w, STK_ERANGE, "key %s: the sum overflows 64 bits", req->key);
  char text[24];
  int n = snprintf(text, sizeof(text), "%lld", (long long)value);
  if (!kv_fits(j, w, req->key, (size_t)n)) return;
  kv_store(j, e ? e : entry_get(j, req->key), text, (size_t)n);
  Stoker__V1__KvAddResponse resp = STOKER__V1__KV_ADD_RESPONSE__INIT;
  resp.value = value;
  coord_answer(w, &resp.base);
}

void coord_kv_compare_set(struct coord *c, const Stoker__V1__KvCompareSetRequest *req,
                          coord_done_fn done, void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_PLAIN, done, arg);
  struct job *j = kv_job(c, w, req->job, req->generation, req->key);
  if (!j || !value_fits(w, req->desired.len)) return;
  struct kv_entry *e = kv_find(j, req->key);
  Stoker__V1__KvGetResponse resp = STOKER__V1__KV_GET_RESPONSE__INIT;
  if (!e && req->expected.len > 0) { /* Absent, and not expected so: no change. */
    resp.value = req->expected;
    return coord_answer(w, &resp.base);
  }
  bool match = !e || (e->len == req->expected.len &&
                      (e->len == 0 || memcmp(e->value, req->expected.data, e->len) == 0));
  if (match && !kv_fits(j, w, req->key, req->desired.len)) return;
  if (match) {
    e = e ? e : entry_get(j, req->key);
    kv_store(j, e, req->desired.data, req->desired.len);
  }
  resp.value.data = e->value;
  resp.value.len = e->len;
  coord_answer(w, &resp.base);
}

void coord_kv_delete(struct coord *c, const Stoker__V1__KvDeleteRequest *req, coord_done_fn done,
                     void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_PLAIN, done, arg);
  struct job *j = kv_job(c, w, req->job, req->generation, req->key);
  if (!j) return;
  struct kv_entry *e = kv_find(j, req->key);
  Stoker__V1__KvDeleteResponse resp = STOKER__V1__KV_DELETE_RESPONSE__INIT;
  resp.deleted = e != NULL;
  if (e) {
    char key[600];
    size_t kl = coord_key_kv_prefix(key, j->name, j->generation);
    memcpy(key + kl, e->key, strlen(e->key));
    coord_store_del(c, key, kl + strlen(e->key));
    if (list_empty(&e->waiters)) {
      free_kv_entry(j, e);
    } else {
      account(j, charge(e), 0);
      e->present = false; /* Parked gets keep waiting for a new value. */
    }
  }
  coord_answer(w, &resp.base);
}

void coord_kv_count(struct coord *c, const Stoker__V1__KvCountRequest *req, coord_done_fn done,
                    void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_PLAIN, done, arg);
  struct job *j = current(c, w, req->job, req->generation);
  if (!j) return;
  Stoker__V1__KvCountResponse resp = STOKER__V1__KV_COUNT_RESPONSE__INIT;
  size_t pos;
  for (struct hnode *n = coord_tab_first(&j->kv, &pos); n; n = coord_tab_next(&j->kv, n, &pos))
    resp.keys += container_of(n, struct kv_entry, hn)->present;
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

void coord_kv_restore(struct job *j, const char *key, size_t key_len, const uint8_t *value,
                      size_t len) {
  struct kv_entry *e = coord_xcalloc(1, sizeof(*e));
  e->key = coord_xmalloc(key_len + 1);
  memcpy(e->key, key, key_len);
  e->key[key_len] = 0;
  e->value = coord_xmalloc(len ? len : 1);
  if (len) memcpy(e->value, value, len);
  e->len = len;
  e->present = true;
  list_init(&e->waiters);
  coord_tab_put(&j->kv, &e->hn, e->key);
  account(j, 0, charge(e));
}
