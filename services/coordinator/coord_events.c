/*
 * coord_events: each job's event log and its watchers. Events are stored
 * (e/<job>/<seq>) and kept in a per-job ring of the last max_events_per_job
 * packed events, so a watch replays its backlog from memory and then
 * follows live events. A watcher holds no memory of its own: it is a
 * position in the ring. It is ended with STK_EBUSY when it falls more than
 * watch_queue_max events behind, or behind the ring's oldest event. Only
 * durable events are delivered. When a job is deleted, its ring moves to a
 * tomb shared by the job's watchers: each still receives every event it
 * had not, then DELETED, then the end.
 */
#include "coord_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stk_error.h"

static struct event_slot *slot_of(struct job *j, uint64_t seq) {
  return &j->events[seq % j->c->opts.max_events_per_job];
}

static size_t event_key(char *buf, const char *job, uint64_t seq) {
  size_t n = (size_t)sprintf(buf, "e/%s/", job);
  kv_put_u64be((uint8_t *)buf + n, seq);
  return n + 8;
}

typedef void (*store_del_fn)(struct coord *c, const void *k, size_t kl);

/* At open: the deletes of events beyond the ring go with the first write. */
static void del_at_load(struct coord *c, const void *k, size_t kl) {
  kv_batch_delete(c->batch, k, kl);
  c->batch_any = true;
}

/* Drops the oldest event when the ring is full; del removes its record. */
static void evict_for(struct job *j, uint64_t seq, store_del_fn del) {
  if (seq - j->first_event_seq + 1 <= j->c->opts.max_events_per_job) return;
  struct event_slot *s = slot_of(j, j->first_event_seq);
  free(s->buf);
  *s = (struct event_slot){0};
  char key[96];
  size_t kl = event_key(key, j->name, j->first_event_seq);
  del(j->c, key, kl);
  j->first_event_seq++;
}

/* A message cut by vsnprintf ends on a whole UTF-8 character (proto3
 * strings must be valid UTF-8, and Python clients check). */
static void utf8_trim(char *s, size_t cap, int n) {
  if (n < 0 || (size_t)n < cap) return;
  size_t len = cap - 1, i = len;
  while (i > 0 && ((unsigned char)s[i - 1] & 0xc0) == 0x80) i--;
  if (i == 0) return;
  unsigned char lead = (unsigned char)s[i - 1];
  size_t want = lead < 0x80 ? 1 : lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : 2;
  if (i - 1 + want > len) s[i - 1] = 0;
}

static void add_event(struct job *j, bool lazy, Stoker__V1__JobEventType type,
                      const char *member_id, uint32_t world, int64_t step, const char *fmt,
                      va_list ap) {
  char msg[1280]; /* Holds a 1024-byte URI or health message with its prefix. */
  utf8_trim(msg, sizeof(msg), vsnprintf(msg, sizeof(msg), fmt, ap));
  Stoker__V1__JobEvent ev = STOKER__V1__JOB_EVENT__INIT;
  ev.seq = ++j->last_event_seq;
  ev.time_ms = coord_wall_ms();
  ev.job = j->name;
  ev.type = type;
  ev.generation = j->generation;
  ev.member_id = (char *)(member_id ? member_id : "");
  ev.world_size = world;
  ev.step = step;
  ev.message = msg;
  size_t len = stoker__v1__job_event__get_packed_size(&ev);
  uint8_t *buf = coord_xmalloc(len);
  stoker__v1__job_event__pack(&ev, buf);
  char key[96];
  size_t kl = event_key(key, j->name, ev.seq);
  if (lazy)
    coord_store_put_lazy(j->c, key, kl, buf, len);
  else
    coord_store_put(j->c, key, kl, buf, len);
  evict_for(j, ev.seq, lazy ? coord_store_del_lazy : coord_store_del);
  *slot_of(j, ev.seq) = (struct event_slot){.buf = buf, .len = len, .dseq = j->c->change_seq};
  j->c->stats.events++;
  if ((unsigned)type < COORD_EVENT_TYPES) j->c->stats.events_by_type[type]++;
  j->updated_ms = ev.time_ms;
  if (lazy)
    coord_store_job_lazy(j);
  else
    coord_store_job(j);
}

void coord_event(struct job *j, Stoker__V1__JobEventType type, const char *member_id, int64_t step,
                 const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  add_event(j, false, type, member_id, j->world, step, fmt, ap);
  va_end(ap);
}

void coord_event_lazy(struct job *j, Stoker__V1__JobEventType type, const char *member_id,
                      int64_t step, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  add_event(j, true, type, member_id, j->world, step, fmt, ap);
  va_end(ap);
}

void coord_event_sized(struct job *j, Stoker__V1__JobEventType type, uint32_t world, int64_t step,
                       const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  add_event(j, false, type, NULL, world, step, fmt, ap);
  va_end(ap);
}

void coord_event_restore(struct job *j, uint64_t seq, const uint8_t *buf, size_t len) {
  if (seq < j->first_event_seq) j->first_event_seq = seq;
  if (seq > j->last_event_seq) j->last_event_seq = seq;
  evict_for(j, seq, del_at_load);
  struct event_slot *s = slot_of(j, seq);
  free(s->buf);
  s->buf = coord_xmalloc(len);
  memcpy(s->buf, buf, len);
  s->len = len;
  s->dseq = 0;
}

void coord_events_free(struct job *j) {
  if (!j->events) return;
  for (uint32_t i = 0; i < j->c->opts.max_events_per_job; i++) free(j->events[i].buf);
  free(j->events);
  j->events = NULL;
}

static void tomb_unref(struct coord *c, struct event_tomb *t);

/* A watch's dispose (see struct coord_wait): its share of a tomb. */
static void dispose_watch(struct coord_wait *w) {
  tomb_unref(w->c, w->u.watch.tomb);
}

struct coord_wait *coord_watch_job(struct coord *c, const Stoker__V1__WatchJobRequest *req,
                                   coord_event_fn on_event, coord_done_fn done, void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_WATCH, done, arg);
  struct job *j = coord_job_or_fail(c, req->job, w);
  if (!j) return w;
  w->job = j;
  w->dispose = dispose_watch;
  w->u.watch.on_event = on_event;
  w->u.watch.next_seq = req->after_seq + 1;
  if (w->u.watch.next_seq < j->first_event_seq) w->u.watch.next_seq = j->first_event_seq;
  w->u.watch.ready = true;
  list_push(&c->watchers, &w->link);
  c->stats.watchers++;
  coord_kick(c);
  return w;
}

void coord_watch_resume(struct coord *c, struct coord_wait *w) {
  w->u.watch.ready = true;
  coord_kick(c);
}

void coord_watch_end(struct coord_wait *w, int err, const char *msg) {
  list_del(&w->link);
  if (w->c->stats.watchers) w->c->stats.watchers--;
  if (err)
    coord_fail(w, err, "%s", msg);
  else
    coord_answer(w, NULL);
}

/* Calls on_event; handles a cancel requested from inside it. */
static void call(struct coord_wait *w, const uint8_t *buf, size_t len) {
  Stoker__V1__JobEvent *ev = stoker__v1__job_event__unpack(NULL, len, buf);
  if (!ev) return;
  w->u.watch.in_cb = true;
  w->u.watch.ready = w->u.watch.on_event(w->arg, ev);
  w->u.watch.in_cb = false;
  stoker__v1__job_event__free_unpacked(ev, NULL);
}

/* The DELETED event, once durable; then the end of the watch. */
static bool pump_final(struct coord_wait *w, struct event_tomb *t) {
  if (w->c->durable_seq < t->final_dseq) return false;
  call(w, t->final, t->final_len);
  if (!w->u.watch.cancel && !w->queued) coord_watch_end(w, 0, "");
  return false;
}

/* One step of delivery; returns false when the watcher must wait. */
static bool pump_one(struct coord_wait *w) {
  struct coord *c = w->c;
  struct event_tomb *t = w->u.watch.tomb;
  struct job *j = w->job;
  struct event_slot *slots = t ? t->slots : j->events;
  uint64_t first = t ? t->first : j->first_event_seq;
  uint64_t last = t ? t->last : j->last_event_seq;
  uint64_t next = w->u.watch.next_seq;
  if (next < first) {
    coord_watch_end(w, STK_EBUSY, "watcher fell behind the event log; resume with after_seq");
    return false;
  }
  if (next > last) {
    if (t) return pump_final(w, t);
    w->u.watch.caught_up = true;
    return false;
  }
  if (!t && w->u.watch.caught_up && last - next + 1 > c->opts.watch_queue_max) {
    coord_watch_end(w, STK_EBUSY, "watcher too slow; resume with after_seq");
    return false;
  }
  struct event_slot *s = &slots[next % c->opts.max_events_per_job];
  if (s->dseq > c->durable_seq) return false;
  if (++w->u.watch.next_seq > last) w->u.watch.caught_up = true;
  if (s->buf) call(w, s->buf, s->len);
  return true;
}

static void pump(struct coord_wait *w) {
  struct job *j = w->job;
  if (j) { /* Overflow is checked even while delivery is held. */
    uint64_t next = w->u.watch.next_seq;
    if (next > j->last_event_seq)
      w->u.watch.caught_up = true;
    else if (w->u.watch.caught_up && j->last_event_seq - next + 1 > w->c->opts.watch_queue_max)
      return coord_watch_end(w, STK_EBUSY, "watcher too slow; resume with after_seq");
  }
  while (w->u.watch.ready && !w->queued) {
    bool more = pump_one(w);
    if (w->u.watch.cancel && !w->queued) {
      w->u.watch.cancel = false;
      coord_cancel(w->c, w);
      return;
    }
    if (!more) return;
  }
}

/* Callbacks may cancel, end or add watchers, delete jobs or close the
 * coordinator: the pass takes watchers one at a time from c->watch_todo,
 * which every such path sees as well as c->watchers. */
void coord_watch_pump_all(struct coord *c) {
  if (list_empty(&c->watchers)) return;
  struct list *todo = &c->watch_todo;
  todo->next = c->watchers.next;
  todo->prev = c->watchers.prev;
  todo->next->prev = todo->prev->next = todo;
  list_init(&c->watchers);
  while (!list_empty(todo)) {
    struct coord_wait *w = container_of(todo->next, struct coord_wait, link);
    list_del(&w->link);
    list_push(&c->watchers, &w->link);
    pump(w);
  }
}

static struct event_tomb *tomb_new(struct job *j) {
  struct event_tomb *t = coord_xcalloc(1, sizeof(*t));
  t->slots = j->events;
  j->events = NULL; /* Now the tomb's. */
  t->first = j->first_event_seq;
  t->last = j->last_event_seq;
  Stoker__V1__JobEvent ev = STOKER__V1__JOB_EVENT__INIT;
  ev.seq = j->last_event_seq + 1;
  ev.time_ms = coord_wall_ms();
  ev.job = j->name;
  ev.type = STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_DELETED;
  ev.generation = j->generation;
  ev.message = "deleted";
  t->final_len = stoker__v1__job_event__get_packed_size(&ev);
  t->final = coord_xmalloc(t->final_len);
  stoker__v1__job_event__pack(&ev, t->final);
  t->final_dseq = j->c->change_seq;
  return t;
}

static void tomb_unref(struct coord *c, struct event_tomb *t) {
  if (!t || --t->refs > 0) return;
  for (uint32_t i = 0; i < c->opts.max_events_per_job; i++) free(t->slots[i].buf);
  free(t->slots);
  free(t->final);
  free(t);
}

/* Call after the job's keys are deleted, before the job is freed. */
void coord_watch_job_deleted(struct job *j) {
  struct coord *c = j->c;
  struct event_tomb *t = NULL;
  struct list *lists[] = {&c->watchers, &c->watch_todo};
  for (size_t i = 0; i < 2; i++) {
    for (struct list *l = lists[i]->next; l != lists[i]; l = l->next) {
      struct coord_wait *w = container_of(l, struct coord_wait, link);
      if (w->job != j) continue;
      if (!t) t = tomb_new(j);
      t->refs++;
      w->u.watch.tomb = t;
      w->job = NULL;
    }
  }
  coord_kick(c);
}
