/*
 * ckpt_events: the service's loop-side delivery helpers, a leaf that calls
 * no other file of the service: deferred writer events (delivered from a
 * loop callback, never inside the call that caused them), late answers of
 * calls that take a ckpt_done_fn, commit and abort hooks queued by recovery, the wall
 * clock and the test probe.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt_service_int.h"
#include "stk_error.h"

int64_t ckpt__svc_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void ckpt__svc_probe(struct ckpt_service *s, const char *point) {
  if (s->o.probe) s->o.probe(s->o.probe_arg, point);
}

/* ---- Deferred writer events and recovered commit and abort hooks ---- */

void ckpt__svc_post_event(struct ckpt_service *s, struct ckpt_writer *w, enum ckpt_write_event ev,
                          int err, const char *msg) {
  struct wevent *e = calloc(1, sizeof(*e));
  if (!e) return;
  e->w = w;
  e->ev = ev;
  e->err = err;
  e->msg = msg ? strdup(msg) : NULL;
  if (s->events_tail)
    s->events_tail->next = e;
  else
    s->events = e;
  s->events_tail = e;
  uv_async_send(&s->events_async);
}

void ckpt__svc_free_hooks(struct hook_call *h) {
  while (h) {
    struct hook_call *n = h->next;
    free(h->job);
    free(h->uri);
    free(h->attempt);
    free(h->reason);
    free(h);
    h = n;
  }
}

void ckpt__svc_queue_hook(struct ckpt_service *s, const char *job, int64_t step, const char *uri) {
  struct hook_call *h = calloc(1, sizeof(*h));
  if (!h) return;
  h->job = strdup(job);
  h->step = step;
  h->uri = uri ? strdup(uri) : NULL;
  h->next = s->pending_hooks;
  s->pending_hooks = h;
}

void ckpt__svc_queue_abort_hook(struct ckpt_service *s, const char *job, int64_t step,
                                const char *attempt, const char *reason) {
  struct hook_call *h = calloc(1, sizeof(*h));
  if (!h) return;
  h->job = strdup(job);
  h->step = step;
  h->attempt = strdup(attempt);
  h->reason = strdup(reason);
  h->next = s->pending_hooks;
  s->pending_hooks = h;
}

static void fire_hooks(struct ckpt_service *s) {
  struct hook_call *list = s->pending_hooks;
  s->pending_hooks = NULL;
  for (struct hook_call *h = list; h; h = h->next)
    if (h->reason && s->o.abort_hook && h->job && h->attempt)
      s->o.abort_hook(s->o.abort_hook_arg, h->job, h->step, h->attempt, h->reason);
    else if (!h->reason && s->o.commit_hook && h->job && h->uri)
      s->o.commit_hook(s->o.commit_hook_arg, h->job, h->step, h->uri);
  ckpt__svc_free_hooks(list);
}

void ckpt__svc_deliver_events(struct ckpt_service *s) {
  fire_hooks(s);
  while (s->events) {
    struct wevent *e = s->events;
    s->events = e->next;
    if (!s->events) s->events_tail = NULL;
    e->w->on_event(e->w->arg, e->ev, e->err, e->msg ? e->msg : "");
    free(e->msg);
    free(e);
  }
}

void ckpt__svc_drop_events(struct ckpt_service *s) {
  while (s->events) {
    struct wevent *e = s->events;
    s->events = e->next;
    free(e->msg);
    free(e);
  }
  s->events_tail = NULL;
}

/* Drops the events of a writer being closed. */
void ckpt__svc_forget_writer(struct ckpt_service *s, struct ckpt_writer *w) {
  struct wevent **pp = &s->events, *last = NULL;
  while (*pp) {
    struct wevent *e = *pp;
    if (e->w == w) {
      *pp = e->next;
      free(e->msg);
      free(e);
    } else {
      last = e;
      pp = &e->next;
    }
  }
  s->events_tail = last;
}

/* ---- Late answers ---- */

/* Answers a call that takes a ckpt_done_fn from a later loop callback. */
struct late_answer {
  uv_timer_t t;
  struct attempt *a;            /* Answer with its reference instead (err 0). */
  const ProtobufCMessage *resp; /* Or this static reply (err 0). */
  ckpt_done_fn done;
  void *arg;
  int err;
  char msg[256];
};

static void late_closed(uv_handle_t *h) {
  free(h->data);
}

static void late_fire(uv_timer_t *t) {
  struct late_answer *f = t->data;
  if (f->a) {
    Stoker__V1__CheckpointRef ref = STOKER__V1__CHECKPOINT_REF__INIT;
    ref.step = f->a->step;
    ref.uri = f->a->manifest_uri;
    ref.committed_at_ms = f->a->committed_at_ms;
    ref.generation = f->a->generation;
    f->done(f->arg, 0, "", &ref.base);
  } else if (f->resp) {
    f->done(f->arg, 0, "", f->resp);
  } else {
    f->done(f->arg, f->err, f->msg, NULL);
  }
  uv_close((uv_handle_t *)t, late_closed);
}

static void later(struct ckpt_service *s, struct attempt *a, const ProtobufCMessage *resp,
                  ckpt_done_fn done, void *arg, int err, const char *msg) {
  struct late_answer *f = calloc(1, sizeof(*f));
  if (!f) return;
  f->a = a;
  f->resp = resp;
  f->done = done;
  f->arg = arg;
  f->err = err;
  snprintf(f->msg, sizeof(f->msg), "%s", msg && msg[0] ? msg : stk_strerror(err));
  uv_timer_init(s->loop, &f->t);
  f->t.data = f;
  uv_timer_start(&f->t, late_fire, 0, 0);
}

void ckpt__svc_fail_later(struct ckpt_service *s, ckpt_done_fn done, void *arg, int err,
                          const char *msg) {
  later(s, NULL, NULL, done, arg, err, msg);
}

void ckpt__svc_ref_later(struct ckpt_service *s, struct attempt *a, ckpt_done_fn done, void *arg) {
  later(s, a, NULL, done, arg, 0, "");
}

void ckpt__svc_reply_later(struct ckpt_service *s, const ProtobufCMessage *resp, ckpt_done_fn done,
                           void *arg) {
  later(s, NULL, resp, done, arg, 0, "");
}
