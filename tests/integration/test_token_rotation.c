/*
 * A long-running libstoker-client follows its token file across a token
 * rotation of the real coordinator (which re-reads its own on SIGHUP): a
 * call refused UNAUTHENTICATED makes the client re-read its file and send
 * the call once more; between failures the file is re-read at most every
 * client_token_reload_ms; a file that does not read (empty, two words)
 * changes nothing, the token in use stays.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "client_internal.h" /* client_token_reload_ms: tests may shorten it. */
#include "harness.h"

static char dir[256], daemon_token[300], client_token[300];

static void write_token(const char *path, const char *text) {
  char tmp[320];
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  assert_int_equal(rename(tmp, path), 0); /* As a secret mount updates: whole. */
}

/* ListJobs through c: 0 or the error. */
static int list(struct stk_client *c) {
  Stoker__V1__ListJobsResponse *resp = NULL;
  int rc = stk_job_list(c, NULL, NULL, 0, 3000, &resp);
  if (resp) protobuf_c_message_free_unpacked(&resp->base, NULL);
  return rc;
}

/* The daemon's token becomes text: file rewritten, SIGHUP, then wait until
 * a client holding the old token is refused. */
static void rotate_daemon(struct harness_daemon *d, const char *old_token, const char *text) {
  write_token(daemon_token, text);
  assert_int_equal(kill(d->pid, SIGHUP), 0);
  struct stk_client_opts o = {.address = d->addr, .token = old_token};
  struct stk_client *probe = NULL;
  assert_int_equal(stk_client_new(&o, &probe), 0);
  int64_t until = harness_now_ms() + 10000;
  while (list(probe) == 0 && harness_now_ms() < until) harness_sleep_ms(20);
  assert_int_equal(list(probe), STK_EUNAUTH);
  stk_client_free(probe);
}

static void test_rotation(void **state) {
  (void)state;
  assert_int_equal(harness_tmpdir_new(dir, sizeof(dir)), 0);
  snprintf(daemon_token, sizeof(daemon_token), "%s/daemon-token", dir);
  snprintf(client_token, sizeof(client_token), "%s/client-token", dir);
  write_token(daemon_token, "first-token\n");
  write_token(client_token, "first-token\n");
  const char *args[] = {"--token-file", daemon_token, NULL};
  struct harness_daemon *d = harness_daemon_start(args);
  assert_non_null(d);
  struct stk_client_opts o = {.address = d->addr, .token_file = client_token};
  struct stk_client *c = NULL;
  assert_int_equal(stk_client_new(&o, &c), 0);
  assert_int_equal(list(c), 0);

  /* Rotated on the daemon only: refused, the file still has the old one. */
  rotate_daemon(d, "first-token", "second-token\n");
  assert_int_equal(list(c), STK_EUNAUTH);
  /* The client's file catches up: the refused call is re-sent and passes,
   * long before the periodic re-read is due. */
  write_token(client_token, "second-token\r\n");
  assert_int_equal(list(c), 0);
  assert_int_equal(list(c), 0);

  /* A bad file changes nothing, however often it is read. */
  client_token_reload_ms = 0;
  write_token(client_token, "");
  assert_int_equal(list(c), 0);
  write_token(client_token, "two words\n");
  assert_int_equal(list(c), 0);

  /* A due re-read takes a new token before any failure: the client now
   * sends it, and the daemon, still on the second, refuses it... */
  write_token(client_token, "third-token\n");
  assert_int_equal(list(c), STK_EUNAUTH);
  /* ...until the daemon rotates too. */
  rotate_daemon(d, "second-token", "third-token\n");
  assert_int_equal(list(c), 0);

  /* Not due: a changed file is not read between failures. */
  client_token_reload_ms = 60000;
  assert_int_equal(client_token_refresh(c, true), 0); /* Read now: the clock restarts. */
  write_token(client_token, "fourth-token\n");
  assert_int_equal(list(c), 0); /* Still the third, which the daemon takes. */

  stk_client_free(c);
  harness_daemon_free(d);
  harness_tmpdir_remove(dir);
}

int main(int argc, char **argv) {
  if (harness_init(argc, argv)) return 2;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rotation),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
