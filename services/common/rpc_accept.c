/*
 * rpc_accept: gRPC's accept on a server's listeners, made to survive
 * running out of descriptors and to hold at most max_connections.
 *
 * gRPC C core 1.51 accepts in tcp_server_posix's on_read: it calls accept4
 * until EAGAIN and only then re-arms its (edge-triggered) read
 * notification; any other error (EMFILE, ENFILE, ECONNABORTED, ENOBUFS)
 * ends the loop without re-arming, and the listener never accepts again.
 * It has no limit on connections either, and with TLS it never hands an
 * accepted descriptor to us. So the daemon executable defines accept4:
 * libgrpc calls it through its PLT, and symbol interposition resolves that
 * to the executable's definition, which forwards to the next one
 * (dlsym(RTLD_NEXT): libc's, or a sanitizer's interceptor). Descriptors
 * other than a registered listener pass straight through. On a listener:
 *
 * - a connection beyond the cap is accepted and closed at once (counted as
 *   refused, reason "limit");
 * - EMFILE or ENFILE: the reserve descriptor (/dev/null, held open) is
 *   closed, the pending connection accepted and closed (reason
 *   "descriptors"), the reserve reopened; again until the backlog is empty;
 * - errors about one connection (ECONNABORTED, EPROTO, network errors) skip
 *   it; ENOBUFS and ENOMEM end the round;
 * - the round always ends in EAGAIN, so gRPC re-arms and keeps listening.
 *
 * Live connections are counted without seeing them close: the inode of each
 * accepted socket is remembered by descriptor number; a number accepted
 * again replaces its entry (the old connection must be gone), and at the
 * cap the table is checked with fstat (a closed connection's number holds
 * nothing or another file), at most every SWEEP_MS and at every
 * rpc_server_accept_stats.
 *
 * Threads: gRPC accepts on its pollers' threads, the stats are read on the
 * loop; one mutex guards everything here.
 */
#include "rpc_internal.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <uv.h>

#include "log.h"
#include "metrics.h"
#include "stk_error.h"

#define MAX_LISTENERS      8  /* per server: a wildcard address binds two */
#define MAX_SERVERS        16 /* per process (tests run several) */
#define SWEEP_MS           100
#define MAX_SKIPPED_ERRORS 64 /* per round: a persistent error ends it */

struct rpc_accept {
  int listeners[MAX_LISTENERS];
  size_t n_listeners;
  size_t max_connections;
  ino_t *conn_ino; /* [conn_len] by descriptor number; 0: none */
  size_t conn_len;
  size_t live; /* Entries in conn_ino. */
  uint64_t last_sweep_ms;
  uint64_t refused_limit, refused_descriptors;
  struct metric_counter *m_refused_limit, *m_refused_descriptors;
  struct metric_gauge *m_live;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct rpc_accept *servers[MAX_SERVERS];
static atomic_int n_servers; /* Read without the lock on every accept. */
static int reserve_fd = -1;

typedef int (*accept4_fn)(int, struct sockaddr *, socklen_t *, int);
static accept4_fn next_accept4;
static pthread_once_t next_once = PTHREAD_ONCE_INIT;

static int syscall_accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
  return (int)syscall(SYS_accept4, fd, addr, len, flags);
}

static void find_next(void) {
  next_accept4 = (accept4_fn)dlsym(RTLD_NEXT, "accept4");
  if (!next_accept4) next_accept4 = syscall_accept4;
}

static int call_next(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
  pthread_once(&next_once, find_next);
  return next_accept4(fd, addr, len, flags);
}

static uint64_t now_ms(void) {
  return uv_hrtime() / 1000000u;
}

static struct rpc_accept *guard_of(int listener) {
  for (int i = 0; i < MAX_SERVERS; i++) {
    struct rpc_accept *a = servers[i];
    if (!a) continue;
    for (size_t k = 0; k < a->n_listeners; k++)
      if (a->listeners[k] == listener) return a;
  }
  return NULL;
}

static void set_live(struct rpc_accept *a, size_t live) {
  a->live = live;
  metric_gauge_set(a->m_live, (double)live);
}

/* Drops the entries of connections closed since they were accepted. */
static void sweep(struct rpc_accept *a) {
  size_t live = 0;
  for (size_t fd = 0; fd < a->conn_len; fd++) {
    if (!a->conn_ino[fd]) continue;
    struct stat st;
    if (fstat((int)fd, &st) != 0 || !S_ISSOCK(st.st_mode) || st.st_ino != a->conn_ino[fd])
      a->conn_ino[fd] = 0;
    else
      live++;
  }
  a->last_sweep_ms = now_ms();
  set_live(a, live);
}

/* Records fd as a live connection, or says it is one too many. A
 * connection that cannot be recorded (no memory) is let in uncounted. */
static bool admit(struct rpc_accept *a, int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) return true;
  size_t i = (size_t)fd;
  if (i < a->conn_len && a->conn_ino[i]) { /* the number's last holder closed */
    a->conn_ino[i] = st.st_ino;
    return true;
  }
  if (a->live >= a->max_connections && now_ms() - a->last_sweep_ms >= SWEEP_MS) sweep(a);
  if (a->live >= a->max_connections) return false;
  if (i >= a->conn_len) {
    size_t len = a->conn_len ? a->conn_len : 256;
    while (len <= i) len *= 2;
    ino_t *grown = realloc(a->conn_ino, len * sizeof(*grown));
    if (!grown) return true;
    memset(grown + a->conn_len, 0, (len - a->conn_len) * sizeof(*grown));
    a->conn_ino = grown;
    a->conn_len = len;
  }
  a->conn_ino[i] = st.st_ino;
  set_live(a, a->live + 1);
  return true;
}

static void reopen_reserve(void) {
  if (reserve_fd < 0) reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

/* Out of descriptors with a connection waiting: gives the reserve up to
 * take the connection off the backlog and close it. False when there was
 * nothing to take or no reserve. */
static bool shed_one(struct rpc_accept *a, int listener) {
  reopen_reserve();
  if (reserve_fd < 0) return false;
  close(reserve_fd);
  reserve_fd = -1;
  int fd = call_next(listener, NULL, NULL, SOCK_CLOEXEC);
  if (fd >= 0) {
    close(fd);
    a->refused_descriptors++;
    metric_counter_add(a->m_refused_descriptors, 1);
  }
  reopen_reserve();
  return fd >= 0;
}

/* One accept on a registered listener, as gRPC expects it: a connection,
 * or -1 with EAGAIN once the backlog is empty (or cannot be emptied now),
 * or the listener's own error (EBADF and the like, at shutdown). */
static int accept_guarded(struct rpc_accept *a, int listener, struct sockaddr *addr,
                          socklen_t *addr_len, int flags) {
  socklen_t room = addr_len ? *addr_len : 0;
  for (int skipped = 0;;) {
    socklen_t len = room;
    int fd = call_next(listener, addr, addr_len ? &len : NULL, flags);
    if (fd >= 0) {
      if (admit(a, fd)) {
        if (addr_len) *addr_len = len;
        return fd;
      }
      close(fd);
      a->refused_limit++;
      metric_counter_add(a->m_refused_limit, 1);
      continue;
    }
    switch (errno) {
    case EAGAIN:
    case EBADF:
    case EINVAL:
    case ENOTSOCK:
    case EFAULT:
      return -1;
    case EMFILE:
    case ENFILE:
      if (shed_one(a, listener)) continue;
      errno = EAGAIN;
      return -1;
    case ENOBUFS:
    case ENOMEM:
      errno = EAGAIN;
      return -1;
    default: /* EINTR, ECONNABORTED, EPROTO, the network errors of accept(2) */
      if (++skipped >= MAX_SKIPPED_ERRORS) {
        errno = EAGAIN;
        return -1;
      }
    }
  }
}

/* The interposed accept4 (see the top of the file), declared as glibc's
 * <sys/socket.h> has it (a transparent union for the address under
 * _GNU_SOURCE). */
int accept4(int fd, __SOCKADDR_ARG addr_arg, socklen_t *restrict addr_len, int flags) {
  struct sockaddr *addr = addr_arg.__sockaddr__;
  if (atomic_load_explicit(&n_servers, memory_order_acquire) == 0)
    return call_next(fd, addr, addr_len, flags);
  pthread_mutex_lock(&mu);
  struct rpc_accept *a = guard_of(fd);
  if (!a) {
    pthread_mutex_unlock(&mu);
    return call_next(fd, addr, addr_len, flags);
  }
  int got = accept_guarded(a, fd, addr, addr_len, flags);
  int saved = errno;
  pthread_mutex_unlock(&mu);
  errno = saved;
  return got;
}

/* The listening TCP sockets of this process bound to port. */
static size_t find_listeners(int port, int *ret_fds, size_t max) {
  uv_fs_t req;
  size_t n = 0;
  if (uv_fs_scandir(NULL, &req, "/proc/self/fd", 0, NULL) < 0) {
    uv_fs_req_cleanup(&req);
    return 0;
  }
  for (uv_dirent_t e; n < max && uv_fs_scandir_next(&req, &e) != UV_EOF;) {
    int fd = atoi(e.name);
    int listening = 0;
    socklen_t optlen = sizeof(listening);
    struct sockaddr_storage ss;
    socklen_t sslen = sizeof(ss);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &optlen) != 0 || !listening ||
        getsockname(fd, (struct sockaddr *)&ss, &sslen) != 0)
      continue;
    int bound = ss.ss_family == AF_INET    ? ntohs(((struct sockaddr_in *)&ss)->sin_port)
                : ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                           : -1;
    if (bound == port) ret_fds[n++] = fd;
  }
  uv_fs_req_cleanup(&req);
  return n;
}

size_t rpc_accept_default_max(void) {
  struct rlimit rl;
  size_t soft = 1u << 20;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < soft)
    soft = (size_t)rl.rlim_cur;
  size_t reserve = soft / 4 < 64 ? 64 : soft / 4 > 1024 ? 1024 : soft / 4;
  return soft > 2 * reserve ? soft - reserve : soft / 2 ? soft / 2 : 1;
}

static void make_metrics(struct rpc_accept *a, struct metrics *m) {
  if (!m) return;
  const char *refused = "gRPC connections closed as soon as accepted: limit (max-connections "
                        "reached), descriptors (none left to hold one).";
  a->m_refused_limit =
      metrics_counter(m, "stoker_rpc_connections_refused_total", refused, "reason=\"limit\"");
  a->m_refused_descriptors =
      metrics_counter(m, "stoker_rpc_connections_refused_total", refused, "reason=\"descriptors\"");
  a->m_live =
      metrics_gauge(m, "stoker_rpc_connections",
                    "gRPC connections open (counted at accept, checked at the limit).", NULL);
  metric_gauge_set(metrics_gauge(m, "stoker_rpc_connections_max",
                                 "The most gRPC connections held open at once (max-connections).",
                                 NULL),
                   (double)a->max_connections);
}

/* Whether libgrpc's accept4 reaches the one above: the executable must
 * define and export it (a static link, or a library built with
 * -Bsymbolic, would not). */
static bool interposed(void) {
  return dlsym(RTLD_DEFAULT, "accept4") == (void *)accept4;
}

int rpc_accept_new(int port, size_t max_connections, struct metrics *m,
                   struct rpc_accept **ret_accept) {
  struct rpc_accept *a = calloc(1, sizeof(*a));
  if (!a) return STK_ENOMEM;
  a->max_connections = max_connections ? max_connections : rpc_accept_default_max();
  a->n_listeners = find_listeners(port, a->listeners, MAX_LISTENERS);
  make_metrics(a, m);
  if (!interposed() || a->n_listeners == 0)
    log_warn("rpc.accept_unguarded",
             "port=%d listeners=%zu: gRPC connections are not capped and "
             "its listener stops for good if descriptors run out",
             port, a->n_listeners);
  pthread_mutex_lock(&mu);
  int slot = -1;
  for (int i = 0; i < MAX_SERVERS && slot < 0; i++)
    if (!servers[i]) slot = i;
  if (slot >= 0) {
    servers[slot] = a;
    atomic_fetch_add_explicit(&n_servers, 1, memory_order_release);
    reopen_reserve();
  }
  pthread_mutex_unlock(&mu);
  if (slot < 0) {
    free(a);
    stk_set_detail("rpc: more than %d servers in one process", MAX_SERVERS);
    return STK_ENOMEM;
  }
  *ret_accept = a;
  return 0;
}

void rpc_accept_stats(struct rpc_accept *a, struct rpc_accept_stats *ret) {
  memset(ret, 0, sizeof(*ret));
  if (!a) return;
  pthread_mutex_lock(&mu);
  if (a->live >= a->max_connections) sweep(a);
  ret->live = a->live;
  ret->max = a->max_connections;
  ret->refused_limit = a->refused_limit;
  ret->refused_descriptors = a->refused_descriptors;
  reopen_reserve();
  ret->reserve_held = reserve_fd >= 0;
  pthread_mutex_unlock(&mu);
}

void rpc_accept_free(struct rpc_accept *a) {
  if (!a) return;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAX_SERVERS; i++)
    if (servers[i] == a) {
      servers[i] = NULL;
      atomic_fetch_sub_explicit(&n_servers, 1, memory_order_release);
    }
  pthread_mutex_unlock(&mu);
  free(a->conn_ino);
  free(a);
}
