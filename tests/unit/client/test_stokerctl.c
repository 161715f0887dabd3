/*
 * The stokerctl binary against the scripted coordinator: exit codes from
 * the --help table, the one-line error format on stderr, JSON output that
 * parses, a watch that ends when the job's stream does, and health. The
 * binary's path comes as argv[1] (meson passes it).
 */
#include <cjson/cJSON.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cli_run.h"

#include "fake_coord.h"

static const char *stokerctl;
static struct fake_coord fake;

/* Runs stokerctl with args (a shell fragment) against the fake. */
static void run(struct cli_run *r, const char *args) {
  char env[256];
  snprintf(env, sizeof(env), "STOKER_COORDINATOR=%s", fake.server.addr);
  cli_run(r, env, stokerctl, args);
}

static int setup(void **state) {
  cli_run_init("stokerctl-test");
  fake_start(&fake);
  return 0;
}

static int teardown(void **state) {
  fake_stop(&fake);
  cli_run_cleanup();
  return 0;
}

static void test_not_found_line(void **state) {
  static struct cli_run r;
  run(&r, "job show nope");
  assert_int_equal(r.rc, 2);
  assert_string_equal(r.err, "stokerctl: job show: no job named \"nope\" (NOT_FOUND)\n");
  assert_string_equal(r.out, "");
}

static void test_show_json(void **state) {
  static struct cli_run r;
  run(&r, "--json job show x");
  assert_int_equal(r.rc, 0);
  cJSON *o = cJSON_Parse(r.out);
  assert_non_null(o);
  assert_string_equal(cJSON_GetObjectItem(o, "name")->valuestring, "x");
  assert_string_equal(cJSON_GetObjectItem(o, "state")->valuestring, "RUNNING");
  cJSON_Delete(o);
  run(&r, "job show x");
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "RUNNING"));
  assert_non_null(strstr(r.out, "Members (0)"));
}

static void test_watch_until_end(void **state) {
  static struct cli_run r;
  run(&r, "job watch x --after 1");
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "2  -  MEMBER_JOINED"));
  assert_non_null(strstr(r.out, "3  -  DELETED"));
  assert_null(strstr(r.out, "\n1  "));
  run(&r, "job watch x --json");
  assert_int_equal(r.rc, 0);
  int lines = 0;
  for (char *p = r.out; (p = strchr(p, '\n')); p++) lines++;
  assert_int_equal(lines, 3);
}

/* One line per service given: SERVICE ADDRESS STATUS DETAIL; a service
 * that does not answer is "unreachable" with the reason, and fails the
 * whole check. --json: one object per service, "error" only on failure. */
static void test_health(void **state) {
  static struct cli_run r;
  run(&r, "health");
  assert_int_equal(r.rc, 0);
  char want[256];
  snprintf(want, sizeof(want), "coordinator  %s  SERVING  -\n", fake.server.addr);
  assert_non_null(strstr(r.out, "SERVICE      ADDRESS"));
  assert_non_null(strstr(r.out, want));
  run(&r, "health --dataloader 127.0.0.1:1 --checkpoint 127.0.0.1:1 --timeout 2s");
  assert_int_equal(r.rc, 4);
  assert_non_null(strstr(r.out, "\ndataloader   127.0.0.1:1 "));
  assert_non_null(strstr(r.out, "\ncheckpoint   127.0.0.1:1 "));
  int unreachable = 0;
  for (char *p = r.out; (p = strstr(p, " unreachable ")); p++) unreachable++;
  assert_int_equal(unreachable, 2);
  run(&r, "--json health --dataloader 127.0.0.1:1 --timeout 2s");
  assert_int_equal(r.rc, 4);
  char *nl = strchr(r.out, '\n');
  assert_non_null(nl);
  *nl = '\0';
  cJSON *co = cJSON_Parse(r.out), *dl = cJSON_Parse(nl + 1);
  assert_non_null(co);
  assert_non_null(dl);
  assert_string_equal(cJSON_GetObjectItem(co, "service")->valuestring, "coordinator");
  assert_string_equal(cJSON_GetObjectItem(co, "address")->valuestring, fake.server.addr);
  assert_string_equal(cJSON_GetObjectItem(co, "status")->valuestring, "SERVING");
  assert_null(cJSON_GetObjectItem(co, "error"));
  assert_string_equal(cJSON_GetObjectItem(dl, "service")->valuestring, "dataloader");
  assert_string_equal(cJSON_GetObjectItem(dl, "status")->valuestring, "unreachable");
  assert_non_null(cJSON_GetObjectItem(dl, "error"));
  cJSON_Delete(co);
  cJSON_Delete(dl);
}

static void test_exit_codes(void **state) {
  static struct cli_run r;
  run(&r, "job frobnicate x");
  assert_int_equal(r.rc, 1);
  assert_non_null(strstr(r.err, "unknown command"));
  run(&r, "job show");
  assert_int_equal(r.rc, 1);
  run(&r, "job show x --force");
  assert_int_equal(r.rc, 1);
  assert_non_null(strstr(r.err, "--force does not apply"));
  run(&r, "job create y --max 2");
  assert_int_equal(r.rc, 1);
  assert_non_null(strstr(r.err, "--min N is required"));
  run(&r, "job delete x"); /* The fake has no DeleteJob. */
  assert_int_equal(r.rc, 6);
  assert_non_null(strstr(r.err, "(UNIMPLEMENTED)"));
  run(&r, "--coordinator 127.0.0.1:1 --timeout 1s jobs list");
  assert_int_equal(r.rc, 4);
  assert_non_null(strstr(r.err, "stokerctl: jobs list: "));
  run(&r, "--help");
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "Exit codes:"));
}

/* --help after a command prints that command's usage; after a group, the
 * group's subcommands; a bare group lists them on stderr, exit 1. */
static void test_help_per_command(void **state) {
  static struct cli_run r;
  run(&r, "checkpoint list --help");
  assert_int_equal(r.rc, 0);
  assert_string_equal(r.err, "");
  assert_true(strncmp(r.out, "usage: stokerctl [GLOBAL FLAGS] checkpoint list JOB\n", 52) == 0);
  assert_non_null(strstr(r.out, "committed checkpoints of a job"));
  assert_null(strstr(r.out, "job create"));
  run(&r, "job create --help"); /* No operands needed with --help. */
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "job create NAME --min N --max N"));
  assert_non_null(strstr(r.out, "--join-timeout DURATION"));
  assert_null(strstr(r.out, "Exit codes:"));
  run(&r, "job --help");
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "usage: stokerctl [GLOBAL FLAGS] job SUBCOMMAND"));
  assert_non_null(strstr(r.out, "  job show NAME "));
  assert_non_null(strstr(r.out, "  job delete NAME [--force] "));
  assert_null(strstr(r.out, "loader create"));
  assert_null(strstr(r.out, "jobs list"));
  run(&r, "loader --help");
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "  loader explain JOB STEP [--rank R --world W]"));
  assert_null(strstr(r.out, "job show"));
  run(&r, "health --help");
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "usage: stokerctl [GLOBAL FLAGS] health\n"));
  run(&r, "job");
  assert_int_equal(r.rc, 1);
  assert_string_equal(r.out, "");
  assert_non_null(strstr(r.err, "  job watch NAME [--after SEQ] "));
  run(&r, "job frobnicate x");
  assert_int_equal(r.rc, 1);
  assert_non_null(strstr(r.err, "unknown command \"job frobnicate\" (see stokerctl job --help)"));
  run(&r, "--help"); /* The global usage still lists every command. */
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "  checkpoint delete JOB STEP "));
  assert_non_null(strstr(r.out, "  jobs list [--label K=V]... "));
  assert_non_null(strstr(r.out, "Global flags"));
  assert_non_null(strstr(r.out, "  --timeout DURATION\n"));
}

/* One run of stokerctl and what it must answer: the exit code, and a text
 * found on stdout (exit 0) or stderr (otherwise, stdout then empty). */
struct expect {
  const char *args;
  int rc;
  const char *text;
};

static void check_all(const struct expect *e, size_t n) {
  static struct cli_run r;
  for (size_t i = 0; i < n; i++) {
    run(&r, e[i].args);
    if (r.rc != e[i].rc) fail_msg("stokerctl %s: exit %d, not %d", e[i].args, r.rc, e[i].rc);
    if (e[i].rc) assert_string_equal(r.out, "");
    if (!strstr(e[i].rc ? r.err : r.out, e[i].text))
      fail_msg("stokerctl %s: no \"%s\" in:\n%s%s", e[i].args, e[i].text, r.out, r.err);
  }
}

/* A command's help lists its flags with their kinds and defaults, from the
 * flag table; "help [COMMAND]" is "[COMMAND] --help". Unknown commands and
 * flags: one clear line on stderr, exit 1. */
static void test_help_forms_and_unknown_words(void **state) {
  static const struct expect e[] = {
      {"job create --help", 0, "\nFlags:\n  --label STRING\n"},
      {"job create --help", 0, "  --heartbeat DURATION\n"},
      {"job create --help", 0, "(duration, default 5s)"},
      {"job create --help", 0, "  --checkpoint-every INTEGER\n"},
      {"loader create --help", 0, "  --max-doc-tokens INTEGER\n"},
      {"checkpoint verify --help", 0, "  --progress\n"},
      {"help job scale", 0, "usage: stokerctl [GLOBAL FLAGS] job scale NAME N"},
      {"help job scale", 0, "  --skip-checkpoint\n"},
      {"help job scale", 0, "  --in-place\n"},
      {"help loader", 0, "  loader commit JOB STEP "},
      {"help", 0, "Exit codes:"},
      {"frobnicate", 1, "stokerctl: unknown command \"frobnicate\" (see stokerctl --help)\n"},
      {"help frobnicate", 1, "unknown command \"frobnicate\""},
      {"job show x --frob", 1, "stokerctl: unknown flag --frob (see stokerctl --help)\n"},
      {"job scale x 2 --force", 1, "job scale: --force does not apply here"},
      {"job create x --min 1 --max 2 --misses many", 1, "--misses"},
  };
  check_all(e, sizeof(e) / sizeof(e[0]));
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* A coordinator demanding a token: none or a wrong one exits 5; the right
 * one, from --token-file or STOKER_TOKEN_FILE, works. */
static void test_token(void **state) {
  static struct fake_coord secure;
  static struct cli_run r;
  char good[64], bad[64], args[512];
  snprintf(good, sizeof(good), "/tmp/stokerctl-test-%d.tok", (int)getpid());
  snprintf(bad, sizeof(bad), "/tmp/stokerctl-test-%d.bad", (int)getpid());
  write_file(good, "s3cret\n");
  write_file(bad, "guess\n");
  fake_start_auth(&secure, good);
  snprintf(args, sizeof(args), "--coordinator %s job show x", secure.server.addr);
  run(&r, args);
  assert_int_equal(r.rc, 5);
  assert_non_null(strstr(r.err, "(UNAUTHENTICATED)"));
  snprintf(args, sizeof(args), "--coordinator %s --token-file %s job show x", secure.server.addr,
           bad);
  run(&r, args);
  assert_int_equal(r.rc, 5);
  snprintf(args, sizeof(args), "--coordinator %s --token-file %s job show x", secure.server.addr,
           good);
  run(&r, args);
  assert_int_equal(r.rc, 0);
  snprintf(args, sizeof(args), "--coordinator %s job show x", secure.server.addr);
  setenv("STOKER_TOKEN_FILE", good, 1);
  run(&r, args);
  unsetenv("STOKER_TOKEN_FILE");
  assert_int_equal(r.rc, 0);
  fake_stop(&secure);
  unlink(good);
  unlink(bad);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PATH-TO-STOKERCTL\n", argv[0]);
    return 2;
  }
  stokerctl = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_not_found_line),  cmocka_unit_test(test_show_json),
      cmocka_unit_test(test_watch_until_end), cmocka_unit_test(test_health),
      cmocka_unit_test(test_exit_codes),      cmocka_unit_test(test_help_per_command),
      cmocka_unit_test(test_token),           cmocka_unit_test(test_help_forms_and_unknown_words),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
