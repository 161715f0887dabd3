/*
 * Tests for metrics_http: a real listener on 127.0.0.1 port 0 driven by a
 * libuv loop on this thread, and a client thread speaking HTTP over real
 * sockets. After stop, the loop must run dry and close cleanly.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "metrics.h"

struct server {
  uv_loop_t loop;
  uv_async_t done; /* The client thread says it is finished. */
  struct metrics *metrics;
  struct metrics_http *http;
  int port;
};

/* Sends raw bytes, reads the whole response (the server closes). */
static char *exchange(int port, const char *request, size_t request_len) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) return strdup("connect failed");
  for (size_t off = 0; off < request_len;) {
    ssize_t n = send(fd, request + off, request_len - off, MSG_NOSIGNAL);
    if (n <= 0) break; /* The server may answer and close early. */
    off += (size_t)n;
  }
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  ssize_t n;
  while ((n = recv(fd, buf + len, cap - 1 - len, 0)) > 0) len += (size_t)n;
  buf[len] = '\0';
  close(fd);
  return buf;
}

static char *get(int port, const char *request) {
  return exchange(port, request, strlen(request));
}

struct results {
  char *metrics, *head, *root, *missing, *garbage, *method, *huge;
};

static struct results results;

static void *client(void *arg) {
  struct server *s = arg;
  results.metrics = get(s->port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  results.head = get(s->port, "HEAD /metrics HTTP/1.0\r\n\r\n");
  results.root = get(s->port, "GET / HTTP/1.1\r\n\r\n");
  results.missing = get(s->port, "GET /nope HTTP/1.1\r\n\r\n");
  results.garbage = get(s->port, "\x16\x03\x01 hello garbage\r\n\r\n");
  results.method = get(s->port, "POST /metrics HTTP/1.1\r\n\r\n");
  size_t huge_len = 20000;
  char *huge = malloc(huge_len);
  memcpy(huge, "GET /metrics HTTP/1.1\r\nX: ", 26);
  memset(huge + 26, 'a', huge_len - 26);
  results.huge = exchange(s->port, huge, huge_len);
  free(huge);
  uv_async_send(&s->done);
  return NULL;
}

static void on_done(uv_async_t *async) {
  struct server *s = async->data;
  metrics_http_stop(s->http);
  uv_close((uv_handle_t *)async, NULL);
}

static void assert_status(const char *response, const char *status_line) {
  if (strncmp(response, status_line, strlen(status_line)) != 0)
    fail_msg("expected '%s', got '%.80s'", status_line, response);
  assert_non_null(strstr(response, "\r\nConnection: close\r\n"));
}

static void test_serves_metrics(void **state) {
  struct server s = {0};
  s.metrics = metrics_new();
  metric_counter_add(metrics_counter(s.metrics, "hits_total", "Hits.", "path=\"/x\""), 42);
  assert_int_equal(uv_loop_init(&s.loop), 0);
  char bound[64];
  assert_int_equal(
      metrics_http_start(&s.loop, s.metrics, "127.0.0.1:0", bound, sizeof(bound), &s.http), 0);
  assert_true(strncmp(bound, "127.0.0.1:", 10) == 0);
  s.port = atoi(bound + 10);
  assert_true(s.port > 0);
  uv_async_init(&s.loop, &s.done, on_done);
  s.done.data = &s;
  pthread_t t;
  pthread_create(&t, NULL, client, &s);
  uv_run(&s.loop, UV_RUN_DEFAULT);
  pthread_join(t, NULL);
  assert_int_equal(uv_loop_close(&s.loop), 0);

  assert_status(results.metrics, "HTTP/1.1 200 OK\r\n");
  assert_non_null(strstr(results.metrics, "Content-Type: text/plain; version=0.0.4"));
  assert_non_null(strstr(results.metrics, "\r\n\r\n# HELP hits_total Hits.\n"));
  assert_non_null(strstr(results.metrics, "\nhits_total{path=\"/x\"} 42\n"));
  assert_status(results.head, "HTTP/1.1 200 OK\r\n");
  assert_null(strstr(results.head, "hits_total"));
  assert_status(results.root, "HTTP/1.1 200 OK\r\n");
  assert_non_null(strstr(results.root, "href=\"/metrics\""));
  assert_status(results.missing, "HTTP/1.1 404 Not Found\r\n");
  assert_status(results.garbage, "HTTP/1.1 400 Bad Request\r\n");
  assert_status(results.method, "HTTP/1.1 405 Method Not Allowed\r\n");
  assert_status(results.huge, "HTTP/1.1 431 ");
  char **all = (char **)&results;
  for (size_t i = 0; i < sizeof(results) / sizeof(char *); i++) free(all[i]);
  metrics_free(s.metrics);
}

static void test_bad_listen(void **state) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  struct metrics *m = metrics_new();
  struct metrics_http *h = NULL;
  char bound[64];
  assert_true(metrics_http_start(&loop, m, "no-port", bound, sizeof(bound), &h) < 0);
  assert_true(metrics_http_start(&loop, m, "127.0.0.1:99999", bound, sizeof(bound), &h) < 0);
  assert_true(metrics_http_start(&loop, m, "not.an.ip:80", bound, sizeof(bound), &h) < 0);
  assert_null(h);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
  metrics_free(m);
}

static void test_stop_with_idle_connection(void **state) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  struct metrics *m = metrics_new();
  struct metrics_http *h = NULL;
  char bound[64];
  assert_int_equal(metrics_http_start(&loop, m, "127.0.0.1:0", bound, sizeof(bound), &h), 0);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)atoi(strchr(bound, ':') + 1))};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
  assert_int_equal(send(fd, "GET /met", 8, 0), 8); /* Half a request, then silence. */
  for (int i = 0; i < 20; i++) uv_run(&loop, UV_RUN_NOWAIT), usleep(1000);
  metrics_http_stop(h);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
  char c;
  assert_int_equal(recv(fd, &c, 1, 0), 0); /* The server closed it. */
  close(fd);
  metrics_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_serves_metrics),
      cmocka_unit_test(test_bad_listen),
      cmocka_unit_test(test_stop_with_idle_connection),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
