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

static const char *command_name(const struct cli_command *cmd, char *buf, size_t len) {
  snprintf(buf, len, "%s%s%s", cmd->words[0], cmd->words[1] ? " " : "",
           cmd->words[1] ? cmd->words[1] : "");
  return buf;
}

/* Each command's help has one row per flag it accepts, and no other. */
static void test_command_help_lists_its_flags(void **state) {
  (void)state;
  const struct flag_table *t = cli_flag_table();
  size_t n;
  const struct cli_command *cmds = cli_commands(&n);
  for (size_t c = 0; c < n; c++) {
    char name[64], rows[64][64];
    char *help = capture(cli_help_command, &cmds[c]);
    size_t n_rows = row_names(help, rows, 64);
    size_t n_taken = 0;
    for (size_t i = 0; i < t->n_specs; i++) {
      const struct flag_spec *s = &t->specs[i];
      if (!(s->flags & FLAG_LISTED) || !cli_command_takes(&cmds[c], s->name)) continue;
      n_taken++;
      if (!in(rows, n_rows, s->name))
        fail_msg("%s --help has no row for --%s:\n%s", command_name(&cmds[c], name, 64), s->name,
                 help);
    }
    if (n_rows != n_taken)
      fail_msg("%s --help has %zu flag rows, the command takes %zu:\n%s",
               command_name(&cmds[c], name, 64), n_rows, n_taken, help);
    free(help);
  }
}

/* Every name in a command's flag list is a verb row of the flag table (so
 * the parser knows it, and help can describe it). */
static void test_command_flags_are_table_rows(void **state) {
  (void)state;
  const struct flag_table *t = cli_flag_table();
  size_t n;
  const struct cli_command *cmds = cli_commands(&n);
  for (size_t c = 0; c < n; c++) {
    char list[512], name[64];
    snprintf(list, sizeof(list), "%s", cmds[c].flags);
    for (char *save = NULL, *w = strtok_r(list, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
      const struct flag_spec *s = flag_find(t, w, strlen(w));
      if (!s || !(s->flags & FLAG_LISTED))
        fail_msg("%s takes --%s, which is no verb row of the flag table",
                 command_name(&cmds[c], name, 64), w);
    }
  }
}

/* A "--NAME" in a command's usage line or notes is a flag it accepts or a
 * global one. */
static void test_usage_names_only_accepted_flags(void **state) {
  (void)state;
  const struct flag_table *t = cli_flag_table();
  size_t n;
  const struct cli_command *cmds = cli_commands(&n);
  for (size_t c = 0; c < n; c++) {
    const char *texts[] = {cmds[c].synopsis, cmds[c].summary, cmds[c].details};
    for (size_t k = 0; k < 3; k++) {
      for (const char *p = texts[k]; p && (p = strstr(p, "--")) != NULL;) {
        p += 2;
        size_t len = strspn(p, "abcdefghijklmnopqrstuvwxyz-");
        char flag[64], name[64];
        snprintf(flag, sizeof(flag), "%.*s", (int)len, p);
        const struct flag_spec *s = flag_find(t, flag, len);
        bool ok = s && (!(s->flags & FLAG_LISTED) || cli_command_takes(&cmds[c], flag));
        if (!ok)
          fail_msg("%s's usage names --%s, which it does not take",
                   command_name(&cmds[c], name, 64), flag);
      }
    }
  }
}

/* The global help: every stored row, with its kind, default and
 * environment variable, and no verb row. */
static void test_global_help_lists_global_flags(void **state) {
  (void)state;
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
  assert_non_null(strstr(help, "  --timeout DURATION\n"));
  assert_non_null(strstr(help, "(duration, default 10s, range [1ms, 1d])"));
  assert_non_null(strstr(help, "(string, env STOKER_COORDINATOR)"));
  assert_non_null(strstr(help, "Exit codes:"));
  free(help);
}

/* Kinds and defaults come from the rows; lines fit in 100 columns. */
static void test_kinds_defaults_width(void **state) {
  (void)state;
  size_t n;
  const struct cli_command *cmds = cli_commands(&n);
  for (size_t c = 0; c <= n; c++) {
    char *help = c < n ? capture(cli_help_command, &cmds[c]) : capture(put_global, NULL);
    for (const char *p = help; *p;) {
      size_t len = strcspn(p, "\n");
      if (len > 100) fail_msg("line over 100 columns: %.*s", (int)len, p);
      p += len + (p[len] == '\n');
    }
    if (c < n && strcmp(cmds[c].words[0], "job") == 0 && strcmp(cmds[c].words[1], "create") == 0) {
      assert_non_null(strstr(help, "  --min INTEGER\n"));
      assert_non_null(strstr(help, "  --heartbeat DURATION\n"));
      assert_non_null(strstr(help, "(duration, default 5s)"));
      assert_non_null(strstr(help, "  --label STRING\n"));
    }
    free(help);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_command_help_lists_its_flags),
      cmocka_unit_test(test_command_flags_are_table_rows),
      cmocka_unit_test(test_usage_names_only_accepted_flags),
      cmocka_unit_test(test_global_help_lists_global_flags),
      cmocka_unit_test(test_kinds_defaults_width),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
