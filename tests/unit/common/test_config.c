/*
 * Tests for config: each layer (default < file < environment < flag)
 * overrides the one before, every value syntax parses, bad values and
 * unknown names fail with one line naming where they came from, --help
 * lists every option, and the generated example file loads back to the
 * defaults.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "config.h"
#include "stk_config.h"
#include "stk_error.h"

struct tcfg {
  char *listen;
  bool verbose;
  int64_t port;
  uint64_t workers;
  int64_t heartbeat_ms;
  uint64_t cache_bytes;
  int mode;
  char *token;
  char *label;
  char *root;
};

static const char *const modes[] = {"fast", "safe", NULL};

#define OFF(f) offsetof(struct tcfg, f)
static const struct flag_spec opts[] = {
    {"listen", FLAG_STRING, OFF(listen), "127.0.0.1:7070", 0, 0, NULL, "Address to serve on.", 0},
    {"verbose", FLAG_BOOL, OFF(verbose), "false", 0, 0, NULL, "Log more.", 0},
    {"port", FLAG_INT64, OFF(port), "7070", 1, 65535, NULL, "A port.", 0},
    {"workers", FLAG_UINT64, OFF(workers), "4", 1, 64, NULL, "Worker threads.", 0},
    {"heartbeat-interval", FLAG_DURATION, OFF(heartbeat_ms), "5s", 100, 3600000, NULL,
     "Time between heartbeats.", 0},
    {"cache-size", FLAG_SIZE, OFF(cache_bytes), "64MiB", 0, 0, NULL, "Cache budget.", 0},
    {"mode", FLAG_ENUM, OFF(mode), "safe", 0, 0, modes, "Trade-off.", 0},
    {"token", FLAG_STRING, OFF(token), NULL, 0, 0, NULL, "Bearer token.", FLAG_SECRET},
    {"label", FLAG_STRING, OFF(label), "a # b", 0, 0, NULL, "Free text.\nSecond line.", 0},
    {"root", FLAG_STRING, OFF(root), "/default", 0, 0, NULL, "A directory.", FLAG_REPEAT},
};
static const struct cfg_table table = {"testd", "TESTD", opts, sizeof(opts) / sizeof(opts[0]),
                                       "A daemon for tests."};

static char err[256];

/* Loads with argv given as a NULL-terminated list after the program. */
static int load(struct tcfg *c, ...) {
  char *argv[32] = {"testd"};
  int argc = 1;
  va_list ap;
  va_start(ap, c);
  for (char *a; (a = va_arg(ap, char *));) argv[argc++] = a;
  va_end(ap);
  memset(c, 0xab, sizeof(*c)); /* cfg_load must not need an initialized struct. */
  return cfg_load(&table, c, argc, argv, err, sizeof(err));
}

static char *write_temp(const char *text) {
  char *path = strdup("/tmp/stk-cfg-XXXXXX");
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  return path;
}

static void test_defaults(void **state) {
  struct tcfg c;
  assert_int_equal(load(&c, NULL), 0);
  assert_string_equal(c.listen, "127.0.0.1:7070");
  assert_false(c.verbose);
  assert_int_equal(c.port, 7070);
  assert_int_equal(c.workers, 4);
  assert_int_equal(c.heartbeat_ms, 5000);
  assert_int_equal(c.cache_bytes, 64ull << 20);
  assert_int_equal(c.mode, 1);
  assert_string_equal(c.token, "");
  assert_string_equal(c.label, "a # b");
  cfg_free(&table, &c);
  assert_null(c.listen);
}

static void test_layers_override(void **state) {
  char *path = write_temp("# comment\n\nport = 1000\nheartbeat-interval = 2m  # inline\n"
                          "listen = \"0.0.0.0:1 # not a comment\"\nworkers=8\n");
  struct tcfg c;
  assert_int_equal(load(&c, "--config", path, NULL), 0); /* File over defaults. */
  assert_int_equal(c.port, 1000);
  assert_int_equal(c.heartbeat_ms, 120000);
  assert_string_equal(c.listen, "0.0.0.0:1 # not a comment");
  assert_int_equal(c.workers, 8);
  cfg_free(&table, &c);
  setenv("STOKER_TESTD_PORT", "2000", 1); /* Environment over file. */
  setenv("STOKER_TESTD_HEARTBEAT_INTERVAL", "1500ms", 1);
  assert_int_equal(load(&c, "--config", path, NULL), 0);
  assert_int_equal(c.port, 2000);
  assert_int_equal(c.heartbeat_ms, 1500);
  assert_int_equal(c.workers, 8); /* Untouched layers keep the file's value. */
  cfg_free(&table, &c);
  assert_int_equal(load(&c, "--port", "3000", "--config=", NULL), 0); /* Flag over env. */
  assert_int_equal(c.port, 3000);
  assert_int_equal(c.heartbeat_ms, 1500);
  cfg_free(&table, &c);
  setenv("STOKER_TESTD_CONFIG", path, 1); /* The file can come from the environment too. */
  assert_int_equal(load(&c, NULL), 0);
  assert_int_equal(c.workers, 8);
  cfg_free(&table, &c);
  unsetenv("STOKER_TESTD_CONFIG");
  unsetenv("STOKER_TESTD_PORT");
  unsetenv("STOKER_TESTD_HEARTBEAT_INTERVAL");
  unlink(path);
  free(path);
}

/* A FLAG_REPEAT option: repeats add within a layer, a later layer replaces. */
static void test_repeatable(void **state) {
  char *path = write_temp("root = /f1\nroot = /f2\n");
  struct tcfg c;
  assert_int_equal(load(&c, NULL), 0);
  assert_string_equal(c.root, "/default");
  cfg_free(&table, &c);
  assert_int_equal(load(&c, "--config", path, NULL), 0);
  assert_string_equal(c.root, "/f1:/f2");
  cfg_free(&table, &c);
  setenv("STOKER_TESTD_ROOT", "/e1:/e2", 1);
  assert_int_equal(load(&c, "--config", path, NULL), 0);
  assert_string_equal(c.root, "/e1:/e2");
  cfg_free(&table, &c);
  assert_int_equal(load(&c, "--config", path, "--root", "/a", "--root=/b", NULL), 0);
  assert_string_equal(c.root, "/a:/b");
  cfg_free(&table, &c);
  unsetenv("STOKER_TESTD_ROOT");
  assert_int_equal(load(&c, "--root", "/only", NULL), 0);
  assert_string_equal(c.root, "/only");
  cfg_free(&table, &c);
  unlink(path);
  free(path);
}

static void test_flag_forms(void **state) {
  struct tcfg c;
  assert_int_equal(load(&c, "--port=5", "--verbose", "--cache-size", "1GiB", "--mode", "fast",
                        "--token", "s3cret", NULL),
                   0);
  assert_int_equal(c.port, 5);
  assert_true(c.verbose);
  assert_int_equal(c.cache_bytes, 1ull << 30);
  assert_int_equal(c.mode, 0);
  assert_string_equal(c.token, "s3cret");
  cfg_free(&table, &c);
  assert_int_equal(load(&c, "--verbose", "--no-verbose", NULL), 0);
  assert_false(c.verbose);
  cfg_free(&table, &c);
  assert_int_equal(load(&c, "--no-verbose", "--verbose=yes", "--token", "a", "--token=b", NULL), 0);
  assert_true(c.verbose);
  assert_string_equal(c.token, "b"); /* Replaced, the old copy freed (ASan checks). */
  cfg_free(&table, &c);
}

static void test_value_syntax(void **state) {
  static const struct {
    const char *flag, *value;
    uint64_t want;
  } ok[] = {
      {"--heartbeat-interval", "100ms", 100},
      {"--heartbeat-interval", "30s", 30000},
      {"--heartbeat-interval", "1h", 3600000},
      {"--heartbeat-interval", "1m30s", 90000}, /* Sums and fractions, as stokerctl takes. */
      {"--heartbeat-interval", "1.5s", 1500},
      {"--cache-size", "4096", 4096},
      {"--cache-size", "64KiB", 65536},
      {"--cache-size", "16MiB", 16ull << 20},
      {"--cache-size", "10KB", 10000},
      {"--cache-size", "2T", 2ull << 40},
      {"--cache-size", "0", 0},
      {"--workers", "64", 64},
  };
  for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
    struct tcfg c;
    assert_int_equal(load(&c, ok[i].flag, ok[i].value, NULL), 0);
    uint64_t got = strcmp(ok[i].flag, "--heartbeat-interval") == 0 ? (uint64_t)c.heartbeat_ms
                   : strcmp(ok[i].flag, "--cache-size") == 0       ? c.cache_bytes
                                                                   : c.workers;
    assert_int_equal(got, ok[i].want);
    cfg_free(&table, &c);
  }
}

static void expect_error(const char *want, ...) {
  char *argv[8] = {"testd"};
  int argc = 1;
  va_list ap;
  va_start(ap, want);
  for (char *a; (a = va_arg(ap, char *));) argv[argc++] = a;
  va_end(ap);
  struct tcfg c;
  assert_int_equal(cfg_load(&table, &c, argc, argv, err, sizeof(err)), STK_EINVAL);
  assert_string_equal(err, want);
  cfg_free(&table, &c);
}

static void test_errors_are_clear(void **state) {
  expect_error("--heartbeat-interval: expected a duration like 5s, got 'abc'",
               "--heartbeat-interval", "abc", NULL);
  expect_error("--heartbeat-interval: 50ms is out of range [100ms, 1h]", "--heartbeat-interval",
               "50ms", NULL);
  expect_error("--port: 70000 is out of range [1, 65535]", "--port", "70000", NULL);
  expect_error("--port: expected an integer, got '12x'", "--port=12x", NULL);
  expect_error("--workers: expected a non-negative integer, got '-1'", "--workers", "-1", NULL);
  expect_error("--workers: 0 is out of range [1, 64]", "--workers", "0", NULL);
  expect_error("--cache-size: expected a size like 64KiB, got '5 parsecs'", "--cache-size",
               "5 parsecs", NULL);
  expect_error("--cache-size: expected a size like 64KiB, got '99999999999TiB'", "--cache-size",
               "99999999999TiB", NULL);
  expect_error("--mode: expected one of fast, safe, got 'slow'", "--mode", "slow", NULL);
  expect_error("--verbose: expected true or false, got 'maybe'", "--verbose=maybe", NULL);
  expect_error("unknown flag --bogus (see --help)", "--bogus", "1", NULL);
  expect_error("unknown flag --no-port (see --help)", "--no-port", NULL);
  expect_error("--port: missing value", "--port", NULL);
  expect_error("unexpected argument 'stray'", "stray", NULL);
  setenv("STOKER_TESTD_WORKERS", "many", 1);
  expect_error("STOKER_TESTD_WORKERS: expected a non-negative integer, got 'many'", NULL);
  unsetenv("STOKER_TESTD_WORKERS");
}

static void expect_file_error(const char *text, const char *want_after_path, int want_rc) {
  char *path = write_temp(text);
  char want[512];
  snprintf(want, sizeof(want), "%s%s", path, want_after_path);
  struct tcfg c;
  assert_int_equal(load(&c, "--config", path, NULL), want_rc);
  assert_string_equal(err, want);
  cfg_free(&table, &c);
  unlink(path);
  free(path);
}

static void test_file_errors(void **state) {
  expect_file_error("port = 1\n# ok\nnope = 3\n", ":3: unknown option 'nope'", STK_EINVAL);
  expect_file_error("\nport = x\n", ":2: port: expected an integer, got 'x'", STK_EINVAL);
  expect_file_error("port 80\n", ":1: expected 'name = value', got 'port 80'", STK_EINVAL);
  expect_file_error("listen = \"open\n", ":1: listen: unterminated quoted value", STK_EINVAL);
  struct tcfg c;
  assert_int_equal(load(&c, "--config", "/nonexistent/stk.conf", NULL), STK_ENOENT);
  assert_string_equal(err, "--config /nonexistent/stk.conf: No such file or directory");
  cfg_free(&table, &c);
}

/* Runs fn with stdout sent to a file; returns what it printed. */
static char *capture_stdout(int (*fn)(struct tcfg *), struct tcfg *c, int *ret_rc) {
  char path[] = "/tmp/stk-cfg-out-XXXXXX";
  int fd = mkstemp(path);
  fflush(stdout);
  int saved = dup(STDOUT_FILENO);
  dup2(fd, STDOUT_FILENO);
  *ret_rc = fn(c);
  fflush(stdout);
  dup2(saved, STDOUT_FILENO);
  close(saved);
  off_t len = lseek(fd, 0, SEEK_END);
  char *text = calloc(1, (size_t)len + 1);
  assert_int_equal(pread(fd, text, (size_t)len, 0), len);
  close(fd);
  unlink(path);
  return text;
}

static int load_help(struct tcfg *c) {
  return load(c, "--port", "bad", "--help", NULL);
}

static void test_help(void **state) {
  struct tcfg c;
  int rc;
  char *text = capture_stdout(load_help, &c, &rc);
  assert_int_equal(rc, 1); /* Help wins over the bad value before it. */
  assert_non_null(strstr(text, "Usage: testd [--config FILE]"));
  assert_non_null(strstr(text, "A daemon for tests."));
  for (size_t i = 0; i < table.n_opts; i++) {
    char flag[64], env[64];
    snprintf(flag, sizeof(flag), "  --%s ", opts[i].name);
    assert_non_null(strstr(text, flag));
    cfg_env_name(&table, &opts[i], env, sizeof(env));
    assert_non_null(strstr(text, env));
    char *first_line = strndup(opts[i].help, strcspn(opts[i].help, "\n"));
    assert_non_null(strstr(text, first_line));
    free(first_line);
  }
  assert_non_null(strstr(text, "      Free text.\n      Second line.\n"));
  assert_non_null(strstr(text, "duration, default 5s, range [100ms, 1h], env "
                               "STOKER_TESTD_HEARTBEAT_INTERVAL"));
  assert_non_null(strstr(text, "--verbose | --no-verbose"));
  assert_non_null(strstr(text, "--mode fast|safe"));
  assert_non_null(strstr(text, "default 64MiB"));
  free(text);
  cfg_free(&table, &c);
}

static int load_version(struct tcfg *c) {
  return load(c, "--port", "bad", "--version", NULL);
}

/* --version prints "PROGRAM VERSION" (meson's project version) and asks
 * the caller to exit 0, whatever else the line holds. */
static void test_version(void **state) {
  struct tcfg c;
  int rc;
  char *text = capture_stdout(load_version, &c, &rc);
  assert_int_equal(rc, 1);
  assert_string_equal(text, "testd " STK_VERSION "\n");
  free(text);
  cfg_free(&table, &c);
}

static void test_example_loads_back_as_defaults(void **state) {
  char path[] = "/tmp/stk-cfg-example-XXXXXX";
  int fd = mkstemp(path);
  FILE *f = fdopen(fd, "w");
  assert_int_equal(cfg_write_example(&table, f), 0);
  fclose(f);
  f = fopen(path, "r");
  char text[8192];
  size_t n = fread(text, 1, sizeof(text) - 1, f);
  text[n] = '\0';
  fclose(f);
  assert_non_null(strstr(text, "# Time between heartbeats.\n"));
  assert_non_null(strstr(text, "\nheartbeat-interval = 5s\n"));
  assert_non_null(strstr(text, "# Free text.\n# Second line.\n"));
  assert_non_null(strstr(text, "\nlabel = \"a # b\"\n"));
  struct tcfg defaults, loaded;
  assert_int_equal(load(&defaults, NULL), 0);
  assert_int_equal(load(&loaded, "--config", path, NULL), 0);
  assert_string_equal(loaded.listen, defaults.listen);
  assert_string_equal(loaded.token, defaults.token);
  assert_string_equal(loaded.label, defaults.label);
  assert_int_equal(loaded.verbose, defaults.verbose);
  assert_int_equal(loaded.port, defaults.port);
  assert_int_equal(loaded.workers, defaults.workers);
  assert_int_equal(loaded.heartbeat_ms, defaults.heartbeat_ms);
  assert_int_equal(loaded.cache_bytes, defaults.cache_bytes);
  assert_int_equal(loaded.mode, defaults.mode);
  cfg_free(&table, &defaults);
  cfg_free(&table, &loaded);
  unlink(path);
}

static void test_effective_hides_secrets(void **state) {
  struct tcfg c;
  assert_int_equal(load(&c, "--token", "hunter2", "--heartbeat-interval", "90s", NULL), 0);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  cfg_print_effective(&table, &c, f);
  fclose(f);
  assert_null(strstr(buf, "hunter2"));
  assert_non_null(strstr(buf, "token = (set)\n"));
  assert_non_null(strstr(buf, "heartbeat-interval = 90s\n"));
  assert_non_null(strstr(buf, "cache-size = 64MiB\n"));
  assert_non_null(strstr(buf, "mode = safe\n"));
  free(buf);
  cfg_free(&table, &c);
}

static void test_cfg_set(void **state) {
  struct tcfg c;
  assert_int_equal(load(&c, NULL), 0);
  assert_int_equal(cfg_set(&table, &c, "port", "81", "test", err, sizeof(err)), 0);
  assert_int_equal(c.port, 81);
  assert_int_equal(cfg_set(&table, &c, "nope", "1", "test", err, sizeof(err)), STK_EINVAL);
  assert_string_equal(err, "test: unknown option 'nope'");
  assert_int_equal(cfg_set(&table, &c, "port", "0", "test", err, sizeof(err)), STK_EINVAL);
  assert_int_equal(c.port, 81); /* A bad value changes nothing. */
  cfg_free(&table, &c);
}

int main(void) {
  unsetenv("STOKER_TESTD_CONFIG");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_layers_override),
      cmocka_unit_test(test_repeatable),
      cmocka_unit_test(test_flag_forms),
      cmocka_unit_test(test_value_syntax),
      cmocka_unit_test(test_errors_are_clear),
      cmocka_unit_test(test_file_errors),
      cmocka_unit_test(test_help),
      cmocka_unit_test(test_version),
      cmocka_unit_test(test_example_loads_back_as_defaults),
      cmocka_unit_test(test_effective_hides_secrets),
      cmocka_unit_test(test_cfg_set),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
