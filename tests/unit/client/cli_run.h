/*
 * cli_run: runs the real stokerctl binary in a shell for the stokerctl
 * tests, capturing its exit code, stdout and stderr (via temporary files).
 */
#ifndef STK_TEST_CLI_RUN_H
#define STK_TEST_CLI_RUN_H

struct cli_run {
  int rc;
  char out[65536];
  char err[4096];
};

/* Picks this process's temporary output files; tag names the test. */
void cli_run_init(const char *tag);
/* Removes them. */
void cli_run_cleanup(void);

/* Runs "ENV 'stokerctl' ARGS" (ENV and ARGS are shell fragments, ENV may
 * be "") with stdin from /dev/null; fails the test if it did not exit. */
void cli_run(struct cli_run *r, const char *env, const char *stokerctl, const char *args);

#endif
