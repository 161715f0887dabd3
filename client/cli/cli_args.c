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
#define VERB(name, help)                                                                           \
  { name, FLAG_ARG, 0, NULL, 0, 0, NULL, help, FLAG_LISTED }
#define SWITCH(name, help)                                                                         \
  { name, FLAG_BOOL, 0, NULL, 0, 0, NULL, help, FLAG_LISTED }
/* Every flag stokerctl knows: the global ones stored in cli_args, the
 * verbs' ones listed in order for the verb to read (cli_main.c refuses one
 * the verb does not take). Help for them is cli_help.c's. */
static const struct flag_spec cli_flags[] = {
    GLOBAL("coordinator", coordinator, "Coordinator address."),
    GLOBAL("dataloader", dataloader, "Dataloader address."),
    GLOBAL("checkpoint", checkpoint, "Checkpoint service address."),
    GLOBAL("tls-ca", tls_ca, "CA file for TLS."),
    GLOBAL("tls-cert", tls_cert, "Client certificate file."),
    GLOBAL("tls-key", tls_key, "Client key file."),
    GLOBAL("token-file", token_file, "Bearer token file."),
    {"timeout", FLAG_DURATION, offsetof(struct cli_args, timeout_ms), "10s", 1, 86400000, NULL,
     "Deadline of each call.", 0},
    {"json", FLAG_BOOL, offsetof(struct cli_args, json), "false", 0, 0, NULL, "JSON output.", 0},
    VERB("label", "KEY=VALUE label."),
    VERB("after", "Events after this sequence number."),
    VERB("min", "Fewest ranks."),
    VERB("max", "Most ranks."),
    VERB("heartbeat", "Heartbeat interval."),
    VERB("misses", "Heartbeats missed before a rank is dead."),
    VERB("last-call", "Wait for more ranks."),
    VERB("join-timeout", "Join deadline."),
    VERB("dataset", "Dataset URI."),
    VERB("checkpoint-storage", "Checkpoint storage URI."),
    VERB("checkpoint-every", "Checkpoint interval in steps."),
    SWITCH("skip-checkpoint", "Skip the checkpoint."),
    SWITCH("force", "Force."),
    VERB("seq-len", "Sequence length."),
    VERB("global-batch", "Global batch."),
    VERB("seed", "Seed."),
    VERB("shards", "Logical shards."),
    VERB("lanes", "Lanes."),
    VERB("bos", "Beginning-of-sequence token."),
    VERB("eos", "End-of-sequence token."),
    VERB("max-doc-tokens", "Longest document."),
    VERB("from-step", "First step."),
    VERB("block-document", "DATASET:FILE:DOC to block."),
    VERB("rank", "Rank."),
    VERB("world", "World size."),
    SWITCH("progress", "Show progress."),
    VERB("reason", "Why."),
};
#undef GLOBAL
#undef VERB
#undef SWITCH

static const struct flag_table cli_table = {"stokerctl", NULL, cli_flags,
                                            sizeof(cli_flags) / sizeof(cli_flags[0]), NULL};

int cli_parse(int argc, char **argv, struct cli_args *a, char *err, size_t err_len) {
  memset(a, 0, sizeof(*a));
  int rc = flag_defaults(&cli_table, a, err, err_len);
  if (rc) return rc;
  struct flag_rest rest = {.pos = a->pos,
                           .max_pos = CLI_MAX_POSITIONAL,
                           .listed = a->flags,
                           .max_listed = CLI_MAX_FLAGS};
  rc = flag_parse(&cli_table, a, argc, argv, &rest, err, err_len);
  a->n_pos = rest.n_pos;
  a->n_flags = rest.n_listed;
  a->help = rest.help;
  a->version = rest.version;
  return rc;
}

void cli_apply_env(struct cli_args *a, const char *(*get)(const char *name)) {
  if (!a->coordinator) a->coordinator = get("STOKER_COORDINATOR");
  if (!a->coordinator || !a->coordinator[0]) a->coordinator = CLI_DEFAULT_COORDINATOR;
  if (!a->dataloader) a->dataloader = get("STOKER_DATALOADER");
  if (!a->checkpoint) a->checkpoint = get("STOKER_CHECKPOINT");
  if (!a->token_file) a->token_file = get("STOKER_TOKEN_FILE");
  if (!a->tls_ca) a->tls_ca = get("STOKER_TLS_CA");
  if (a->dataloader && !a->dataloader[0]) a->dataloader = NULL;
  if (a->checkpoint && !a->checkpoint[0]) a->checkpoint = NULL;
  if (a->token_file && !a->token_file[0]) a->token_file = NULL;
  if (a->tls_ca && !a->tls_ca[0]) a->tls_ca = NULL;
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
