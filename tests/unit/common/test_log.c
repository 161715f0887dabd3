/*
 * Tests for log: the exact shape of text and JSON lines (collectors parse
 * them), escaping that keeps one event on one line, and level filtering.
 * stderr is redirected into a pipe around each call.
 */
#include <pthread.h>
#include <regex.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "log.h"

/* Runs log_event with stderr captured; returns what was written. */
static char captured[8192];

static const char *capture(enum log_level level, const char *event, const char *msg) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  int saved = dup(STDERR_FILENO);
  dup2(fds[1], STDERR_FILENO);
  log_event(level, event, "%s", msg);
  dup2(saved, STDERR_FILENO);
  close(saved);
  close(fds[1]);
  ssize_t n = read(fds[0], captured, sizeof(captured) - 1);
  close(fds[0]);
  captured[n > 0 ? n : 0] = '\0';
  return captured;
}

static void assert_matches(const char *text, const char *pattern) {
  regex_t re;
  assert_int_equal(regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB), 0);
  int rc = regexec(&re, text, 0, NULL, 0);
  regfree(&re);
  if (rc != 0) fail_msg("'%s' does not match /%s/", text, pattern);
}

#define TS "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z"

static void test_text_line(void **state) {
  log_init(LOG_INFO, false);
  assert_matches(capture(LOG_INFO, "coordinator.join", "job=a rank=3"),
                 "^" TS " INFO  coordinator\\.join job=a rank=3\n$");
  assert_matches(capture(LOG_ERROR, "x.y", "bad"), "^" TS " ERROR x\\.y bad\n$");
  /* A newline in the message cannot start a second line. */
  assert_matches(capture(LOG_WARN, "e", "one\ntwo"), "^" TS " WARN  e one\\\\ntwo\n$");
}

static void test_json_line(void **state) {
  log_init(LOG_DEBUG, true);
  assert_matches(capture(LOG_DEBUG, "ev", "plain"),
                 "^\\{\"ts\":\"" TS
                 "\",\"level\":\"debug\",\"event\":\"ev\",\"msg\":\"plain\"\\}\n$");
  const char *line = capture(LOG_INFO, "q\"e", "say \"hi\"\nback\\slash\ttab\x01");
  assert_non_null(strstr(line, "\"event\":\"q\\\"e\""));
  assert_non_null(strstr(line, "\"msg\":\"say \\\"hi\\\"\\nback\\\\slash\\ttab\\u0001\"}\n"));
  assert_ptr_equal(strchr(line, '\n'), line + strlen(line) - 1); /* One line. */
  log_init(LOG_INFO, false);
}

/* A message of key=value words also becomes the line's own fields (all
 * strings); prose, a mix, a reserved or repeated key keep "msg" alone. */
static void test_json_fields(void **state) {
  log_init(LOG_INFO, true);
  assert_non_null(strstr(capture(LOG_INFO, "j", "job=a rank=3"),
                         "\"msg\":\"job=a rank=3\",\"job\":\"a\",\"rank\":\"3\"}\n"));
  assert_non_null(
      strstr(capture(LOG_INFO, "c", "ready-file=\"\" label=\"a b\" q=\"x\\\"y\" n=1.5"),
             "\",\"ready-file\":\"\",\"label\":\"a b\",\"q\":\"x\\\"y\",\"n\":\"1.5\"}\n"));
  static const char *const whole[] = {
      "calls drained; closing the service",
      "listening on x=1 beyond loopback",
      "msg=1 a=2",
      "a=1 a=2",
      "a=\"open",
      "=v",
      "a=\"b\"c",
  };
  for (size_t i = 0; i < sizeof(whole) / sizeof(whole[0]); i++) {
    const char *line = capture(LOG_INFO, "e", whole[i]);
    const char *msg = strstr(line, "\"msg\":\"");
    assert_non_null(msg);
    /* Nothing after msg's value: the line ends with "}. */
    const char *end = line + strlen(line) - 3;
    assert_string_equal(end, "\"}\n");
    assert_null(strstr(msg + 7, "\",\""));
  }
  log_init(LOG_INFO, false);
}

static void test_level_filter(void **state) {
  log_init(LOG_WARN, false);
  assert_string_equal(capture(LOG_INFO, "e", "hidden"), "");
  assert_string_equal(capture(LOG_DEBUG, "e", "hidden"), "");
  assert_true(strlen(capture(LOG_WARN, "e", "shown")) > 0);
  assert_false(log_enabled(LOG_INFO));
  assert_true(log_enabled(LOG_ERROR));
  log_init(LOG_OFF, false);
  assert_string_equal(capture(LOG_ERROR, "e", "hidden"), "");
  assert_false(log_enabled(LOG_ERROR));
  log_init(LOG_INFO, false);
}

static void test_level_parse(void **state) {
  assert_int_equal(log_level_parse("debug"), LOG_DEBUG);
  assert_int_equal(log_level_parse("WARN"), LOG_WARN);
  assert_int_equal(log_level_parse("off"), LOG_OFF);
  assert_int_equal(log_level_parse("verbose"), -1);
  assert_int_equal(log_level_parse(NULL), -1);
}

/* Threads log long lines into one file: every line comes out whole. */
#define LINES_PER_THREAD 2000

static void *log_many(void *arg) {
  char msg[600];
  memset(msg, 'a' + (int)(intptr_t)arg, sizeof(msg) - 1);
  msg[sizeof(msg) - 1] = '\0';
  for (int i = 0; i < LINES_PER_THREAD; i++) log_info("t", "%s", msg);
  return NULL;
}

static void test_threads_never_interleave(void **state) {
  char path[] = "/tmp/stk-log-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  int saved = dup(STDERR_FILENO);
  dup2(fd, STDERR_FILENO);
  log_init(LOG_INFO, false);
  pthread_t threads[4];
  for (intptr_t i = 0; i < 4; i++) pthread_create(&threads[i], NULL, log_many, (void *)i);
  for (int i = 0; i < 4; i++) pthread_join(threads[i], NULL);
  dup2(saved, STDERR_FILENO);
  close(saved);
  FILE *f = fdopen(fd, "r");
  rewind(f);
  char line[1024];
  int n = 0;
  while (fgets(line, sizeof(line), f)) {
    const char *msg = strstr(line, " INFO  t ");
    assert_non_null(msg);
    msg += 9;
    assert_int_equal(strspn(msg, (char[]){msg[0], 0}), 599);
    assert_string_equal(msg + 599, "\n");
    n++;
  }
  fclose(f);
  unlink(path);
  assert_int_equal(n, 4 * LINES_PER_THREAD);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_text_line),   cmocka_unit_test(test_json_line),
      cmocka_unit_test(test_json_fields), cmocka_unit_test(test_level_filter),
      cmocka_unit_test(test_level_parse), cmocka_unit_test(test_threads_never_interleave),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
