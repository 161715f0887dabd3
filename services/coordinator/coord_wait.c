/*
 * Completions. Every operation's answer is packed into its struct
 * coord_wait together with the change seq current when it was produced,
 * and queued on c->ready in seq order. The idle pass releases answers whose
 * seq is durable: nothing is acknowledged before the synced write that
 * holds every change it may have observed. Parked operations (join,
 * barrier, KV wait) sit in their job's structures until answered; whoever
 * parks one sets its unpark and dispose callbacks, so this file calls none
 * of the files above it and need not know where a call is parked.
 */
#include "coord_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "stk_error.h"

struct coord_wait *coord_wait_new(struct coord *c, enum wait_kind kind, coord_done_fn done,
                                  void *arg) {
  struct coord_wait *w = coord_xcalloc(1, sizeof(*w));
  list_init(&w->link);
  w->kind = kind;
  w->c = c;
  w->done = done;
  w->arg = arg;
  return w;
}

static void wait_free(struct coord_wait *w) {
  if (!w) return;
  free(w->errmsg);
  free(w->resp);
  if (w->dispose) w->dispose(w);
  free(w);
}

/* Takes w out of the job's structures without answering it. */
static void unpark(struct coord_wait *w) {
  if (!w->parked) return;
  w->parked = false;
  if (w->c->stats.parked) w->c->stats.parked--;
  list_del(&w->link);
  if (w->unpark) w->unpark(w);
}

static void enqueue(struct coord_wait *w) {
  struct coord *c = w->c;
  if (w->parked) unpark(w);
  list_del(&w->link);
  w->seq = c->change_seq;
  w->queued = true;
  list_push(&c->ready, &w->link);
  coord_kick(c);
}

void coord_answer(struct coord_wait *w, const ProtobufCMessage *resp) {
  if (resp) {
    w->desc = resp->descriptor;
    w->resp_len = protobuf_c_message_get_packed_size(resp);
    w->resp = coord_xmalloc(w->resp_len);
    protobuf_c_message_pack(resp, w->resp);
  }
  enqueue(w);
}

void coord_fail(struct coord_wait *w, int err, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  w->err = err;
  free(w->errmsg);
  w->errmsg = coord_xstrdup(msg);
  enqueue(w);
}

/* Calls done with the stored answer, then frees w. */
static void deliver(struct coord_wait *w, int err) {
  if (err) {
    w->done(w->arg, err, w->err == err && w->errmsg ? w->errmsg : stk_strerror(err), NULL);
  } else if (w->err) {
    w->done(w->arg, w->err, w->errmsg, NULL);
  } else if (w->desc) {
    ProtobufCMessage *m = protobuf_c_message_unpack(w->desc, NULL, w->resp_len, w->resp);
    if (m)
      w->done(w->arg, 0, NULL, m);
    else
      w->done(w->arg, STK_EINTERNAL, "answer lost", NULL);
    protobuf_c_message_free_unpacked(m, NULL);
  } else {
    w->done(w->arg, 0, NULL, NULL);
  }
  wait_free(w);
}

void coord_release(struct coord *c) {
  while (!list_empty(&c->ready)) {
    struct coord_wait *w = container_of(c->ready.next, struct coord_wait, link);
    int err = 0;
    if (w->seq > c->durable_seq) {
      if (!c->broken) break;
      err = STK_EIO;
    }
    list_del(&w->link);
    w->queued = false;
    deliver(w, err);
  }
}

void coord_cancel(struct coord *c, struct coord_wait *w) {
  if (!w) return;
  if (w->kind == WAIT_WATCH && w->u.watch.in_cb) {
    w->u.watch.cancel = true; /* Finished by the pump after on_event returns. */
    return;
  }
  if (w->kind == WAIT_WATCH && !w->queued && c->stats.watchers) c->stats.watchers--;
  if (w->parked) unpark(w);
  list_del(&w->link);
  w->queued = false;
  w->err = STK_ECANCELED;
  free(w->errmsg);
  w->errmsg = coord_xstrdup("cancelled");
  deliver(w, 0);
}

struct job *coord_job_or_fail(struct coord *c, const char *name, struct coord_wait *w) {
  if (c->closing || c->broken) {
    coord_fail(w, STK_EUNAVAIL, "coordinator %s", c->closing ? "closing" : "store failed");
    return NULL;
  }
  if (!coord_valid_job_name(name)) {
    coord_fail(w, STK_EINVAL, "bad job name");
    return NULL;
  }
  struct hnode *n = coord_tab_get(&c->jobs, name);
  if (!n) {
    coord_fail(w, STK_ENOENT, "no job %s", name);
    return NULL;
  }
  return container_of(n, struct job, hn);
}
