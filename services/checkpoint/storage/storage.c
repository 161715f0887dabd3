/*
 * The storage interface: URL parsing and dispatch to a backend. Arguments
 * are checked here once (the key rules are storage_base.c's), so backends
 * can trust them. This file is the top of the library: it opens the
 * backends and calls through their vtables; they call only files below.
 */
#include "storage_internal.h"

#include "s3_config.h"

#include "stk_error.h"

#include <stdlib.h>
#include <string.h>

/* A listing prefix may be empty or end with '/'; its segments obey the key rules. */
static int prefix_check(const char *prefix) {
  if (!prefix || !prefix[0]) return 0;
  size_t len = strlen(prefix);
  if (len > STORAGE_KEY_MAX) return STK_EINVAL;
  char *copy = strdup(prefix);
  if (!copy) return STK_ENOMEM;
  if (copy[len - 1] == '/') copy[len - 1] = '\0';
  int err = copy[0] ? storage_key_check(copy) : STK_EINVAL;
  free(copy);
  return err;
}

static int open_s3(const char *rest, const struct s3_config *s3, struct storage **ret) {
  const char *slash = strchr(rest, '/');
  size_t blen = slash ? (size_t)(slash - rest) : strlen(rest);
  if (blen == 0 || blen > 63) return STK_EINVAL;
  char bucket[64];
  memcpy(bucket, rest, blen);
  bucket[blen] = '\0';
  const char *prefix = slash ? slash + 1 : "";
  if (prefix[0] && prefix_check(prefix)) return STK_EINVAL;
  struct s3_config cfg = {0};
  if (s3) cfg = *s3;
  cfg.bucket = bucket;
  return storage_open_s3(&cfg, prefix, ret);
}

int storage_open(const char *url, struct storage **ret) {
  return storage_open_with(url, NULL, ret);
}

int storage_open_with(const char *url, const struct s3_config *s3, struct storage **ret) {
  if (!url) return STK_EINVAL;
  if (strncmp(url, "file://", 7) == 0) {
    if (url[7] != '/') {
      stk_set_detail("file:// URL needs an absolute path");
      return STK_EINVAL;
    }
    return fs_backend_open(url + 7, ret);
  }
  if (strncmp(url, "s3://", 5) == 0) return open_s3(url + 5, s3, ret);
  stk_set_detail("unknown storage URL scheme in \"%.64s\"", url);
  return STK_EINVAL;
}

void storage_free(struct storage *st) {
  if (!st) return;
  st->be->free(st->impl);
  free(st);
}

const struct storage_caps *storage_caps(const struct storage *st) {
  return &st->caps;
}

int storage_put(struct storage *st, const char *key, const void *data, size_t len, unsigned flags) {
  int err = storage_key_check(key);
  if (err) return err;
  if (!data && len) return STK_EINVAL;
  return st->be->put(st->impl, key, data, len, flags);
}

int storage_get(struct storage *st, const char *key, uint64_t offset, void *buf, size_t len,
                size_t *ret_len) {
  int err = storage_key_check(key);
  if (err) return err;
  if ((!buf && len) || offset > INT64_MAX || len > INT64_MAX - offset) return STK_EINVAL;
  return st->be->get(st->impl, key, offset, buf, len, ret_len);
}

int storage_head(struct storage *st, const char *key, uint64_t *ret_size_bytes) {
  int err = storage_key_check(key);
  return err ? err : st->be->head(st->impl, key, ret_size_bytes);
}

int storage_delete(struct storage *st, const char *key) {
  int err = storage_key_check(key);
  return err ? err : st->be->del(st->impl, key);
}

int storage_list(struct storage *st, const char *prefix, storage_list_cb cb, void *arg) {
  int err = prefix_check(prefix);
  if (err) return err;
  return st->be->list(st->impl, prefix ? prefix : "", cb, arg);
}

/* Upload ids come back from the store; they are checked as printable and
 * bounded here, and each backend checks its own format. */
static int upload_id_check(const char *id) {
  if (!id || !id[0] || strlen(id) > 1024) return STK_EINVAL;
  for (const char *p = id; *p; p++)
    if ((unsigned char)*p <= 0x20 || *p == 0x7f) return STK_EINVAL;
  return 0;
}

int storage_mpu_begin(struct storage *st, const char *key, char **ret_upload_id) {
  int err = storage_key_check(key);
  return err ? err : st->be->mpu_begin(st->impl, key, ret_upload_id);
}

int storage_mpu_part(struct storage *st, const char *key, const char *upload_id, int number,
                     const void *data, size_t len, char **ret_etag) {
  int err = storage_key_check(key);
  if (!err) err = upload_id_check(upload_id);
  if (err) return err;
  if (number < 1 || number > STORAGE_PART_MAX || (!data && len)) return STK_EINVAL;
  return st->be->mpu_part(st->impl, key, upload_id, number, data, len, ret_etag);
}

int storage_mpu_complete(struct storage *st, const char *key, const char *upload_id,
                         const struct storage_part *parts, size_t n_parts, unsigned flags) {
  int err = storage_key_check(key);
  if (!err) err = upload_id_check(upload_id);
  if (err) return err;
  if (n_parts == 0 || n_parts > STORAGE_PART_MAX) return STK_EINVAL;
  for (size_t i = 0; i < n_parts; i++) {
    if (parts[i].number < 1 || parts[i].number > STORAGE_PART_MAX || !parts[i].etag)
      return STK_EINVAL;
    if (i > 0 && parts[i].number <= parts[i - 1].number) return STK_EINVAL;
  }
  return st->be->mpu_complete(st->impl, key, upload_id, parts, n_parts, flags);
}

int storage_mpu_abort(struct storage *st, const char *key, const char *upload_id) {
  int err = storage_key_check(key);
  if (!err) err = upload_id_check(upload_id);
  return err ? err : st->be->mpu_abort(st->impl, key, upload_id);
}

int storage_mpu_list(struct storage *st, const char *prefix, storage_upload_cb cb, void *arg) {
  int err = prefix_check(prefix);
  if (err) return err;
  if (!cb) return STK_EINVAL;
  if (!st->caps.multipart_list_uploads || !st->be->mpu_list) {
    stk_set_detail("this store cannot list multipart uploads");
    return STK_ENOTSUP;
  }
  return st->be->mpu_list(st->impl, prefix ? prefix : "", cb, arg);
}
