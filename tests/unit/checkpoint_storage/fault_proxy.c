/*
 * The fault-injecting TCP proxy for the S3 retry tests (see fault_proxy.h):
 * one accept thread, one thread per connection.
 */
#include "fault_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

struct fault_proxy {
  int listen_fd;
  int port;
  int upstream_port;
  pthread_t acceptor;
  atomic_int faults_left;
  atomic_int kind;
  atomic_int injected;
  atomic_int live; /* Connection threads still running. */
  atomic_bool stopping;
};

struct conn {
  struct fault_proxy *p;
  int fd;
  bool fault;
  enum fault_kind kind;
};

/* Reads a request's headers and its Content-Length body. */
static void drain_request(int fd) {
  char buf[65536];
  size_t len = 0;
  char *end = NULL;
  while (!end && len < sizeof(buf) - 1) {
    ssize_t n = read(fd, buf + len, sizeof(buf) - 1 - len);
    if (n <= 0) return;
    len += (size_t)n;
    buf[len] = '\0';
    end = strstr(buf, "\r\n\r\n");
  }
  if (!end) return;
  long body = 0;
  for (char *line = strstr(buf, "\r\n"); line && line < end; line = strstr(line + 2, "\r\n"))
    if (strncasecmp(line + 2, "Content-Length:", 15) == 0) body = atol(line + 17);
  long have = (long)(len - (size_t)(end + 4 - buf));
  while (have < body) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) return;
    have += n;
  }
}

static void inject(struct conn *c) {
  drain_request(c->fd);
  if (c->kind == FAULT_RESET) {
    struct linger lg = {1, 0};
    setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    return;
  }
  const char *body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code>"
                     "<Message>Please reduce your request rate.</Message></Error>";
  char head[256];
  int n = snprintf(head, sizeof(head),
                   "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                   "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                   strlen(body));
  if (write(c->fd, head, (size_t)n) < 0 || write(c->fd, body, strlen(body)) < 0) return;
}

static int connect_upstream(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0) return fd;
  if (fd >= 0) close(fd);
  return -1;
}

static void relay(int a, int b) {
  struct pollfd pf[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
  char buf[65536];
  for (;;) {
    if (poll(pf, 2, 30000) <= 0) return;
    for (int i = 0; i < 2; i++) {
      if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = read(pf[i].fd, buf, sizeof(buf));
      if (n <= 0) return;
      for (ssize_t off = 0; off < n;) {
        ssize_t w = write(pf[1 - i].fd, buf + off, (size_t)(n - off));
        if (w <= 0) return;
        off += w;
      }
    }
  }
}

static void *conn_main(void *arg) {
  struct conn *c = arg;
  if (c->fault) {
    inject(c);
  } else {
    int up = connect_upstream(c->p->upstream_port);
    if (up >= 0) {
      relay(c->fd, up);
      close(up);
    }
  }
  close(c->fd);
  atomic_fetch_sub(&c->p->live, 1);
  free(c);
  return NULL;
}

static void *accept_main(void *arg) {
  struct fault_proxy *p = arg;
  for (;;) {
    int fd = accept4(p->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
      if (atomic_load(&p->stopping)) return NULL;
      continue;
    }
    struct conn *c = calloc(1, sizeof(*c));
    c->p = p;
    c->fd = fd;
    c->kind = (enum fault_kind)atomic_load(&p->kind);
    c->fault = atomic_fetch_sub(&p->faults_left, 1) > 0;
    if (c->fault)
      atomic_fetch_add(&p->injected, 1);
    else
      atomic_fetch_add(&p->faults_left, 1);
    atomic_fetch_add(&p->live, 1);
    pthread_t t;
    pthread_create(&t, NULL, conn_main, c);
    pthread_detach(t);
  }
}

struct fault_proxy *fault_proxy_start(int upstream_port) {
  struct fault_proxy *p = calloc(1, sizeof(*p));
  p->upstream_port = upstream_port;
  p->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof(a);
  if (bind(p->listen_fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(p->listen_fd, 64) != 0 ||
      getsockname(p->listen_fd, (struct sockaddr *)&a, &alen) != 0) {
    close(p->listen_fd);
    free(p);
    return NULL;
  }
  p->port = ntohs(a.sin_port);
  pthread_create(&p->acceptor, NULL, accept_main, p);
  return p;
}

void fault_proxy_set(struct fault_proxy *p, enum fault_kind kind, int count) {
  atomic_store(&p->kind, (int)kind);
  atomic_store(&p->faults_left, count);
}

int fault_proxy_port(const struct fault_proxy *p) {
  return p->port;
}

int fault_proxy_injected(const struct fault_proxy *p) {
  return atomic_load(&p->injected);
}

void fault_proxy_stop(struct fault_proxy *p) {
  atomic_store(&p->stopping, true);
  shutdown(p->listen_fd, SHUT_RDWR);
  pthread_join(p->acceptor, NULL);
  close(p->listen_fd);
  /* Relays end when their peers close; give them a moment. */
  for (int i = 0; i < 500 && atomic_load(&p->live) > 0; i++) usleep(10000);
  if (atomic_load(&p->live) == 0) free(p); /* else leak it rather than race a thread */
}
