/*
 * s3rver_fixture: a real S3-protocol server for the tests. npm's
 * @20minutes/s3rver (verifies SigV4 signatures) is installed on first use
 * into a cache directory (STK_S3RVER_CACHE, default /tmp/stk-s3rver-cache;
 * falls back to s3rver@3.7.1) and started on 127.0.0.1 with an ephemeral
 * port. Credentials: S3RVER / S3RVER.
 */
#ifndef STK_TEST_S3RVER_FIXTURE_H
#define STK_TEST_S3RVER_FIXTURE_H

#include <sys/types.h>

#define S3RVER_BUCKET "stoker-test"
#define S3RVER_KEY    "S3RVER"

struct s3rver {
  pid_t pid;
  int port;
  int stdin_fd; /* Closing it stops the server even if we crash. */
  char data_dir[64];
  char endpoint[64]; /* "http://127.0.0.1:<port>" */
};

/* 0 on success; -1 when npm or node is unusable (the caller skips: exit 77). */
int s3rver_start(struct s3rver *s);
void s3rver_stop(struct s3rver *s);

#endif
