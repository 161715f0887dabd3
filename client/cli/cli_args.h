/*
 * stokerctl's contract with its caller: the command line (flags may appear
 * anywhere; parsed by services/common/flags.c from one table), the
 * environment and the exit codes. Pure functions, so that tests can drive
 * them without a coordinator. Numbers and durations given to verbs are read
 * with flag_parse_uint and flag_parse_duration_ms ("1m30s", "1.5s").
 */
#ifndef STK_CLI_ARGS_H
#define STK_CLI_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flags.h"

#define CLI_MAX_POSITIONAL      80 /* job submit: NAME and up to 64 trainer args. */
#define CLI_MAX_FLAGS           64
#define CLI_DEFAULT_COORDINATOR "127.0.0.1:7070"
#define CLI_DEFAULT_TIMEOUT_MS  10000

/* Exit codes (documented in --help). */
enum cli_exit {
  CLI_EXIT_OK = 0,
  CLI_EXIT_USAGE = 1,
  CLI_EXIT_NOT_FOUND = 2,
  CLI_EXIT_CONFLICT = 3,    /* Failed precondition, already exists, aborted. */
  CLI_EXIT_UNAVAILABLE = 4, /* Unavailable or deadline exceeded. */
  CLI_EXIT_AUTH = 5,        /* Unauthenticated or permission denied. */
  CLI_EXIT_OTHER = 6,
};

/* Everything on the command line. Strings point into argv. */
struct cli_args {
  /* Global flags. */
  const char *coordinator;
  const char *dataloader;
  const char *checkpoint;
  const char *tls_ca;
  const char *tls_cert;
  const char *tls_key;
  const char *token_file;
  int64_t timeout_ms;
  bool json;
  bool help;
  bool version; /* --version: print "stokerctl VERSION" and exit 0. */
  /* Words that are not flags: the subcommand and its operands. */
  int n_pos;
  const char *pos[CLI_MAX_POSITIONAL];
  /* Index in pos of the first word after "--" (-1: no "--"): for job
   * submit, the trainer's arguments; for other commands, operands. */
  int dashdash;
  /* Subcommand flags in order (repeatable ones appear several times);
   * name without the dashes, value NULL for switches. */
  int n_flags;
  struct flag_occurrence flags[CLI_MAX_FLAGS];
};

/* Parses argv[1..argc-1] ("--name VALUE", "--name=VALUE", switches, and
 * the first "--" ending flags: every word after it is a word, even one
 * that looks like a flag; a flag whose value is "--" is written
 * --name=--). Returns 0, or STK_EINVAL with a one-line reason in
 * err naming the flag (unknown flag, missing value, bad --timeout, too many
 * words). */
int cli_parse(int argc, char **argv, struct cli_args *a, char *err, size_t err_len);

/* The one table of every flag stokerctl parses (global and verb flags),
 * which its help prints. */
const struct flag_table *cli_flag_table(void);

/* The environment variable a global flag falls back to, or NULL. */
const char *cli_flag_env(const char *flag);

/* Fills unset addresses and the token file from STOKER_COORDINATOR,
 * STOKER_DATALOADER, STOKER_CHECKPOINT, STOKER_TOKEN_FILE (read through
 * get, normally getenv), then the default coordinator. */
void cli_apply_env(struct cli_args *a, const char *(*get)(const char *name));

/* The last value given for flag name, or NULL. */
const char *cli_flag_value(const struct cli_args *a, const char *name);
bool cli_flag_set(const struct cli_args *a, const char *name);

/* Splits "key=value" into the buffers. STK_EINVAL when there is no '=',
 * the key is empty, or a part does not fit. */
int cli_split_label(const char *s, char *key, size_t key_len, char *value, size_t value_len);

/* The exit code for a STK_E* error (0 for 0). */
int cli_exit_code(int err);

#endif
