/*
 * cli_help: stokerctl's usage texts, all made from the one command table:
 * the global --help (every command, the global flags, the exit codes), a
 * group's (`stokerctl job --help`: its subcommands) and one command's
 * (`stokerctl job create --help`: its synopsis and what it does).
 */
#ifndef STK_CLI_HELP_H
#define STK_CLI_HELP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

struct cli_ctx;

/* One row of the command table (cli_main.c). */
struct cli_command {
  const char *words[2]; /* words[1] NULL for one-word commands. */
  int n_ops;            /* Operands required after the words. */
  const char *flags;    /* Subcommand flags accepted, space-separated. */
  int (*run)(const struct cli_ctx *x);
  const char *synopsis; /* After the words: "NAME [--after SEQ]"; '\n' breaks a long one. */
  const char *summary;  /* One line for the lists. */
  const char *details;  /* More for the command's own --help (flags, output), or NULL. */
};

/* Global usage: every command, the global flags, the exit codes. */
void cli_help_global(const struct cli_command *cmds, size_t n, FILE *out);

/* True when some command's first word is word ("job", "loader"). */
bool cli_help_is_group(const struct cli_command *cmds, size_t n, const char *word);

/* A group's usage: the commands whose first word is group. */
void cli_help_group(const struct cli_command *cmds, size_t n, const char *group, FILE *out);

/* One command's usage: synopsis, summary, details. */
void cli_help_command(const struct cli_command *cmd, FILE *out);

#endif
