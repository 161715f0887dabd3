/*
 * Background staging of a rank's shard (stk_ckpt_stage_*): a save machine
 * (ckpt_save.c) on the client's engine reads the caller's buffers in place,
 * and a fence tells the caller when they are free to change again. The
 * stage only watches the machine through its hooks (buffers released, save
 * done) and keeps the engine thread's nice value while a low-priority stage
 * runs on it. A stage still in flight when its client is freed is
 * cancelled and done (STK_ECANCELED); the stage itself stays the caller's
 * until stk_ckpt_stage_finish, which touches no client.
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
  struct ckpt_save *save;
  struct stk_ckpt_stage_opts opts;
  pid_t tid; /* The engine thread's, for its nice value; 0 until lowered. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool released, done;
  bool raised; /* A fence put the thread back at normal priority. */
};

static void stage_released(void *arg) {
  struct stk_ckpt_stage *s = arg;
  pthread_mutex_lock(&s->mu);
  s->released = true;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* On the engine thread: a low-priority stage lowers it before its first
 * byte is read (unless a fence came first). */
static void stage_before_tensor(void *arg, size_t i) {
  struct stk_ckpt_stage *s = arg;
  pthread_mutex_lock(&s->mu);
  if (s->opts.low_priority && !s->raised && !s->tid) {
    s->tid = gettid();
    (void)setpriority(PRIO_PROCESS, (id_t)s->tid, LOW_PRIORITY_NICE);
  }
  pthread_mutex_unlock(&s->mu);
  if (s->opts.before_tensor) s->opts.before_tensor(s->opts.hook_arg, i);
}

/* The engine thread goes back to nice 0 for the client's other saves (best
 * effort, as a fence's raise). */
static void stage_done(void *arg) {
  struct stk_ckpt_stage *s = arg;
  pthread_mutex_lock(&s->mu);
  if (s->tid && !s->raised) (void)setpriority(PRIO_PROCESS, (id_t)s->tid, 0);
  s->released = s->done = true;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static void stage_free(struct stk_ckpt_stage *s) {
  ckpt_save_free(s->save);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
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
  client_cond_init(&s->cv);
  if (opts) s->opts = *opts;
  struct ckpt_save_hooks h = {.before_tensor = stage_before_tensor,
                              .released = stage_released,
                              .done = stage_done,
                              .arg = s};
  int err = ckpt_save_new(c, attempt, rank, tensors, n_tensors, &h, &s->save);
  if (!err) err = ckpt_save_submit(s->save);
  if (err) {
    stage_free(s);
    return err == STK_EINVAL ? client_fail(err, "stage: bad tensor") : err;
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
  pthread_mutex_unlock(&s->mu);
  return ckpt_save_result(s->save, ret_bytes); /* Done: nothing changes it any more. */
}

int stk_ckpt_stage_finish(struct stk_ckpt_stage *s, uint64_t *ret_bytes) {
  if (!s) return 0;
  pthread_mutex_lock(&s->mu);
  if (!s->done) raise_priority(s);
  while (!s->done) pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  int err = ckpt_save_result(s->save, ret_bytes);
  stage_free(s);
  return err;
}
