/*
 * stokerctl's usage texts against the tables that parse its command line:
 * each command's --help lists exactly the flags the command accepts (every
 * one a row of the flag table, so parsed and described by the same row),
 * with their kinds and defaults; the global --help lists every global flag;
 * and no usage line or note names a flag the command would refuse.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli_args.h"
#include "cli_help.h"

/* text printed by put(cmd) into a malloc'd string. */
static char *capture(void (*put)(const struct cli_command *cmd, FILE *out),
                     const struct cli_command *cmd) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  assert_non_null(f);
  put(cmd, f);
  fclose(f);
  return buf;
}

static void put_global(const struct cli_command *cmd, FILE *out) {
  (void)cmd;
  size_t n;
  const struct cli_command *cmds = cli_commands(&n);
  cli_help_global(cmds, n, out);
}

/* The flag names of help's rows: lines starting "  --NAME" (then " ", "," or the end). */
static size_t row_names(const char *help, char names[][64], size_t max) {
  size_t n = 0;
  for (const char *p = help; p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
    if (strncmp(p, "  --", 4) != 0) continue;
    size_t len = strcspn(p + 4, " ,\n");
    assert_true(len < 64 && n < max);
    memcpy(names[n], p + 4, len);
    names[n++][len] = '\0';
  }
  return n;
}

static bool in(char names[][64], size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(names[i], name) == 0) return true;
  return false;
}

/* "job show", for failure messages. */
static const char *name_of(const struct cli_command *cmd) {
  static char buf[64];
  snprintf(buf, sizeof(buf), "%s%s%s", cmd->words[0], cmd->words[1] ? " " : "",
           cmd->words[1] ? cmd->words[1] : "");
  return buf;
}

/* cmd's help has one row per flag it accepts, and no other. */
static void check_help_rows(const struct cli_command *cmd, const struct flag_table *t) {
  char rows[64][64];
  char *help = capture(cli_help_command, cmd);
  size_t n_rows = row_names(help, rows, 64), n_taken = 0;
  for (size_t i = 0; i < t->n_specs; i++) {
    const struct flag_spec *s = &t->specs[i];
    if (!(s->flags & FLAG_LISTED) || !cli_command_takes(cmd, s->name)) continue;
    n_taken++;
    if (!in(rows, n_rows, s->name))
      fail_msg("%s --help has no row for --%s:\n%s", name_of(cmd), s->name, help);
  }
  if (n_rows != n_taken)
    fail_msg("%s --help has %zu flag rows, the command takes %zu:\n%s", name_of(cmd), n_rows,
             n_taken, help);
  free(help);
}

/* Every name in cmd's flag list is a verb row of the flag table (so the
 * parser knows it, and help can describe it). */
static void check_flags_are_rows(const struct cli_command *cmd, const struct flag_table *t) {
  char list[512];
  snprintf(list, sizeof(list), "%s", cmd->flags);
  for (char *save = NULL, *w = strtok_r(list, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
    const struct flag_spec *s = flag_find(t, w, strlen(w));
    if (!s || !(s->flags & FLAG_LISTED))
      fail_msg("%s takes --%s, which is no verb row of the flag table", name_of(cmd), w);
  }
}

/* A "--NAME" in cmd's usage line, summary or notes is a flag it accepts or
 * a global one. */
static void check_usage_names(const struct cli_command *cmd, const struct flag_table *t) {
  const char *texts[] = {cmd->synopsis, cmd->summary, cmd->details};
  for (size_t k = 0; k < 3; k++) {
    for (const char *p = texts[k]; p && (p = strstr(p, "--")) != NULL;) {
      p += 2;
      size_t len = strspn(p, "abcdefghijklmnopqrstuvwxyz-");
      if (len == 0) continue; /* "-- ARGS": the end of the flags. */
      const struct flag_spec *s = flag_find(t, p, len);
      if (!s || ((s->flags & FLAG_LISTED) && !cli_command_takes(cmd, s->name)))
        fail_msg("%s's usage names --%.*s, which it does not take", name_of(cmd), (int)len, p);
    }
  }
}

/* No line of help is over 100 columns. */
static void check_width(const char *help) {
  for (const char *p = help; *p;) {
    size_t len = strcspn(p, "\n");
    if (len > 100) fail_msg("line over 100 columns: %.*s", (int)len, p);
    p += len + (p[len] == '\n');
  }
}

static void check_command_width(const struct cli_command *cmd, const struct flag_table *t) {
  (void)t;
  char *help = capture(cli_help_command, cmd);
  check_width(help);
  free(help);
}

/* A check of one command, run on every row of the command table by
 * test_each_command (the test's state). */
struct command_check {
  void (*check)(const struct cli_command *cmd, const struct flag_table *t);
};

static void test_each_command(void **state) {
  const struct command_check *c = *state;
  size_t n;
  const struct cli_command *cmds = cli_commands(&n);
  for (size_t i = 0; i < n; i++) c->check(&cmds[i], cli_flag_table());
}

static void test_global_help_width(void **state) {
  (void)state;
  char *help = capture(put_global, NULL);
  check_width(help);
  free(help);
}

/* The global help: every stored row, with its kind, default and
 * environment variable, and no verb row. */
static void test_global_help_lists_global_flags(void **state) {
  (void)state;
  static const char *const wants[] = {
      "  --timeout DURATION\n",
      "(duration, default 10s, range [1ms, 1d])",
      "(string, env STOKER_COORDINATOR)",
      "\nExit codes:\n",
  };
  const struct flag_table *t = cli_flag_table();
  char rows[64][64];
  char *help = capture(put_global, NULL);
  size_t n_rows = row_names(help, rows, 64);
  for (size_t i = 0; i < t->n_specs; i++) {
    const struct flag_spec *s = &t->specs[i];
    bool listed = s->flags & FLAG_LISTED;
    if (listed == in(rows, n_rows, s->name))
      fail_msg("--%s is %s the global help:\n%s", s->name, listed ? "in" : "missing from", help);
  }
  assert_true(in(rows, n_rows, "help") && in(rows, n_rows, "version"));
  for (size_t i = 0; i < sizeof(wants) / sizeof(wants[0]); i++)
    if (!strstr(help, wants[i])) fail_msg("no \"%s\" in the global help:\n%s", wants[i], help);
  free(help);
}

int main(void) {
  static struct command_check help_rows = {check_help_rows},
                              flags_are_rows = {check_flags_are_rows},
                              usage_names = {check_usage_names}, width = {check_command_width};
  const struct CMUnitTest tests[] = {
      {"command_help_lists_its_flags", test_each_command, NULL, NULL, &help_rows},
      {"command_flags_are_table_rows", test_each_command, NULL, NULL, &flags_are_rows},
      {"usage_names_only_accepted_flags", test_each_command, NULL, NULL, &usage_names},
      {"command_help_fits_100_columns", test_each_command, NULL, NULL, &width},
      cmocka_unit_test(test_global_help_width),
      cmocka_unit_test(test_global_help_lists_global_flags),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
