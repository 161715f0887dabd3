/*
 * The fake S3 HTTP server of the S3 listing tests (see fake_s3.h): one
 * thread accepts and serves connections one at a time.
 */
#include "fake_s3.h"

#include "s3_xml.h"
#include "strbuf.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_LOG 256

struct fake_s3 {
  int listen_fd, port;
  char endpoint[64]; /* "http://127.0.0.1:<port>" */
  fake_s3_handler fn;
  void *arg;
  pthread_t thread;
  atomic_bool stopping;
  pthread_mutex_t mu;
  char *log[MAX_LOG];
  size_t n_log;
};

/* Reads the request head and skips its Content-Length body. 0 or -1. */
static int read_request(int fd, char *head, size_t cap) {
  size_t len = 0;
  char *end = NULL;
  while (!end && len < cap - 1) {
    ssize_t n = read(fd, head + len, cap - 1 - len);
    if (n <= 0) return -1;
    len += (size_t)n;
    head[len] = '\0';
    end = strstr(head, "\r\n\r\n");
  }
  if (!end) return -1;
  long body = 0;
  for (char *line = strstr(head, "\r\n"); line && line < end; line = strstr(line + 2, "\r\n"))
    if (strncasecmp(line + 2, "Content-Length:", 15) == 0) body = atol(line + 17);
  long have = (long)(len - (size_t)(end + 4 - head));
  char sink[4096];
  while (have < body) {
    ssize_t n = read(fd, sink, sizeof(sink));
    if (n <= 0) return -1;
    have += n;
  }
  *end = '\0';
  return 0;
}

static void write_all(int fd, const char *p, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n <= 0) return;
    p += n;
    len -= (size_t)n;
  }
}

static void log_request(struct fake_s3 *f, const char *line) {
  pthread_mutex_lock(&f->mu);
  if (f->n_log < MAX_LOG) f->log[f->n_log++] = strdup(line);
  pthread_mutex_unlock(&f->mu);
}

static void serve(struct fake_s3 *f, int fd) {
  static char head[65536];
  if (read_request(fd, head, sizeof(head)) != 0) return;
  char method[16], target[8192];
  if (sscanf(head, "%15s %8191s", method, target) != 2) return;
  char line[8300];
  snprintf(line, sizeof(line), "%s %s", method, target);
  log_request(f, line);
  char *q = strchr(target, '?');
  if (q) *q++ = '\0';
  struct fake_s3_reply r = {.status = 200};
  f->fn(f->arg, method, target, q ? q : "", &r);
  size_t blen = r.body ? strlen(r.body) : 0;
  char hdr[512];
  int n = snprintf(hdr, sizeof(hdr),
                   "HTTP/1.1 %d X\r\nContent-Length: %zu\r\nConnection: close\r\n%s%s%s\r\n",
                   r.status, strcmp(method, "HEAD") == 0 ? (size_t)r.head_size : blen,
                   r.etag[0] ? "ETag: " : "", r.etag, r.etag[0] ? "\r\n" : "");
  write_all(fd, hdr, (size_t)n);
  if (strcmp(method, "HEAD") != 0 && blen) write_all(fd, r.body, blen);
  free(r.body);
}

static void *run(void *arg) {
  struct fake_s3 *f = arg;
  while (!atomic_load(&f->stopping)) {
    struct pollfd p = {f->listen_fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    int fd = accept(f->listen_fd, NULL, NULL);
    if (fd < 0) continue;
    serve(f, fd);
    shutdown(fd, SHUT_WR);
    close(fd);
  }
  return NULL;
}

struct fake_s3 *fake_s3_start(fake_s3_handler fn, void *arg) {
  struct fake_s3 *f = calloc(1, sizeof(*f));
  f->fn = fn;
  f->arg = arg;
  pthread_mutex_init(&f->mu, NULL);
  f->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t alen = sizeof(a);
  if (f->listen_fd < 0 || bind(f->listen_fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
      listen(f->listen_fd, 64) != 0 || getsockname(f->listen_fd, (struct sockaddr *)&a, &alen)) {
    if (f->listen_fd >= 0) close(f->listen_fd);
    free(f);
    return NULL;
  }
  f->port = ntohs(a.sin_port);
  snprintf(f->endpoint, sizeof(f->endpoint), "http://127.0.0.1:%d", f->port);
  pthread_create(&f->thread, NULL, run, f);
  return f;
}

int fake_s3_port(const struct fake_s3 *f) {
  return f->port;
}

struct s3_config fake_s3_config(const struct fake_s3 *f, uint32_t max_attempts) {
  struct s3_config cfg = {.endpoint = f->endpoint,
                          .region = "us-east-1",
                          .bucket = FAKE_S3_BUCKET,
                          .access_key = "AK",
                          .secret_key = "SK",
                          .max_attempts = max_attempts,
                          .backoff_base_ms = 1,
                          .backoff_max_ms = 5};
  return cfg;
}

void fake_s3_stop(struct fake_s3 *f) {
  if (!f) return;
  atomic_store(&f->stopping, true);
  pthread_join(f->thread, NULL);
  close(f->listen_fd);
  for (size_t i = 0; i < f->n_log; i++) free(f->log[i]);
  pthread_mutex_destroy(&f->mu);
  free(f);
}

size_t fake_s3_requests(struct fake_s3 *f) {
  pthread_mutex_lock(&f->mu);
  size_t n = f->n_log;
  pthread_mutex_unlock(&f->mu);
  return n;
}

void fake_s3_request(struct fake_s3 *f, size_t n, char *buf, size_t len) {
  pthread_mutex_lock(&f->mu);
  snprintf(buf, len, "%s", n < f->n_log ? f->log[n] : "");
  pthread_mutex_unlock(&f->mu);
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

static void decode(const char *s, size_t n, char *buf, size_t len) {
  size_t o = 0;
  for (size_t i = 0; i < n && o + 1 < len; i++) {
    if (s[i] == '%' && i + 2 < n && hexval(s[i + 1]) >= 0 && hexval(s[i + 2]) >= 0) {
      buf[o++] = (char)(hexval(s[i + 1]) * 16 + hexval(s[i + 2]));
      i += 2;
    } else {
      buf[o++] = s[i];
    }
  }
  buf[o] = '\0';
}

int fake_s3_query(const char *query, const char *name, char *buf, size_t len) {
  size_t nlen = strlen(name);
  for (const char *p = query; p && *p; p = strchr(p, '&') ? strchr(p, '&') + 1 : NULL) {
    size_t plen = strcspn(p, "&");
    if (strncmp(p, name, nlen) != 0 || (plen != nlen && p[nlen] != '=')) continue;
    const char *v = plen == nlen ? p + plen : p + nlen + 1;
    decode(v, (size_t)(p + plen - v), buf, len);
    return 1;
  }
  return 0;
}

int fake_s3_answer_probe(const char *method, const char *query, struct fake_s3_reply *ret) {
  char v[8];
  bool uploads_q = fake_s3_query(query, "uploads", v, sizeof(v));
  bool id_q = fake_s3_query(query, "uploadId", v, sizeof(v));
  if (strcmp(method, "PUT") == 0) {
    snprintf(ret->etag, sizeof(ret->etag), "\"e\"");
  } else if (strcmp(method, "DELETE") == 0) {
    ret->status = 204;
  } else if (strcmp(method, "POST") == 0 && uploads_q) {
    ret->body = strdup("<InitiateMultipartUploadResult><UploadId>" FAKE_S3_PROBE_UPLOAD_ID
                       "</UploadId></InitiateMultipartUploadResult>");
  } else if (strcmp(method, "GET") == 0 && id_q) {
    ret->status = 404;
    ret->body = strdup("<Error><Code>NoSuchUpload</Code></Error>");
  } else if (strcmp(method, "GET") == 0 && uploads_q) {
    ret->body = strdup("<ListMultipartUploadsResult><IsTruncated>false</IsTruncated>"
                       "</ListMultipartUploadsResult>");
  } else {
    return 0;
  }
  return 1;
}

/* Whether upload u comes after the query's markers. */
static bool after_markers(const struct fake_s3_upload *u, const char *query) {
  char km[1024], im[256];
  if (!fake_s3_query(query, "key-marker", km, sizeof(km))) return true;
  int c = strcmp(u->key, km);
  if (c != 0) return c > 0;
  return fake_s3_query(query, "upload-id-marker", im, sizeof(im)) && strcmp(u->id, im) > 0;
}

static void upload_xml(struct strbuf *sb, const struct fake_s3_upload *u) {
  strbuf_puts(sb, "<Upload><Key>");
  s3_xml_escape(sb, u->key);
  strbuf_printf(sb, "</Key><UploadId>%s</UploadId><Initiator><ID>x</ID></Initiator>", u->id);
  if (u->initiated) strbuf_printf(sb, "<Initiated>%s</Initiated>", u->initiated);
  strbuf_puts(sb, "<StorageClass>STANDARD</StorageClass></Upload>");
}

char *fake_s3_list_uploads(const struct fake_s3_upload *u, size_t n, const char *query,
                           int page_max) {
  char prefix[1024] = "", maxs[16];
  fake_s3_query(query, "prefix", prefix, sizeof(prefix));
  int max = fake_s3_query(query, "max-uploads", maxs, sizeof(maxs)) ? atoi(maxs) : 1000;
  if (max > page_max) max = page_max;
  struct strbuf sb = STRBUF_INIT;
  strbuf_puts(&sb, "<?xml version=\"1.0\"?>\n<ListMultipartUploadsResult>");
  int listed = 0;
  const struct fake_s3_upload *last = NULL;
  bool more = false;
  for (size_t i = 0; i < n && !more; i++) {
    if (strncmp(u[i].key, prefix, strlen(prefix)) != 0 || !after_markers(&u[i], query)) continue;
    more = listed == max;
    if (more) break;
    upload_xml(&sb, &u[i]);
    listed++;
    last = &u[i];
  }
  strbuf_printf(&sb, "<IsTruncated>%s</IsTruncated>", more ? "true" : "false");
  if (more) {
    strbuf_puts(&sb, "<NextKeyMarker>");
    s3_xml_escape(&sb, last->key);
    strbuf_printf(&sb, "</NextKeyMarker><NextUploadIdMarker>%s</NextUploadIdMarker>", last->id);
  }
  strbuf_puts(&sb, "</ListMultipartUploadsResult>");
  return strbuf_take(&sb, NULL);
}
