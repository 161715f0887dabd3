/*
 * h2_grpc: the bench's unary gRPC client over nghttp2 (see h2_grpc.h).
 *
 * The connection's thread loops: take the calls queued by other threads
 * (a locked list and an eventfd), submit each as an HTTP/2 stream (HEADERS
 * with gRPC's request headers, one DATA frame with the length-prefixed
 * message), let nghttp2 serialize everything pending into one buffer and
 * write it with one send, then poll the socket and feed what it reads to
 * nghttp2. A reply's DATA is gathered per stream; grpc-status comes in the
 * trailers (or a trailers-only response); the stream's close runs done.
 */
#include "h2_grpc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define READ_BYTES  (256 * 1024)
#define WRITE_BYTES (256 * 1024) /* Serialized before each send. */

/* One call: its request bytes (prefix included) and the reply gathered. */
struct h2_req {
  struct h2_req *next; /* The submit queue. */
  const char *path;
  uint8_t *body;
  size_t body_len, body_off;
  uint8_t *reply;
  size_t reply_len, reply_cap;
  int status;
  h2_grpc_done_fn done;
  void *arg;
};

struct h2_grpc {
  int fd;
  int wake_fd;
  char authority[64];
  pthread_t thread;
  nghttp2_session *session;
  pthread_mutex_t mu;
  struct h2_req *head, *tail; /* Queued calls, under mu. */
  bool quit;                  /* Under mu. */
  uint8_t *out;               /* Serialized frames not yet written. */
  size_t out_len, out_off;
  size_t open; /* Calls submitted and not yet finished (thread only). */
  bool broken;
};

/* ------------------------------------------------------ nghttp2 callbacks */

static ssize_t read_body(nghttp2_session *s, int32_t stream_id, uint8_t *buf, size_t len,
                         uint32_t *flags, nghttp2_data_source *src, void *user) {
  struct h2_req *r = src->ptr;
  size_t n = r->body_len - r->body_off;
  if (n > len) n = len;
  memcpy(buf, r->body + r->body_off, n);
  r->body_off += n;
  if (r->body_off == r->body_len) *flags |= NGHTTP2_DATA_FLAG_EOF;
  return (ssize_t)n;
}

static int on_header(nghttp2_session *s, const nghttp2_frame *frame, const uint8_t *name,
                     size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                     void *user) {
  if (namelen != 11 || memcmp(name, "grpc-status", 11) != 0) return 0;
  struct h2_req *r = nghttp2_session_get_stream_user_data(s, frame->hd.stream_id);
  if (r) r->status = atoi((const char *)value); /* Digits, then a byte nghttp2 NUL-terminates. */
  (void)valuelen;
  return 0;
}

static int on_data(nghttp2_session *s, uint8_t flags, int32_t stream_id, const uint8_t *data,
                   size_t len, void *user) {
  struct h2_req *r = nghttp2_session_get_stream_user_data(s, stream_id);
  if (!r) return 0;
  if (r->reply_len + len > r->reply_cap) {
    size_t cap = r->reply_cap ? r->reply_cap * 2 : 256;
    while (cap < r->reply_len + len) cap *= 2;
    uint8_t *grown = realloc(r->reply, cap);
    if (!grown) return NGHTTP2_ERR_CALLBACK_FAILURE;
    r->reply = grown;
    r->reply_cap = cap;
  }
  memcpy(r->reply + r->reply_len, data, len);
  r->reply_len += len;
  return 0;
}

static void finish(struct h2_grpc *c, struct h2_req *r, bool reset) {
  c->open--;
  const uint8_t *msg = NULL;
  size_t len = 0;
  if (r->reply_len >= 5) {
    uint32_t n = (uint32_t)r->reply[1] << 24 | (uint32_t)r->reply[2] << 16 |
                 (uint32_t)r->reply[3] << 8 | r->reply[4];
    if (n <= r->reply_len - 5) {
      msg = r->reply + 5;
      len = n;
    }
  }
  int status = reset && r->status == 0 && !msg ? -1 : r->status;
  r->done(r->arg, status, msg, len);
  free(r->reply);
  free(r->body);
  free(r);
}

static int on_close(nghttp2_session *s, int32_t stream_id, uint32_t error_code, void *user) {
  struct h2_req *r = nghttp2_session_get_stream_user_data(s, stream_id);
  if (r) finish(user, r, error_code != NGHTTP2_NO_ERROR);
  return 0;
}

static int new_session(struct h2_grpc *c) {
  nghttp2_session_callbacks *cb;
  if (nghttp2_session_callbacks_new(&cb) != 0) return -1;
  nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data);
  nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_close);
  int rc = nghttp2_session_client_new(&c->session, cb, c);
  nghttp2_session_callbacks_del(cb);
  if (rc != 0) return -1;
  /* Wide windows: replies are small, but 100,000 open streams are not. */
  nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20},
                                 {NGHTTP2_SETTINGS_ENABLE_PUSH, 0}};
  if (nghttp2_submit_settings(c->session, NGHTTP2_FLAG_NONE, iv, 2) != 0) return -1;
  return nghttp2_session_set_local_window_size(c->session, NGHTTP2_FLAG_NONE, 0, 1 << 30);
}

/* ------------------------------------------------------- the connection */

#define NV(n, v)                                                                                   \
  { (uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, strlen(v), NGHTTP2_NV_FLAG_NO_COPY_NAME }

static void submit(struct h2_grpc *c, struct h2_req *r) {
  nghttp2_nv nva[] = {NV(":method", "POST"),
                      NV(":scheme", "http"),
                      NV(":path", r->path),
                      NV(":authority", c->authority),
                      NV("content-type", "application/grpc"),
                      NV("te", "trailers")};
  nghttp2_data_provider body = {.source.ptr = r, .read_callback = read_body};
  c->open++;
  if (nghttp2_submit_request(c->session, NULL, nva, sizeof(nva) / sizeof(nva[0]), &body, r) < 0)
    finish(c, r, true);
}

static void submit_queued(struct h2_grpc *c, bool *ret_quit) {
  pthread_mutex_lock(&c->mu);
  struct h2_req *r = c->head;
  c->head = c->tail = NULL;
  *ret_quit = c->quit;
  pthread_mutex_unlock(&c->mu);
  while (r) {
    struct h2_req *next = r->next;
    submit(c, r);
    r = next;
  }
}

/* Serializes what nghttp2 has pending and writes as much as the socket
 * takes. true while bytes are left for POLLOUT. */
static bool flush(struct h2_grpc *c) {
  for (;;) {
    if (c->out_off == c->out_len) {
      c->out_off = c->out_len = 0;
      while (c->out_len < WRITE_BYTES) {
        const uint8_t *data;
        ssize_t n = nghttp2_session_mem_send(c->session, &data);
        if (n <= 0) break;
        if (c->out_len + (size_t)n > WRITE_BYTES) { /* Rare: a frame larger than the room. */
          uint8_t *grown = realloc(c->out, c->out_len + (size_t)n);
          if (!grown) break;
          c->out = grown;
        }
        memcpy(c->out + c->out_len, data, (size_t)n);
        c->out_len += (size_t)n;
      }
      if (c->out_len == 0) return false;
    }
    ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EAGAIN || errno == EINTR) return true;
      c->broken = true;
      return false;
    }
    c->out_off += (size_t)w;
    if (c->out_off < c->out_len) return true;
  }
}

static void receive(struct h2_grpc *c, uint8_t *buf) {
  for (;;) {
    ssize_t n = recv(c->fd, buf, READ_BYTES, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0 || nghttp2_session_mem_recv(c->session, buf, (size_t)n) < 0) {
      c->broken = true;
      return;
    }
    if (n < READ_BYTES) return;
  }
}

static void *run(void *arg) {
  struct h2_grpc *c = arg;
  uint8_t *buf = malloc(READ_BYTES);
  for (;;) {
    bool quit;
    submit_queued(c, &quit);
    bool want_out = !c->broken && flush(c);
    if (c->broken) break;
    if (quit && c->open == 0) break;
    struct pollfd fds[2] = {{.fd = c->fd, .events = POLLIN | (want_out ? POLLOUT : 0)},
                            {.fd = c->wake_fd, .events = POLLIN}};
    if (poll(fds, 2, -1) < 0 && errno != EINTR) break;
    if (fds[1].revents & POLLIN) {
      uint64_t v;
      if (read(c->wake_fd, &v, sizeof(v)) < 0) { /* Nonblocking; spurious wakeups are fine. */
      }
    }
    if (fds[0].revents & (POLLIN | POLLERR | POLLHUP)) receive(c, buf);
  }
  if (c->broken) { /* Its open calls would never finish: the bench cannot go on. */
    fprintf(stderr, "h2_grpc: connection to %s broke\n", c->authority);
    exit(1);
  }
  free(buf);
  return NULL;
}

/* ------------------------------------------------------------- the API */

static int dial(const char *host_port) {
  char host[64];
  const char *colon = strrchr(host_port, ':');
  if (!colon || (size_t)(colon - host_port) >= sizeof(host)) return -1;
  memcpy(host, host_port, (size_t)(colon - host_port));
  host[colon - host_port] = '\0';
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
  if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) return -1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int h2_grpc_connect(const char *host_port, struct h2_grpc **ret_conn) {
  struct h2_grpc *c = calloc(1, sizeof(*c));
  if (!c) return -1;
  snprintf(c->authority, sizeof(c->authority), "%s", host_port);
  pthread_mutex_init(&c->mu, NULL);
  c->out = malloc(WRITE_BYTES);
  c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  c->fd = dial(host_port);
  if (c->fd < 0 || c->wake_fd < 0 || !c->out || new_session(c) != 0 ||
      pthread_create(&c->thread, NULL, run, c) != 0) {
    fprintf(stderr, "h2_grpc: cannot connect to %s\n", host_port);
    if (c->session) nghttp2_session_del(c->session);
    if (c->fd >= 0) close(c->fd);
    if (c->wake_fd >= 0) close(c->wake_fd);
    free(c->out);
    free(c);
    return -1;
  }
  *ret_conn = c;
  return 0;
}

static void wake(struct h2_grpc *c) {
  uint64_t one = 1;
  if (write(c->wake_fd, &one, sizeof(one)) < 0) { /* Only fails when the counter is full. */
  }
}

int h2_grpc_call(struct h2_grpc *c, const char *path, const ProtobufCMessage *req,
                 h2_grpc_done_fn done, void *arg) {
  struct h2_req *r = calloc(1, sizeof(*r));
  size_t n = protobuf_c_message_get_packed_size(req);
  if (!r || !(r->body = malloc(n + 5))) {
    free(r);
    return -1;
  }
  r->body[0] = 0; /* Not compressed. */
  r->body[1] = (uint8_t)(n >> 24);
  r->body[2] = (uint8_t)(n >> 16);
  r->body[3] = (uint8_t)(n >> 8);
  r->body[4] = (uint8_t)n;
  protobuf_c_message_pack(req, r->body + 5);
  r->body_len = n + 5;
  r->path = path;
  r->done = done;
  r->arg = arg;
  pthread_mutex_lock(&c->mu);
  bool first = !c->head;
  if (c->tail)
    c->tail->next = r;
  else
    c->head = r;
  c->tail = r;
  pthread_mutex_unlock(&c->mu);
  if (first) wake(c); /* Later ones find the thread already woken. */
  return 0;
}

void h2_grpc_close(struct h2_grpc *c) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  c->quit = true;
  pthread_mutex_unlock(&c->mu);
  wake(c);
  pthread_join(c->thread, NULL);
  nghttp2_session_del(c->session); /* Runs no callbacks: every call has finished. */
  close(c->fd);
  close(c->wake_fd);
  free(c->out);
  pthread_mutex_destroy(&c->mu);
  free(c);
}
