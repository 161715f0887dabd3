/*
 * harness: spawning, waiting for, killing and restarting the real
 * coordinator daemon for the integration tests (see harness.h), plus the
 * few client helpers every test needs. The daemon is started with
 * posix_spawn (the test process has gRPC threads, so fork without exec
 * would be unsafe) and always reaped by pid.
 */
#include "harness.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define READY_TIMEOUT_MS 30000

/* Daemons alive, killed at exit in case a failing test skipped its
 * teardown (a live daemon would hold the test's output pipes open). */
#define MAX_LIVE 64
static struct harness_daemon *live[MAX_LIVE];

static void track(struct harness_daemon *d, bool on) {
  for (size_t i = 0; i < MAX_LIVE; i++) {
    if (on && !live[i]) {
      live[i] = d;
      return;
    }
    if (!on && live[i] == d) live[i] = NULL;
  }
}

static void kill_live(void) {
  for (size_t i = 0; i < MAX_LIVE; i++) {
    if (live[i] && live[i]->pid) kill(live[i]->pid, SIGKILL);
  }
}

static int test_argc;
static char **test_argv;
static const char *binary;

int harness_init(int argc, char **argv) {
  test_argc = argc;
  test_argv = argv;
  binary = argc > 1 ? argv[1] : getenv("STOKER_COORDINATOR");
  if (!binary || !binary[0]) {
    fprintf(stderr, "usage: %s COORDINATOR_BINARY [ARGS...] (or set STOKER_COORDINATOR)\n",
            argv[0]);
    return -1;
  }
  signal(SIGPIPE, SIG_IGN);
  atexit(kill_live);
  return 0;
}

const char *harness_binary(void) {
  return binary;
}

const char *harness_arg(int i) {
  return i + 1 < test_argc ? test_argv[i + 1] : NULL;
}

int harness_promtool_check(const char *body, char *ret_out, size_t out_len) {
  ret_out[0] = '\0';
  if (system("command -v promtool > /dev/null 2>&1") != 0) return -1;
  char path[] = "/tmp/stoker-promtool-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return 1;
  size_t len = strlen(body);
  bool written = write(fd, body, len) == (ssize_t)len;
  close(fd);
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "promtool check metrics < %s 2>&1", path);
  FILE *p = written ? popen(cmd, "r") : NULL;
  size_t n = p ? fread(ret_out, 1, out_len - 1, p) : 0;
  ret_out[n] = '\0';
  int status = p ? pclose(p) : 1;
  unlink(path);
  return status != 0 ? status : n > 0;
}

int64_t harness_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void harness_sleep_ms(int64_t ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

int harness_tmpdir_new(char *ret_path, size_t len) {
  const char *base = getenv("TMPDIR");
  char tmpl[256];
  snprintf(tmpl, sizeof(tmpl), "%s/stoker-it-XXXXXX", base && base[0] ? base : "/tmp");
  if (!mkdtemp(tmpl)) return STK_EIO;
  snprintf(ret_path, len, "%s", tmpl);
  return 0;
}

int harness_shm_tmpdir_new(char *ret_path, size_t len) {
  char tmpl[256];
  snprintf(tmpl, sizeof(tmpl), "/dev/shm/stoker-it-XXXXXX");
  if (mkdtemp(tmpl)) {
    snprintf(ret_path, len, "%s", tmpl);
    return 0;
  }
  return harness_tmpdir_new(ret_path, len);
}

bool harness_shm_auto_dir(const char *prefix, const char *data_dir, char *ret_dir, size_t len) {
  char want[4096];
  if (!realpath(data_dir, want)) return false;
  DIR *d = opendir("/dev/shm");
  bool found = false;
  for (struct dirent *e; d && !found && (e = readdir(d));) {
    if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
    char path[512], owner[4096] = "";
    snprintf(path, sizeof(path), "/dev/shm/%s/owner", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t n = fread(owner, 1, sizeof(owner) - 1, f);
    fclose(f);
    owner[n] = '\0';
    owner[strcspn(owner, "\n")] = '\0';
    if (strcmp(owner, want) == 0) {
      snprintf(ret_dir, len, "/dev/shm/%s", e->d_name);
      found = true;
    }
  }
  if (d) closedir(d);
  return found;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  return remove(path);
}

void harness_tmpdir_remove(const char *path) {
  if (path && path[0]) nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Spawns the binary with the standard arguments, listening on listen. */
static int spawn(struct harness_daemon *d, const char *listen) {
  const char *argv[HARNESS_MAX_ARGS + 16];
  size_t n = 0;
  argv[n++] = binary;
  argv[n++] = "--listen";
  argv[n++] = listen;
  argv[n++] = "--data-dir";
  argv[n++] = d->data_dir;
  argv[n++] = "--ready-file";
  argv[n++] = d->ready_file;
  argv[n++] = "--log-level";
  argv[n++] = "warn";
  /* A dataloader serves the files the tests make under the temp directory. */
  const char *slash = strrchr(binary, '/');
  if (strcmp(slash ? slash + 1 : binary, "stoker-dataloader") == 0) {
    const char *base = getenv("TMPDIR");
    argv[n++] = "--data-root";
    argv[n++] = base && base[0] ? base : "/tmp";
  }
  for (size_t i = 0; i < d->n_args; i++) argv[n++] = d->args[i];
  argv[n] = NULL;
  unlink(d->ready_file);
  int rc = posix_spawn(&d->pid, binary, NULL, NULL, (char *const *)argv, environ);
  if (rc != 0) {
    fprintf(stderr, "harness: cannot spawn %s: %s\n", binary, strerror(rc));
    d->pid = 0;
    return STK_EIO;
  }
  return 0;
}

/* Reads the first line of the ready file into d->addr; false if absent. */
static bool read_ready(struct harness_daemon *d) {
  FILE *f = fopen(d->ready_file, "r");
  if (!f) return false;
  char line[128] = "";
  bool ok = fgets(line, sizeof(line), f) != NULL;
  fclose(f);
  line[strcspn(line, "\r\n")] = 0;
  if (!ok || !line[0]) return false;
  snprintf(d->addr, sizeof(d->addr), "%s", line);
  return true;
}

/* Waits for the ready file; fails early when the daemon exits. */
static int wait_ready(struct harness_daemon *d) {
  int64_t deadline = harness_now_ms() + READY_TIMEOUT_MS;
  while (harness_now_ms() < deadline) {
    if (!harness_daemon_alive(d)) {
      fprintf(stderr, "harness: the daemon exited before it was ready\n");
      return STK_EIO;
    }
    if (read_ready(d)) return 0;
    harness_sleep_ms(10);
  }
  fprintf(stderr, "harness: no ready file after %d ms\n", READY_TIMEOUT_MS);
  harness_daemon_kill(d);
  return STK_ETIMEDOUT;
}

struct harness_daemon *harness_daemon_start(const char *const *extra_args) {
  struct harness_daemon *d = calloc(1, sizeof(*d));
  if (!d || harness_tmpdir_new(d->root, sizeof(d->root)) != 0) {
    free(d);
    return NULL;
  }
  snprintf(d->data_dir, sizeof(d->data_dir), "%s/data", d->root);
  snprintf(d->ready_file, sizeof(d->ready_file), "%s/ready", d->root);
  for (size_t i = 0; extra_args && extra_args[i] && i < HARNESS_MAX_ARGS; i++)
    d->args[d->n_args++] = strdup(extra_args[i]);
  track(d, true);
  if (spawn(d, "127.0.0.1:0") != 0 || wait_ready(d) != 0) {
    harness_daemon_free(d);
    return NULL;
  }
  return d;
}

/* A TCP port free on 127.0.0.1 now (0 on failure). */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(a);
  int port = 0;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

struct harness_daemon *harness_daemon_start_metrics(const char *const *extra_args, int *ret_port) {
  const char *args[HARNESS_MAX_ARGS + 1] = {"--metrics-listen"};
  char listen[64];
  size_t n = 2;
  for (size_t i = 0; extra_args && extra_args[i] && n < HARNESS_MAX_ARGS; i++)
    args[n++] = extra_args[i];
  args[n] = NULL;
  for (int attempt = 0; attempt < 5; attempt++) {
    int port = free_port();
    if (!port) continue;
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
    args[1] = listen;
    struct harness_daemon *d = harness_daemon_start(args);
    if (d) {
      *ret_port = port;
      return d;
    }
    fprintf(stderr, "harness: retrying with another metrics port\n");
  }
  return NULL;
}

int harness_daemon_restart(struct harness_daemon *d) {
  harness_daemon_kill(d);
  char listen[sizeof(d->addr)];
  snprintf(listen, sizeof(listen), "%s", d->addr);
  int rc = spawn(d, listen);
  return rc ? rc : wait_ready(d);
}

static int decode_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

bool harness_daemon_alive(struct harness_daemon *d) {
  if (!d->pid) return false;
  int status;
  pid_t r = waitpid(d->pid, &status, WNOHANG);
  if (r == 0) return true;
  d->pid = 0;
  return false;
}

void harness_daemon_kill(struct harness_daemon *d) {
  if (!d || !d->pid) return;
  kill(d->pid, SIGKILL);
  int status;
  while (waitpid(d->pid, &status, 0) < 0 && errno == EINTR) {
  }
  d->pid = 0;
}

int harness_daemon_term(struct harness_daemon *d, int64_t timeout_ms, int *ret_status) {
  if (!d->pid) return STK_ESTATE;
  kill(d->pid, SIGTERM);
  int64_t deadline = harness_now_ms() + timeout_ms;
  for (;;) {
    int status;
    pid_t r = waitpid(d->pid, &status, WNOHANG);
    if (r == d->pid) {
      d->pid = 0;
      *ret_status = decode_status(status);
      return 0;
    }
    if (harness_now_ms() >= deadline) break;
    harness_sleep_ms(10);
  }
  harness_daemon_kill(d);
  return STK_ETIMEDOUT;
}

void harness_daemon_free(struct harness_daemon *d) {
  if (!d) return;
  harness_daemon_kill(d);
  track(d, false);
  harness_tmpdir_remove(d->root);
  for (size_t i = 0; i < d->n_args; i++) free(d->args[i]);
  free(d);
}

struct stk_client *harness_client(const struct harness_daemon *d) {
  struct stk_client_opts o = {.address = d->addr};
  struct stk_client *c = NULL;
  return stk_client_new(&o, &c) == 0 ? c : NULL;
}

struct rpc_client *harness_rpc(const struct harness_daemon *d) {
  struct rpc_client_opts o = {.target = d->addr};
  struct rpc_client *c = NULL;
  return rpc_client_new(&o, &c) == 0 ? c : NULL;
}

int harness_create_job(struct stk_client *c, const char *name, uint32_t min_ranks,
                       uint32_t max_ranks, uint32_t interval_ms, uint32_t last_call_ms) {
  Stoker__V1__JobSpec spec = STOKER__V1__JOB_SPEC__INIT;
  spec.name = (char *)name;
  spec.min_ranks = min_ranks;
  spec.max_ranks = max_ranks;
  spec.heartbeat_interval_ms = interval_ms;
  spec.heartbeat_misses = 3;
  spec.last_call_ms = last_call_ms;
  spec.join_timeout_ms = 60000;
  Stoker__V1__Job *job = NULL;
  int rc = stk_job_create(c, &spec, 10000, &job);
  if (job) protobuf_c_message_free_unpacked(&job->base, NULL);
  return rc;
}

Stoker__V1__Job *harness_get_job(struct stk_client *c, const char *name) {
  Stoker__V1__Job *job = NULL;
  return stk_job_get(c, name, 10000, &job) == 0 ? job : NULL;
}

void harness_method_path(const ProtobufCServiceDescriptor *desc, const char *method, char *buf,
                         size_t len) {
  const ProtobufCMethodDescriptor *md =
      protobuf_c_service_descriptor_get_method_by_name(desc, method);
  if (!md) {
    fprintf(stderr, "harness: %s has no method %s\n", desc->name, method);
    abort();
  }
  snprintf(buf, len, "/%s/%s", desc->name, md->name);
}

int harness_call(struct rpc_client *rc, const char *method, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **ret_resp,
                 char *ret_msg, size_t msg_len) {
  char path[256];
  if (method[0] == '/')
    snprintf(path, sizeof(path), "%s", method);
  else
    harness_method_path(&stoker__v1__coordinator__descriptor, method, path, sizeof(path));
  ProtobufCMessage *resp = NULL;
  struct rpc_status st = {0};
  int err = rpc_client_unary(rc, path, req, resp_desc, 10000, &resp, &st);
  if (ret_msg) snprintf(ret_msg, msg_len, "%s", err ? st.message : "");
  if (err == 0 && ret_resp)
    *ret_resp = resp;
  else if (resp)
    protobuf_c_message_free_unpacked(resp, NULL);
  return err == 0 ? RPC_OK : (st.code ? st.code : RPC_UNKNOWN);
}

char *harness_http_get(int port, const char *path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  /* Never hang on a peer that does not answer (a port reused by another
   * process between picking it and the daemon's bind, say). */
  struct timeval tv = {.tv_sec = 5};
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
    if (fd >= 0) close(fd);
    return NULL;
  }
  char req[256];
  int n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
  if (write(fd, req, (size_t)n) != n) {
    close(fd);
    return NULL;
  }
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  ssize_t got;
  while ((got = read(fd, buf + len, cap - len - 1)) > 0) {
    len += (size_t)got;
    if (len + 1 == cap) buf = realloc(buf, cap *= 2);
  }
  buf[len] = 0;
  close(fd);
  return buf;
}

int harness_open_fds(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
  DIR *d = opendir(path);
  if (!d) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

int harness_connect_idle(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int harness_health(struct stk_client *c) {
  int status = -1;
  if (stk_health_check(c, "", 3000, &status) != 0) return -1;
  return status;
}

int harness_health_becomes(struct stk_client *c, int want, int64_t timeout_ms) {
  int64_t end = harness_now_ms() + timeout_ms;
  int st = harness_health(c);
  while (st != want && harness_now_ms() < end) {
    harness_sleep_ms(100);
    st = harness_health(c);
  }
  return st;
}

long long harness_metric(int port, const char *series) {
  char *body = harness_http_get(port, "/metrics");
  if (!body) return -1;
  long long v = -1;
  size_t n = strlen(series);
  for (char *line = strstr(body, series); line; line = strstr(line + 1, series))
    if ((line == body || line[-1] == '\n') && line[n] == ' ') v = strtoll(line + n + 1, NULL, 10);
  free(body);
  return v;
}
