/*
 * Installs (once, under a file lock) and starts s3rver for a test run; see
 * s3rver_fixture.h.
 */
#include "s3rver_fixture.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *cache_dir(void) {
  const char *d = getenv("STK_S3RVER_CACHE");
  return d && d[0] ? d : "/tmp/stk-s3rver-cache";
}

/* The installed module directory, or NULL. */
static const char *module_dir(char *buf, size_t size) {
  const char *names[] = {"node_modules/@20minutes/s3rver", "node_modules/s3rver"};
  for (size_t i = 0; i < 2; i++) {
    char probe[512];
    snprintf(buf, size, "%s/%s", cache_dir(), names[i]);
    if (snprintf(probe, sizeof(probe), "%s/lib/s3rver.js", buf) >= (int)sizeof(probe)) continue;
    if (access(probe, R_OK) == 0) return buf;
  }
  return NULL;
}

static int install(void) {
  char cmd[1024];
  mkdir(cache_dir(), 0755);
  const char *pkgs[] = {"@20minutes/s3rver", "s3rver@3.7.1"};
  for (size_t i = 0; i < 2; i++) {
    snprintf(cmd, sizeof(cmd),
             "timeout 240 npm install --prefix '%s' --no-audit --no-fund --loglevel=error %s "
             ">/dev/null 2>&1",
             cache_dir(), pkgs[i]);
    if (system(cmd) == 0) return 0;
  }
  return -1;
}

static int ensure_installed(char *dir, size_t size) {
  if (module_dir(dir, size)) return 0;
  mkdir(cache_dir(), 0755);
  char lock_path[512];
  snprintf(lock_path, sizeof(lock_path), "%s.lock", cache_dir());
  int lock = open(lock_path, O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (lock >= 0) flock(lock, LOCK_EX);
  int rc = module_dir(dir, size) ? 0 : install();
  if (lock >= 0) close(lock);
  if (rc == 0 && !module_dir(dir, size)) rc = -1;
  if (rc != 0)
    fprintf(stderr,
            "s3rver: cannot install npm @20minutes/s3rver or s3rver@3.7.1 into %s "
            "(no network or no npm?); skipping the S3 tests\n",
            cache_dir());
  return rc;
}

static void child(int in_fd, int out_fd, const char *mod, const char *data) {
  dup2(in_fd, 0);
  dup2(out_fd, 1);
  const char *launcher = getenv("S3RVER_LAUNCHER");
  /* s3rver's ListObjectsV2 continuation tokens use DES, which Node 20's
   * OpenSSL 3 only offers through the legacy provider. */
  execlp("node", "node", "--openssl-legacy-provider", launcher ? launcher : "s3rver_launch.js", mod,
         data, S3RVER_BUCKET, (char *)NULL);
  _exit(127);
}

static int read_port(int fd) {
  char buf[128];
  size_t len = 0;
  while (len < sizeof(buf) - 1) {
    ssize_t n = read(fd, buf + len, sizeof(buf) - 1 - len);
    if (n <= 0) return -1;
    len += (size_t)n;
    buf[len] = '\0';
    char *p = strstr(buf, "PORT ");
    if (p && strchr(p, '\n')) return atoi(p + 5);
  }
  return -1;
}

int s3rver_start(struct s3rver *s) {
  char mod[512];
  memset(s, 0, sizeof(*s));
  if (ensure_installed(mod, sizeof(mod)) != 0) return -1;
  snprintf(s->data_dir, sizeof(s->data_dir), "/tmp/stk-s3rver-XXXXXX");
  if (!mkdtemp(s->data_dir)) return -1;
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return -1;
  s->pid = fork();
  if (s->pid == 0) child(in[0], out[1], mod, s->data_dir);
  close(in[0]);
  close(out[1]);
  s->stdin_fd = in[1];
  s->port = s->pid > 0 ? read_port(out[0]) : -1;
  close(out[0]);
  if (s->port <= 0) {
    fprintf(stderr, "s3rver: did not start (is node installed?)\n");
    s3rver_stop(s);
    return -1;
  }
  snprintf(s->endpoint, sizeof(s->endpoint), "http://127.0.0.1:%d", s->port);
  return 0;
}

void s3rver_stop(struct s3rver *s) {
  if (s->stdin_fd > 0) close(s->stdin_fd);
  s->stdin_fd = -1;
  if (s->pid > 0) {
    kill(s->pid, SIGTERM);
    waitpid(s->pid, NULL, 0);
  }
  s->pid = 0;
  if (s->data_dir[0]) {
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", s->data_dir);
    if (system(cmd) != 0) fprintf(stderr, "s3rver: could not remove %s\n", s->data_dir);
  }
}
