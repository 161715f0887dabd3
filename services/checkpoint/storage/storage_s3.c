/*
 * The storage interface on S3 (s3://bucket/prefix): each call is one or a
 * few blocking S3 operations through s3_sync, with keys placed under the
 * prefix. Capabilities come from the probe at open; a conditional put on a
 * store without If-None-Match falls back to HEAD-then-PUT, which is not
 * atomic (the commit protocol reads caps.conditional_put to know).
 */
#include "storage_internal.h"

#include "s3_probe.h"
#include "s3_sync.h"
#include "stk_error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct s3b {
  struct s3_sync *sync;
  char *prefix; /* "" or "a/b/" */
  bool conditional_put;
};

/* prefix + key into buf (sized for STORAGE_KEY_MAX twice). */
static const char *full_key(struct s3b *b, const char *key, char buf[2 * STORAGE_KEY_MAX + 2]) {
  snprintf(buf, 2 * STORAGE_KEY_MAX + 2, "%s%s", b->prefix, key);
  return buf;
}

static int run(struct s3b *b, const struct s3_op *op) {
  struct s3_result res;
  int err = s3_sync_do(b->sync, op, &res);
  if (err && res.error_code) stk_set_detail("S3 %ld %s", res.status, res.error_code);
  s3_result_clear(&res);
  return err;
}

static int s3b_head(void *impl, const char *key, uint64_t *ret_size) {
  struct s3b *b = impl;
  char k[2 * STORAGE_KEY_MAX + 2];
  struct s3_op op = {.kind = S3_OP_HEAD, .key = full_key(b, key, k)};
  struct s3_result res;
  int err = s3_sync_do(b->sync, &op, &res);
  if (!err) *ret_size = res.content_length;
  s3_result_clear(&res);
  return err;
}

static int s3b_put(void *impl, const char *key, const void *data, size_t len, unsigned flags) {
  struct s3b *b = impl;
  char k[2 * STORAGE_KEY_MAX + 2];
  bool cond = flags & STORAGE_IF_ABSENT;
  if (cond && !b->conditional_put) {
    uint64_t size;
    int err = s3b_head(impl, key, &size);
    if (err == 0) return STK_EEXIST;
    if (err != STK_ENOENT) return err;
  }
  struct s3_op op = {.kind = S3_OP_PUT,
                     .key = full_key(b, key, k),
                     .body = data,
                     .body_len = len,
                     .if_none_match = cond && b->conditional_put};
  return run(b, &op);
}

struct sink_buf {
  char *buf;
  size_t cap;
};

static int sink_copy(void *arg, uint64_t offset, const void *data, size_t len) {
  struct sink_buf *s = arg;
  if (offset > s->cap || len > s->cap - offset) return -1;
  memcpy(s->buf + offset, data, len);
  return 0;
}

static int s3b_get(void *impl, const char *key, uint64_t offset, void *buf, size_t len,
                   size_t *ret_len) {
  struct s3b *b = impl;
  if (len == 0) {
    uint64_t size;
    int err = s3b_head(impl, key, &size);
    if (!err && offset > size) err = STK_ERANGE;
    if (!err) *ret_len = 0;
    return err;
  }
  char k[2 * STORAGE_KEY_MAX + 2];
  struct sink_buf sink = {buf, len};
  struct s3_op op = {.kind = S3_OP_GET,
                     .key = full_key(b, key, k),
                     .range_offset = offset,
                     .range_len = len,
                     .sink = sink_copy,
                     .sink_arg = &sink};
  struct s3_result res;
  int err = s3_sync_do(b->sync, &op, &res);
  if (!err) *ret_len = (size_t)res.content_length;
  s3_result_clear(&res);
  return err;
}

static int s3b_del(void *impl, const char *key) {
  struct s3b *b = impl;
  char k[2 * STORAGE_KEY_MAX + 2];
  struct s3_op op = {.kind = S3_OP_DELETE, .key = full_key(b, key, k)};
  int err = run(b, &op);
  return err == STK_ENOENT ? 0 : err;
}

static int list_page(struct s3b *b, const char *prefix, char **marker, storage_list_cb cb,
                     void *arg, bool *ret_more) {
  char p[2 * STORAGE_KEY_MAX + 2];
  struct s3_op op = {.kind = S3_OP_LIST, .prefix = full_key(b, prefix, p), .marker = *marker};
  struct s3_result res;
  int err = s3_sync_do(b->sync, &op, &res);
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

static int s3b_mpu_begin(void *impl, const char *key, char **ret_upload_id) {
  struct s3b *b = impl;
  char k[2 * STORAGE_KEY_MAX + 2];
  struct s3_op op = {.kind = S3_OP_MPU_CREATE, .key = full_key(b, key, k)};
  struct s3_result res;
  int err = s3_sync_do(b->sync, &op, &res);
  if (!err) {
    *ret_upload_id = res.upload_id;
    res.upload_id = NULL;
  }
  s3_result_clear(&res);
  return err;
}

static int s3b_mpu_part(void *impl, const char *key, const char *upload_id, int number,
                        const void *data, size_t len, char **ret_etag) {
  struct s3b *b = impl;
  char k[2 * STORAGE_KEY_MAX + 2];
  struct s3_op op = {.kind = S3_OP_MPU_PART,
                     .key = full_key(b, key, k),
                     .upload_id = upload_id,
                     .part_number = number,
                     .body = data,
                     .body_len = len};
  struct s3_result res;
  int err = s3_sync_do(b->sync, &op, &res);
  if (!err && !res.etag) err = STK_EIO;
  if (!err) {
    *ret_etag = res.etag;
    res.etag = NULL;
  }
  s3_result_clear(&res);
  return err;
}

static int s3b_mpu_complete(void *impl, const char *key, const char *upload_id,
                            const struct storage_part *parts, size_t n_parts, unsigned flags) {
  struct s3b *b = impl;
  char k[2 * STORAGE_KEY_MAX + 2];
  bool cond = flags & STORAGE_IF_ABSENT;
  if (cond && !b->conditional_put) {
    uint64_t size;
    int err = s3b_head(impl, key, &size);
    if (err == 0) return STK_EEXIST;
    if (err != STK_ENOENT) return err;
  }
  struct s3_part *p = calloc(n_parts, sizeof(*p));
  if (!p) return STK_ENOMEM;
  for (size_t i = 0; i < n_parts; i++) p[i] = (struct s3_part){parts[i].number, parts[i].etag};
  struct s3_op op = {.kind = S3_OP_MPU_COMPLETE,
                     .key = full_key(b, key, k),
                     .upload_id = upload_id,
                     .parts = p,
                     .n_parts = n_parts,
                     .if_none_match = cond && b->conditional_put};
  int err = run(b, &op);
  free(p);
  return err;
}

static int s3b_mpu_abort(void *impl, const char *key, const char *upload_id) {
  struct s3b *b = impl;
  char k[2 * STORAGE_KEY_MAX + 2];
  struct s3_op op = {.kind = S3_OP_MPU_ABORT, .key = full_key(b, key, k), .upload_id = upload_id};
  return run(b, &op);
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
  int err = s3_sync_do(b->sync, &op, &res);
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
  s3_sync_free(b->sync);
  free(b->prefix);
  free(b);
}

static const struct storage_backend s3_backend = {
    .put = s3b_put,
    .get = s3b_get,
    .head = s3b_head,
    .del = s3b_del,
    .list = s3b_list,
    .mpu_begin = s3b_mpu_begin,
    .mpu_part = s3b_mpu_part,
    .mpu_complete = s3b_mpu_complete,
    .mpu_abort = s3b_mpu_abort,
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
  int err = b->prefix ? s3_sync_new(cfg, &b->sync) : STK_ENOMEM;
  struct s3_caps caps = {0};
  if (!err) err = s3_probe(b->sync, b->prefix, &caps);
  struct storage *st = NULL;
  if (!err) {
    b->conditional_put = caps.conditional_put;
    struct storage_caps sc = {caps.conditional_put, caps.multipart_abort,
                              caps.multipart_list_parts && caps.multipart_list_uploads,
                              caps.multipart_list_uploads};
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
