/*
 * stokerctl's command line, environment and exit codes. Flags are known up
 * front (one table, parsed by flags.c) so that they may appear anywhere and
 * a typo is a usage error rather than a silently ignored word.
 */
#include "cli_args.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stk_error.h"

#define GLOBAL(name, field, help)                                                                  \
  { name, FLAG_ARG, offsetof(struct cli_args, field), NULL, 0, 0, NULL, help, 0 }
/* A verb's flag: recorded in order for the verb to read (cli_commands.c
 * names the verbs taking it; another is refused). type checks the value's
 * form as it is parsed; def is the default the verb (or the service) applies
 * when the flag is absent, shown in help only. */
#define VERB(name, type, def, help)                                                                \
  { name, type, 0, def, 0, 0, NULL, help, FLAG_LISTED }
/* Every flag stokerctl knows, and their help: the global ones stored in
 * cli_args, then the verbs' ones. */
static const struct flag_spec cli_flags[] = {
    GLOBAL("coordinator", coordinator,
           "Coordinator HOST:PORT (default " CLI_DEFAULT_COORDINATOR ")."),
    GLOBAL("dataloader", dataloader,
           "Dataloader HOST:PORT, or a comma-separated list of the parts of a scaled-out one."),
    GLOBAL("checkpoint", checkpoint,
           "Checkpoint service HOST:PORT (checkpoint commands default to 127.0.0.1:7072)."),
    {"json", FLAG_BOOL, offsetof(struct cli_args, json), "false", 0, 0, NULL,
     "JSON output, one object per line.", 0},
    {"timeout", FLAG_DURATION, offsetof(struct cli_args, timeout_ms), "10s", 1, 86400000, NULL,
     "Deadline of each call (e.g. 500ms, 30s, 2m).", 0},
    GLOBAL("tls-ca", tls_ca, "Use TLS, verifying servers with this CA file (PEM)."),
    GLOBAL("tls-cert", tls_cert, "Client certificate file for mutual TLS (PEM)."),
    GLOBAL("tls-key", tls_key, "Client key file for mutual TLS (PEM)."),
    GLOBAL("token-file", token_file, "File holding the bearer token sent with every call."),
    VERB("label", FLAG_ARG, NULL,
         "A label KEY=VALUE (repeatable; jobs list: jobs with all of them)."),
    VERB("after", FLAG_UINT64, NULL, "Only the events after this sequence number."),
    VERB("min", FLAG_UINT64, NULL, "Fewest ranks a generation may start with (required)."),
    VERB("max", FLAG_UINT64, NULL, "Most ranks a generation may have (required)."),
    VERB("heartbeat", FLAG_DURATION, "5s", "Heartbeat interval of the ranks."),
    VERB("misses", FLAG_UINT64, "3", "Heartbeats missed before a rank is lost."),
    VERB("last-call", FLAG_DURATION, "30s", "Wait for more ranks once --min joined."),
    VERB("join-timeout", FLAG_DURATION, "10m", "How long a join may wait."),
    VERB("dataset", FLAG_ARG, NULL,
         "job create: a dataset URI kept in the spec. loader: a dataset\n"
         "NAME=URI[:FORMAT][@WEIGHT] (repeatable; FORMAT megatron, llmc or text, WEIGHT default "
         "1)."),
    VERB("checkpoint-storage", FLAG_ARG, NULL, "Checkpoint storage URI, kept in the spec."),
    VERB("checkpoint-every", FLAG_UINT64, NULL, "Checkpoint interval in steps, kept in the spec."),
    VERB("skip-checkpoint", FLAG_BOOL, NULL, "Restart without taking a checkpoint first."),
    VERB("in-place", FLAG_BOOL, NULL,
         "job scale of a submitted job down: the removed ranks' pods are being\n"
         "deleted; the kept ranks rejoin without restarting."),
    VERB("force", FLAG_BOOL, NULL,
         "pause, stop: without the checkpoint; delete: even while ranks are members."),
    VERB("seq-len", FLAG_UINT64, NULL, "Tokens per sequence (required by loader create)."),
    VERB("global-batch", FLAG_UINT64, NULL,
         "Sequences per step over all ranks (required by loader create)."),
    VERB("seed", FLAG_UINT64, "0", "Seed of the shuffle."),
    VERB("shards", FLAG_UINT64, NULL,
         "Logical shards the data is split into (service default 256)."),
    VERB("lanes", FLAG_UINT64, NULL,
         "Lanes (packing streams) of the whole job, not per rank: at most --shards, fixed for\n"
         "the job's life, the most dataloader parts that can serve it (service default 8)."),
    VERB("block-tokens", FLAG_UINT64, NULL,
         "Unit size in tokens of every llm.c (:llmc) dataset given: the block read at random\n"
         "(service default 32768; the job keeps it)."),
    VERB("bos", FLAG_UINT64, NULL, "Beginning-of-sequence token id put before each document."),
    VERB("eos", FLAG_UINT64, NULL, "End-of-sequence token id put after each document."),
    VERB("max-doc-tokens", FLAG_UINT64, NULL, "Longest document in tokens (longer ones are cut)."),
    VERB("from-step", FLAG_UINT64, NULL, "First step the new configuration applies to (required)."),
    VERB("tokenizer", FLAG_ARG, NULL,
         "NAME=SPEC: text dataset NAME read with SPEC (bytes, gpt2:VOCAB,MERGES; repeatable)."),
    VERB("block-document", FLAG_ARG, NULL,
         "A document DATASET/FILE/DOC (as explain names it) never to serve again (repeatable)."),
    VERB("rank", FLAG_UINT64, "0", "The rank whose slice to explain."),
    VERB("world", FLAG_UINT64, "1", "World size the slice is cut for."),
    VERB("progress", FLAG_BOOL, NULL, "A progress bar on stderr (the default on a terminal)."),
    VERB("template", FLAG_ARG, NULL,
         "job submit: the workload template the queue controller knows by this name\n"
         "(on Kubernetes the ConfigMap stoker-template-NAME; required)."),
    VERB("queue", FLAG_ARG, NULL,
         "job submit: the queue (a Kueue LocalQueue; default: the controller's)."),
    VERB("priority", FLAG_ARG, NULL,
         "job submit: a priority class (a Kueue WorkloadPriorityClass; default: the queue's)."),
    VERB("reason", FLAG_ARG, NULL,
         "Why: named in the error the attempt's writers get; job preempt: in the event."),
};
#undef GLOBAL
#undef VERB

static const struct flag_table cli_table = {"stokerctl", NULL, cli_flags,
                                            sizeof(cli_flags) / sizeof(cli_flags[0]), NULL};

/* The global flags read from the environment when not given. */
static const struct {
  const char *flag, *env;
} cli_envs[] = {
    {"coordinator", "STOKER_COORDINATOR"}, {"dataloader", "STOKER_DATALOADER"},
    {"checkpoint", "STOKER_CHECKPOINT"},   {"token-file", "STOKER_TOKEN_FILE"},
    {"tls-ca", "STOKER_TLS_CA"},
};

const struct flag_table *cli_flag_table(void) {
  return &cli_table;
}

const char *cli_flag_env(const char *flag) {
  for (size_t i = 0; i < sizeof(cli_envs) / sizeof(cli_envs[0]); i++)
    if (strcmp(cli_envs[i].flag, flag) == 0) return cli_envs[i].env;
  return NULL;
}

int cli_parse(int argc, char **argv, struct cli_args *a, char *err, size_t err_len) {
  memset(a, 0, sizeof(*a));
  int rc = flag_defaults(&cli_table, a, err, err_len);
  if (rc) return rc;
  struct flag_rest rest = {.pos = a->pos,
                           .max_pos = CLI_MAX_POSITIONAL,
                           .listed = a->flags,
                           .max_listed = CLI_MAX_FLAGS};
  int dd = 1;
  while (dd < argc && strcmp(argv[dd], "--") != 0) dd++;
  rc = flag_parse(&cli_table, a, dd, argv, &rest, err, err_len);
  a->n_pos = rest.n_pos;
  a->dashdash = dd < argc ? a->n_pos : -1;
  for (int i = dd + 1; rc == 0 && i < argc; i++) {
    if (a->n_pos >= CLI_MAX_POSITIONAL) {
      snprintf(err, err_len, "too many arguments (at most %d words)", CLI_MAX_POSITIONAL);
      rc = STK_EINVAL;
    } else {
      a->pos[a->n_pos++] = argv[i];
    }
  }
  a->n_flags = rest.n_listed;
  a->help = rest.help;
  a->version = rest.version;
  return rc;
}

void cli_apply_env(struct cli_args *a, const char *(*get)(const char *name)) {
  for (size_t i = 0; i < sizeof(cli_envs) / sizeof(cli_envs[0]); i++) {
    const struct flag_spec *s = flag_find(&cli_table, cli_envs[i].flag, strlen(cli_envs[i].flag));
    const char **field = (const char **)((char *)a + s->offset);
    if (!*field) *field = get(cli_envs[i].env);
    if (*field && !(*field)[0]) *field = NULL;
  }
  if (!a->coordinator) a->coordinator = CLI_DEFAULT_COORDINATOR;
}

const char *cli_flag_value(const struct cli_args *a, const char *name) {
  for (int i = a->n_flags - 1; i >= 0; i--) {
    if (strcmp(a->flags[i].name, name) == 0) return a->flags[i].value;
  }
  return NULL;
}

bool cli_flag_set(const struct cli_args *a, const char *name) {
  for (int i = 0; i < a->n_flags; i++) {
    if (strcmp(a->flags[i].name, name) == 0) return true;
  }
  return false;
}

int cli_split_label(const char *s, char *key, size_t key_len, char *value, size_t value_len) {
  const char *eq = s ? strchr(s, '=') : NULL;
  if (!eq || eq == s) return STK_EINVAL;
  size_t klen = (size_t)(eq - s), vlen = strlen(eq + 1);
  if (klen >= key_len || vlen >= value_len) return STK_EINVAL;
  memcpy(key, s, klen);
  key[klen] = '\0';
  memcpy(value, eq + 1, vlen + 1);
  return 0;
}

int cli_exit_code(int err) {
  switch (err) {
  case 0:
    return CLI_EXIT_OK;
  case STK_EINVAL:
    return CLI_EXIT_USAGE;
  case STK_ENOENT:
    return CLI_EXIT_NOT_FOUND;
  case STK_ESTATE:
  case STK_ESTALE:
  case STK_EEXIST:
  case STK_EABORTED:
    return CLI_EXIT_CONFLICT;
  case STK_EUNAVAIL:
  case STK_ETIMEDOUT:
    return CLI_EXIT_UNAVAILABLE;
  case STK_EUNAUTH:
  case STK_EPERM:
    return CLI_EXIT_AUTH;
  default:
    return CLI_EXIT_OTHER;
  }
}
