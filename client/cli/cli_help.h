/*
 * cli_help: stokerctl's usage texts, all made from the command table
 * (cli_commands.h) and the flag table that parses the command line
 * (cli_args.h): the global --help (every command, the global flags, the
 * exit codes), a group's (`stokerctl job --help`: its subcommands) and one
 * command's (`stokerctl job create --help`: its usage, every flag it
 * accepts, its notes).
 */
#ifndef STK_CLI_HELP_H
#define STK_CLI_HELP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "cli_commands.h"

/* Global usage: every command, the global flags, the exit codes. */
void cli_help_global(const struct cli_command *cmds, size_t n, FILE *out);

/* True when some command's first word is word ("job", "loader"). */
bool cli_help_is_group(const struct cli_command *cmds, size_t n, const char *word);

/* A group's usage: the commands whose first word is group. */
void cli_help_group(const struct cli_command *cmds, size_t n, const char *group, FILE *out);

/* One command's usage: synopsis, summary, every flag it accepts (with
 * kind and default, from the flag table), details. */
void cli_help_command(const struct cli_command *cmd, FILE *out);

#endif
