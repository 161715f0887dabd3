/*
 * cli_commands: stokerctl's command table (cli_commands.c). Each row names
 * the flags the command accepts; their types, defaults and help are rows of
 * the flag table (cli_args.c), so parsing and help read the same rows.
 */
#ifndef STK_CLI_COMMANDS_H
#define STK_CLI_COMMANDS_H

#include <stdbool.h>
#include <stddef.h>

struct cli_ctx;

/* One row of the command table. */
struct cli_command {
  const char *words[2]; /* words[1] NULL for one-word commands. */
  int n_ops;            /* Operands required after the words. */
  const char *flags;    /* Verb flags accepted (rows of cli_flag_table()), space-separated. */
  int (*run)(const struct cli_ctx *x);
  const char *synopsis; /* After the words: "NAME [--after SEQ]"; '\n' breaks a long one. */
  const char *summary;  /* One line for the lists. */
  const char *details;  /* Notes for the command's own --help beyond its flags, or NULL. */
};

/* Every command, in the order help lists them; *ret_n rows. */
const struct cli_command *cli_commands(size_t *ret_n);

/* True when cmd accepts the verb flag named flag (without dashes). */
bool cli_command_takes(const struct cli_command *cmd, const char *flag);

#endif
