/*
 * The save machine: one rank's shard of one attempt sent through its Write
 * stream (ckpt_write.c), as a state machine advanced one step at a time.
 * There is one machine and every way to save runs it:
 *
 *   - stk_ckpt_save steps it to its end on the caller's thread (the
 *     blocking shell, as curl_easy_perform drives its own handle);
 *   - stk_ckpt_save_async and background staging (ckpt_stage.c) hand it to
 *     the client's engine (client_engine.c), whose one thread steps every
 *     save in flight of the client in turn. The client owns them: freeing
 *     it cancels those not done (the stream's call is cancelled, a write or
 *     the wait for the reply returns) and finishes them, so no save outlives
 *     its client and none touches it once freed.
 *
 *   OPEN --> TENSOR (once per piece of each tensor, then once more)
 *        --> FINISH ("last") --> CLOSE (half-close) --> REPLY --> DONE
 *
 * A step never waits on the network: TENSOR, FINISH and CLOSE go on only
 * when the stream took the message before (gRPC flow control), REPLY once
 * the reply is in; otherwise the step answers WAIT and the stream's next
 * move (a callback on the rpc client's thread) wakes the job on the engine,
 * or the blocking caller. A piece is one message (gRPC) or one copy into a
 * shared-memory segment. The first TENSOR step also waits (WAIT, woken
 * the same way) for GetStagingInfo's answer, which decides the path, and
 * a completed segment's chunk messages go one a step (in TENSOR when the
 * segment filled, in FINISH for the last one), each once the stream took
 * the one before. Any step that fails, or finds the save cancelled,
 * goes to DONE with the error. The caller's buffers are released (the
 * hook) on leaving TENSOR for FINISH, or when the save fails before. The
 * tensor array, names, shapes and boxes are copied at new, so a caller's
 * metadata may go at once.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"
#include "client_internal.h"

enum save_state {
  SAVE_OPEN,   /* Next: open the rank's Write stream. */
  SAVE_TENSOR, /* Next: a piece of tensor `next` (its hook first); at n: release. */
  SAVE_FINISH, /* Every byte sent: next "last". */
  SAVE_CLOSE,  /* Next: the half-close, once "last" was taken. */
  SAVE_REPLY,  /* Waiting for the service's reply (the shard staged). */
  SAVE_DONE,   /* err, err_code, msg and bytes hold the outcome. */
};

struct ckpt_save {
  struct client_job job; /* For the client's engine. */
  struct stk_client *c;
  char attempt[STK_CKPT_ATTEMPT_MAX];
  uint32_t rank;
  struct stk_ckpt_tensor *tensors;
  size_t n;
  uint64_t *dims; /* Every tensor's global shape, offsets and sizes. */
  char *names;    /* Every tensor's name, NUL-terminated, one after another. */
  struct ckpt_save_hooks h;
  enum save_state state;
  size_t next;         /* The tensor being sent. */
  struct ckpt_put put; /* Its pieces; put.done (or not started): the next tensor. */
  bool put_started;
  bool released;  /* The released hook ran. */
  bool on_engine; /* Submitted: stream moves wake the job, else the caller. */
  pthread_mutex_t mu;
  pthread_cond_t cv;         /* The caller's wait (ckpt_save_run). */
  bool moved;                /* Under mu: the stream moved since the caller looked. */
  bool cancelled;            /* Under mu. */
  struct stk_ckpt_writer *w; /* Set and cleared under mu (the stepping thread reads it). */
  int err;
  int err_code;  /* gRPC code of the error (the step's last error). */
  char msg[512]; /* Its message. */
  uint64_t bytes;
};

static enum client_step job_step(struct client_job *j);
static void job_cancel(struct client_job *j);
static void job_done(struct client_job *j);
static const struct client_job_ops save_ops = {job_step, job_cancel, job_done};
static int copy_tensors(struct ckpt_save *s, const struct stk_ckpt_tensor *ts, size_t n);
static enum client_step step(struct ckpt_save *s);
static enum client_step send_held(struct ckpt_save *s);

int ckpt_save_new(struct stk_client *c, const char *attempt, uint32_t rank,
                  const struct stk_ckpt_tensor *tensors, size_t n_tensors,
                  const struct ckpt_save_hooks *h, struct ckpt_save **ret_save) {
  if (!c || !attempt || strlen(attempt) >= STK_CKPT_ATTEMPT_MAX || (n_tensors > 0 && !tensors))
    return client_fail(STK_EINVAL, "save");
  struct ckpt_save *s = calloc(1, sizeof(*s));
  if (!s) return client_fail(STK_ENOMEM, "save");
  s->job.ops = &save_ops;
  s->c = c, s->rank = rank;
  snprintf(s->attempt, sizeof(s->attempt), "%s", attempt);
  if (h) s->h = *h;
  pthread_mutex_init(&s->mu, NULL);
  client_cond_init(&s->cv);
  int err = copy_tensors(s, tensors, n_tensors);
  if (err) {
    ckpt_save_free(s);
    return client_fail(err, err == STK_EINVAL ? "save: bad tensor" : "save");
  }
  *ret_save = s;
  return 0;
}

/* The blocking shell: steps on this thread; a WAIT step sleeps until the
 * stream moves. */
void ckpt_save_run(struct ckpt_save *s) {
  for (enum client_step st; (st = step(s)) != CLIENT_STEP_DONE;) {
    if (st != CLIENT_STEP_WAIT) continue;
    pthread_mutex_lock(&s->mu);
    while (!s->moved) pthread_cond_wait(&s->cv, &s->mu);
    s->moved = false;
    pthread_mutex_unlock(&s->mu);
  }
}

int ckpt_save_submit(struct ckpt_save *s) {
  s->on_engine = true;
  int err = client_engine_submit(&s->c->engine, &s->job);
  if (err) s->on_engine = false;
  return err ? client_fail(err, "save: the client is closing") : 0;
}

int ckpt_save_result(const struct ckpt_save *s, uint64_t *ret_bytes) {
  if (s->err) {
    client_set_error(s->err_code, "%s", s->msg);
    return s->err;
  }
  if (ret_bytes) *ret_bytes = s->bytes;
  return 0;
}

void ckpt_save_free(struct ckpt_save *s) {
  if (!s) return;
  ckpt_writer_free(s->w); /* NULL unless never run to its end. */
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  free(s->tensors), free(s->dims), free(s->names), free(s);
}

/* ----------------------------------------------------------- the engine */

static enum client_step job_step(struct client_job *j) {
  return step((struct ckpt_save *)j);
}

/* The call the save waits on is cancelled; the next step ends the save. */
static void job_cancel(struct client_job *j) {
  struct ckpt_save *s = (struct ckpt_save *)j;
  pthread_mutex_lock(&s->mu);
  s->cancelled = true;
  if (s->w) ckpt_writer_cancel(s->w);
  pthread_mutex_unlock(&s->mu);
}

static void job_done(struct client_job *j) {
  struct ckpt_save *s = (struct ckpt_save *)j;
  if (s->h.done) s->h.done(s->h.arg);
}

/* On the rpc client's thread (under the stream's lock): the stream moved. */
static void stream_moved(void *arg) {
  struct ckpt_save *s = arg;
  if (s->on_engine) {
    client_engine_wake(&s->c->engine, &s->job);
    return;
  }
  pthread_mutex_lock(&s->mu);
  s->moved = true;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* ------------------------------------------------------------ the steps */

static void release(struct ckpt_save *s) {
  if (s->released) return;
  s->released = true;
  if (s->h.released) s->h.released(s->h.arg);
}

/* Takes w out of s (under mu, so that a cancel no longer reaches it). */
static struct stk_ckpt_writer *take_writer(struct ckpt_save *s) {
  pthread_mutex_lock(&s->mu);
  struct stk_ckpt_writer *w = s->w;
  s->w = NULL;
  pthread_mutex_unlock(&s->mu);
  return w;
}

/* DONE with err (this thread's last error says why) and the stream, if any,
 * ended: with "last" when the service ended the call (its status is the
 * reason), else abandoned. */
static enum client_step finish(struct ckpt_save *s, int err, uint64_t bytes) {
  release(s);
  pthread_mutex_lock(&s->mu);
  bool cancelled = s->cancelled;
  pthread_mutex_unlock(&s->mu);
  struct stk_ckpt_writer *w = s->w;
  if (w && err && ckpt_writer_failed(w) && !cancelled)
    err = ckpt_writer_end(w, true, false, NULL, NULL);
  else if (w)
    ckpt_writer_end(w, false, false, NULL, NULL);
  ckpt_writer_free(take_writer(s));
  pthread_mutex_lock(&s->mu);
  cancelled = s->cancelled; /* Also a cancel that came while it ended. */
  pthread_mutex_unlock(&s->mu);
  if (err && cancelled) {
    err = STK_ECANCELED;
    client_set_error(stk_error_to_grpc(err), "save cancelled: its client was freed");
  }
  s->err = err, s->bytes = bytes;
  if (err) snprintf(s->msg, sizeof(s->msg), "%s", stk_client_last_error(&s->err_code));
  s->state = SAVE_DONE;
  return CLIENT_STEP_DONE;
}

static enum client_step step_open(struct ckpt_save *s) {
  struct stk_ckpt_writer *w = NULL;
  int err = stk_ckpt_writer_open(s->c, s->attempt, s->rank, 0, &w);
  if (err) return finish(s, err, 0);
  ckpt_writer_set_notify(w, stream_moved, s);
  pthread_mutex_lock(&s->mu);
  s->w = w;
  if (s->cancelled) ckpt_writer_cancel(w); /* Cancelled while it opened. */
  pthread_mutex_unlock(&s->mu);
  s->state = SAVE_TENSOR;
  return CLIENT_STEP_MORE;
}

/* One piece of the current tensor, once the stream can take it (a held
 * segment message first; the path decided first). */
static enum client_step step_tensor(struct ckpt_save *s) {
  if (!ckpt_writer_ready(s->w)) return CLIENT_STEP_WAIT;
  if (ckpt_writer_holds(s->w)) return send_held(s);
  int path = s->n ? ckpt_writer_decide(s->w) : 0; /* GetStagingInfo's answer. */
  if (path == CKPT_LATER) return CLIENT_STEP_WAIT;
  if (path) return finish(s, path, 0);
  if (!s->put_started || s->put.done) {
    if (s->put_started) s->next++;
    s->put_started = false;
    if (s->h.before_tensor) s->h.before_tensor(s->h.arg, s->next);
    if (s->next == s->n) { /* Every byte is in a segment or a packed message. */
      release(s);
      s->state = SAVE_FINISH;
      return CLIENT_STEP_MORE;
    }
    const struct stk_ckpt_tensor *t = &s->tensors[s->next];
    int err =
        ckpt_put_start(s->w, &s->put, t->name, t->dtype, t->global_shape, &t->box, t->data, t->len);
    if (err) return finish(s, err == STK_EINVAL ? client_fail(err, "save: bad tensor") : err, 0);
    s->put_started = true;
  }
  int err = ckpt_put_next(s->w, &s->put);
  if (err == CKPT_LATER) return CLIENT_STEP_MORE; /* A full segment's messages go first. */
  if (err && !ckpt_writer_failed(s->w)) /* Our own failure: the server has not failed it. */
    err = client_fail(err, "save");
  return err ? finish(s, err, 0) : CLIENT_STEP_MORE;
}

/* One message of a completed segment (the stream is ready). */
static enum client_step send_held(struct ckpt_save *s) {
  int err = ckpt_writer_send_held(s->w);
  if (err && !ckpt_writer_failed(s->w)) err = client_fail(err, "save");
  return err ? finish(s, err, 0) : CLIENT_STEP_MORE;
}

/* The last segment's messages, one a step, then "last". */
static enum client_step step_finish(struct ckpt_save *s) {
  if (!ckpt_writer_ready(s->w)) return CLIENT_STEP_WAIT;
  int err = ckpt_writer_seal(s->w);
  if (err) return finish(s, client_fail(err, "save: shm segment"), 0);
  if (ckpt_writer_holds(s->w)) return send_held(s);
  err = ckpt_writer_send_last(s->w, false);
  if (err) return finish(s, err, 0);
  s->state = SAVE_CLOSE;
  return CLIENT_STEP_MORE;
}

static enum client_step step_close(struct ckpt_save *s) {
  if (!ckpt_writer_ready(s->w)) return CLIENT_STEP_WAIT;
  ckpt_writer_close_send(s->w);
  s->state = SAVE_REPLY;
  return CLIENT_STEP_MORE;
}

static enum client_step step_reply(struct ckpt_save *s) {
  if (!ckpt_writer_ended(s->w)) return CLIENT_STEP_WAIT;
  uint64_t bytes = 0;
  int err = ckpt_writer_end(s->w, true, false, &bytes, NULL); /* Returns at once. */
  ckpt_writer_free(take_writer(s)); /* Ended: finish must not end it again. */
  return finish(s, err, bytes);
}

/* One step: MORE, WAIT (until the stream moves) or DONE. */
static enum client_step step(struct ckpt_save *s) {
  pthread_mutex_lock(&s->mu);
  bool cancelled = s->cancelled;
  pthread_mutex_unlock(&s->mu);
  if (cancelled && s->state != SAVE_DONE) return finish(s, STK_ECANCELED, 0);
  switch (s->state) {
  case SAVE_OPEN:
    return step_open(s);
  case SAVE_TENSOR:
    return step_tensor(s);
  case SAVE_FINISH:
    return step_finish(s);
  case SAVE_CLOSE:
    return step_close(s);
  case SAVE_REPLY:
    return step_reply(s);
  case SAVE_DONE:
    break;
  }
  return CLIENT_STEP_DONE;
}

/* Copies the tensors' metadata into s (data pointers stay the caller's). */
static int copy_tensors(struct ckpt_save *s, const struct stk_ckpt_tensor *ts, size_t n) {
  size_t ndims = 0, nchars = 0;
  for (size_t i = 0; i < n; i++) {
    if (!ts[i].name || !ts[i].global_shape || ts[i].box.ndim < 1 ||
        ts[i].box.ndim > STK_CKPT_MAX_DIMS || !ts[i].box.offsets || !ts[i].box.sizes)
      return STK_EINVAL;
    ndims += 3 * ts[i].box.ndim;
    nchars += strlen(ts[i].name) + 1;
  }
  s->tensors = calloc(n ? n : 1, sizeof(*ts));
  s->dims = calloc(ndims ? ndims : 1, sizeof(*s->dims));
  s->names = malloc(nchars ? nchars : 1);
  if (!s->tensors || !s->dims || !s->names) return STK_ENOMEM;
  uint64_t *d = s->dims;
  char *p = s->names;
  for (size_t i = 0; i < n; i++) {
    size_t nd = ts[i].box.ndim, len = strlen(ts[i].name) + 1;
    memcpy(d, ts[i].global_shape, nd * sizeof(*d));
    memcpy(d + nd, ts[i].box.offsets, nd * sizeof(*d));
    memcpy(d + 2 * nd, ts[i].box.sizes, nd * sizeof(*d));
    memcpy(p, ts[i].name, len);
    s->tensors[i] = ts[i];
    s->tensors[i].name = p;
    s->tensors[i].global_shape = d;
    s->tensors[i].box = (struct stk_ckpt_box){nd, d + nd, d + 2 * nd};
    d += 3 * nd, p += len;
  }
  s->n = n;
  return 0;
}

/* ------------------------------------------------- the public save calls */

int stk_ckpt_save(struct stk_client *c, const char *attempt, uint32_t rank,
                  const struct stk_ckpt_tensor *tensors, size_t n_tensors, uint64_t *ret_bytes) {
  struct ckpt_save *s = NULL;
  int err = ckpt_save_new(c, attempt, rank, tensors, n_tensors, NULL, &s);
  if (err) return err;
  ckpt_save_run(s);
  err = ckpt_save_result(s, ret_bytes);
  ckpt_save_free(s);
  return err;
}

/* An async save's caller: its callback, run once the engine is done. */
struct async_save {
  struct ckpt_save *s;
  stk_ckpt_saved_fn done;
  void *arg;
};

static void async_done(void *arg) {
  struct async_save *a = arg;
  uint64_t bytes = 0;
  int err = ckpt_save_result(a->s, &bytes);
  a->done(a->arg, err, err ? stk_client_last_error(NULL) : "", bytes);
  ckpt_save_free(a->s);
  free(a);
}

int stk_ckpt_save_async(struct stk_client *c, const char *attempt, uint32_t rank,
                        const struct stk_ckpt_tensor *tensors, size_t n_tensors,
                        stk_ckpt_saved_fn done, void *arg) {
  if (!done) return client_fail(STK_EINVAL, "save");
  struct async_save *a = calloc(1, sizeof(*a));
  if (!a) return client_fail(STK_ENOMEM, "save");
  *a = (struct async_save){.done = done, .arg = arg};
  struct ckpt_save_hooks h = {.done = async_done, .arg = a};
  int err = ckpt_save_new(c, attempt, rank, tensors, n_tensors, &h, &a->s);
  if (!err) err = ckpt_save_submit(a->s);
  if (err) {
    ckpt_save_free(a->s);
    free(a);
  }
  return err;
}
