/*
 * stoker-train: the reference trainer, one process per rank. It joins a
 * coordinator job, builds a TCP ring with the other ranks through the
 * generation's KV store, streams its slice of each global batch from the
 * dataloader, trains the reference GPT with FSDP, checkpoints every N steps
 * through the checkpoint service (in the background: the shards are
 * staged while the next step's forward and backward run) and, on RESTART or a failed collective,
 * rejoins at the new world size and restores the latest committed checkpoint, resharded.
 *
 * Steps: trainer step s (1-based, "s steps done") trains on the loader's
 * step s - 1 (the loader counts from 0), so a checkpoint at step S holds
 * the loader state after loader step S - 1 and training resumes with loader
 * step S.
 *
 * Checkpoints happen every N steps and when the coordinator says
 * CHECKPOINT_NOW to any rank: the rank votes in the next step's all-reduce
 * (fsdp_set_vote) and every rank sees the sum after that step, so all of
 * them checkpoint at the same step without an extra collective.
 *
 * Stopping resumably: when the job is pausing (an operator's PauseJob, or a
 * preemption: the coordinator's CHECKPOINT_NOW with pausing, or this rank's
 * SIGTERM, which it reports at the next step boundary) the rank votes
 * TRAIN_STOP_VOTE instead of 1; every rank then checkpoints at the same
 * step, waits until its shards are staged (rank 0: committed), leaves
 * with that step and exits TRAIN_EXIT_RESUMABLE (75), so a Kubernetes Job
 * does not count the pod as completed and the job resumes from the step.
 * A resize (ScaleJob: CHECKPOINT_NOW with resizing) stops the same way,
 * then waits for the coordinator's RESTART instead of leaving, so that no
 * step past the checkpoint is trained and thrown away.
 *
 * The dataloader may be several processes (--dataloader a,b,c: part i of
 * P at place i): the trainer talks to them through one struct stk_loader,
 * which assembles every part's lines into the rank's slice and carries
 * every part's state as one blob, so the trainer does the same with one
 * address or many.
 *
 * This header is shared by the program's files only.
 */
#ifndef STK_TRAIN_H
#define STK_TRAIN_H

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "fsdp.h"
#include "stoker_admin.h" /* Rank 0 creates the loader (stk_loader_create, in-tree only). */
#include "stoker_ckpt.h"
#include "stoker_client.h"
#include "stoker_loader.h"

/* Exit codes: 0 done (every step trained, or the job stopped or scaled
 * down without this rank), 1 a failure, 2 bad flags, and 75 (EX_TEMPFAIL)
 * stopped resumably: the job is paused or preempted, start the rank again
 * to resume from its checkpoint. */
#define TRAIN_EXIT_RESUMABLE 75
/* --on-sigterm exit (baselines only): SIGTERM ends the rank at once with
 * the status a shell reports for a process killed by it, saving nothing. */
#define TRAIN_EXIT_SIGTERM (128 + SIGTERM)
/* A rank's vote for "checkpoint, then stop" (a plain checkpoint votes 1):
 * the sum of the votes tells both apart below 4096 ranks. */
#define TRAIN_STOP_VOTE 4096

/* Set by the SIGTERM handler (train_main.c), read at step boundaries. */
extern volatile sig_atomic_t train_sigterm;
/* Set while parked in Join (train_join.c): the handler exits 75 at once. */
extern volatile sig_atomic_t train_sigterm_exits;

struct train_opts {
  const char *coordinator, *checkpoint; /* Service addresses. */
  const char *dataloader; /* One address, or part i's at place i of a comma-separated list. */
  const char *job;        /* Coordinator job. */
  const char *data_job;   /* Loader and checkpoint job; default: job. */
  const char *member;
  const char *corpus; /* Directory of .txt files (rank 0 creates the loader). */
  struct model_config cfg;
  int seq_len;      /* T */
  int global_batch; /* Lines per step over all ranks. */
  int64_t steps;
  int64_t checkpoint_every;
  int limiter_k;
  float lr;
  uint64_t seed;
  int64_t restore_from;    /* > 0: restore this step instead of the job's latest. */
  const char *dump_params; /* At the end, rank 0 writes every unit's params here. */
  const char *tls_ca;      /* PEM CA: TLS to every service (NULL: plaintext). */
  const char *token_file;  /* Bearer token for every service (NULL: none). */
  const char *ring_host;   /* Ring listens on and publishes this host (NULL: 127.0.0.1). */
  int64_t ring_timeout_ms;
  enum fsdp_precision precision; /* --mixed-precision bf16|fp32 */
  bool ckpt_low_priority;        /* --ckpt-stage-priority low: staging at nice 19. */
  /* --ckpt-stage-test: forces an interleaving of staging and training. */
  int64_t ckpt_test_delay_ms; /* slow:MS: the staging thread waits until the next update
                                 is at the fence, then sleeps MS before its first and its
                                 middle tensor. */
  bool ckpt_test_early;       /* early: staging done before the next step starts. */
  int64_t hear_late_test_ms;  /* --hear-late-test: CHECKPOINT_NOW taken in this much later. */
  /* --heartbeat-test: the heartbeats lag the loop by this many steps (0:
   * not). lag:K holds the stop step back until the lagging step reaches it;
   * stale:K (hb_test_stop_at_once) sends it at once. */
  int64_t hb_test_lag;
  bool hb_test_stop_at_once;
  int eval_every;         /* Held-out loss every N steps (and after the last); 0: never. */
  int eval_batches;       /* Loader steps in the held-out set (those after the last step). */
  bool sigterm_exits_now; /* --on-sigterm exit: no checkpoint, exit 143 at once (baselines). */
};

/* A checkpoint on its way: its pipeline thread (attempt, loader export,
 * staging, barrier, commit) runs beside training. Its tensors are the live
 * FSDP shards (no snapshot): the next step's update fences on the stage
 * (fsdp_set_before_update) before it writes them. */
struct train_pending {
  int64_t step;
  bool last;    /* The generation's last checkpoint (a stop): rank 0 commits detached. */
  bool running; /* The pipeline thread exists (not joined yet). */
  pthread_t thread;
  char attempt[STK_CKPT_ATTEMPT_MAX];
  struct stk_ckpt_tensor *ts; /* Shard tensors, then rank 0's state and loader tensors. */
  size_t n_shard_tensors;
  uint64_t *dims;    /* Shapes and boxes of the tensors. */
  char (*names)[32]; /* Their names. */
  uint8_t *loader_blob;
  uint64_t state[4];
  pthread_mutex_t mu; /* Guards what follows against the pipeline thread. */
  pthread_cond_t cv;
  struct stk_ckpt_stage *stage; /* Freed by the loop's thread after the join. */
  bool started;                 /* The stage exists, or the pipeline failed before. */
  bool at_fence;                /* An update reached the fence (or the pipeline is reaped). */
  size_t middle_tensor;         /* --ckpt-stage-test slow: where the stage sleeps again. */
  bool done;
  int err;
  char msg[320];         /* Why err: the failing call's message, taken on its thread. */
  int64_t fence_wait_us; /* What the next update's fence waited; -1: no update yet. */
};

struct train {
  struct train_opts o;
  struct stk_client *coord, *ckpt;
  struct stk_loader *loader; /* Every dataloader part (one for a single process). */
  struct stk_membership m;
  struct fsdp *fsdp;
  struct stk_batch_stream *stream;
  pthread_mutex_t group_mu; /* Guards group against the action callback. */
  struct coll_group *group;
  atomic_bool aborted;     /* RESTART or STOP seen by the callback. */
  atomic_bool ckpt_wanted; /* CHECKPOINT_NOW heard; voted on at the next step. */
  atomic_bool stop_wanted; /* Pausing or resizing: checkpoint, then stop (TRAIN_STOP_VOTE). */
  bool sigterm_told;       /* This rank's SIGTERM was reported to the coordinator. */
  int64_t sigterm_ms;      /* When the loop saw it (train_now_ms): the grace it needs. */
  int64_t stopped_step;    /* > 0: stopped after staging the checkpoint of this step. */
  int64_t stop_told;       /* The stop step given to stk_report_stop (0: none yet). */
  atomic_bool stop_heard;  /* A pause's STOP naming its checkpoint was logged. */
  bool not_needed;         /* The coordinator refused the join (job stopped or scaled down). */
  char not_needed_why[256];
  char why[640]; /* What failed this generation, in words (train_why); "" while nothing. */
  int64_t step;  /* Last step trained (or restored). */
  struct train_pending pend;
  int32_t *inputs, *targets;
  int32_t *eval_inputs, *eval_targets; /* This rank's held-out slice (train_eval.c). */
  int eval_lines;                      /* Its lines; 0: not fetched at this world size. */
};

/* The base (train_base.c): every file may call these; they call no file of
 * the trainer. */

/* Records what failed (printf format), unless something was recorded
 * already this generation; returns err. */
int train_why(struct train *t, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The service's message for err, the last call that failed on this thread,
 * or err's name when the failure was local. */
const char *train_client_why(int err);
/* Names of a unit's checkpoint tensors: kind is "param", "m" or "v". */
void train_tensor_name(int unit, const char *kind, char *ret_name, size_t len);
/* Monotonic clocks. */
int64_t train_now_ms(void);
int64_t train_now_us(void);
/* Splits a batch's lines of T + 1 tokens into inputs and targets, T each
 * (lines x T, row-major). */
void train_split_lines(const struct stk_batch *b, int32_t *inputs, int32_t *targets);

/* Flags and environment (train_args.c). Returns 0 with ret_opts filled; 1
 * when --help or --version was printed (exit 0); -1 when they are bad,
 * after one line on stderr naming the flag (exit 2). */
int train_parse_args(int argc, char **argv, struct train_opts *ret_opts);

/* Joins (or rejoins) the job and builds the ring group of the generation.
 * A Join refused with STK_ESTATE (the job is stopped, or was scaled down
 * and has no seat for this member) sets not_needed and its reason. */
int train_join(struct train *t);
/* Aborts and frees the ring group (the action callback may race). */
void train_drop_group(struct train *t);

/* Rank 0 creates the loader on every part that lacks it. */
int train_loader_ensure(struct train *t);

/* Restores checkpoint step into the fresh fsdp at this world size; rank 0
 * imports the dataloader state. */
int train_restore(struct train *t, int64_t step);

/* Starts the checkpoint of step (the last step trained) in the
 * background, after reaping the previous one; the next step's update
 * waits for the copy of the shards. */
int train_ckpt_start(struct train *t, int64_t step, bool last);
/* The before-update hook: waits until the pending stage no longer reads
 * the shards. */
int train_ckpt_fence(void *train);
/* Reaps the checkpoint pipeline once it is done (wait: until it is): 0
 * or its error. No-op without one. */
int train_ckpt_finish(struct train *t, bool wait);
void train_ckpt_drop(struct train *t);

/* Trains one generation until the steps are done (0), STOP (1), a stop
 * after a checkpoint the ranks voted for (2: t->stopped_step) or a failure
 * that needs a rejoin (negative). */
int train_run_generation(struct train *t);

/* Gathers every unit and (rank 0) writes them to path. */
int train_dump_params(struct train *t, const char *path);

/* The held-out loss when this step is due for one (train_eval.c); rank 0
 * prints it. Every rank calls it after every step. */
int train_eval_maybe(struct train *t);
/* Forgets the held-out slice (the next generation's world size may differ). */
void train_eval_free(struct train *t);

#endif
