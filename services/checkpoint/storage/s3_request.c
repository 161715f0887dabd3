/*
 * One HTTP attempt of an S3 operation: the URL (path-style or virtual-host),
 * the signed headers, the libcurl easy handle with body callbacks, and the
 * parsing of what came back.
 */
#include "s3_internal.h"

#include "s3_sigv4.h"
#include "s3_xml.h"
#include "stk_error.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_QUERY        6
#define MAX_XML_BYTES    (8u << 20) /* Listings and errors are far smaller. */
#define MAX_GET_BUFFERED (2ull << 30)
#define UPLOAD_BUFFER    (1L << 20)   /* curl's default 64 KiB: 16x the callbacks. */
#define DOWNLOAD_BUFFER  (512L << 10) /* curl's default 16 KiB: a recv and a callback each. */

static const char *method_of(enum s3_op_kind k) {
  switch (k) {
  case S3_OP_PUT:
  case S3_OP_MPU_PART:
    return "PUT";
  case S3_OP_HEAD:
    return "HEAD";
  case S3_OP_DELETE:
  case S3_OP_MPU_ABORT:
    return "DELETE";
  case S3_OP_MPU_CREATE:
  case S3_OP_MPU_COMPLETE:
    return "POST";
  default:
    return "GET";
  }
}

/* The query parameters of an operation; numbers are formatted into nbuf. */
static size_t query_of(const struct s3_op *op, struct s3_kv *q, char nbuf[2][24]) {
  size_t n = 0;
  snprintf(nbuf[0], 24, "%d", op->part_number);
  snprintf(nbuf[1], 24, "%d", op->max_keys);
  switch (op->kind) {
  case S3_OP_MPU_CREATE:
    q[n++] = (struct s3_kv){"uploads", ""};
    break;
  case S3_OP_MPU_PART:
    q[n++] = (struct s3_kv){"partNumber", nbuf[0]};
    q[n++] = (struct s3_kv){"uploadId", op->upload_id};
    break;
  case S3_OP_MPU_COMPLETE:
  case S3_OP_MPU_ABORT:
    q[n++] = (struct s3_kv){"uploadId", op->upload_id};
    break;
  case S3_OP_MPU_LIST_PARTS:
    q[n++] = (struct s3_kv){"uploadId", op->upload_id};
    if (op->marker) q[n++] = (struct s3_kv){"part-number-marker", op->marker};
    if (op->max_keys > 0) q[n++] = (struct s3_kv){"max-parts", nbuf[1]};
    break;
  case S3_OP_MPU_LIST_UPLOADS:
    q[n++] = (struct s3_kv){"uploads", ""};
    if (op->prefix) q[n++] = (struct s3_kv){"prefix", op->prefix};
    if (op->marker) q[n++] = (struct s3_kv){"key-marker", op->marker};
    if (op->marker && op->upload_id_marker)
      q[n++] = (struct s3_kv){"upload-id-marker", op->upload_id_marker};
    if (op->max_keys > 0) q[n++] = (struct s3_kv){"max-uploads", nbuf[1]};
    break;
  case S3_OP_LIST:
    q[n++] = (struct s3_kv){"list-type", "2"};
    if (op->prefix) q[n++] = (struct s3_kv){"prefix", op->prefix};
    if (op->marker) q[n++] = (struct s3_kv){"continuation-token", op->marker};
    if (op->max_keys > 0) q[n++] = (struct s3_kv){"max-keys", nbuf[1]};
    break;
  default:
    break;
  }
  return n;
}

static bool has_key(enum s3_op_kind k) {
  return k != S3_OP_LIST && k != S3_OP_MPU_LIST_UPLOADS;
}

/* Host header and unencoded path for this op under the configured addressing. */
static void host_and_path(struct s3_req *r, struct strbuf *host, struct strbuf *path) {
  const struct s3_client *c = r->c;
  if (c->cfg.virtual_host) {
    strbuf_printf(host, "%s.%s", c->cfg.bucket, c->host);
    strbuf_printf(path, "/%s", has_key(r->op.kind) ? r->op.key : "");
  } else {
    strbuf_puts(host, c->host);
    strbuf_printf(path, "/%s", c->cfg.bucket);
    if (has_key(r->op.kind)) strbuf_printf(path, "/%s", r->op.key);
  }
}

static char *build_url(struct s3_req *r, const char *host, const char *path, const struct s3_kv *q,
                       size_t nq) {
  struct strbuf sb = STRBUF_INIT;
  const char *scheme_end = strstr(r->c->scheme_host, "://");
  strbuf_append(&sb, r->c->scheme_host, (size_t)(scheme_end - r->c->scheme_host) + 3);
  strbuf_puts(&sb, host);
  s3_uri_encode(&sb, path, true);
  for (size_t i = 0; i < nq; i++) {
    strbuf_putc(&sb, i ? '&' : '?');
    s3_uri_encode(&sb, q[i].name, false);
    if (q[i].value && q[i].value[0]) {
      strbuf_putc(&sb, '=');
      s3_uri_encode(&sb, q[i].value, false);
    }
  }
  return strbuf_take(&sb, NULL);
}

/* ---- Body callbacks. ---- */

static size_t on_read(char *buf, size_t size, size_t nitems, void *ud) {
  struct s3_req *r = ud;
  size_t n = size * nitems, left = r->send_len - r->sent;
  if (n > left) n = left;
  if (n) memcpy(buf, r->send + r->sent, n);
  r->sent += n;
  return n;
}

static int on_seek(void *ud, curl_off_t offset, int origin) {
  struct s3_req *r = ud;
  if (origin != SEEK_SET || offset < 0 || (size_t)offset > r->send_len)
    return CURL_SEEKFUNC_CANTSEEK;
  r->sent = (size_t)offset;
  return CURL_SEEKFUNC_OK;
}

static size_t on_write(char *ptr, size_t size, size_t nmemb, void *ud) {
  struct s3_req *r = ud;
  size_t n = size * nmemb;
  long status = 0;
  curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &status);
  bool ok = status / 100 == 2;
  if (ok && r->op.kind == S3_OP_GET && r->op.sink) {
    if (r->op.sink(r->op.sink_arg, r->sink_offset, ptr, n) != 0) {
      r->sink_failed = true;
      return 0;
    }
    r->sink_offset += n;
    return n;
  }
  uint64_t cap = ok && r->op.kind == S3_OP_GET ? MAX_GET_BUFFERED : MAX_XML_BYTES;
  if (r->resp.len + n > cap) {
    r->too_big = true;
    return 0;
  }
  strbuf_append(&r->resp, ptr, n);
  return r->resp.failed ? 0 : n;
}

/* ---- Headers and signature. ---- */

struct hdrs {
  struct s3_kv kv[8];
  size_t n;
  char range[64];
};

static void signed_headers_of(struct s3_req *r, const char *host, const char *date,
                              struct hdrs *h) {
  h->n = 0;
  h->kv[h->n++] = (struct s3_kv){"host", host};
  h->kv[h->n++] = (struct s3_kv){"x-amz-date", date};
  h->kv[h->n++] = (struct s3_kv){"x-amz-content-sha256", r->payload_hash};
  if (r->c->cfg.session_token)
    h->kv[h->n++] = (struct s3_kv){"x-amz-security-token", r->c->cfg.session_token};
  const struct s3_op *op = &r->op;
  if (op->kind == S3_OP_GET && (op->range_offset || op->range_len)) {
    if (op->range_len)
      snprintf(h->range, sizeof(h->range), "bytes=%" PRIu64 "-%" PRIu64, op->range_offset,
               op->range_offset + op->range_len - 1);
    else
      snprintf(h->range, sizeof(h->range), "bytes=%" PRIu64 "-", op->range_offset);
    h->kv[h->n++] = (struct s3_kv){"range", h->range};
  }
  if (op->if_none_match && (op->kind == S3_OP_PUT || op->kind == S3_OP_MPU_COMPLETE))
    h->kv[h->n++] = (struct s3_kv){"if-none-match", "*"};
}

/* Turns the signed headers plus Authorization into curl's list. Expect is
 * disabled (no 100-continue round trip); bodies get a Content-Type. */
static int header_list(struct s3_req *r, const struct hdrs *h, const char *auth) {
  struct curl_slist *list = NULL, *next;
  char line[4096];
  bool has_body = r->op.kind == S3_OP_PUT || r->op.kind == S3_OP_MPU_PART ||
                  r->op.kind == S3_OP_MPU_CREATE || r->op.kind == S3_OP_MPU_COMPLETE;
  size_t n = h->n + (has_body ? 3 : 2);
  for (size_t i = 0; i < n; i++) {
    if (i < h->n)
      snprintf(line, sizeof(line), "%s: %s", h->kv[i].name, h->kv[i].value);
    else if (i == h->n)
      snprintf(line, sizeof(line), "Authorization: %s", auth);
    else if (i == h->n + 1)
      snprintf(line, sizeof(line), "Expect:");
    else
      snprintf(line, sizeof(line), "Content-Type: %s",
               r->op.kind == S3_OP_MPU_COMPLETE ? "application/xml" : "application/octet-stream");
    next = curl_slist_append(list, line);
    if (!next) {
      curl_slist_free_all(list);
      return STK_ENOMEM;
    }
    list = next;
  }
  r->headers = list;
  return 0;
}

static void set_method(struct s3_req *r, CURL *e) {
  const char *m = method_of(r->op.kind);
  curl_easy_setopt(e, CURLOPT_READFUNCTION, on_read);
  curl_easy_setopt(e, CURLOPT_READDATA, r);
  curl_easy_setopt(e, CURLOPT_SEEKFUNCTION, on_seek);
  curl_easy_setopt(e, CURLOPT_SEEKDATA, r);
  if (strcmp(m, "PUT") == 0) {
    curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, (curl_off_t)r->send_len);
    if (r->send_len >= (size_t)UPLOAD_BUFFER)
      curl_easy_setopt(e, CURLOPT_UPLOAD_BUFFERSIZE, UPLOAD_BUFFER);
  } else if (strcmp(m, "POST") == 0) {
    curl_easy_setopt(e, CURLOPT_POST, 1L);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->send_len);
  } else if (r->op.kind == S3_OP_GET) {
    curl_easy_setopt(e, CURLOPT_BUFFERSIZE, DOWNLOAD_BUFFER);
  } else if (strcmp(m, "HEAD") == 0) {
    curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
  } else if (strcmp(m, "DELETE") == 0) {
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, "DELETE");
  }
}

static CURL *make_easy(struct s3_req *r, const char *url) {
  CURL *e = curl_easy_init();
  if (!e) return NULL;
  const struct s3_config *cfg = &r->c->cfg;
  curl_easy_setopt(e, CURLOPT_URL, url);
  curl_easy_setopt(e, CURLOPT_PRIVATE, (char *)r);
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, r->headers);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)cfg->timeout_ms);
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)cfg->connect_timeout_ms);
  curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, (long)cfg->low_speed_timeout_s);
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  set_method(r, e);
  return e;
}

int s3_request_start(struct s3_req *r) {
  struct s3_kv q[MAX_QUERY];
  char nbuf[2][24], date[17];
  size_t nq = query_of(&r->op, q, nbuf);
  struct strbuf host = STRBUF_INIT, path = STRBUF_INIT;
  host_and_path(r, &host, &path);
  s3_sigv4_format_date((long long)time(NULL), date);
  struct hdrs h;
  char *auth = NULL, *url = NULL;
  int err = host.failed || path.failed ? STK_ENOMEM : 0;
  if (!err) {
    signed_headers_of(r, host.buf, date, &h);
    struct s3_sigv4_request sreq = {method_of(r->op.kind), path.buf, q, nq, h.kv, h.n,
                                    r->payload_hash};
    struct s3_credentials cred = {r->c->cfg.access_key, r->c->cfg.secret_key, NULL};
    struct s3_sigv4_scope scope = {date, r->c->cfg.region, "s3"};
    err = s3_sigv4_authorization(&sreq, &cred, &scope, &auth);
  }
  if (!err) err = header_list(r, &h, auth);
  if (!err) err = (url = build_url(r, host.buf, path.buf, q, nq)) ? 0 : STK_ENOMEM;
  if (!err) err = (r->easy = make_easy(r, url)) ? 0 : STK_ENOMEM;
  if (!err && curl_multi_add_handle(r->c->multi, r->easy) != CURLM_OK) err = STK_EINTERNAL;
  free(auth);
  free(url);
  strbuf_release(&host);
  strbuf_release(&path);
  if (err) s3_request_reset(r);
  return err;
}

void s3_request_reset(struct s3_req *r) {
  if (r->easy) curl_easy_cleanup(r->easy);
  r->easy = NULL;
  curl_slist_free_all(r->headers);
  r->headers = NULL;
  strbuf_release(&r->resp);
  r->sent = 0;
  r->sink_offset = 0;
  r->sink_failed = false;
  r->too_big = false;
}

/* ---- Once per operation: the body and its hash. ---- */

static char *complete_xml(const struct s3_op *op) {
  struct strbuf sb = STRBUF_INIT;
  strbuf_puts(&sb, "<CompleteMultipartUpload>");
  for (size_t i = 0; i < op->n_parts; i++) {
    strbuf_printf(&sb, "<Part><PartNumber>%d</PartNumber><ETag>", op->parts[i].number);
    s3_xml_escape(&sb, op->parts[i].etag);
    strbuf_puts(&sb, "</ETag></Part>");
  }
  strbuf_puts(&sb, "</CompleteMultipartUpload>");
  return strbuf_take(&sb, NULL);
}

int s3_request_prepare(struct s3_req *r) {
  r->send = "";
  r->send_len = 0;
  if (r->op.kind == S3_OP_PUT || r->op.kind == S3_OP_MPU_PART) {
    r->send = r->op.body ? r->op.body : "";
    r->send_len = r->op.body_len;
  } else if (r->op.kind == S3_OP_MPU_COMPLETE) {
    r->xml_body = complete_xml(&r->op);
    if (!r->xml_body) return STK_ENOMEM;
    r->send = r->xml_body;
    r->send_len = strlen(r->xml_body);
  }
  if (r->c->cfg.unsigned_payload && r->send_len > 0)
    snprintf(r->payload_hash, sizeof(r->payload_hash), "%s", S3_UNSIGNED_PAYLOAD);
  else
    s3_sha256_hex(r->send, r->send_len, r->payload_hash);
  return 0;
}

/* ---- Results. ---- */

static char *header_value(CURL *e, const char *name) {
  struct curl_header *h = NULL;
  if (curl_easy_header(e, name, 0, CURLH_HEADER, -1, &h) != CURLHE_OK || !h) return NULL;
  return strdup(h->value);
}

static struct s3_xml_span body_span(const struct s3_req *r) {
  return (struct s3_xml_span){r->resp.buf ? r->resp.buf : "", r->resp.len};
}

static uint64_t parse_u64(struct s3_xml_span doc, const char *tag) {
  char *t = s3_xml_text(doc, tag);
  uint64_t v = t ? strtoull(t, NULL, 10) : 0;
  free(t);
  return v;
}

/* Milliseconds since the epoch of an ISO 8601 element; 0 if absent or bad. */
static int64_t parse_time(struct s3_xml_span doc, const char *tag) {
  char *t = s3_xml_text(doc, tag);
  int64_t ms = 0;
  if (t && s3_xml_time_ms(t, &ms) != 0) ms = 0;
  free(t);
  return ms;
}

/* Fills res->entries from every <item> element of the body. */
static int parse_entries(struct s3_req *r, const char *item) {
  struct s3_xml_span doc = body_span(r), inner;
  size_t cursor = 0, cap = 0;
  struct s3_result *res = &r->res;
  while (s3_xml_next(doc, item, &cursor, &inner)) {
    if (res->n_entries == cap) {
      cap = cap ? 2 * cap : 16;
      struct s3_entry *grown = realloc(res->entries, cap * sizeof(*grown));
      if (!grown) return STK_ENOMEM;
      res->entries = grown;
    }
    struct s3_entry *e = &res->entries[res->n_entries++];
    *e = (struct s3_entry){s3_xml_text(inner, "Key"),           s3_xml_text(inner, "UploadId"),
                           s3_xml_text(inner, "ETag"),          parse_u64(inner, "Size"),
                           (int)parse_u64(inner, "PartNumber"), parse_time(inner, "Initiated")};
  }
  char *trunc = s3_xml_text(doc, "IsTruncated");
  res->truncated = trunc && strcmp(trunc, "true") == 0;
  free(trunc);
  return 0;
}

static int parse_list(struct s3_req *r) {
  struct s3_xml_span doc = body_span(r);
  int err;
  switch (r->op.kind) {
  case S3_OP_LIST:
    err = parse_entries(r, "Contents");
    r->res.next_marker = s3_xml_text(doc, "NextContinuationToken");
    return err;
  case S3_OP_MPU_LIST_PARTS:
    err = parse_entries(r, "Part");
    r->res.next_marker = s3_xml_text(doc, "NextPartNumberMarker");
    return err;
  default:
    err = parse_entries(r, "Upload");
    r->res.next_marker = s3_xml_text(doc, "NextKeyMarker");
    r->res.next_upload_id_marker = s3_xml_text(doc, "NextUploadIdMarker");
    return err;
  }
}

/* A 200 to CompleteMultipartUpload may still be a failure: it must carry an
 * <ETag> and no <Error>. */
static int parse_complete(struct s3_req *r) {
  struct s3_xml_span doc = body_span(r);
  size_t cursor = 0;
  struct s3_xml_span inner;
  if (s3_xml_next(doc, "Error", &cursor, &inner)) {
    r->res.error_code = s3_xml_text(inner, "Code");
    return STK_EUNAVAIL;
  }
  r->res.etag = s3_xml_text(doc, "ETag");
  return r->res.etag ? 0 : STK_EIO;
}

int s3_request_parse(struct s3_req *r) {
  struct s3_result *res = &r->res;
  switch (r->op.kind) {
  case S3_OP_MPU_CREATE:
    res->upload_id = s3_xml_text(body_span(r), "UploadId");
    return res->upload_id ? 0 : STK_EIO;
  case S3_OP_MPU_COMPLETE:
    return parse_complete(r);
  case S3_OP_LIST:
  case S3_OP_MPU_LIST_PARTS:
  case S3_OP_MPU_LIST_UPLOADS:
    return parse_list(r);
  case S3_OP_GET:
    res->etag = header_value(r->easy, "ETag");
    if (!r->op.sink) {
      res->body_len = r->resp.len;
      res->body = strbuf_take(&r->resp, NULL);
      if (!res->body) return STK_ENOMEM;
    }
    res->content_length = r->op.sink ? r->sink_offset : res->body_len;
    return 0;
  case S3_OP_HEAD: {
    curl_off_t len = -1;
    curl_easy_getinfo(r->easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &len);
    res->content_length = len > 0 ? (uint64_t)len : 0;
    res->etag = header_value(r->easy, "ETag");
    return 0;
  }
  default:
    res->etag = header_value(r->easy, "ETag");
    return 0;
  }
}

void s3_request_parse_error(struct s3_req *r) {
  free(r->res.error_code);
  r->res.error_code = s3_xml_text(body_span(r), "Code");
}
