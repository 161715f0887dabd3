/*
 * stokerctl's usage texts (see cli_help.h). Every list is printed from the
 * command table, and every flag from the flag table that parses it (with
 * flags.c's row format, as the daemons' --help), so a command's synopsis is
 * written once and no flag it accepts can be left out of its help.
 */
#include "cli_help.h"

#include <string.h>

#include "cli_args.h"
#include "strbuf.h"

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

/* The global flags: the stored rows of the flag table, then the ones the
 * parser always knows. */
static void put_global_flags(FILE *out) {
  const struct flag_table *t = cli_flag_table();
  struct strbuf sb = STRBUF_INIT;
  strbuf_puts(&sb, "Global flags (anywhere on the line):\n");
  for (size_t i = 0; i < t->n_specs; i++) {
    const struct flag_spec *s = &t->specs[i];
    if (!(s->flags & FLAG_LISTED)) flag_put_help(s, cli_flag_env(s->name), &sb);
  }
  strbuf_puts(&sb, "  --help, -h\n      This text; after a command or group: its usage.\n"
                   "  --version\n      Print \"stokerctl VERSION\" and exit.\n");
  if (sb.buf) fputs(sb.buf, out);
  strbuf_release(&sb);
}

/* The verb flags cmd accepts, in the flag table's order. */
static void put_command_flags(const struct cli_command *cmd, FILE *out) {
  const struct flag_table *t = cli_flag_table();
  struct strbuf sb = STRBUF_INIT;
  for (size_t i = 0; i < t->n_specs; i++) {
    const struct flag_spec *s = &t->specs[i];
    if ((s->flags & FLAG_LISTED) && cli_command_takes(cmd, s->name)) {
      if (!sb.len) strbuf_puts(&sb, "\nFlags:\n");
      flag_put_help(s, NULL, &sb);
    }
  }
  if (sb.buf) fputs(sb.buf, out);
  strbuf_release(&sb);
}

void cli_help_global(const struct cli_command *cmds, size_t n, FILE *out) {
  fputs("usage: stokerctl [GLOBAL FLAGS] COMMAND [ARGS] [FLAGS]\n"
        "       stokerctl COMMAND --help     one command's or group's usage and flags\n\n"
        "Commands:\n",
        out);
  for (size_t i = 0; i < n; i++) put_row(&cmds[i], out);
  fputs("\n", out);
  put_global_flags(out);
  fprintf(out, "\n%s", exit_codes);
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
  put_command_flags(cmd, out);
  if (cmd->details) fprintf(out, "\n%s", cmd->details);
  fputs("\nGlobal flags (addresses, --json, --timeout, TLS): see \"stokerctl --help\".\n", out);
}
