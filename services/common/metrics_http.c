/*
 * metrics_http: the smallest HTTP/1.1 server that lets Prometheus scrape a
 * daemon. It runs on the daemon's libuv loop, so it needs no thread of its
 * own: each connection reads one request (capped at 8 KiB), answers it
 * with Connection: close, shuts its side down, drains what the client
 * still sends and closes; a sweep timer cuts off any connection older than
 * ten seconds. At most MAX_CONNS connections are open: a new one beyond
 * that closes the oldest, so idle connections can neither exhaust the
 * daemon's descriptors nor lock a scraper out. GET /metrics returns the registry's render; GET /
 * points there; other paths get 404, other methods 405, anything that is not a request line 400,
 * and a request over the cap 431.
 *
 * Lifetime: the server and each connection are libuv handles, freed only
 * in their close callbacks; metrics_http_stop closes them all, and the
 * struct itself is freed when the last one has closed, so the caller's
 * loop runs dry and uv_loop_close succeeds.
 */
#include "metrics.h"
#include "net_listen.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stk_error.h"
#include "strbuf.h"

#define REQUEST_CAP     8192
#define CONN_TIMEOUT_MS 10000 /* A connection lives at most this long. */
#define SWEEP_MS        1000
#define MAX_CONNS       32 /* Open connections; a new one closes the oldest. */

struct conn {
  uv_tcp_t tcp; /* First: the handle's address is the conn's. */
  struct metrics_http *http;
  struct conn *prev, *next;
  uv_write_t write_req;
  uv_shutdown_t shutdown_req;
  char *response; /* malloc'd, alive until the write completes. */
  size_t len;
  bool answered;
  uint64_t started_ms; /* uv_now at accept. */
  char request[REQUEST_CAP];
};

struct metrics_http {
  uv_tcp_t server;
  uv_timer_t sweep; /* Closes connections older than CONN_TIMEOUT_MS. */
  struct metrics *metrics;
  struct conn *conns; /* Open connections, newest first, to close on stop. */
  int n_conns;        /* In conns (closing ones included). */
  int open_handles;   /* Server, timer and connections not yet closed. */
};

static void handle_closed(struct metrics_http *h) {
  if (--h->open_handles == 0) free(h);
}

static void on_conn_closed(uv_handle_t *handle) {
  struct conn *c = (struct conn *)handle;
  struct metrics_http *h = c->http;
  if (c->prev) c->prev->next = c->next;
  if (c->next) c->next->prev = c->prev;
  if (h->conns == c) h->conns = c->next;
  h->n_conns--;
  free(c->response);
  free(c);
  handle_closed(h);
}

static void conn_close(struct conn *c) {
  if (!uv_is_closing((uv_handle_t *)&c->tcp)) uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
}

static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf);

/* Lingering close: read and discard until the client closes, so unread
 * request bytes do not turn our close into a reset that loses the reply. */
static void on_shutdown(uv_shutdown_t *req, int status) {
  struct conn *c = req->data;
  if (status < 0 || uv_is_closing((uv_handle_t *)&c->tcp) ||
      uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0)
    conn_close(c);
}

static void on_written(uv_write_t *req, int status) {
  struct conn *c = req->data;
  if (status < 0 || uv_is_closing((uv_handle_t *)&c->tcp) ||
      uv_shutdown(&c->shutdown_req, (uv_stream_t *)&c->tcp, on_shutdown) != 0)
    conn_close(c);
}

/* Queues the whole response and closes after it is written. */
static void respond(struct conn *c, int status, const char *reason, const char *type,
                    const char *body, size_t body_len, bool head_only) {
  struct strbuf sb = STRBUF_INIT;
  strbuf_printf(&sb,
                "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                "Connection: close\r\n\r\n",
                status, reason, type, body_len);
  if (!head_only) strbuf_append(&sb, body, body_len);
  c->answered = true;
  uv_read_stop((uv_stream_t *)&c->tcp);
  c->response = strbuf_take(&sb, NULL);
  if (!c->response) return conn_close(c);
  uv_buf_t buf = uv_buf_init(c->response, (unsigned)strlen(c->response));
  c->write_req.data = c;
  c->shutdown_req.data = c;
  if (uv_write(&c->write_req, (uv_stream_t *)&c->tcp, &buf, 1, on_written) != 0) conn_close(c);
}

static void respond_text(struct conn *c, int status, const char *reason, const char *body) {
  respond(c, status, reason, "text/plain; charset=utf-8", body, strlen(body), false);
}

/* Splits "METHOD TARGET HTTP/1.x" (line is NUL-terminated, no CRLF).
 * Returns false when it is not a request line. */
static bool parse_request_line(char *line, char **ret_method, char **ret_target) {
  char *sp1 = strchr(line, ' ');
  char *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
  if (!sp1 || !sp2 || strchr(sp2 + 1, ' ')) return false;
  *sp1 = *sp2 = '\0';
  if (sp1 == line || strncmp(sp2 + 1, "HTTP/1.", 7) != 0 || sp1[1] != '/') return false;
  for (char *p = line; *p; p++)
    if (*p < 'A' || *p > 'Z') return false;
  *ret_method = line;
  *ret_target = sp1 + 1;
  return true;
}

static bool path_is(const char *target, const char *path) {
  size_t n = strlen(path);
  return strncmp(target, path, n) == 0 && (target[n] == '\0' || target[n] == '?');
}

static void serve(struct conn *c, const char *method, const char *target) {
  bool head = strcmp(method, "HEAD") == 0;
  if (!head && strcmp(method, "GET") != 0)
    return respond_text(c, 405, "Method Not Allowed", "method not allowed\n");
  if (path_is(target, "/metrics")) {
    size_t len = 0;
    char *text = metrics_render(c->http->metrics, &len);
    if (!text) return respond_text(c, 500, "Internal Server Error", "out of memory\n");
    respond(c, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", text, len, head);
    free(text);
  } else if (path_is(target, "/")) {
    static const char page[] = "<html><body><a href=\"/metrics\">/metrics</a></body></html>\n";
    respond(c, 200, "OK", "text/html; charset=utf-8", page, sizeof(page) - 1, head);
  } else {
    respond_text(c, 404, "Not Found", "not found\n");
  }
}

/* Decides once the request line is complete (answering garbage at once)
 * and serves once the header block has ended. */
static void examine(struct conn *c, size_t len) {
  c->request[len] = '\0';
  char *eol = strchr(c->request, '\n');
  if (!eol) {
    if (len >= REQUEST_CAP - 1)
      respond_text(c, 431, "Request Header Fields Too Large", "request too large\n");
    return;
  }
  bool complete = strstr(c->request, "\r\n\r\n") || strstr(c->request, "\n\n");
  char line[REQUEST_CAP];
  size_t n = (size_t)(eol - c->request);
  if (n > 0 && c->request[n - 1] == '\r') n--;
  memcpy(line, c->request, n);
  line[n] = '\0';
  char *method, *target;
  if (!parse_request_line(line, &method, &target))
    return respond_text(c, 400, "Bad Request", "bad request\n");
  if (complete) return serve(c, method, target);
  if (len >= REQUEST_CAP - 1)
    respond_text(c, 431, "Request Header Fields Too Large", "request too large\n");
}

static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf) {
  struct conn *c = (struct conn *)handle;
  if (c->answered) { /* Draining: the buffer is scratch. */
    buf->base = c->request;
    buf->len = REQUEST_CAP;
    return;
  }
  /* One byte stays free for the terminating NUL. */
  buf->base = c->request + c->len;
  buf->len = REQUEST_CAP - 1 - c->len;
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
  struct conn *c = (struct conn *)stream;
  if (c->answered) {
    if (nread < 0) conn_close(c);
    return;
  }
  if (nread < 0) {
    if (nread == UV_EOF && c->len > 0)
      return respond_text(c, 400, "Bad Request", "incomplete request\n");
    return conn_close(c);
  }
  c->len += (size_t)nread;
  examine(c, c->len);
}

/* At the cap: closes the oldest connection not already closing. */
static void evict_oldest(struct metrics_http *h) {
  struct conn *oldest = NULL;
  for (struct conn *c = h->conns; c; c = c->next)
    if (!uv_is_closing((uv_handle_t *)&c->tcp)) oldest = c;
  if (oldest) conn_close(oldest);
}

static void on_connection(uv_stream_t *server, int status) {
  struct metrics_http *h = server->data;
  if (status < 0) return;
  if (h->n_conns >= MAX_CONNS) evict_oldest(h);
  struct conn *c = calloc(1, sizeof(*c));
  if (!c) return;
  c->http = h;
  c->started_ms = uv_now(server->loop);
  uv_tcp_init(server->loop, &c->tcp);
  h->open_handles++;
  h->n_conns++;
  c->next = h->conns;
  if (h->conns) h->conns->prev = c;
  h->conns = c;
  if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0 ||
      uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0)
    conn_close(c);
}

/* "HOST:PORT", "[V6]:PORT" or ":PORT" (all interfaces) to a socket address. */
static int parse_listen(const char *listen, struct sockaddr_storage *ret_addr) {
  const char *colon = strrchr(listen, ':');
  if (!colon) return STK_EINVAL;
  char *end;
  long port = strtol(colon + 1, &end, 10);
  if (end == colon + 1 || *end || port < 0 || port > 65535) return STK_EINVAL;
  char host[64];
  size_t n = (size_t)(colon - listen);
  if (n >= sizeof(host)) return STK_EINVAL;
  memcpy(host, listen, n);
  host[n] = '\0';
  if (n >= 2 && host[0] == '[' && host[n - 1] == ']') {
    host[n - 1] = '\0';
    return uv_ip6_addr(host + 1, (int)port, (struct sockaddr_in6 *)ret_addr) ? STK_EINVAL : 0;
  }
  if (n == 0) strcpy(host, "0.0.0.0");
  return uv_ip4_addr(host, (int)port, (struct sockaddr_in *)ret_addr) ? STK_EINVAL : 0;
}

static void format_bound(const uv_tcp_t *tcp, char *out, size_t out_len) {
  struct sockaddr_storage ss;
  int len = sizeof(ss);
  char ip[64] = "?";
  int port = 0;
  uv_tcp_getsockname(tcp, (struct sockaddr *)&ss, &len);
  if (ss.ss_family == AF_INET6) {
    uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof(ip));
    port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    snprintf(out, out_len, "[%s]:%d", ip, port);
  } else {
    uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof(ip));
    port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    snprintf(out, out_len, "%s:%d", ip, port);
  }
}

static void on_server_closed(uv_handle_t *handle) {
  handle_closed(handle->data);
}

/* Slow or silent clients (a request that never ends, a client that never
 * closes after the reply) are cut off here. */
static void on_sweep(uv_timer_t *timer) {
  struct metrics_http *h = timer->data;
  uint64_t now = uv_now(timer->loop);
  for (struct conn *c = h->conns; c; c = c->next)
    if (now - c->started_ms > CONN_TIMEOUT_MS) conn_close(c);
}

/* On failure the half-made server is closed and freed once the loop runs. */
int metrics_http_start(uv_loop_t *loop, struct metrics *m, const char *listen, char *ret_bound,
                       size_t bound_len, struct metrics_http **ret_http) {
  struct sockaddr_storage addr;
  memset(&addr, 0, sizeof(addr));
  if (!loop || !m || !listen || parse_listen(listen, &addr) != 0) {
    stk_set_detail("metrics listen address '%s': expected HOST:PORT", listen ? listen : "");
    return STK_EINVAL;
  }
  struct metrics_http *h = calloc(1, sizeof(*h));
  if (!h) return STK_ENOMEM;
  h->metrics = m;
  uv_tcp_init(loop, &h->server);
  h->server.data = h;
  uv_timer_init(loop, &h->sweep);
  h->sweep.data = h;
  uv_unref((uv_handle_t *)&h->sweep);
  h->open_handles = 2;
  int rc = uv_tcp_bind(&h->server, (struct sockaddr *)&addr, 0);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&h->server, 128, on_connection);
  if (rc != 0) {
    char why[300];
    net_listen_describe(listen, -rc, why, sizeof(why));
    stk_set_detail("%s", why);
    uv_close((uv_handle_t *)&h->server, on_server_closed);
    uv_close((uv_handle_t *)&h->sweep, on_server_closed);
    return rc == UV_EADDRINUSE ? STK_EUNAVAIL : STK_EIO;
  }
  uv_timer_start(&h->sweep, on_sweep, SWEEP_MS, SWEEP_MS);
  if (ret_bound && bound_len) format_bound(&h->server, ret_bound, bound_len);
  *ret_http = h;
  return 0;
}

void metrics_http_stop(struct metrics_http *h) {
  if (!h) return;
  for (struct conn *c = h->conns; c; c = c->next) conn_close(c);
  uv_close((uv_handle_t *)&h->server, on_server_closed);
  uv_close((uv_handle_t *)&h->sweep, on_server_closed);
}
