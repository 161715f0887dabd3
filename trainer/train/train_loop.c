/*
 * One generation of training: set up (loader, FSDP at this world size,
 * restore, batch stream), then steps until done, STOP or a failure. Rank 0
 * logs loss and tokens/s per step; every rank reports them with its
 * heartbeats. A step checkpoints every N steps, or when any rank voted
 * (CHECKPOINT_NOW) in it; when a rank voted to stop (the job is pausing, or
 * a rank got SIGTERM), every rank checkpoints at that step and stops, and
 * tells the coordinator the step at once. A pause's STOP is acted on at a
 * step boundary: past the checkpoint it names, the rank votes to stop.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "train.h"

/* Creates the loader on part c unless it has it already. */
static int ensure_on_part(struct train *t, struct stk_client *c,
                          const Stoker__V1__LoaderSpec *spec) {
  Stoker__V1__LoaderInfo *info = NULL;
  int err = stk_loader_get(c, t->o.data_job, 30000, &info);
  if (err == STK_ENOENT) {
    err = t->o.corpus ? stk_loader_create(c, spec, 30000, &info) : STK_EINVAL;
    if (err == STK_EEXIST) err = 0;
  }
  if (info) protobuf_c_message_free_unpacked(&info->base, NULL);
  return err;
}

/* Part by part, so that a part left without the job (a process replaced,
 * or a create that failed half way) gets it while the others keep theirs. */
int train_loader_ensure(struct train *t) {
  char uri[1100];
  snprintf(uri, sizeof(uri), "file://%s", t->o.corpus ? t->o.corpus : "");
  Stoker__V1__StorageRef ref = STOKER__V1__STORAGE_REF__INIT;
  ref.uri = uri;
  Stoker__V1__DatasetSpec ds = STOKER__V1__DATASET_SPEC__INIT;
  ds.name = "corpus", ds.source = &ref, ds.weight = 1.0, ds.tokenizer = "bytes";
  ds.format = STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_TEXT, ds.block_bytes = 4096;
  Stoker__V1__DatasetSpec *dss[1] = {&ds};
  Stoker__V1__LoaderSpec spec = STOKER__V1__LOADER_SPEC__INIT;
  spec.job = (char *)t->o.data_job, spec.n_datasets = 1, spec.datasets = dss;
  spec.seq_len = (uint32_t)t->o.seq_len, spec.global_batch = (uint32_t)t->o.global_batch;
  spec.seed = t->o.seed;
  uint32_t n = stk_loader_n_parts(t->loader);
  for (uint32_t i = 0; i < n; i++) {
    int err = ensure_on_part(t, stk_loader_part(t->loader, i), &spec);
    if (err) {
      if (n > 1)
        fprintf(stderr, "[%s] loader %s on dataloader part %u of %u: %s\n", t->o.member,
                t->o.data_job, i, n, stk_client_last_error(NULL));
      return err;
    }
  }
  return 0;
}

/* FSDP at this world size, restored when there is a checkpoint; the stream. */
static int setup(struct train *t) {
  int64_t from = t->o.restore_from > 0 ? t->o.restore_from : t->m.checkpoint_step;
  stk_ckpt_set_generation(t->ckpt, t->m.generation); /* Listed with each checkpoint. */
  int err = t->m.rank == 0 ? train_loader_ensure(t) : 0;
  if (err) return train_why(t, err, "dataloader job %s: %s", t->o.data_job, train_client_why(err));
  struct fsdp_opts fo;
  fsdp_opts_default(&fo);
  fo.max_inflight_units = t->o.limiter_k, fo.seed = t->o.seed;
  fo.lr_max = t->o.lr, fo.lr_min = t->o.lr / 10, fo.warmup_steps = 10;
  fo.total_steps = t->o.steps;
  fo.precision = t->o.precision;
  fsdp_free(t->fsdp);
  t->fsdp = NULL;
  if (!err) err = fsdp_new(&t->o.cfg, t->group, &fo, &t->fsdp);
  if (!err) fsdp_set_before_update(t->fsdp, train_ckpt_fence, t);
  if (err) return train_why(t, err, "model setup: %s", stk_strerror(err));
  if (from > 0 && (err = train_restore(t, from)) != 0)
    return train_why(t, err, "restoring step %" PRId64 ": %s", from, train_client_why(err));
  err = stk_barrier(t->coord, "ready", 120000); /* The loader state is in place. */
  if (err) return train_why(t, err, "barrier 'ready' of the ranks: %s", train_client_why(err));
  t->step = from;
  /* Again at the restored step, at this world size: the same held-out set
   * and the restored parameters give the loss logged before (tested). */
  if (from > 0 && (err = train_eval_maybe(t)) != 0) return err;
  if (from < t->o.steps) {
    err = stk_loader_stream_all(t->loader, t->o.data_job, from, t->m.rank, t->m.world_size, 4,
                                &t->stream);
    if (err) return train_why(t, err, "opening the batch stream: %s", train_client_why(err));
  }
  return 0;
}

/* The step's batch, split into inputs and targets. */
static int take_batch(struct train *t, int *ret_B) {
  struct stk_batch b;
  int err = stk_batch_stream_next(t->stream, 120000, &b);
  if (err)
    return train_why(t, err, "no batch for step %" PRId64 " from the dataloader: %s", t->step,
                     train_client_why(err));
  int T = t->o.seq_len, B = (int)b.lines;
  if (b.step != t->step || b.line_tokens != (uint32_t)T + 1 ||
      B * (int)t->m.world_size != t->o.global_batch)
    err = STK_ECORRUPT;
  if (!err) train_split_lines(&b, t->inputs, t->targets);
  stk_batch_free(&b);
  *ret_B = B;
  return err;
}

static uint64_t heartbeat_step(const struct train *t);
static void tell_stop_step(struct train *t, int64_t step);

static int one_step(struct train *t) {
  int64_t t0 = train_now_ms();
  int B = 0;
  float loss = 0;
  int err = take_batch(t, &B);
  bool ckpt = atomic_load(&t->ckpt_wanted); /* First: see on_action's order. */
  bool stop = atomic_load(&t->stop_wanted);
  fsdp_set_vote(t->fsdp, stop ? TRAIN_STOP_VOTE : ckpt ? 1 : 0);
  if (err) return err;
  err = fsdp_step(t->fsdp, t->inputs, t->targets, B, t->o.seq_len, &loss);
  if (err) {
    const char *why = t->group ? coll_why(t->group) : "";
    return train_why(t, err, "step %" PRId64 "'s collectives: %s%s", t->step + 1,
                     why[0] ? why : stk_strerror(err),
                     err == STK_EIO || err == STK_ETIMEDOUT ? " (a peer died or left?)" : "");
  }
  t->step++;
  int sum = fsdp_votes(t->fsdp); /* The same on every rank. */
  int stops = sum / TRAIN_STOP_VOTE, votes = sum % TRAIN_STOP_VOTE + stops;
  if (votes > 0) atomic_store(&t->ckpt_wanted, false);
  if (stops > 0) atomic_store(&t->stop_wanted, false);
  double dt = (double)(train_now_ms() - t0) / 1000.0;
  double tps = (double)t->o.global_batch * t->o.seq_len / (dt > 1e-3 ? dt : 1e-3);
  stk_report(t->coord, heartbeat_step(t), tps, loss, STK_RANK_HEALTH_OK);
  if (t->m.rank == 0)
    printf("[%s] step %" PRId64 " loss %.4f tokens/s %.0f world %u\n", t->o.member, t->step,
           (double)loss, tps, t->m.world_size);
  err = train_eval_maybe(t);
  if (!err) err = train_ckpt_finish(t, false); /* An earlier checkpoint, if its pipeline is done. */
  bool periodic = t->o.checkpoint_every > 0 && t->step % t->o.checkpoint_every == 0;
  if (votes > 0)
    printf("[%s] checkpoint now at step %" PRId64 " (asked by %d rank%s)%s\n", t->o.member, t->step,
           votes, votes > 1 ? "s" : "", stops ? ", then stop: no step past it" : "");
  if (stops > 0) tell_stop_step(t, t->step); /* Before an earlier checkpoint is reaped. */
  if (!err && (periodic || votes > 0)) err = train_ckpt_start(t, t->step, stops > 0);
  if (!err && stops) t->stopped_step = t->step;
  return err;
}

/* The step the heartbeats carry: the one trained, or K behind under
 * --heartbeat-test (a heartbeat whose reply comes back K steps late). */
static uint64_t heartbeat_step(const struct train *t) {
  int64_t s = t->step - t->o.hb_test_lag;
  return s > 0 ? (uint64_t)s : 0;
}

/* The ranks agreed to stop at step: the coordinator hears it at once
 * (stk_report_stop), so that while the job pauses it takes no checkpoint
 * below step as the pause's and tells no rank STOP below it. Under
 * --heartbeat-test lag:K only once the lagging step reaches it (never,
 * since the rank trains no step past it). */
static void tell_stop_step(struct train *t, int64_t step) {
  if (t->stop_told >= step) return;
  if (t->o.hb_test_lag && !t->o.hb_test_stop_at_once && (int64_t)heartbeat_step(t) < step) return;
  t->stop_told = step;
  stk_report_stop(t->coord, step);
}

/* A STOP seen at a step boundary: 1 to stop here, 0 to train on. A pause's
 * STOP names the checkpoint it took (stk_stop_checkpoint_step) and may have
 * crossed steps this rank finished after the heartbeat it answered. Past
 * that checkpoint the rank does not stop here, since its peers may stop at
 * another boundary or train on: it votes to stop, so that every rank
 * checkpoints at the same step S, stages, and leaves with S (the
 * coordinator keeps its seat until then). At or below the checkpoint
 * nothing is lost, and no peer can be past this boundary without this
 * rank: it stops. A STOP naming no checkpoint (a forced pause, a stopped
 * job, a scale-down) stops at once, as before. */
static int stop_at_boundary(struct train *t, int err) {
  int64_t ckpt = stk_stop_checkpoint_step(t->coord);
  if (err || ckpt <= 0 || t->step <= ckpt || !stk_job_pausing(t->coord)) return 1;
  if (!atomic_exchange(&t->stop_wanted, true))
    printf("[%s] STOP at step %" PRId64 ", past the pause's checkpoint of step %" PRId64
           ": checkpoint, then stop\n",
           t->o.member, t->step, ckpt);
  return 0;
}

/* This rank got SIGTERM: at the step boundary it tells the coordinator (a
 * preemption notice for the whole job) and votes to stop in the next step. */
static void sigterm_maybe(struct train *t) {
  if (!train_sigterm || t->sigterm_told) return;
  t->sigterm_told = true;
  t->sigterm_ms = train_now_ms();
  printf("[%s] SIGTERM at step %" PRId64 ": telling the coordinator; checkpoint, then stop\n",
         t->o.member, t->step);
  stk_notify_terminating(t->coord);
  atomic_store(&t->stop_wanted, true);
}

static int stop_at_boundary(struct train *t, int err);

int train_run_generation(struct train *t) {
  t->why[0] = '\0';
  t->stop_told = 0;
  atomic_store(&t->stop_heard, false);
  int err = train_join(t);
  if (err) train_why(t, err, "joining job %s: %s", t->o.job, train_client_why(err));
  if (!err) err = setup(t);
  while (!err && t->step < t->o.steps && !t->stopped_step) {
    sigterm_maybe(t);
    err = one_step(t);
    enum stk_action a = stk_poll_action(t->coord); /* CHECKPOINT_NOW: on_action's. */
    if (a == STK_ACTION_STOP && !t->stopped_step) err = stop_at_boundary(t, err);
    if (a == STK_ACTION_RESTART)
      err = train_why(t, STK_EABORTED, "the coordinator asked for a restart");
  }
  if (!err) err = train_ckpt_finish(t, true);
  if (!err && t->stopped_step) err = 2; /* Staged (rank 0: commit accepted): stop here. */
  if (err < 0) t->stopped_step = 0;     /* Its checkpoint may not commit: a failure. */
  if (!err && t->o.dump_params) err = train_dump_params(t, t->o.dump_params);
  if (!err) (void)stk_barrier(t->coord, "done", 30000); /* Nobody leaves mid-collective. */
  train_ckpt_drop(t);
  stk_batch_stream_free(t->stream);
  t->stream = NULL;
  train_eval_free(t);
  return err;
}
