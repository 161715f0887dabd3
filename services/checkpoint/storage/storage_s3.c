/*
 * The storage interface on S3 (s3://bucket/prefix): each request is one S3
 * operation (two where a HEAD must come first) submitted to the S3 client
 * on its engine thread (s3_thread.h), its answer delivered from there; keys
 * are placed under the prefix. Capabilities come from the probe at open; a
 * conditional put on a store without If-None-Match falls back to
 * HEAD-then-PUT, which is not atomic (the commit protocol reads
 * caps.conditional_put to know). Listings page with blocking waits.
 */
#include "storage_internal.h"

#include "s3_probe.h"
#include "s3_thread.h"
#include "stk_error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct s3b {
  struct s3_thread *engine;
  char *prefix; /* "" or "a/b/" */
  bool conditional_put;
};

/* prefix + key into buf (sized for STORAGE_KEY_MAX twice). */
static const char *full_key(struct s3b *b, const char *key, char buf[2 * STORAGE_KEY_MAX + 2]) {
  snprintf(buf, 2 * STORAGE_KEY_MAX + 2, "%s%s", b->prefix, key);
  return buf;
}

/* One storage request in flight: copies of what the S3 operation points
 * to, until it answers. */
struct call {
  struct s3b *b;
  struct storage_req rq; /* Its strings point into this call. */
  storage_done_fn done;
  void *arg;
  bool head_first; /* A HEAD is out before the operation itself. */
  char key[2 * STORAGE_KEY_MAX + 2];
  char *upload_id;
  struct s3_part *parts; /* MPU_COMPLETE; the ETags copied. */
  struct storage_result res;
};

static void call_free(struct call *c) {
  if (c->parts)
    for (size_t i = 0; i < c->rq.n_parts; i++) free((char *)c->parts[i].etag);
  free(c->parts);
  free(c->upload_id);
  free(c);
}

/* Answers the request and frees it. */
static void finish(struct call *c, int err) {
  c->res.err = err;
  storage_answer(c->done, c->arg, &c->res);
  call_free(c);
}

static int sink_copy(void *arg, uint64_t offset, const void *data, size_t len) {
  struct call *c = arg;
  if (offset > c->rq.len || len > c->rq.len - offset) return -1;
  memcpy((char *)c->rq.buf + offset, data, len);
  return 0;
}

static void on_head_first(void *arg, struct s3_result *res);
static void on_done(void *arg, struct s3_result *res);

/* The S3 operation of the request itself. */
static void send_op(struct call *c) {
  const struct storage_req *rq = &c->rq;
  bool cond = (rq->flags & STORAGE_IF_ABSENT) && c->b->conditional_put;
  struct s3_op op = {.key = c->key, .upload_id = c->upload_id}; /* NULL but for MPU_*. */
  switch (rq->op) {
  case STORAGE_OP_PUT:
    op.kind = S3_OP_PUT;
    op.body = rq->data;
    op.body_len = rq->len;
    op.if_none_match = cond;
    break;
  case STORAGE_OP_GET:
    op.kind = S3_OP_GET;
    op.range_offset = rq->offset;
    op.range_len = rq->len;
    op.sink = sink_copy;
    op.sink_arg = c;
    break;
  case STORAGE_OP_HEAD:
    op.kind = S3_OP_HEAD;
    break;
  case STORAGE_OP_DELETE:
    op.kind = S3_OP_DELETE;
    break;
  case STORAGE_OP_MPU_BEGIN:
    op.kind = S3_OP_MPU_CREATE;
    break;
  case STORAGE_OP_MPU_PART:
    op.kind = S3_OP_MPU_PART;
    op.part_number = rq->number;
    op.body = rq->data;
    op.body_len = rq->len;
    break;
  case STORAGE_OP_MPU_COMPLETE:
    op.kind = S3_OP_MPU_COMPLETE;
    op.parts = c->parts;
    op.n_parts = rq->n_parts;
    op.if_none_match = cond;
    break;
  case STORAGE_OP_MPU_ABORT:
    op.kind = S3_OP_MPU_ABORT;
    break;
  }
  s3_thread_submit(c->b->engine, &op, on_done, c);
}

/* The S3 answer as the request's result (engine thread). */
static void on_done(void *arg, struct s3_result *res) {
  struct call *c = arg;
  stk_clear_detail();
  int err = res->err;
  if (err && res->error_code)
    snprintf(c->res.detail, sizeof(c->res.detail), "S3 %ld %s", res->status, res->error_code);
  switch (c->rq.op) {
  case STORAGE_OP_GET:
    c->res.len = (size_t)res->content_length;
    break;
  case STORAGE_OP_HEAD:
    c->res.size = res->content_length;
    break;
  case STORAGE_OP_DELETE:
    if (err == STK_ENOENT) err = 0;
    break;
  case STORAGE_OP_MPU_BEGIN:
    c->res.upload_id = res->upload_id;
    res->upload_id = NULL;
    break;
  case STORAGE_OP_MPU_PART:
    if (!err && !res->etag) err = STK_EIO;
    c->res.etag = res->etag;
    res->etag = NULL;
    break;
  default:
    break;
  }
  finish(c, err);
}

/* A HEAD before the operation: a conditional write on a store without
 * If-None-Match, or a GET of no bytes (which only checks the offset). */
static void on_head_first(void *arg, struct s3_result *res) {
  struct call *c = arg;
  stk_clear_detail();
  int err = res->err;
  if (c->rq.op == STORAGE_OP_GET) {
    if (!err && c->rq.offset > res->content_length) err = STK_ERANGE;
    return finish(c, err);
  }
  if (err == 0) return finish(c, STK_EEXIST);
  if (err != STK_ENOENT) return finish(c, err);
  send_op(c);
}

/* Copies what the operation points to into c; STK_ENOMEM. */
static int call_copy(struct call *c, const struct storage_req *rq) {
  full_key(c->b, rq->key, c->key);
  c->rq = *rq;
  c->rq.key = c->key;
  if (rq->upload_id && !(c->upload_id = strdup(rq->upload_id))) return STK_ENOMEM;
  c->rq.upload_id = c->upload_id;
  c->rq.parts = NULL;
  if (rq->op != STORAGE_OP_MPU_COMPLETE) return 0;
  c->parts = calloc(rq->n_parts, sizeof(*c->parts));
  if (!c->parts) return STK_ENOMEM;
  for (size_t i = 0; i < rq->n_parts; i++) {
    c->parts[i].number = rq->parts[i].number;
    if (!(c->parts[i].etag = strdup(rq->parts[i].etag))) return STK_ENOMEM;
  }
  return 0;
}

static void s3b_submit(void *impl, const struct storage_req *rq, storage_done_fn done, void *arg) {
  struct s3b *b = impl;
  struct call *c = calloc(1, sizeof(*c));
  if (!c) {
    struct storage_result res = {.err = STK_ENOMEM};
    return storage_answer(done, arg, &res);
  }
  c->b = b;
  c->done = done;
  c->arg = arg;
  int err = call_copy(c, rq);
  if (err) return finish(c, err);
  bool cond = (rq->flags & STORAGE_IF_ABSENT) && !b->conditional_put &&
              (rq->op == STORAGE_OP_PUT || rq->op == STORAGE_OP_MPU_COMPLETE);
  c->head_first = cond || (rq->op == STORAGE_OP_GET && rq->len == 0);
  if (!c->head_first) return send_op(c);
  struct s3_op head = {.kind = S3_OP_HEAD, .key = c->key};
  s3_thread_submit(b->engine, &head, on_head_first, c);
}

static int list_page(struct s3b *b, const char *prefix, char **marker, storage_list_cb cb,
                     void *arg, bool *ret_more) {
  char p[2 * STORAGE_KEY_MAX + 2];
  struct s3_op op = {.kind = S3_OP_LIST, .prefix = full_key(b, prefix, p), .marker = *marker};
  struct s3_result res;
  int err = s3_thread_do(b->engine, &op, &res);
  size_t plen = strlen(b->prefix);
  for (size_t i = 0; !err && i < res.n_entries; i++) {
    const char *key = res.entries[i].key;
    if (!key || strncmp(key, b->prefix, plen) != 0) continue;
    err = cb(arg, key + plen, res.entries[i].size);
  }
  free(*marker);
  *marker = res.next_marker;
  res.next_marker = NULL;
  *ret_more = !err && res.truncated && *marker;
  s3_result_clear(&res);
  return err;
}

static int s3b_list(void *impl, const char *prefix, storage_list_cb cb, void *arg) {
  char *marker = NULL;
  bool more = true;
  int err = 0;
  while (!err && more) err = list_page(impl, prefix, &marker, cb, arg, &more);
  free(marker);
  return err;
}

/* ListMultipartUploads paging: key-marker and upload-id-marker, both taken
 * from the page before (several uploads may share a key). */
struct upload_pager {
  char *key_marker, *id_marker;
};

/* Moves the next markers out of res; STK_EIO if they do not advance (a
 * store that would make us loop forever). */
static int pager_advance(struct upload_pager *pg, struct s3_result *res, bool *ret_more) {
  *ret_more = res->truncated;
  if (!*ret_more) return 0;
  if (!res->next_marker || !res->next_marker[0]) {
    stk_set_detail("ListMultipartUploads is truncated without a NextKeyMarker");
    return STK_EIO;
  }
  bool same = pg->key_marker && strcmp(pg->key_marker, res->next_marker) == 0 &&
              (pg->id_marker && res->next_upload_id_marker
                   ? strcmp(pg->id_marker, res->next_upload_id_marker) == 0
                   : !pg->id_marker && !res->next_upload_id_marker);
  if (same) {
    stk_set_detail("ListMultipartUploads does not advance past key %.64s", pg->key_marker);
    return STK_EIO;
  }
  free(pg->key_marker);
  free(pg->id_marker);
  pg->key_marker = res->next_marker;
  pg->id_marker = res->next_upload_id_marker;
  res->next_marker = res->next_upload_id_marker = NULL;
  return 0;
}

static int uploads_page(struct s3b *b, const char *full_prefix, struct upload_pager *pg,
                        storage_upload_cb cb, void *arg, bool *ret_more) {
  struct s3_op op = {.kind = S3_OP_MPU_LIST_UPLOADS,
                     .prefix = full_prefix,
                     .marker = pg->key_marker,
                     .upload_id_marker = pg->id_marker};
  struct s3_result res;
  int err = s3_thread_do(b->engine, &op, &res);
  if (err && res.error_code) stk_set_detail("S3 %ld %s", res.status, res.error_code);
  size_t plen = strlen(b->prefix);
  for (size_t i = 0; !err && i < res.n_entries; i++) {
    const struct s3_entry *e = &res.entries[i];
    if (!e->key || !e->upload_id || strncmp(e->key, full_prefix, strlen(full_prefix)) != 0 ||
        storage_key_check(e->key + plen) != 0)
      continue;
    struct storage_upload u = {e->key + plen, e->upload_id, e->initiated_ms};
    err = cb(arg, &u);
  }
  if (!err) err = pager_advance(pg, &res, ret_more);
  s3_result_clear(&res);
  return err;
}

static int s3b_mpu_list(void *impl, const char *prefix, storage_upload_cb cb, void *arg) {
  struct s3b *b = impl;
  char p[2 * STORAGE_KEY_MAX + 2];
  full_key(b, prefix, p);
  struct upload_pager pg = {0};
  bool more = true;
  int err = 0;
  while (!err && more) err = uploads_page(b, p, &pg, cb, arg, &more);
  free(pg.key_marker);
  free(pg.id_marker);
  return err;
}

static void s3b_free(void *impl) {
  struct s3b *b = impl;
  if (!b) return;
  s3_thread_free(b->engine);
  free(b->prefix);
  free(b);
}

static const struct storage_backend s3_backend = {
    .submit = s3b_submit,
    .list = s3b_list,
    .mpu_list = s3b_mpu_list,
    .free = s3b_free,
};

static char *normalized_prefix(const char *prefix) {
  size_t len = prefix ? strlen(prefix) : 0;
  char *p = malloc(len + 2);
  if (!p) return NULL;
  memcpy(p, prefix ? prefix : "", len);
  if (len && p[len - 1] != '/') p[len++] = '/';
  p[len] = '\0';
  return p;
}

int storage_open_s3(const struct s3_config *cfg, const char *prefix, struct storage **ret) {
  struct s3b *b = calloc(1, sizeof(*b));
  if (!b) return STK_ENOMEM;
  b->prefix = normalized_prefix(prefix);
  int err = b->prefix ? s3_thread_new(cfg, &b->engine) : STK_ENOMEM;
  struct s3_caps caps = {0};
  if (!err) err = s3_probe(b->engine, b->prefix, &caps);
  struct storage *st = NULL;
  if (!err) {
    b->conditional_put = caps.conditional_put;
    struct storage_caps sc = {caps.conditional_put, caps.multipart_abort,
                              caps.multipart_list_parts && caps.multipart_list_uploads,
                              caps.multipart_list_uploads, false};
    st = storage_wrap(&s3_backend, b, &sc);
    if (!st) err = STK_ENOMEM;
  }
  if (err) {
    s3b_free(b);
    return err;
  }
  *ret = st;
  return 0;
}
