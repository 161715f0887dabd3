/*
 * coord_store: the RocksDB layout and group commit.
 *
 *   j/<job>                   -> Stoker__V1__JobRecord
 *   m/<job>/<member_id>       -> Stoker__V1__MemberRecord (current generation)
 *   k/<job>/<gen:u64be>/<key> -> KV value (current generation)
 *   e/<job>/<seq:u64be>       -> Stoker__V1__JobEvent (the last N)
 *
 * Every state change goes into the pending batch and takes the next change
 * seq. While one batch is being written (synced, on the libuv threadpool),
 * later changes collect in the next one, so N concurrent changes cost about
 * two fsyncs. Job records are serialized once per batch (dirty list, which
 * coord_job_touch joins with a reason and update time);
 * heartbeat statistics ride along with the next batch, or are flushed
 * unsynced every stats_flush_ms. Lazy changes (the events of parked Joins,
 * whose replies wait for the round's synced close) are written at once but
 * unsynced, so a rendezvous of N joins is one synced write.
 */
#include "coord_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stk_error.h"

/* Every change takes a seq (answers and events wait until it is written);
 * a lazy one (sync false) does not make the batch synced. */
static void changed(struct coord *c, bool sync) {
  c->change_seq++;
  c->batch_any = true;
  if (sync) c->batch_sync = true;
  coord_kick(c);
}

void coord_store_put(struct coord *c, const void *k, size_t kl, const void *v, size_t vl) {
  kv_batch_put(c->batch, k, kl, v, vl);
  changed(c, true);
}

void coord_store_del(struct coord *c, const void *k, size_t kl) {
  kv_batch_delete(c->batch, k, kl);
  changed(c, true);
}

void coord_store_put_lazy(struct coord *c, const void *k, size_t kl, const void *v, size_t vl) {
  kv_batch_put(c->batch, k, kl, v, vl);
  changed(c, false);
}

void coord_store_del_lazy(struct coord *c, const void *k, size_t kl) {
  kv_batch_delete(c->batch, k, kl);
  changed(c, false);
}

void coord_store_del_prefix(struct coord *c, const char *prefix, size_t len) {
  char end[512];
  memcpy(end, prefix, len);
  end[len - 1]++; /* Prefixes end with '/': the range ends before '0'. */
  kv_batch_delete_range(c->batch, prefix, len, end, len);
  changed(c, true);
}

static void mark_job_dirty(struct job *j) {
  if (!j->dirty) {
    j->dirty = true;
    list_push(&j->c->dirty_jobs, &j->dirty_link);
  }
}

void coord_store_job(struct job *j) {
  mark_job_dirty(j);
  changed(j->c, true);
}

void coord_store_job_lazy(struct job *j) {
  mark_job_dirty(j);
  changed(j->c, false);
}

void coord_job_touch(struct job *j, const char *reason) {
  j->updated_ms = coord_wall_ms();
  if (reason) {
    free(j->reason);
    j->reason = coord_xstrdup(reason);
  }
  coord_store_job(j);
}

size_t coord_key_kv_prefix(char *buf, const char *job, uint64_t gen) {
  size_t n = (size_t)sprintf(buf, "k/%s/", job);
  kv_put_u64be((uint8_t *)buf + n, gen);
  buf[n + 8] = '/';
  return n + 9;
}

static void put_member(struct coord *c, struct job *j, struct member *m, bool lazy) {
  Stoker__V1__Member mm = STOKER__V1__MEMBER__INIT;
  Stoker__V1__MemberRecord rec = STOKER__V1__MEMBER_RECORD__INIT;
  coord_member_fill(m, &mm);
  rec.member = &mm;
  rec.generation = j->generation;
  rec.finished = m->finished;
  size_t vl = stoker__v1__member_record__get_packed_size(&rec);
  uint8_t *v = coord_xmalloc(vl);
  stoker__v1__member_record__pack(&rec, v);
  char key[512];
  int kl = snprintf(key, sizeof(key), "m/%s/%s", j->name, m->id);
  kv_batch_put(c->batch, key, (size_t)kl, v, vl);
  free(v);
  if (lazy)
    c->batch_any = true;
  else
    changed(c, true);
}

void coord_store_member(struct job *j, struct member *m) {
  if (!list_empty(&m->dirty)) list_del(&m->dirty);
  put_member(j->c, j, m, false);
}

/* Stats are memory-first: the member joins the dirty list. */
void coord_store_member_lazy(struct member *m) {
  if (list_empty(&m->dirty)) list_push(&m->job->c->dirty_members, &m->dirty);
}

static void flush_dirty_jobs(struct coord *c) {
  while (!list_empty(&c->dirty_jobs)) {
    struct job *j = container_of(c->dirty_jobs.next, struct job, dirty_link);
    list_del(&j->dirty_link);
    j->dirty = false;
    size_t vl;
    uint8_t *v = coord_job_record_pack(j, &vl);
    char key[80];
    int kl = snprintf(key, sizeof(key), "j/%s", j->name);
    kv_batch_put(c->batch, key, (size_t)kl, v, vl);
    free(v);
  }
}

static void flush_dirty_members(struct coord *c) {
  while (!list_empty(&c->dirty_members)) {
    struct member *m = container_of(c->dirty_members.next, struct member, dirty);
    list_del(&m->dirty);
    put_member(c, m->job, m, true);
  }
  c->next_stats_flush = coord_now(c) + c->opts.stats_flush_ms;
}

static void write_work(uv_work_t *req) {
  struct coord *c = req->data;
  c->write_err = kv_write(c->kv, c->writing, c->writing_sync);
}

static void write_done(uv_work_t *req, int status) {
  struct coord *c = req->data;
  c->inflight = false;
  c->stats.writes++;
  if (c->writing_sync) c->stats.synced_writes++;
  if (status == 0 && c->write_err == 0)
    c->durable_seq = c->writing_seq;
  else
    c->broken = c->write_err ? c->write_err : STK_EIO;
  kv_batch_clear(c->writing);
  coord_kick(c);
}

void coord_store_maybe_commit(struct coord *c) {
  if (c->inflight) return;
  flush_dirty_jobs(c);
  if (c->batch_sync || c->closing || coord_now(c) >= c->next_stats_flush) flush_dirty_members(c);
  if (!c->batch_any) return;
  struct kv_batch *b = c->writing;
  c->writing = c->batch;
  c->batch = b;
  c->writing_seq = c->change_seq;
  c->writing_sync = c->batch_sync || c->closing;
  c->batch_sync = c->batch_any = false;
  c->inflight = true;
  c->work.data = c;
  if (uv_queue_work(c->loop, &c->work, write_work, write_done) != 0) {
    c->inflight = false;
    c->broken = STK_EINTERNAL;
  }
}

bool coord_store_idle(const struct coord *c) {
  return !c->inflight && !c->batch_any && list_empty(&c->dirty_jobs) &&
         list_empty(&c->dirty_members);
}
