/*
 * Shared by the stokerctl tests: run the binary, capture what it printed.
 */
#include "cli_run.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

static char out_path[96], err_path[96];

void cli_run_init(const char *tag) {
  snprintf(out_path, sizeof(out_path), "/tmp/%s-%d.out", tag, (int)getpid());
  snprintf(err_path, sizeof(err_path), "/tmp/%s-%d.err", tag, (int)getpid());
}

void cli_run_cleanup(void) {
  unlink(out_path);
  unlink(err_path);
}

static void slurp(const char *path, char *buf, size_t len) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  size_t n = fread(buf, 1, len - 1, f);
  buf[n] = '\0';
  fclose(f);
}

void cli_run(struct cli_run *r, const char *env, const char *stokerctl, const char *args) {
  char cmd[4096];
  snprintf(cmd, sizeof(cmd), "%s '%s' %s >%s 2>%s </dev/null", env, stokerctl, args, out_path,
           err_path);
  int st = system(cmd);
  assert_true(WIFEXITED(st));
  r->rc = WEXITSTATUS(st);
  slurp(out_path, r->out, sizeof(r->out));
  slurp(err_path, r->err, sizeof(r->err));
}
