/*
 * Background staging of a rank's shard (stk_ckpt_stage_*): a thread runs
 * the save (ckpt_save_hooked) straight from the caller's buffers, and a
 * fence tells the caller when they are free to change again. Everything
 * the save needs besides the data (tensor array, names, shapes, boxes) is
 * copied at start, so the caller's metadata may go away at once.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "ckpt_internal.h"
#include "client_internal.h"

#define LOW_PRIORITY_NICE 19

struct stk_ckpt_stage {
  struct stk_client *c;
  char attempt[STK_CKPT_ATTEMPT_MAX];
  uint32_t rank;
  struct stk_ckpt_tensor *tensors;
  size_t n;
  uint64_t *dims; /* Every tensor's global shape, offsets and sizes. */
  char *names;    /* Every tensor's name, NUL-terminated, one after another. */
  struct stk_ckpt_stage_opts opts;
  pthread_t thread;
  pid_t tid; /* The staging thread's, for its nice value; 0 until known. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool released, done;
  bool raised; /* A fence put the thread back at normal priority. */
  int err;
  int err_code;  /* gRPC code of the save's error (stk_client_last_error). */
  char msg[512]; /* Its message. */
  uint64_t bytes;
};

static void stage_released(void *arg) {
  struct stk_ckpt_stage *s = arg;
  pthread_mutex_lock(&s->mu);
  s->released = true;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static void stage_before_tensor(void *arg, size_t i) {
  struct stk_ckpt_stage *s = arg;
  if (s->opts.before_tensor) s->opts.before_tensor(s->opts.hook_arg, i);
}

static void *stage_main(void *arg) {
  struct stk_ckpt_stage *s = arg;
  pid_t tid = gettid();
  pthread_mutex_lock(&s->mu);
  s->tid = tid;
  if (s->opts.low_priority && !s->raised)
    (void)setpriority(PRIO_PROCESS, (id_t)tid, LOW_PRIORITY_NICE);
  pthread_mutex_unlock(&s->mu);
  struct ckpt_save_hooks h = {
      .before_tensor = stage_before_tensor, .released = stage_released, .arg = s};
  uint64_t bytes = 0;
  int err = ckpt_save_hooked(s->c, s->attempt, s->rank, s->tensors, s->n, &h, &bytes);
  int code = 0;
  const char *msg = err ? stk_client_last_error(&code) : "";
  pthread_mutex_lock(&s->mu);
  s->err = err, s->err_code = code, s->bytes = bytes;
  snprintf(s->msg, sizeof(s->msg), "%s", msg);
  s->done = true;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

static void stage_free(struct stk_ckpt_stage *s) {
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s->tensors), free(s->dims), free(s->names), free(s);
}

/* Copies the tensors' metadata into s (data pointers stay the caller's). */
static int copy_tensors(struct stk_ckpt_stage *s, const struct stk_ckpt_tensor *ts, size_t n) {
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

int stk_ckpt_stage_start(struct stk_client *c, const char *attempt, uint32_t rank,
                         const struct stk_ckpt_tensor *tensors, size_t n_tensors,
                         const struct stk_ckpt_stage_opts *opts,
                         struct stk_ckpt_stage **ret_stage) {
  if (!c || !attempt || !attempt[0] || strlen(attempt) >= STK_CKPT_ATTEMPT_MAX || !ret_stage ||
      (n_tensors > 0 && !tensors))
    return client_fail(STK_EINVAL, "stage");
  struct stk_ckpt_stage *s = calloc(1, sizeof(*s));
  if (!s) return client_fail(STK_ENOMEM, "stage");
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  s->c = c, s->rank = rank;
  snprintf(s->attempt, sizeof(s->attempt), "%s", attempt);
  if (opts) s->opts = *opts;
  int err = copy_tensors(s, tensors, n_tensors);
  if (err) {
    stage_free(s);
    return client_fail(err, err == STK_EINVAL ? "stage: bad tensor" : "stage");
  }
  if (pthread_create(&s->thread, NULL, stage_main, s) != 0) {
    stage_free(s);
    return client_fail(STK_ENOMEM, "stage: thread");
  }
  *ret_stage = s;
  return 0;
}

/* Under s->mu: a low-priority thread the caller now waits for goes back
 * to nice 0 (best effort: without the privilege it stays at 19). */
static void raise_priority(struct stk_ckpt_stage *s) {
  if (!s->opts.low_priority || s->raised) return;
  s->raised = true;
  if (s->tid) (void)setpriority(PRIO_PROCESS, (id_t)s->tid, 0);
}

int stk_ckpt_stage_fence(struct stk_ckpt_stage *s) {
  if (!s) return client_fail(STK_EINVAL, "stage fence");
  pthread_mutex_lock(&s->mu);
  if (!s->released) raise_priority(s);
  while (!s->released) pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  return 0;
}

bool stk_ckpt_stage_released(struct stk_ckpt_stage *s) {
  if (!s) return true;
  pthread_mutex_lock(&s->mu);
  bool r = s->released;
  pthread_mutex_unlock(&s->mu);
  return r;
}

int stk_ckpt_stage_wait(struct stk_ckpt_stage *s, uint64_t *ret_bytes) {
  if (!s) return client_fail(STK_EINVAL, "stage wait");
  pthread_mutex_lock(&s->mu); /* No priority raise: only a fence is waited for by training. */
  while (!s->done) pthread_cond_wait(&s->cv, &s->mu);
  int err = s->err;
  if (err) client_set_error(s->err_code, "%s", s->msg);
  if (!err && ret_bytes) *ret_bytes = s->bytes;
  pthread_mutex_unlock(&s->mu);
  return err;
}

int stk_ckpt_stage_finish(struct stk_ckpt_stage *s, uint64_t *ret_bytes) {
  if (!s) return 0;
  pthread_mutex_lock(&s->mu);
  if (!s->done) raise_priority(s);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  int err = s->err;
  if (err) client_set_error(s->err_code, "%s", s->msg);
  if (!err && ret_bytes) *ret_bytes = s->bytes;
  stage_free(s);
  return err;
}
