/*
 * stoker-train's main: connects to the three services, registers the
 * action callback (a RESTART or STOP aborts the ring group so a rank stuck
 * in a collective returns at once) and runs generations until the steps
 * are done or the job is stopped. A failed generation waits for the
 * coordinator's RESTART (or STOP), then rejoins. CHECKPOINT_NOW sets a
 * flag the loop votes with (and, when the job is pausing, the stop flag).
 * A rank the coordinator no longer needs (its Join refused after a
 * scale-down, or STOP) exits 0 with a message. A pause's STOP that names
 * its checkpoint aborts nothing: the loop handles it at the step boundary
 * (train_loop.c), since it may have crossed steps this rank trained. SIGTERM (a pod evicted)
 * only sets a flag the loop reads at the step boundary (with --on-sigterm
 * exit, for baselines, it exits 143 at once, saving nothing). A rank that
 * stopped because the job is pausing (after its last checkpoint, or told
 * STOP while pausing) exits TRAIN_EXIT_RESUMABLE (75).
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "stk_config.h"
#include "train.h"

static void sleep_ms(long ms);

static void on_action(void *arg, enum stk_action a, uint64_t generation, const char *reason) {
  struct train *t = arg;
  if (a == STK_ACTION_CHECKPOINT_NOW && t->o.hear_late_test_ms > 0)
    sleep_ms((long)t->o.hear_late_test_ms); /* --hear-late-test: heard after the others. */
  bool pausing = stk_job_pausing(t->coord);
  if (a == STK_ACTION_CHECKPOINT_NOW && (pausing || stk_job_resizing(t->coord))) {
    fprintf(stderr, "[%s] the job is %s: checkpoint, then stop (%s)\n", t->o.member,
            pausing ? "pausing" : "resizing", reason ? reason : "");
    atomic_store(&t->stop_wanted, true);
  }
  /* After the stop: the loop reads ckpt_wanted first, so a vote that saw
   * it sees the stop too (not a plain checkpoint, then a stop a step later,
   * two checkpoints for one resize); the loop does not set it from the
   * polled action, which comes before this call. */
  if (a == STK_ACTION_CHECKPOINT_NOW) atomic_store(&t->ckpt_wanted, true);
  if (a != STK_ACTION_RESTART && a != STK_ACTION_STOP) return;
  if (a == STK_ACTION_STOP && pausing && stk_stop_checkpoint_step(t->coord) > 0) {
    /* A pause's STOP naming its checkpoint: the ring stays, the loop decides
     * at the step boundary (stop there, or checkpoint first: train_loop.c),
     * so every rank leaves at the same step. */
    if (!atomic_exchange(&t->stop_heard, true))
      fprintf(stderr, "[%s] STOP (generation %" PRIu64 ": %s; the pause took step %" PRId64 ")\n",
              t->o.member, generation, reason ? reason : "", stk_stop_checkpoint_step(t->coord));
    return;
  }
  fprintf(stderr, "[%s] %s (generation %" PRIu64 ": %s)\n", t->o.member,
          a == STK_ACTION_STOP ? "STOP" : "RESTART", generation, reason ? reason : "");
  atomic_store(&t->aborted, true);
  pthread_mutex_lock(&t->group_mu);
  if (t->group) coll_abort(t->group);
  pthread_mutex_unlock(&t->group_mu);
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* After a failure: RESTART (0), STOP (1); rejoins anyway after 30 s. */
static int wait_for_verdict(struct train *t) {
  for (int64_t end = train_now_ms() + 30000; train_now_ms() < end; sleep_ms(50)) {
    enum stk_action a = stk_poll_action(t->coord);
    if (a == STK_ACTION_STOP) return 1;
    if (a == STK_ACTION_RESTART) return 0;
  }
  return 0;
}

/* After this rank stopped at its checkpoint without knowing the job pauses
 * (a resize, or a peer's vote that outran the coordinator's word): the
 * verdict. RESTART (0: rejoin and restore it), STOP (1), or the job pausing
 * (2: leave with the checkpoint); rejoins anyway after 120 s. A SIGTERM
 * meanwhile (its pod deleted by a shrink in place, or evicted) leaves with
 * the checkpoint too (2): the coordinator learns that this rank is one a
 * shrink removes, so the round gives it no seat a kept rank needs. */
static int wait_after_stop(struct train *t) {
  for (int64_t end = train_now_ms() + 120000; train_now_ms() < end; sleep_ms(50)) {
    if (train_sigterm) return 2;
    enum stk_action a = stk_poll_action(t->coord);
    if (stk_job_pausing(t->coord)) return 2;
    if (a == STK_ACTION_STOP) return 1;
    if (a == STK_ACTION_RESTART) return 0;
  }
  return 0;
}

/* A stop after this rank's checkpoint at t->stopped_step: true when the
 * rank leaves (resumable in *ret_resumable), false when it rejoins. */
static bool after_stop(struct train *t, bool *ret_resumable) {
  int v = t->sigterm_told || stk_job_pausing(t->coord) ? 2 : wait_after_stop(t);
  if (v == 2) {
    char took[64] = ""; /* What terminationGracePeriodSeconds must cover, and more. */
    if (t->sigterm_told)
      snprintf(took, sizeof(took), ", %" PRId64 " ms after SIGTERM",
               train_now_ms() - t->sigterm_ms);
    /* SIGTERM while the job is not (yet) pausing: a preemption the
     * coordinator has not answered, or a shrink in place that removes this
     * rank (its pod is deleted) while the others resize without it. */
    printf("[%s] stopped at step %" PRId64 " after staging its checkpoint: %s (exit %d%s)\n",
           t->o.member, t->stopped_step,
           stk_job_pausing(t->coord) ? "the job is pausing" : "this rank got SIGTERM",
           TRAIN_EXIT_RESUMABLE, took);
    *ret_resumable = true;
    return true;
  }
  int64_t step = t->stopped_step;
  t->stopped_step = 0; /* A plain leave, or the next generation trains. */
  if (v == 1) {
    *ret_resumable = stk_job_pausing(t->coord);
    printf("[%s] STOP at step %" PRId64 "\n", t->o.member, step);
    return true;
  }
  printf("[%s] stopped at step %" PRId64 " after its checkpoint: rejoining (the job is resizing)\n",
         t->o.member, step);
  train_drop_group(t);
  return false;
}

/* Returns the exit code: 0, or TRAIN_EXIT_RESUMABLE when the job is
 * pausing (this rank stopped after its last checkpoint, or was told STOP
 * while the job pauses). */
static int run(struct train *t) {
  bool finished = false; /* Every step trained. */
  bool resumable = false;
  for (;;) {
    int err = train_run_generation(t);
    finished = err == 0;
    if (err == 0) break;
    if (err == 2) {
      if (after_stop(t, &resumable)) break;
      continue;
    }
    if (err == 1) {
      resumable = stk_job_pausing(t->coord);
      printf("[%s] STOP at step %" PRId64 "%s\n", t->o.member, t->step,
             resumable ? ": the job is pausing" : "");
      break;
    }
    if (t->not_needed) {
      printf("[%s] not needed any more, leaving at step %" PRId64 ": %s\n", t->o.member, t->step,
             t->not_needed_why);
      break;
    }
    fprintf(stderr, "[%s] generation %" PRIu64 " failed at step %" PRId64 ": %s\n", t->o.member,
            t->m.generation, t->step, t->why[0] ? t->why : stk_strerror(err));
    t->why[0] = '\0';
    train_drop_group(t);
    if (err != STK_EABORTED && wait_for_verdict(t) == 1) {
      resumable = stk_job_pausing(t->coord);
      break;
    }
  }
  printf("[%s] done at step %" PRId64 "\n", t->o.member, t->step);
  if (!t->not_needed && finished)
    stk_leave_finished(t->coord); /* The others go on; the job ends once all did. */
  else if (!t->not_needed && t->stopped_step)
    stk_leave_checkpointed(t->coord, t->stopped_step); /* The next round waits for it. */
  else if (!t->not_needed)
    stk_leave(t->coord);
  return resumable ? TRAIN_EXIT_RESUMABLE : 0;
}

/* --on-sigterm exit: the handler exits at once. */
static volatile sig_atomic_t sigterm_now;

static void on_sigterm(int sig) {
  (void)sig;
  if (sigterm_now) _exit(TRAIN_EXIT_SIGTERM); /* --on-sigterm exit: save nothing. */
  train_sigterm = 1;
  if (train_sigterm_exits) _exit(TRAIN_EXIT_RESUMABLE); /* Parked in Join: nothing to save. */
}

/* SIGTERM sets a flag (read at step boundaries); a second one is as the
 * first: the rank finishes its checkpoint unless SIGKILL comes first. With
 * --on-sigterm exit (a baseline's trainer that saves nothing on SIGTERM)
 * the handler exits 143 at once. It is a handler, not SIG_DFL: a container's
 * PID 1 ignores a signal whose action is the default, and would wait for
 * the SIGKILL at the end of the grace period. */
static void catch_sigterm(bool exit_now) {
  sigterm_now = exit_now;
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_sigterm;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, NULL);
}

static int connect_all(struct train *t) {
  /* One TLS and token setting for all three services. */
  struct stk_client_opts co = {
      .address = t->o.coordinator, .tls_ca_file = t->o.tls_ca, .token_file = t->o.token_file};
  struct stk_client_opts lo = co, ko = co;
  lo.address = t->o.dataloader;
  ko.address = t->o.checkpoint;
  int err = stk_client_new(&co, &t->coord);
  if (!err) err = stk_loader_open(&lo, &t->loader);
  if (!err) err = stk_ckpt_connect(&ko, &t->ckpt);
  size_t n = (size_t)t->o.global_batch * (size_t)t->o.seq_len;
  t->inputs = calloc(n, sizeof(int32_t));
  t->targets = calloc(n, sizeof(int32_t));
  if (!err && (!t->inputs || !t->targets)) err = STK_ENOMEM;
  return err;
}

int main(int argc, char **argv) {
  static struct train t;
  int parsed = train_parse_args(argc, argv, &t.o);
  if (parsed != 0) return parsed > 0 ? 0 : 2;
  setvbuf(stdout, NULL, _IOLBF, 0);
  pthread_mutex_init(&t.group_mu, NULL);
  pthread_mutex_init(&t.pend.mu, NULL);
  pthread_cond_init(&t.pend.cv, NULL);
  catch_sigterm(t.o.sigterm_exits_now);
  int err = connect_all(&t), code = 0;
  if (!err) {
    stk_on_action(t.coord, on_action, &t);
    code = run(&t);
  }
  if (err)
    fprintf(stderr, "stoker-train: %s: %s (%s)\n", t.o.member, stk_strerror(err),
            stk_client_last_error(NULL));
  stk_client_free(t.coord); /* Stops the heartbeat thread before the group goes. */
  train_drop_group(&t);
  fsdp_free(t.fsdp);
  stk_loader_close(t.loader);
  stk_client_free(t.ckpt);
  free(t.inputs), free(t.targets);
  return err ? 1 : code;
}
