/*
 * stokerctl: the operator's command line for Stoker. main() parses the
 * command line, finds the subcommand in the command table (cli_commands.c;
 * cli_help.c prints the usage texts from it), checks its operands and
 * flags, and runs it; every failure ends as one line on stderr and an exit
 * code from the table in --help.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_help.h"
#include "stk_config.h"

static const struct cli_command *commands;
static size_t n_commands;

static int words_of(const struct cli_command *cmd) {
  return cmd->words[1] ? 2 : 1;
}

static const struct cli_command *find_command(const struct cli_args *a) {
  for (size_t i = 0; i < n_commands; i++) {
    const struct cli_command *cmd = &commands[i];
    int w = words_of(cmd);
    if (a->n_pos >= w && strcmp(a->pos[0], cmd->words[0]) == 0 &&
        (w == 1 || strcmp(a->pos[1], cmd->words[1]) == 0))
      return cmd;
  }
  return NULL;
}

/* Checks operands and flags of cmd, then runs it. */
static int run_command(const struct cli_command *cmd, const struct cli_args *a) {
  char name[64];
  int w = words_of(cmd);
  snprintf(name, sizeof(name), "%s%s%s", cmd->words[0], w == 2 ? " " : "",
           w == 2 ? cmd->words[1] : "");
  /* job submit's words after "--" are the trainer's; other commands'
   * are operands, as before "--" existed for submit. */
  int end = cmd->run == cli_job_submit && a->dashdash >= 0 ? a->dashdash : a->n_pos;
  struct cli_ctx x = {.args = a,
                      .cmd = name,
                      .n_ops = end - w,
                      .ops = a->pos + w,
                      .n_trailing = a->n_pos - end,
                      .trailing = a->pos + end};
  if (x.n_ops != cmd->n_ops)
    return cli_usage_error(&x, "expected %d argument%s, got %d", cmd->n_ops,
                           cmd->n_ops == 1 ? "" : "s", x.n_ops);
  for (int i = 0; i < a->n_flags; i++) {
    if (!cli_command_takes(cmd, a->flags[i].name))
      return cli_usage_error(&x, "--%s does not apply here", a->flags[i].name);
  }
  x.name = x.n_ops > 0 ? x.ops[0] : NULL;
  return cmd->run(&x);
}

/* No command matches the words: a group alone ("stokerctl job") or with
 * --help prints the group's subcommands (to stderr with exit 1 when bare,
 * like stokerctl alone); anything else is an unknown command. */
static int no_command(const struct cli_args *a) {
  struct cli_ctx top = {.args = a};
  if (cli_help_is_group(commands, n_commands, a->pos[0])) {
    if (a->help) {
      cli_help_group(commands, n_commands, a->pos[0], stdout);
      return CLI_EXIT_OK;
    }
    if (a->n_pos == 1) {
      cli_help_group(commands, n_commands, a->pos[0], stderr);
      return CLI_EXIT_USAGE;
    }
    fprintf(stderr, "stokerctl: unknown command \"%s %s\" (see stokerctl %s --help)\n", a->pos[0],
            a->pos[1], a->pos[0]);
    return CLI_EXIT_USAGE;
  }
  return cli_usage_error(&top, "unknown command \"%s\"", a->pos[0]);
}

static const char *env(const char *name) {
  return getenv(name);
}

int main(int argc, char **argv) {
  struct cli_args a;
  char why[256];
  struct cli_ctx top = {.args = &a};
  commands = cli_commands(&n_commands);
  if (cli_parse(argc, argv, &a, why, sizeof(why)) < 0) {
    char *see = strstr(why, " (see --help)"); /* cli_usage_error says where to look. */
    if (see) *see = '\0';
    return cli_usage_error(&top, "%s", why);
  }
  if (a.version) {
    printf("stokerctl %s\n", STK_VERSION);
    return CLI_EXIT_OK;
  }
  if (a.n_pos > 0 && strcmp(a.pos[0], "help") == 0) { /* "help [COMMAND]": "[COMMAND] --help". */
    memmove(a.pos, a.pos + 1, (size_t)--a.n_pos * sizeof(a.pos[0]));
    a.help = true;
  }
  if (a.n_pos == 0) {
    cli_help_global(commands, n_commands, a.help ? stdout : stderr);
    return a.help ? CLI_EXIT_OK : CLI_EXIT_USAGE;
  }
  cli_apply_env(&a, env);
  const struct cli_command *cmd = find_command(&a);
  if (!cmd) return no_command(&a);
  if (a.help) {
    cli_help_command(cmd, stdout);
    return CLI_EXIT_OK;
  }
  return run_command(cmd, &a);
}
