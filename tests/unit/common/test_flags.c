/*
 * Tests for flags, the one command-line parser: both spellings of a value,
 * bools and --no-, whole bounded numbers of every type (durations with sums
 * and fractions, sizes), repeatable rows, listed rows kept in order,
 * positional words and "--", and one line naming the flag for an unknown
 * flag, a missing value or a bad number, with nothing stored.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "flags.h"
#include "stk_error.h"

struct topts {
  const char *job;
  char *roots;
  bool json;
  int layers;
  int64_t steps;
  uint64_t seed;
  float lr;
  int64_t timeout_ms;
  uint64_t budget_bytes;
  int precision;
};

static const char *const precisions[] = {"fp32", "bf16", NULL};

#define OFF(f) offsetof(struct topts, f)
static const struct flag_spec specs[] = {
    {"job", FLAG_ARG, OFF(job), NULL, 0, 0, NULL, "Job name.", 0},
    {"data-root", FLAG_STRING, OFF(roots), "/d", 0, 0, NULL, "A root.", FLAG_REPEAT},
    {"json", FLAG_BOOL, OFF(json), "false", 0, 0, NULL, "JSON output.", 0},
    {"layers", FLAG_INT, OFF(layers), "2", 1, 1024, NULL, "Layers.", 0},
    {"steps", FLAG_INT64, OFF(steps), "100", 0, 0, NULL, "Steps.", 0},
    {"seed", FLAG_UINT64, OFF(seed), "1234", 0, 0, NULL, "Seed.", 0},
    {"lr", FLAG_FLOAT, OFF(lr), "0.002", 0, 10, NULL, "Learning rate.", 0},
    {"timeout", FLAG_DURATION, OFF(timeout_ms), "10s", 1, 86400000, NULL, "Deadline.", 0},
    {"budget", FLAG_SIZE, OFF(budget_bytes), "1GiB", 0, 0, NULL, "Budget.", 0},
    {"precision", FLAG_ENUM, OFF(precision), NULL, 0, 0, precisions, "Precision.", 0},
    {"label", FLAG_ARG, 0, NULL, 0, 0, NULL, "A label.", FLAG_LISTED},
    {"force", FLAG_BOOL, 0, NULL, 0, 0, NULL, "Force.", FLAG_LISTED},
};
static const struct flag_table table = {"prog", "--job NAME", specs,
                                        sizeof(specs) / sizeof(specs[0]), "A program."};

static char err[256];
static const char *pos[4];
static struct flag_occurrence listed[4];
static struct flag_rest rest;

/* Defaults, then argv given as a NULL-terminated list after the program. */
static int parse(struct topts *o, ...) {
  static char *argv[32];
  int argc = 0;
  argv[argc++] = "prog";
  va_list ap;
  va_start(ap, o);
  for (char *a; (a = va_arg(ap, char *));) argv[argc++] = a;
  va_end(ap);
  memset(o, 0xab, sizeof(*o));
  rest = (struct flag_rest){.pos = pos, .max_pos = 4, .listed = listed, .max_listed = 4};
  err[0] = '\0';
  int rc = flag_defaults(&table, o, err, sizeof(err));
  assert_int_equal(rc, 0);
  return flag_parse(&table, o, argc, argv, &rest, err, sizeof(err));
}

static void test_defaults(void **state) {
  struct topts o;
  assert_int_equal(parse(&o, NULL), 0);
  assert_null(o.job);
  assert_string_equal(o.roots, "/d");
  assert_false(o.json);
  assert_int_equal(o.layers, 2);
  assert_int_equal(o.steps, 100);
  assert_int_equal(o.seed, 1234);
  assert_float_equal(o.lr, 0.002f, 1e-9);
  assert_int_equal(o.timeout_ms, 10000);
  assert_int_equal(o.budget_bytes, 1ull << 30);
  assert_int_equal(o.precision, 0);
  flag_free(&table, &o);
}

static void test_both_spellings(void **state) {
  struct topts o;
  assert_int_equal(parse(&o, "--job", "j", "--layers=8", "--steps", "-3",
                         "--seed=18446744073709551615", "--lr", "1e-3", "--timeout=1m30s",
                         "--budget", "3GiB", "--precision", "bf16", "--json", NULL),
                   0);
  assert_string_equal(o.job, "j");
  assert_int_equal(o.layers, 8);
  assert_int_equal(o.steps, -3);
  assert_true(o.seed == UINT64_MAX);
  assert_float_equal(o.lr, 1e-3f, 1e-9);
  assert_int_equal(o.timeout_ms, 90000);
  assert_int_equal(o.budget_bytes, 3ull << 30);
  assert_int_equal(o.precision, 1);
  assert_true(o.json);
  flag_free(&table, &o);
  assert_int_equal(parse(&o, "--json", "--no-json", NULL), 0);
  assert_false(o.json);
  flag_free(&table, &o);
  assert_int_equal(parse(&o, "--json=yes", NULL), 0);
  assert_true(o.json);
  flag_free(&table, &o);
}

static void test_durations(void **state) {
  static const struct {
    const char *text;
    int64_t ms;
  } good[] = {{"0", 0},         {"250ms", 250},   {"5s", 5000},   {"10m", 600000},
              {"2h", 7200000},  {"1m30s", 90000}, {"1.5s", 1500}, {"1h1m1s", 3661000},
              {"1d", 86400000}, {"0.0005s", 1}};
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
    int64_t ms = -1;
    assert_int_equal(flag_parse_duration_ms(good[i].text, &ms), 0);
    assert_int_equal(ms, good[i].ms);
  }
  static const char *const bad[] = {"",     "5",   "s",   "-1s", "5x",     "1.s",
                                    "1m30", " 5s", ".5s", "5s3", "1.2.3s", "5 s"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    int64_t ms = 7;
    assert_int_equal(flag_parse_duration_ms(bad[i], &ms), STK_EINVAL);
    assert_int_equal(ms, 7);
  }
  int64_t ms;
  assert_int_equal(flag_parse_duration_ms("9999999999999999d", &ms), STK_ERANGE);
}

static void test_uint(void **state) {
  uint64_t v = 0;
  assert_int_equal(flag_parse_uint("42", 100, &v), 0);
  assert_int_equal(v, 42);
  assert_int_equal(flag_parse_uint("101", 100, &v), STK_ERANGE);
  assert_int_equal(flag_parse_uint("4x", 100, &v), STK_EINVAL);
  assert_int_equal(flag_parse_uint("-1", 100, &v), STK_EINVAL);
  assert_int_equal(flag_parse_uint("99999999999999999999", UINT64_MAX, &v), STK_EINVAL);
  assert_int_equal(v, 42);
}

/* Each bad line: the message, and the field left at its default. */
static void expect_error(const char *want, ...) {
  static char *argv[8];
  int argc = 0;
  argv[argc++] = "prog";
  va_list ap;
  va_start(ap, want);
  for (char *a; (a = va_arg(ap, char *));) argv[argc++] = a;
  va_end(ap);
  struct topts o;
  assert_int_equal(flag_defaults(&table, &o, err, sizeof(err)), 0);
  rest = (struct flag_rest){.pos = pos, .max_pos = 4, .listed = listed, .max_listed = 4};
  assert_int_equal(flag_parse(&table, &o, argc, argv, &rest, err, sizeof(err)), STK_EINVAL);
  assert_string_equal(err, want);
  assert_int_equal(o.layers, 2);
  assert_int_equal(o.steps, 100);
  flag_free(&table, &o);
}

static void test_errors_name_the_flag(void **state) {
  expect_error("unknown flag --stepz (see --help)", "--stepz", "10", NULL);
  expect_error("unknown flag --no-layers (see --help)", "--no-layers", NULL);
  expect_error("--steps: missing value", "--steps", NULL);
  expect_error("--steps: expected an integer, got '10x'", "--steps", "10x", NULL);
  expect_error("--steps: expected an integer, got ''", "--steps=", NULL);
  expect_error("--steps: expected an integer, got '99999999999999999999'", "--steps",
               "99999999999999999999", NULL);
  expect_error("--layers: 0 is out of range [1, 1024]", "--layers", "0", NULL);
  expect_error("--layers: expected an integer, got '4294967297'", "--layers", "4294967297", NULL);
  expect_error("--lr: -1 is out of range [0, 10]", "--lr", "-1", NULL);
  expect_error("--lr: expected a number, got 'fast'", "--lr", "fast", NULL);
  expect_error("--timeout: 0 is out of range [1ms, 1d]", "--timeout", "0", NULL);
  expect_error("--budget: expected a size like 64KiB, got '3 GiB'", "--budget", "3 GiB", NULL);
  expect_error("--precision: expected one of fp32, bf16, got 'fp8'", "--precision", "fp8", NULL);
  expect_error("--json: expected true or false, got 'maybe'", "--json=maybe", NULL);
  expect_error("--force takes no value", "--force=yes", NULL);
}

static void test_repeat_listed_positional(void **state) {
  struct topts o;
  assert_int_equal(parse(&o, "run", "--data-root", "/a", "--label", "x=1", "--data-root=/b",
                         "--force", "--label=y=2", "--", "--odd", NULL),
                   0);
  assert_string_equal(o.roots, "/a:/b");
  assert_int_equal(rest.n_pos, 2);
  assert_string_equal(pos[0], "run");
  assert_string_equal(pos[1], "--odd");
  assert_int_equal(rest.n_listed, 3);
  assert_string_equal(listed[0].name, "label");
  assert_string_equal(listed[0].value, "x=1");
  assert_string_equal(listed[1].name, "force");
  assert_null(listed[1].value);
  assert_string_equal(listed[2].value, "y=2");
  flag_free(&table, &o);
  assert_int_equal(parse(&o, "-h", "--version", NULL), 0);
  assert_true(rest.help);
  assert_true(rest.version);
  flag_free(&table, &o);
  assert_int_equal(parse(&o, "a", "b", "c", "d", "e", NULL), STK_EINVAL);
  assert_string_equal(err, "too many arguments");
  flag_free(&table, &o);
  /* Without a place for them, positional words are errors. */
  char *argv[] = {"prog", "stray"};
  assert_int_equal(flag_defaults(&table, &o, err, sizeof(err)), 0);
  assert_int_equal(flag_parse(&table, &o, 2, argv, NULL, err, sizeof(err)), STK_EINVAL);
  assert_string_equal(err, "unexpected argument 'stray'");
  flag_free(&table, &o);
}

static void test_help(void **state) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  flag_print_help(&table, f);
  fclose(f);
  assert_non_null(strstr(text, "Usage: prog --job NAME\nA program.\n"));
  assert_non_null(strstr(text, "  --layers INTEGER\n      Layers.\n"
                               "      (integer, default 2, range [1, 1024])\n"));
  assert_non_null(strstr(text, "  --job STRING\n      Job name.\n      (string)\n"));
  assert_non_null(strstr(text, "  --json | --no-json\n"));
  assert_non_null(strstr(text, "  --precision fp32|bf16\n"));
  assert_non_null(strstr(text, "(duration, default 10s, range [1ms, 1d])"));
  free(text);
}

static void test_bad_table(void **state) {
  static const struct flag_spec dup[] = {
      {"x", FLAG_INT, 0, NULL, 0, 0, NULL, "X.", 0},
      {"x", FLAG_INT, 0, NULL, 0, 0, NULL, "X again.", 0},
  };
  static const struct flag_table t = {"prog", NULL, dup, 2, NULL};
  int x;
  assert_int_equal(flag_defaults(&t, &x, err, sizeof(err)), STK_EINVAL);
  assert_non_null(strstr(err, "row 1 (x)"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_both_spellings),
      cmocka_unit_test(test_durations),
      cmocka_unit_test(test_uint),
      cmocka_unit_test(test_errors_name_the_flag),
      cmocka_unit_test(test_repeat_listed_positional),
      cmocka_unit_test(test_help),
      cmocka_unit_test(test_bad_table),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
