/*
 * Start-up errors that name their cause. The real daemons are started
 * where they cannot run and must exit non-zero with the reason an operator
 * acts on: the gRPC port taken ("cannot listen on 127.0.0.1:P: port P is
 * in use by process PID (NAME)", the holder found in /proc), the metrics
 * port taken, and the data directory held by another running daemon ("the
 * data directory DIR is locked by process PID"), the checkpoint replicas'
 * flags that cannot work together. gRPC core's own lines
 * come through the daemon's logger. Arguments: the coordinator, dataloader
 * and checkpoint binaries.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static int test_argc;
static char **test_argv;

/* A socket listening on 127.0.0.1 on a port the kernel picked, closed on
 * exec: the shell popen starts must not hold it too (the daemon then names
 * that shell as the port's holder, not this process). */
static int listen_somewhere(int *ret_port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(a);
  assert_true(fd >= 0);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
  assert_int_equal(listen(fd, 4), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  *ret_port = ntohs(a.sin_port);
  return fd;
}

/* Runs binary with args (a shell fragment), stderr and stdout together;
 * returns the output (malloc'd) and the exit status. */
static char *run(const char *binary, const char *args, int *ret_status) {
  char cmd[4096];
  snprintf(cmd, sizeof(cmd), "timeout 30 '%s' --log-level info %s 2>&1", binary, args);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t cap = 1 << 16, len = 0, got;
  char *out = calloc(1, cap);
  while (len + 1 < cap && (got = fread(out + len, 1, cap - len - 1, p)) > 0) len += got;
  int status = pclose(p);
  *ret_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  return out;
}

static void expect_failure(const char *binary, const char *args, const char *want) {
  int status;
  char *out = run(binary, args, &status);
  if (status == 0 || status == 124 || !strstr(out, want))
    fail_msg("%s %s: exit %d, want non-zero and \"%s\" in:\n%s", binary, args, status, want, out);
  free(out);
}

static void test_grpc_port_in_use(void **state) {
  char dir[256], args[1024], want[192];
  assert_int_equal(harness_tmpdir_new(dir, sizeof(dir)), 0);
  int port;
  int fd = listen_somewhere(&port);
  snprintf(args, sizeof(args), "--listen 127.0.0.1:%d --data-dir '%s/data'", port, dir);
  /* This process holds the port: the message names it. */
  snprintf(want, sizeof(want), "cannot listen on 127.0.0.1:%d: port %d is in use by process %d (",
           port, port, (int)getpid());
  expect_failure(test_argv[1], args, want);
  /* gRPC's own complaint came through the daemon's logger, not as gRPC's
   * "E1125 01:09:48.982531759 ..." line. */
  expect_failure(test_argv[1], args, " WARN  grpc ");
  int status;
  char *out = run(test_argv[1], args, &status);
  for (const char *line = out; line && *line;
       line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
    if (line[0] == 'E' && line[1] >= '0' && line[1] <= '9') fail_msg("a gRPC line in:\n%s", out);
  free(out);
  close(fd);
  harness_tmpdir_remove(dir);
}

static void test_metrics_port_in_use(void **state) {
  char dir[256], args[1024], want[192];
  assert_int_equal(harness_tmpdir_new(dir, sizeof(dir)), 0);
  int port;
  int fd = listen_somewhere(&port);
  snprintf(args, sizeof(args),
           "--listen 127.0.0.1:0 --metrics-listen 127.0.0.1:%d --data-dir '%s/data'", port, dir);
  snprintf(want, sizeof(want),
           "cannot serve metrics on 127.0.0.1:%d: port %d is in use by process %d (", port, port,
           (int)getpid());
  expect_failure(test_argv[1], args, want);
  close(fd);
  harness_tmpdir_remove(dir);
}

/* Each daemon started a second time on the data directory of a running one. */
static void test_data_dir_locked(void **state) {
  for (int i = 1; i < test_argc; i++) {
    char *alt[] = {test_argv[0], test_argv[i], NULL};
    assert_int_equal(harness_init(2, alt), 0);
    struct harness_daemon *d = harness_daemon_start(NULL);
    assert_non_null(d);
    char args[1024], want[512];
    snprintf(args, sizeof(args), "--listen 127.0.0.1:0 --data-dir '%s'", d->data_dir);
    snprintf(want, sizeof(want), "is locked by process %d", (int)d->pid);
    expect_failure(test_argv[i], args, want);
    harness_daemon_free(d);
  }
}

/* Writes text to DIR/name; ret_path gets the path. */
static void write_in(const char *dir, const char *name, const char *text, char *ret_path,
                     size_t len) {
  snprintf(ret_path, len, "%s/%s", dir, name);
  FILE *f = fopen(ret_path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* Every daemon reads its token table by one rule (rpc.h): a line whose
 * second word is not a scope is refused at start, naming the file and the
 * line; the checkpoint service reads its coordinator token file (a client's:
 * one word) by rpc_read_token_file. */
static void test_token_file_rule(void **state) {
  char dir[256], tok[300], empty[300], args[1024], want[512];
  assert_int_equal(harness_tmpdir_new(dir, sizeof(dir)), 0);
  write_in(dir, "two-words", "s3cret token\n", tok, sizeof(tok));
  write_in(dir, "empty", "\n", empty, sizeof(empty));
  for (int i = 1; i < test_argc; i++) {
    snprintf(args, sizeof(args), "--listen 127.0.0.1:0 --data-dir '%s/data%d' --token-file '%s'",
             dir, i, tok);
    snprintf(want, sizeof(want), "token file %s line 1: scope 'token' is not '*' nor", tok);
    expect_failure(test_argv[i], args, want);
    if (!strstr(test_argv[i], "checkpoint")) continue;
    snprintf(args, sizeof(args),
             "--listen 127.0.0.1:0 --data-dir '%s/data%d' --coordinator 127.0.0.1:1 "
             "--coordinator-token-file '%s'",
             dir, i, empty);
    snprintf(want, sizeof(want), "coordinator-token-file: token file %s: empty", empty);
    expect_failure(test_argv[i], args, want);
  }
  harness_tmpdir_remove(dir);
}

/* The checkpoint replicas' flags (issue 26): shared storage with an orphan
 * grace that another replica's live attempt could outlast, and an
 * advertised host with a port, are refused at start, naming the rule. */
static void test_replica_flags(void **state) {
  char dir[256], args[1024];
  assert_int_equal(harness_tmpdir_new(dir, sizeof(dir)), 0);
  for (int i = 1; i < test_argc; i++) {
    if (!strstr(test_argv[i], "checkpoint")) continue;
    snprintf(args, sizeof(args),
             "--listen 127.0.0.1:0 --data-dir '%s/data' --shared-storage "
             "--attempt-timeout 10m --orphan-attempt-grace 5m",
             dir);
    expect_failure(test_argv[i], args,
                   "with shared-storage, orphan-upload-grace and orphan-attempt-grace must "
                   "exceed attempt-timeout");
    snprintf(args, sizeof(args),
             "--listen 127.0.0.1:0 --data-dir '%s/data' --advertise-host checkpoint-0:7072", dir);
    expect_failure(test_argv[i], args,
                   "advertise-host checkpoint-0:7072: a host name or IPv4 address, no port");
  }
  harness_tmpdir_remove(dir);
}

int main(int argc, char **argv) {
  if (harness_init(argc, argv)) return 2;
  test_argc = argc;
  test_argv = argv;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_grpc_port_in_use), cmocka_unit_test(test_metrics_port_in_use),
      cmocka_unit_test(test_data_dir_locked),  cmocka_unit_test(test_token_file_rule),
      cmocka_unit_test(test_replica_flags),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
