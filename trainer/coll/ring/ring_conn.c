/*
 * ring_conn.c: the ring's TCP plumbing: an ephemeral-port listener, the
 * connection to the next rank (retried until the deadline, since ranks start
 * in any order) and the one accepted from the previous rank, recognised by a
 * small hello (magic, group size, sender rank) so a stray or stale connection
 * is dropped instead of joining the ring. Sockets end up non-blocking with
 * TCP_NODELAY and large buffers, as the engine wants them.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ring.h"
#include "ring_internal.h"
#include "stk_error.h"

#define HELLO_MAGIC   0x53544b52u /* "STKR" */
#define SOCK_BUFFER   (8 << 20)
#define RETRY_MS      20
#define HELLO_WAIT_MS 2000

struct hello {
  uint32_t magic;
  int32_t size;
  int32_t rank;
};

static void set_buffers(int fd) {
  int sz = SOCK_BUFFER;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
}

static void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Splits "HOST:PORT" or "[V6]:PORT" into host and port strings. */
static int split_addr(const char *addr, char *host, size_t host_len, char *port, size_t port_len) {
  const char *colon = strrchr(addr, ':');
  if (!colon || !colon[1] || strlen(colon + 1) >= port_len) return STK_EINVAL;
  const char *h = addr;
  size_t hl = (size_t)(colon - addr);
  if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
    h++;
    hl -= 2;
  }
  if (hl == 0 || hl >= host_len) return STK_EINVAL;
  memcpy(host, h, hl);
  host[hl] = '\0';
  strcpy(port, colon + 1);
  return 0;
}

static int resolve(const char *host, const char *port, int passive, struct addrinfo **ret) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
  if (passive) hints.ai_flags = AI_PASSIVE;
  int rc = getaddrinfo(host, port, &hints, ret);
  if (rc != 0) {
    stk_set_detail("ring: resolve %s: %s", host, gai_strerror(rc));
    return STK_EINVAL;
  }
  return 0;
}

static int format_addr(int fd, char *ret_addr) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0 ||
      getnameinfo((struct sockaddr *)&ss, len, host, sizeof host, port, sizeof port,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return STK_EIO;
  const char *fmt = ss.ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s";
  int n = snprintf(ret_addr, RING_ADDR_MAX, fmt, host, port);
  return n > 0 && n < RING_ADDR_MAX ? 0 : STK_ERANGE;
}

/* Binds and listens on host:port (port "0": ephemeral). */
static int open_listener(const char *host, const char *port, int *ret_fd) {
  struct addrinfo *ai;
  int rc = resolve(host, port, 1, &ai);
  if (rc) return rc;
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  rc = STK_EIO;
  if (fd >= 0) {
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    set_buffers(fd); /* Inherited by accepted sockets, before the handshake. */
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 64) == 0) rc = 0;
  }
  freeaddrinfo(ai);
  if (rc) {
    stk_set_detail("ring: listen on %s:%s: %s", host, port, strerror(errno));
    if (fd >= 0) close(fd);
    return rc;
  }
  *ret_fd = fd;
  return 0;
}

int ring_listen(const char *host, int *ret_listener, char *ret_addr) {
  int fd;
  int rc = open_listener(host && *host ? host : "127.0.0.1", "0", &fd);
  if (rc) return rc;
  if ((rc = format_addr(fd, ret_addr))) {
    close(fd);
    return rc;
  }
  *ret_listener = fd;
  return 0;
}

int ring_listen_at(const char *addr, int *ret_listener) {
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (split_addr(addr, host, sizeof host, port, sizeof port) != 0) {
    stk_set_detail("ring: bad address '%s' (want HOST:PORT)", addr);
    return STK_EINVAL;
  }
  return open_listener(host, port, ret_listener);
}

/* Waits for events on fd until deadline; 0 when ready. */
static int wait_fd(int fd, short events, int64_t deadline_ms) {
  struct pollfd pfd = {.fd = fd, .events = events};
  for (;;) {
    int64_t left = deadline_ms - ring_now_ms();
    if (left <= 0) return STK_ETIMEDOUT;
    int n = poll(&pfd, 1, left > 1000 ? 1000 : (int)left);
    if (n > 0) return 0;
    if (n < 0 && errno != EINTR) return STK_EIO;
  }
}

/* Sends or receives exactly len bytes on a non-blocking socket. */
static int xfer_all(int fd, void *buf, size_t len, int sending, int64_t deadline_ms) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = sending ? send(fd, (char *)buf + done, len - done, MSG_NOSIGNAL)
                        : recv(fd, (char *)buf + done, len - done, 0);
    if (n > 0) {
      done += (size_t)n;
      continue;
    }
    if (n == 0) return STK_EIO;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return STK_EIO;
    int rc = wait_fd(fd, sending ? POLLOUT : POLLIN, deadline_ms);
    if (rc) return rc;
  }
  return 0;
}

/* One non-blocking connect attempt bounded by the deadline. */
static int try_connect(const struct addrinfo *ai, int64_t deadline_ms, int *ret_fd) {
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return STK_EIO;
  set_buffers(fd);
  int rc = 0;
  if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
    rc = errno == EINPROGRESS ? wait_fd(fd, POLLOUT, deadline_ms) : STK_EUNAVAIL;
    int err = 0;
    socklen_t len = sizeof err;
    if (rc == 0 && (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0))
      rc = STK_EUNAVAIL;
  }
  if (rc) {
    close(fd);
    return rc;
  }
  *ret_fd = fd;
  return 0;
}

static void sleep_ms(int64_t ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

int ring_connect_next(const char *addr, int rank, int size, int64_t deadline_ms, int *ret_fd) {
  char host[NI_MAXHOST], port[NI_MAXSERV];
  struct addrinfo *ai;
  int rc = split_addr(addr, host, sizeof host, port, sizeof port);
  if (rc) {
    stk_set_detail("ring: bad address '%s' (want HOST:PORT)", addr);
    return rc;
  }
  if ((rc = resolve(host, port, 0, &ai))) return rc;
  int fd = -1;
  while ((rc = try_connect(ai, deadline_ms, &fd)) == STK_EUNAVAIL) {
    int64_t left = deadline_ms - ring_now_ms();
    if (left <= 0) break;
    sleep_ms(left < RETRY_MS ? left : RETRY_MS);
  }
  freeaddrinfo(ai);
  if (rc) {
    stk_set_detail("ring: connect to %s timed out", addr);
    return STK_ETIMEDOUT;
  }
  set_nodelay(fd);
  struct hello h = {.magic = HELLO_MAGIC, .size = size, .rank = rank};
  if ((rc = xfer_all(fd, &h, sizeof h, 1, deadline_ms))) {
    stk_set_detail("ring: hello to %s failed", addr);
    close(fd);
    return rc;
  }
  *ret_fd = fd;
  return 0;
}

/* Reads and checks the hello of a freshly accepted connection. */
static int check_hello(int fd, int prev_rank, int size, int64_t deadline_ms) {
  struct hello h;
  int64_t hello_deadline = ring_now_ms() + HELLO_WAIT_MS;
  if (hello_deadline > deadline_ms) hello_deadline = deadline_ms;
  if (xfer_all(fd, &h, sizeof h, 0, hello_deadline) != 0) return STK_EIO;
  return h.magic == HELLO_MAGIC && h.size == size && h.rank == prev_rank ? 0 : STK_EINVAL;
}

int ring_accept_prev(int listener, int prev_rank, int size, int64_t deadline_ms, int *ret_fd) {
  for (;;) {
    if (wait_fd(listener, POLLIN, deadline_ms) != 0) {
      stk_set_detail("ring: rank %d did not connect in time", prev_rank);
      return STK_ETIMEDOUT;
    }
    int fd = accept4(listener, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
      stk_set_detail("ring: accept: %s", strerror(errno));
      return STK_EIO;
    }
    if (check_hello(fd, prev_rank, size, deadline_ms) == 0) {
      set_nodelay(fd);
      *ret_fd = fd;
      return 0;
    }
    close(fd); /* Not our neighbour: keep waiting for it. */
  }
}
