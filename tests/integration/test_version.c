/*
 * What an operator asks a binary first: its version. Every binary given on
 * the command line (the three daemons, stokerctl, stoker-train) answers
 * --version with "PROGRAM VERSION" on stdout and exit 0, VERSION being
 * meson's project version (STK_VERSION). A daemon also names its version
 * in the first line it logs: checked by starting each daemon with a TLS
 * certificate that does not exist, so it logs its start and exits at once.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "stk_config.h"

static int n_binaries;
static char **binaries;

/* Runs the shell command, returns its output (malloc'd) and exit status. */
static char *run(const char *cmd, int *ret_status) {
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t cap = 1 << 16, len = 0;
  char *out = calloc(1, cap);
  size_t got;
  while (len + 1 < cap && (got = fread(out + len, 1, cap - len - 1, p)) > 0) len += got;
  int status = pclose(p);
  *ret_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  return out;
}

static const char *program_name(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

static void test_version_flag(void **state) {
  for (int i = 0; i < n_binaries; i++) {
    char cmd[4200], want[256];
    snprintf(cmd, sizeof(cmd), "'%s' --version 2>&1", binaries[i]);
    int status;
    char *out = run(cmd, &status);
    snprintf(want, sizeof(want), "%s %s\n", program_name(binaries[i]), STK_VERSION);
    if (status != 0 || strcmp(out, want) != 0)
      fail_msg("%s --version: exit %d, printed \"%s\", want \"%s\"", binaries[i], status, out,
               want);
    free(out);
  }
}

/* Daemons only (their names start with stoker- and are not stoker-train). */
static void test_first_log_line_has_version(void **state) {
  for (int i = 0; i < n_binaries; i++) {
    const char *name = program_name(binaries[i]);
    if (strncmp(name, "stoker-", 7) != 0 || strcmp(name, "stoker-train") == 0) continue;
    char dir[] = "/tmp/stoker-version-XXXXXX", cmd[4200], want[256];
    assert_non_null(mkdtemp(dir));
    snprintf(cmd, sizeof(cmd),
             "'%s' --listen 127.0.0.1:0 --data-dir %s/data --log-level info "
             "--tls-cert %s/none.pem --tls-key %s/none.pem 2>&1; rm -rf %s",
             binaries[i], dir, dir, dir, dir);
    int status;
    char *out = run(cmd, &status);
    snprintf(want, sizeof(want), " start daemon=%s version=%s ", name, STK_VERSION);
    char *nl = strchr(out, '\n');
    if (nl) *nl = '\0';
    if (!strstr(out, want)) fail_msg("%s: first log line \"%s\" lacks \"%s\"", name, out, want);
    free(out);
  }
}

int main(int argc, char **argv) {
  n_binaries = argc - 1;
  binaries = argv + 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_version_flag),
      cmocka_unit_test(test_first_log_line_has_version),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
