/*
 * stokerctl's usage texts (see cli_help.h). Every list is printed from the
 * command table, so a command's synopsis is written once and the global,
 * group and command help can never disagree.
 */
#include "cli_help.h"

#include <string.h>

#include "cli_args.h"

static const char global_flags[] =
    "Global flags:\n"
    "  --coordinator ADDR   coordinator HOST:PORT (env STOKER_COORDINATOR,\n"
    "                       default " CLI_DEFAULT_COORDINATOR ")\n"
    "  --dataloader ADDRS   dataloader HOST:PORT, or a comma-separated list of the parts\n"
    "                       of a scaled-out one (env STOKER_DATALOADER)\n"
    "  --checkpoint ADDR    checkpoint service HOST:PORT (env STOKER_CHECKPOINT; checkpoint\n"
    "                       commands default to 127.0.0.1:7072)\n"
    "  --json               JSON output, one object per line\n"
    "  --timeout DURATION   per-call deadline (default 10s; e.g. 500ms, 30s, 2m)\n"
    "  --tls-ca FILE        use TLS, verifying servers with this CA (PEM; env STOKER_TLS_CA)\n"
    "  --tls-cert FILE      client certificate for mutual TLS (PEM)\n"
    "  --tls-key FILE       client key for mutual TLS (PEM)\n"
    "  --token-file FILE    bearer token (env STOKER_TOKEN_FILE)\n"
    "  -h, --help           this text; after a command or group: its usage\n"
    "  --version            print \"stokerctl VERSION\" and exit\n";

static const char exit_codes[] =
    "Exit codes:\n"
    "  0  ok\n"
    "  1  usage error or invalid argument (a bare group like \"stokerctl job\" included)\n"
    "  2  not found\n"
    "  3  failed precondition or conflict (wrong state, already exists, aborted)\n"
    "  4  unavailable or timed out (includes a service not SERVING)\n"
    "  5  unauthenticated or permission denied\n"
    "  6  other error\n";

/* Column where the summaries of a list start. */
#define SUMMARY_COL 34

/* "job show NAME": the words and the synopsis, its line breaks indented
 * under the words. Returns the length of the last line. */
static size_t put_synopsis(const struct cli_command *c, const char *indent, FILE *out) {
  int n = fprintf(out, "%s%s%s%s", c->words[0], c->words[1] ? " " : "",
                  c->words[1] ? c->words[1] : "", c->synopsis[0] ? " " : "");
  size_t col = n > 0 ? (size_t)n : 0;
  for (const char *p = c->synopsis; *p; p++) {
    if (*p == '\n') {
      fprintf(out, "\n%s", indent);
      col = strlen(indent);
    } else {
      fputc(*p, out);
      col++;
    }
  }
  return col;
}

/* "  job show NAME                   spec, state, ..." */
static void put_row(const struct cli_command *c, FILE *out) {
  fputs("  ", out);
  size_t col = 2 + put_synopsis(c, "             ", out);
  if (col + 1 >= SUMMARY_COL) {
    fprintf(out, "\n%*s", SUMMARY_COL, "");
  } else {
    fprintf(out, "%*s", (int)(SUMMARY_COL - col), "");
  }
  fprintf(out, "%s\n", c->summary);
}

void cli_help_global(const struct cli_command *cmds, size_t n, FILE *out) {
  fputs("usage: stokerctl [GLOBAL FLAGS] COMMAND [ARGS] [FLAGS]\n"
        "       stokerctl COMMAND --help     one command's or group's usage\n\nCommands:\n",
        out);
  for (size_t i = 0; i < n; i++) put_row(&cmds[i], out);
  fprintf(out, "\n%s\n%s", global_flags, exit_codes);
}

bool cli_help_is_group(const struct cli_command *cmds, size_t n, const char *word) {
  for (size_t i = 0; i < n; i++)
    if (cmds[i].words[1] && strcmp(cmds[i].words[0], word) == 0) return true;
  return false;
}

void cli_help_group(const struct cli_command *cmds, size_t n, const char *group, FILE *out) {
  fprintf(out, "usage: stokerctl [GLOBAL FLAGS] %s SUBCOMMAND [ARGS] [FLAGS]\n\nSubcommands:\n",
          group);
  for (size_t i = 0; i < n; i++)
    if (strcmp(cmds[i].words[0], group) == 0) put_row(&cmds[i], out);
  fprintf(out,
          "\n\"stokerctl %s SUBCOMMAND --help\" tells more of one; \"stokerctl --help\" "
          "lists the global flags.\n",
          group);
}

void cli_help_command(const struct cli_command *cmd, FILE *out) {
  fputs("usage: stokerctl [GLOBAL FLAGS] ", out);
  put_synopsis(cmd, "                 ", out);
  fprintf(out, "\n\n%s.\n", cmd->summary);
  if (cmd->details) fprintf(out, "\n%s", cmd->details);
  fputs("\nGlobal flags (addresses, --json, --timeout, TLS): see \"stokerctl --help\".\n", out);
}
