/*
 * Command-line flags of stoker-train: one table parsed by the shared
 * parser (services/common/flags.c), so a flag is whole, bounded and named
 * in its error line as the daemons' and stokerctl's are. The service
 * addresses, ring host, CA and token file also come from the environment
 * (STOKER_COORDINATOR, STOKER_DATALOADER, STOKER_CHECKPOINT,
 * STOKER_RING_HOST, STOKER_TLS_CA, STOKER_TOKEN_FILE); a flag wins. What
 * the table cannot say is checked here: the required flags, --heads
 * dividing --channels, and --ckpt-stage-test's syntax. Defaults give a
 * tiny model that trains in seconds.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flags.h"
#include "stk_config.h"
#include "train.h"

/* What the table fills: the options, and the flags read into them after. */
struct train_cli {
  struct train_opts o;
  int precision;          /* Index in precisions. */
  int stage_priority;     /* Index in priorities. */
  int on_sigterm;         /* Index in sigterm_modes. */
  const char *stage_test; /* --ckpt-stage-test as given. */
  const char *hb_test;    /* --heartbeat-test as given. */
};

static const char *const precisions[] = {"fp32", "bf16", NULL};
static const char *const priorities[] = {"normal", "low", NULL};
static const char *const sigterm_modes[] = {"checkpoint", "exit", NULL};

#define ARG(name, field, help)                                                                     \
  { name, FLAG_ARG, offsetof(struct train_cli, field), NULL, 0, 0, NULL, help, 0 }
#define NUM(name, type, field, def, lo, hi, help)                                                  \
  { name, type, offsetof(struct train_cli, o.field), def, lo, hi, NULL, help, 0 }
static const struct flag_spec train_flags[] = {
    ARG("job", o.job, "Coordinator job to join (required)."),
    ARG("member", o.member, "This rank's member id (required)."),
    ARG("corpus", o.corpus, "Directory of .txt files (rank 0 creates the loader)."),
    ARG("coordinator", o.coordinator, "Coordinator address (required; env STOKER_COORDINATOR)."),
    ARG("dataloader", o.dataloader,
        "Dataloader address, or part i's at place i of a comma-separated list\n"
        "(env STOKER_DATALOADER)."),
    ARG("checkpoint", o.checkpoint, "Checkpoint service address (env STOKER_CHECKPOINT)."),
    ARG("data-job", o.data_job, "Loader and checkpoint job (default: --job)."),
    NUM("steps", FLAG_INT64, steps, "100", 0, 1000000000000000, "Steps to train."),
    NUM("checkpoint-every", FLAG_INT64, checkpoint_every, "20", 0, 1000000000000000,
        "Checkpoint every N steps (0: never)."),
    NUM("limiter", FLAG_INT, limiter_k, "2", 0, 1024, "FSDP rate limiter K."),
    NUM("channels", FLAG_INT, cfg.channels, "64", 1, 65536, "Model channels C."),
    NUM("layers", FLAG_INT, cfg.n_layer, "2", 1, 1024, "Model layers L."),
    NUM("heads", FLAG_INT, cfg.n_head, "4", 1, 1024, "Attention heads NH (divides C)."),
    NUM("seq-len", FLAG_INT, seq_len, "64", 1, 1 << 20, "Sequence length T."),
    NUM("global-batch", FLAG_INT, global_batch, "12", 1, 1 << 24,
        "Lines per step over all ranks B."),
    NUM("lr", FLAG_FLOAT, lr, "0.002", 0, 10, "Learning rate."),
    NUM("seed", FLAG_UINT64, seed, "1234", 0, 0, "Seed."),
    NUM("restore-from", FLAG_INT64, restore_from, "0", 0, 1000000000000000,
        "Restore this step instead of the job's latest (0: the latest)."),
    ARG("dump-params", o.dump_params, "At the end, rank 0 writes every unit's params here."),
    NUM("ring-timeout-ms", FLAG_INT64, ring_timeout_ms, "15000", 1, 1000000000000,
        "Collective ring timeout in milliseconds."),
    {"mixed-precision", FLAG_ENUM, offsetof(struct train_cli, precision), "fp32", 0, 0, precisions,
     "bf16: bf16 all-gather and reduce-scatter, f32 master state.", 0},
    NUM("eval-every", FLAG_INT, eval_every, "10", 0, 1000000000,
        "Held-out loss every N steps and after the last (0: off)."),
    NUM("eval-batches", FLAG_INT, eval_batches, "4", 1, 1 << 16,
        "Held-out set: the K loader steps after the last trained one."),
    {"ckpt-stage-priority", FLAG_ENUM, offsetof(struct train_cli, stage_priority), "normal", 0, 0,
     priorities, "Checkpoint staging thread at nice 0 (normal) or 19 (low).", 0},
    ARG("ckpt-stage-test", stage_test,
        "Tests: slow:MS (staging waits for the next update's fence, then sleeps MS\n"
        "before its first and middle tensor) or early (staging is waited for before\n"
        "the next step)."),
    NUM("hear-late-test", FLAG_INT64, hear_late_test_ms, "0", 0, 60000,
        "Tests: a CHECKPOINT_NOW is taken in MS milliseconds after it arrives (a\n"
        "rank that hears a resize after the others voted on it; 0: at once)."),
    ARG("heartbeat-test", hb_test,
        "Tests: lag:K (heartbeats carry the step K steps behind the one trained,\n"
        "and the agreed stop step only once that lagging step reaches it: a reply\n"
        "comes back K steps late) or stale:K (the step K behind, the stop step at\n"
        "once)."),
    ARG("ring-host", o.ring_host,
        "Address the ring listens on and publishes (env STOKER_RING_HOST; default\n"
        "127.0.0.1; a pod passes its IP)."),
    {"on-sigterm", FLAG_ENUM, offsetof(struct train_cli, on_sigterm), "checkpoint", 0, 0,
     sigterm_modes,
     "checkpoint: SIGTERM is a preemption notice (checkpoint at the next step\n"
     "boundary, then exit 75). exit: for baselines only, as a trainer without\n"
     "a SIGTERM handler: exit 143 at once, saving nothing (the job resumes from\n"
     "its last periodic checkpoint).",
     0},
    ARG("tls-ca", o.tls_ca, "TLS to every service, verified with this CA (env STOKER_TLS_CA)."),
    ARG("token-file", o.token_file, "Bearer token for every service (env STOKER_TOKEN_FILE)."),
};
#undef ARG
#undef NUM

static const struct flag_table train_table = {
    "stoker-train", "--job NAME --member ID --corpus DIR [--OPTION VALUE]...", train_flags,
    sizeof(train_flags) / sizeof(train_flags[0]),
    "The reference trainer: one process per rank. Also: stoker-train --version.\n"
    "Exit codes: 0 done (every step trained, or the job stopped or scaled down\n"
    "without this rank); 75 (EX_TEMPFAIL) stopped resumably: the job is paused or\n"
    "preempted (PauseJob, PreemptJob, or SIGTERM to a rank), every rank saved a\n"
    "checkpoint at one step; start the ranks again to resume from it; 1 a\n"
    "failure; 2 bad flags; 143 SIGTERM with --on-sigterm exit (nothing saved)."};

/* An environment variable's value; NULL when unset or empty. */
static const char *env(const char *name) {
  const char *v = getenv(name);
  return v && v[0] ? v : NULL;
}

static void env_defaults(struct train_opts *o) {
  o->cfg.vocab_size = 256;
  o->coordinator = env("STOKER_COORDINATOR");
  o->dataloader = env(STK_LOADER_ENV);
  o->checkpoint = env(STK_CKPT_ENV);
  o->ring_host = env("STOKER_RING_HOST");
  o->tls_ca = env("STOKER_TLS_CA");
  o->token_file = env("STOKER_TOKEN_FILE");
}

/* --ckpt-stage-test: "early" or "slow:MS" with MS a whole number > 0. */
static int stage_test(struct train_opts *o, const char *v) {
  uint64_t ms = 0;
  if (!v) return 0;
  if (strcmp(v, "early") == 0) return (o->ckpt_test_early = true), 0;
  if (strncmp(v, "slow:", 5) == 0 && flag_parse_uint(v + 5, INT64_MAX, &ms) == 0 && ms > 0)
    return (o->ckpt_test_delay_ms = (int64_t)ms), 0;
  fprintf(stderr, "stoker-train: --ckpt-stage-test: expected slow:MS or early, got '%s'\n", v);
  return -1;
}

/* --heartbeat-test: "lag:K" or "stale:K" with K a whole number > 0. */
static int hb_test(struct train_opts *o, const char *v) {
  uint64_t k = 0;
  if (!v) return 0;
  bool lag = strncmp(v, "lag:", 4) == 0, stale = strncmp(v, "stale:", 6) == 0;
  if ((lag || stale) && flag_parse_uint(v + (lag ? 4 : 6), 1000000, &k) == 0 && k > 0) {
    o->hb_test_lag = (int64_t)k;
    o->hb_test_stop_at_once = stale;
    return 0;
  }
  fprintf(stderr, "stoker-train: --heartbeat-test: expected lag:K or stale:K, got '%s'\n", v);
  return -1;
}

/* What the table cannot check: required flags and --heads | --channels. */
static int check(const struct train_opts *o) {
  const char *missing = !o->coordinator ? "--coordinator (or STOKER_COORDINATOR)"
                        : !o->job       ? "--job"
                        : !o->member    ? "--member"
                                        : NULL;
  if (missing) {
    fprintf(stderr, "stoker-train: %s is required (see --help)\n", missing);
    return -1;
  }
  if (model_config_check(&o->cfg) != 0) {
    fprintf(stderr, "stoker-train: --heads %d does not divide --channels %d\n", o->cfg.n_head,
            o->cfg.channels);
    return -1;
  }
  return 0;
}

int train_parse_args(int argc, char **argv, struct train_opts *ret_opts) {
  static struct train_cli c; /* FLAG_ARG fields point into argv or the environment. */
  char err[512];
  struct flag_rest rest = {0};
  memset(&c, 0, sizeof(c));
  if (flag_defaults(&train_table, &c, err, sizeof(err)) != 0 ||
      (env_defaults(&c.o), flag_parse(&train_table, &c, argc, argv, &rest, err, sizeof(err))) !=
          0) {
    fprintf(stderr, "stoker-train: %s\n", err);
    return -1;
  }
  if (rest.help || rest.version) {
    if (rest.help)
      flag_print_help(&train_table, stdout);
    else
      printf("stoker-train %s\n", STK_VERSION);
    return 1;
  }
  struct train_opts *o = &c.o;
  o->precision = c.precision ? FSDP_PRECISION_BF16 : FSDP_PRECISION_FP32;
  o->ckpt_low_priority = c.stage_priority == 1;
  o->sigterm_exits_now = c.on_sigterm == 1;
  if (!o->data_job) o->data_job = o->job;
  o->cfg.max_seq_len = o->seq_len;
  if (stage_test(o, c.stage_test) != 0 || hb_test(o, c.hb_test) != 0 || check(o) != 0) return -1;
  *ret_opts = *o;
  return 0;
}
