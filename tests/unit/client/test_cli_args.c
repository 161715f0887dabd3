/*
 * stokerctl's command line: flags anywhere, --x=v and --x v, unknown and
 * incomplete flags refused, environment fallbacks, durations, labels, the
 * job spec built from `job create` flags, and the exit code table.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cli_args.h"
#include "cli_format.h"
#include "cli_spec.h"
#include "stk_error.h"

/* Parses a NULL-terminated word list (argv[0] is added). */
static int parse(struct cli_args *a, char *err, const char *first, ...) {
  static char *argv[64];
  int argc = 0;
  argv[argc++] = "stokerctl";
  va_list ap;
  va_start(ap, first);
  for (const char *w = first; w; w = va_arg(ap, const char *)) argv[argc++] = (char *)w;
  va_end(ap);
  return cli_parse(argc, argv, a, err, 256);
}

static void test_flags_anywhere(void **state) {
  struct cli_args a;
  char err[256];
  assert_int_equal(parse(&a, err, "job", "--json", "create", "x", "--min", "2", "--max=4",
                         "--coordinator", "h:1", "--timeout=2s", NULL),
                   0);
  assert_int_equal(a.n_pos, 3);
  assert_string_equal(a.pos[0], "job");
  assert_string_equal(a.pos[1], "create");
  assert_string_equal(a.pos[2], "x");
  assert_true(a.json);
  assert_string_equal(a.coordinator, "h:1");
  assert_int_equal(a.timeout_ms, 2000);
  assert_string_equal(cli_flag_value(&a, "min"), "2");
  assert_string_equal(cli_flag_value(&a, "max"), "4");
  assert_false(cli_flag_set(&a, "force"));
  /* Global switches take the shared parser's forms. */
  assert_int_equal(parse(&a, err, "health", "--json", "--no-json", NULL), 0);
  assert_false(a.json);
  assert_int_equal(parse(&a, err, "health", "--json=true", NULL), 0);
  assert_true(a.json);
}

static void test_repeated_and_switches(void **state) {
  struct cli_args a;
  char err[256];
  assert_int_equal(parse(&a, err, "jobs", "list", "--label", "a=1", "--label=b=2", "--force", NULL),
                   0);
  assert_int_equal(a.n_flags, 3);
  assert_string_equal(a.flags[0].value, "a=1");
  assert_string_equal(a.flags[1].value, "b=2");
  assert_string_equal(cli_flag_value(&a, "label"), "b=2"); /* The last one. */
  assert_true(cli_flag_set(&a, "force"));
  assert_null(a.flags[2].value);
  assert_int_equal(a.timeout_ms, CLI_DEFAULT_TIMEOUT_MS);
}

static void test_bad_flags(void **state) {
  struct cli_args a;
  char err[256];
  assert_int_equal(parse(&a, err, "health", "--colour", NULL), STK_EINVAL);
  assert_non_null(strstr(err, "unknown flag --colour"));
  assert_int_equal(parse(&a, err, "job", "show", "x", "--coordinator", NULL), STK_EINVAL);
  assert_non_null(strstr(err, "--coordinator: missing value"));
  assert_int_equal(parse(&a, err, "job", "delete", "x", "--force=yes", NULL), STK_EINVAL);
  assert_int_equal(parse(&a, err, "health", "--timeout", "soon", NULL), STK_EINVAL);
  assert_non_null(strstr(err, "--timeout"));
  assert_int_equal(parse(&a, err, "health", "--timeout", "0", NULL), STK_EINVAL);
  assert_int_equal(parse(&a, err, "health", "--timeout", "25h", NULL), STK_EINVAL);
  assert_string_equal(err, "--timeout: 25h is out of range [1ms, 1d]");
  /* After "--", words that look like flags are operands. */
  assert_int_equal(parse(&a, err, "job", "show", "--", "--odd", NULL), 0);
  assert_string_equal(a.pos[2], "--odd");
}

static const char *fake_env(const char *name) {
  if (strcmp(name, "STOKER_COORDINATOR") == 0) return "env-coord:1";
  if (strcmp(name, "STOKER_DATALOADER") == 0) return "env-dl:2";
  if (strcmp(name, "STOKER_TOKEN_FILE") == 0) return "/tmp/tok";
  if (strcmp(name, "STOKER_TLS_CA") == 0) return "/tmp/ca.pem";
  return NULL;
}

static const char *empty_env(const char *name) {
  return NULL;
}

static void test_env(void **state) {
  struct cli_args a;
  char err[256];
  assert_int_equal(parse(&a, err, "health", NULL), 0);
  cli_apply_env(&a, fake_env);
  assert_string_equal(a.coordinator, "env-coord:1");
  assert_string_equal(a.dataloader, "env-dl:2");
  assert_null(a.checkpoint);
  assert_string_equal(a.token_file, "/tmp/tok");
  assert_string_equal(a.tls_ca, "/tmp/ca.pem");
  /* Flags win over the environment. */
  assert_int_equal(parse(&a, err, "health", "--coordinator", "flag:3", NULL), 0);
  cli_apply_env(&a, fake_env);
  assert_string_equal(a.coordinator, "flag:3");
  /* Neither: the default. */
  assert_int_equal(parse(&a, err, "health", NULL), 0);
  cli_apply_env(&a, empty_env);
  assert_string_equal(a.coordinator, CLI_DEFAULT_COORDINATOR);
  assert_null(a.dataloader);
}

/* What fmt_duration_ms writes, flag_parse_duration_ms reads back. */
static void test_duration_round_trip(void **state) {
  static const int64_t values[] = {0, 1, 250, 1000, 5000, 59000, 60000, 90000, 600000, 3661000};
  for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
    char buf[32];
    int64_t back = -1;
    fmt_duration_ms(values[i], buf, sizeof(buf));
    assert_int_equal(flag_parse_duration_ms(buf, &back), 0);
    assert_int_equal(back, values[i]);
  }
  char buf[32];
  fmt_duration_ms(90000, buf, sizeof(buf));
  assert_string_equal(buf, "1m30s");
  fmt_duration_ms(0, buf, sizeof(buf));
  assert_string_equal(buf, "0s");
  fmt_duration_ms(1500, buf, sizeof(buf));
  assert_string_equal(buf, "1500ms");
}

static void test_numbers_and_labels(void **state) {
  char k[8], val[8];
  assert_int_equal(cli_split_label("team=ml=x", k, sizeof(k), val, sizeof(val)), 0);
  assert_string_equal(k, "team");
  assert_string_equal(val, "ml=x");
  assert_int_equal(cli_split_label("k=", k, sizeof(k), val, sizeof(val)), 0);
  assert_string_equal(val, "");
  assert_int_equal(cli_split_label("=v", k, sizeof(k), val, sizeof(val)), STK_EINVAL);
  assert_int_equal(cli_split_label("novalue", k, sizeof(k), val, sizeof(val)), STK_EINVAL);
  assert_int_equal(cli_split_label("muchtoolong=v", k, sizeof(k), val, sizeof(val)), STK_EINVAL);
}

static void test_spec(void **state) {
  struct cli_args a;
  char err[256];
  static struct cli_spec s;
  assert_int_equal(parse(&a, err, "job", "create", "gpt", "--min", "2", "--max", "8", "--heartbeat",
                         "2s", "--misses", "4", "--last-call", "1m", "--join-timeout", "10m",
                         "--label", "team=ml", "--label", "tier=a", "--dataset", "file:///d",
                         "--checkpoint-storage", "s3://b/p", "--checkpoint-every", "500", NULL),
                   0);
  assert_int_equal(cli_spec_from_args(&a, "gpt", &s, err, sizeof(err)), 0);
  assert_string_equal(s.spec.name, "gpt");
  assert_int_equal(s.spec.min_ranks, 2);
  assert_int_equal(s.spec.max_ranks, 8);
  assert_int_equal(s.spec.heartbeat_interval_ms, 2000);
  assert_int_equal(s.spec.heartbeat_misses, 4);
  assert_int_equal(s.spec.last_call_ms, 60000);
  assert_int_equal(s.spec.join_timeout_ms, 600000);
  assert_int_equal(s.spec.n_labels, 2);
  assert_string_equal(s.spec.labels[1]->key, "tier");
  assert_string_equal(s.spec.labels[1]->value, "a");
  assert_string_equal(s.spec.dataset->uri, "file:///d");
  assert_string_equal(s.spec.checkpoint_storage->uri, "s3://b/p");
  assert_int_equal(s.spec.checkpoint_every_steps, 500);
  /* The spec packs: every pointer the message holds is valid. */
  assert_true(protobuf_c_message_get_packed_size(&s.spec.base) > 0);
}

static void test_spec_errors(void **state) {
  struct cli_args a;
  char err[256];
  static struct cli_spec s;
  assert_int_equal(parse(&a, err, "job", "create", "x", "--max", "2", NULL), 0);
  assert_int_equal(cli_spec_from_args(&a, "x", &s, err, sizeof(err)), STK_EINVAL);
  assert_non_null(strstr(err, "--min N is required"));
  assert_int_equal(parse(&a, err, "job", "create", "x", "--min", "3", "--max", "2", NULL), 0);
  assert_int_equal(cli_spec_from_args(&a, "x", &s, err, sizeof(err)), STK_EINVAL);
  /* A duration without its unit is refused as the line is parsed (the
   * flag row is a duration), naming the flag. */
  assert_int_equal(
      parse(&a, err, "job", "create", "x", "--min", "1", "--max", "2", "--heartbeat", "5", NULL),
      STK_EINVAL);
  assert_non_null(strstr(err, "--heartbeat"));
  assert_int_equal(
      parse(&a, err, "job", "create", "x", "--min", "1", "--max", "2", "--label", "k", NULL), 0);
  assert_int_equal(cli_spec_from_args(&a, "x", &s, err, sizeof(err)), STK_EINVAL);
  assert_non_null(strstr(err, "KEY=VALUE"));
}

/* job submit: the words after the first "--" are the trainer's, flags
 * among them too; --template is required; queue and priority optional. */
static void test_submission(void **state) {
  struct cli_args a;
  static struct cli_spec s;
  char err[256];
  assert_int_equal(parse(&a, err, "job", "submit", "llm-7b", "--template", "llm", "--min", "2",
                         "--max", "4", "--queue", "team-a", "--", "--lr", "3e-4", "--", "x", NULL),
                   0);
  assert_int_equal(a.dashdash, 3);
  assert_int_equal(a.n_pos, 7);
  assert_null(cli_flag_value(&a, "lr")); /* Not parsed as a flag. */
  assert_int_equal(cli_spec_from_args(&a, "llm-7b", &s, err, sizeof(err)), 0);
  assert_int_equal(cli_submission_from_args(&a, a.pos + 3, a.n_pos - 3, &s, err, sizeof(err)), 0);
  assert_ptr_equal(s.spec.submission, &s.submission);
  assert_string_equal(s.submission.template_, "llm");
  assert_string_equal(s.submission.queue, "team-a");
  assert_string_equal(s.submission.priority, "");
  assert_int_equal(s.submission.n_args, 4);
  assert_string_equal(s.submission.args[0], "--lr");
  assert_string_equal(s.submission.args[2], "--");
  assert_int_equal(s.spec.max_ranks, 4);
  /* Without --template: a usage error naming it. */
  assert_int_equal(parse(&a, err, "job", "submit", "x", "--min", "1", "--max", "1", NULL), 0);
  assert_int_equal(a.dashdash, -1);
  assert_int_equal(cli_submission_from_args(&a, NULL, 0, &s, err, sizeof(err)), STK_EINVAL);
  assert_non_null(strstr(err, "--template"));
  /* Up to 64 trainer arguments fit on the command line. */
  const char *argv[80] = {"stokerctl", "job", "submit", "x", "--"};
  for (int i = 5; i < 69; i++) argv[i] = "--flag";
  assert_int_equal(cli_parse(69, (char **)argv, &a, err, sizeof(err)), 0);
  assert_int_equal(a.n_pos - a.dashdash, 64);
}

static void test_exit_codes(void **state) {
  assert_int_equal(cli_exit_code(0), 0);
  assert_int_equal(cli_exit_code(STK_EINVAL), 1);
  assert_int_equal(cli_exit_code(STK_ENOENT), 2);
  assert_int_equal(cli_exit_code(STK_ESTATE), 3);
  assert_int_equal(cli_exit_code(STK_EEXIST), 3);
  assert_int_equal(cli_exit_code(STK_EUNAVAIL), 4);
  assert_int_equal(cli_exit_code(STK_ETIMEDOUT), 4);
  assert_int_equal(cli_exit_code(STK_EUNAUTH), 5);
  assert_int_equal(cli_exit_code(STK_EPERM), 5);
  assert_int_equal(cli_exit_code(STK_EINTERNAL), 6);
  /* Every gRPC status lands on a documented code. */
  for (int code = 1; code <= 16; code++) {
    int rc = cli_exit_code(stk_error_from_grpc(code));
    assert_true(rc >= 1 && rc <= 6);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_flags_anywhere),
      cmocka_unit_test(test_repeated_and_switches),
      cmocka_unit_test(test_bad_flags),
      cmocka_unit_test(test_env),
      cmocka_unit_test(test_duration_round_trip),
      cmocka_unit_test(test_numbers_and_labels),
      cmocka_unit_test(test_spec),
      cmocka_unit_test(test_spec_errors),
      cmocka_unit_test(test_submission),
      cmocka_unit_test(test_exit_codes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
