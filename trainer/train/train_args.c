/*
 * Command-line flags of stoker-train, with the service addresses also
 * taken from the environment (STOKER_COORDINATOR, STOKER_DATALOADER,
 * STOKER_CHECKPOINT). Defaults give a tiny model that trains in seconds.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

static void usage(const char *prog) {
  fprintf(
      stderr,
      "usage: %s --job NAME --member ID --corpus DIR [--coordinator ADDR]\n"
      "  [--dataloader ADDR[,ADDR...]] [--checkpoint ADDR] [--data-job NAME] [--steps N]\n"
      "  [--checkpoint-every N] [--limiter K] [--channels C] [--layers L] [--heads NH]\n"
      "  [--seq-len T] [--global-batch B] [--lr LR] [--seed S] [--restore-from STEP]\n"
      "  [--dump-params FILE] [--ring-timeout-ms MS] [--mixed-precision bf16|fp32]\n"
      "  [--eval-every N] [--eval-batches K] (held-out loss every N steps, default 10, 0: off;\n"
      "                     on the K loader steps after the last trained one, default 4)\n"
      "  [--ckpt-stage-priority low|normal] (checkpoint staging thread at nice 19 or 0)\n"
      "  [--ckpt-stage-test slow:MS|early] (tests: staging waits for the next update's\n"
      "                     fence, then sleeps MS before its first and middle tensor; or\n"
      "                     staging is waited for before the next step)\n"
      "  [--ring-host HOST]  (address the ring listens on and publishes; env STOKER_RING_HOST,\n"
      "                       default 127.0.0.1; a pod passes its IP)\n"
      "  [--tls-ca FILE]     (TLS to every service, verified with this CA; env STOKER_TLS_CA)\n"
      "  [--token-file FILE] (bearer token for every service; env STOKER_TOKEN_FILE)\n"
      "       %s --version\n",
      prog, prog);
}

/* An environment variable's value; NULL when unset or empty. */
static const char *env(const char *name) {
  const char *v = getenv(name);
  return v && v[0] ? v : NULL;
}

static void defaults(struct train_opts *o) {
  *o = (struct train_opts){
      .cfg = {.vocab_size = 256, .channels = 64, .n_layer = 2, .n_head = 4},
      .seq_len = 64,
      .global_batch = 12,
      .steps = 100,
      .checkpoint_every = 20,
      .limiter_k = 2,
      .lr = 2e-3f,
      .seed = 1234,
      .ring_timeout_ms = 15000,
      .eval_every = 10,
      .eval_batches = 4,
  };
  o->coordinator = env("STOKER_COORDINATOR");
  o->dataloader = env(STK_LOADER_ENV);
  o->checkpoint = env(STK_CKPT_ENV);
  o->ring_host = env("STOKER_RING_HOST");
  o->tls_ca = env("STOKER_TLS_CA");
  o->token_file = env("STOKER_TOKEN_FILE");
}

/* The numeric flags: where each goes and its bounds. */
enum num_kind { NUM_INT, NUM_INT64, NUM_U64, NUM_FLOAT };
struct num_flag {
  const char *name;
  enum num_kind kind;
  size_t offset; /* In struct train_opts. */
  double min, max;
};

#define NUM(name, kind, field, lo, hi)                                                             \
  { name, kind, offsetof(struct train_opts, field), lo, hi }
static const struct num_flag num_flags[] = {
    NUM("--steps", NUM_INT64, steps, 0, 1e15),
    NUM("--checkpoint-every", NUM_INT64, checkpoint_every, 0, 1e15),
    NUM("--limiter", NUM_INT, limiter_k, 0, 1024),
    NUM("--channels", NUM_INT, cfg.channels, 1, 65536),
    NUM("--layers", NUM_INT, cfg.n_layer, 1, 1024),
    NUM("--heads", NUM_INT, cfg.n_head, 1, 1024),
    NUM("--seq-len", NUM_INT, seq_len, 1, 1 << 20),
    NUM("--global-batch", NUM_INT, global_batch, 1, 1 << 24),
    NUM("--lr", NUM_FLOAT, lr, 0, 10),
    NUM("--seed", NUM_U64, seed, 0, 1.8e19),
    NUM("--restore-from", NUM_INT64, restore_from, 0, 1e15),
    NUM("--eval-every", NUM_INT, eval_every, 0, 1e9),
    NUM("--eval-batches", NUM_INT, eval_batches, 1, 1 << 16),
    NUM("--ring-timeout-ms", NUM_INT64, ring_timeout_ms, 1, 1e12),
};
#undef NUM

/* A numeric flag, parsed whole and bounded; the message names the flag. */
static int set_number(struct train_opts *o, const char *k, const char *v) {
  for (size_t i = 0; i < sizeof(num_flags) / sizeof(num_flags[0]); i++) {
    const struct num_flag *f = &num_flags[i];
    if (strcmp(k, f->name)) continue;
    char *end = NULL;
    errno = 0;
    double d = f->kind == NUM_FLOAT ? strtod(v, &end) : (double)strtoll(v, &end, 10);
    if (!v[0] || *end || errno == ERANGE || d < f->min || d > f->max) {
      fprintf(stderr, "stoker-train: %s: expected %s in [%.15g, %.15g], got '%s'\n", k,
              f->kind == NUM_FLOAT ? "a number" : "an integer", f->min, f->max, v);
      return -2;
    }
    char *at = (char *)o + f->offset;
    if (f->kind == NUM_INT) *(int *)at = (int)d;
    if (f->kind == NUM_INT64) *(int64_t *)at = strtoll(v, NULL, 10);
    if (f->kind == NUM_U64) *(uint64_t *)at = (uint64_t)strtoull(v, NULL, 10);
    if (f->kind == NUM_FLOAT) *(float *)at = (float)d;
    return 0;
  }
  fprintf(stderr, "stoker-train: unknown flag %s\n", k);
  return -2;
}

/* One "--flag value" pair; -1 when a value is not one of the choices,
 * -2 when the problem was printed already. */
static int set_flag(struct train_opts *o, const char *k, const char *v) {
  const char *const str_keys[] = {"--coordinator", "--dataloader", "--checkpoint", "--job",
                                  "--data-job",    "--member",     "--corpus",     "--dump-params",
                                  "--ring-host",   "--tls-ca",     "--token-file"};
  const char **str_vals[] = {&o->coordinator, &o->dataloader, &o->checkpoint, &o->job,
                             &o->data_job,    &o->member,     &o->corpus,     &o->dump_params,
                             &o->ring_host,   &o->tls_ca,     &o->token_file};
  for (size_t i = 0; i < sizeof(str_keys) / sizeof(str_keys[0]); i++)
    if (!strcmp(k, str_keys[i])) return (*str_vals[i] = v), 0;
  if (!strcmp(k, "--mixed-precision")) {
    if (strcmp(v, "bf16") && strcmp(v, "fp32")) return -1;
    o->precision = !strcmp(v, "bf16") ? FSDP_PRECISION_BF16 : FSDP_PRECISION_FP32;
    return 0;
  }
  if (!strcmp(k, "--ckpt-stage-priority")) {
    if (strcmp(v, "low") && strcmp(v, "normal")) return -1;
    o->ckpt_low_priority = !strcmp(v, "low");
    return 0;
  }
  if (!strcmp(k, "--ckpt-stage-test")) {
    char *end = NULL;
    if (!strcmp(v, "early")) return (o->ckpt_test_early = true), 0;
    if (strncmp(v, "slow:", 5)) return -1;
    o->ckpt_test_delay_ms = strtoll(v + 5, &end, 10);
    return (*end || o->ckpt_test_delay_ms <= 0) ? -1 : 0;
  }
  return set_number(o, k, v);
}

int train_parse_args(int argc, char **argv, struct train_opts *ret_opts) {
  struct train_opts *o = ret_opts;
  defaults(o);
  int bad = 0;
  if (argc % 2 == 0) {
    fprintf(stderr, "stoker-train: %s has no value\n", argv[argc - 1]);
    bad = -2;
  }
  for (int i = 1; !bad && i + 1 < argc; i += 2) {
    bad = set_flag(o, argv[i], argv[i + 1]);
    if (bad == -1)
      fprintf(stderr, "stoker-train: %s: '%s' is not a choice\n", argv[i], argv[i + 1]);
  }
  if (!o->data_job) o->data_job = o->job;
  o->cfg.max_seq_len = o->seq_len;
  const char *missing = !o->coordinator ? "--coordinator (or STOKER_COORDINATOR)"
                        : !o->job       ? "--job"
                        : !o->member    ? "--member"
                                        : NULL;
  if (!bad && missing) fprintf(stderr, "stoker-train: %s is required\n", missing);
  if (!bad && !missing && model_config_check(&o->cfg) != 0)
    fprintf(stderr, "stoker-train: --heads %d does not divide --channels %d\n", o->cfg.n_head,
            o->cfg.channels);
  if (bad || missing || model_config_check(&o->cfg) != 0) {
    usage(argv[0]);
    return -1;
  }
  return 0;
}
