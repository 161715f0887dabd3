/*
 * Command-line flags of stoker-train, with the service addresses also
 * taken from the environment (STOKER_COORDINATOR, STOKER_DATALOADER,
 * STOKER_CHECKPOINT). Defaults give a tiny model that trains in seconds.
 */
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
  o->coordinator = getenv("STOKER_COORDINATOR");
  o->dataloader = getenv(STK_LOADER_ENV);
  o->checkpoint = getenv(STK_CKPT_ENV);
  o->ring_host = getenv("STOKER_RING_HOST");
  o->tls_ca = getenv("STOKER_TLS_CA");
  o->token_file = getenv("STOKER_TOKEN_FILE");
}

/* One "--flag value" pair; -1 when the flag is unknown. */
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
  long long n = strtoll(v, NULL, 10);
  if (!strcmp(k, "--steps"))
    o->steps = n;
  else if (!strcmp(k, "--checkpoint-every"))
    o->checkpoint_every = n;
  else if (!strcmp(k, "--limiter"))
    o->limiter_k = (int)n;
  else if (!strcmp(k, "--channels"))
    o->cfg.channels = (int)n;
  else if (!strcmp(k, "--layers"))
    o->cfg.n_layer = (int)n;
  else if (!strcmp(k, "--heads"))
    o->cfg.n_head = (int)n;
  else if (!strcmp(k, "--seq-len"))
    o->seq_len = (int)n;
  else if (!strcmp(k, "--global-batch"))
    o->global_batch = (int)n;
  else if (!strcmp(k, "--lr"))
    o->lr = strtof(v, NULL);
  else if (!strcmp(k, "--seed"))
    o->seed = (uint64_t)n;
  else if (!strcmp(k, "--restore-from"))
    o->restore_from = n;
  else if (!strcmp(k, "--eval-every"))
    o->eval_every = (int)n;
  else if (!strcmp(k, "--eval-batches"))
    o->eval_batches = (int)n;
  else if (!strcmp(k, "--ring-timeout-ms"))
    o->ring_timeout_ms = n;
  else
    return -1;
  return 0;
}

int train_parse_args(int argc, char **argv, struct train_opts *ret_opts) {
  struct train_opts *o = ret_opts;
  defaults(o);
  int bad = argc % 2 == 0;
  for (int i = 1; !bad && i + 1 < argc; i += 2) bad = set_flag(o, argv[i], argv[i + 1]) != 0;
  if (!o->data_job) o->data_job = o->job;
  o->cfg.max_seq_len = o->seq_len;
  if (bad || !o->coordinator || !o->job || !o->member || o->steps < 0 || o->global_batch <= 0 ||
      o->seq_len <= 0 || o->eval_every < 0 || o->eval_batches < 1 ||
      model_config_check(&o->cfg) != 0) {
    usage(argv[0]);
    return -1;
  }
  return 0;
}
