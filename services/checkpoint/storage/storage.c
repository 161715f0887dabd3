/*
 * The storage interface: URL parsing and dispatch to a backend. Arguments
 * are checked here once (the key rules are storage_base.c's), so backends
 * can trust them. This file opens the backends and calls through their
 * vtables; they call only files below. The blocking calls wait over
 * storage_submit from storage_wait.c, the one file above.
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

/* Upload ids come back from the store; they are checked as printable and
 * bounded here, and each backend checks its own format. */
static int upload_id_check(const char *id) {
  if (!id || !id[0] || strlen(id) > 1024) return STK_EINVAL;
  for (const char *p = id; *p; p++)
    if ((unsigned char)*p <= 0x20 || *p == 0x7f) return STK_EINVAL;
  return 0;
}

static int parts_check(const struct storage_part *parts, size_t n_parts) {
  if (!parts || n_parts == 0 || n_parts > STORAGE_PART_MAX) return STK_EINVAL;
  for (size_t i = 0; i < n_parts; i++) {
    if (parts[i].number < 1 || parts[i].number > STORAGE_PART_MAX || !parts[i].etag)
      return STK_EINVAL;
    if (i > 0 && parts[i].number <= parts[i - 1].number) return STK_EINVAL;
  }
  return 0;
}

/* The arguments of rq as its operation needs them. */
static int req_check(const struct storage_req *rq) {
  int err = storage_key_check(rq->key);
  if (err) return err;
  switch (rq->op) {
  case STORAGE_OP_PUT:
    return !rq->data && rq->len ? STK_EINVAL : 0;
  case STORAGE_OP_GET:
    if ((!rq->buf && rq->len) || rq->offset > INT64_MAX || rq->len > INT64_MAX - rq->offset)
      return STK_EINVAL;
    return 0;
  case STORAGE_OP_HEAD:
  case STORAGE_OP_DELETE:
  case STORAGE_OP_MPU_BEGIN:
    return 0;
  case STORAGE_OP_MPU_PART:
    if (rq->number < 1 || rq->number > STORAGE_PART_MAX || (!rq->data && rq->len))
      return STK_EINVAL;
    return upload_id_check(rq->upload_id);
  case STORAGE_OP_MPU_COMPLETE:
    err = upload_id_check(rq->upload_id);
    return err ? err : parts_check(rq->parts, rq->n_parts);
  case STORAGE_OP_MPU_ABORT:
    return upload_id_check(rq->upload_id);
  }
  return STK_EINVAL;
}

void storage_submit(struct storage *st, const struct storage_req *rq, storage_done_fn done,
                    void *arg) {
  stk_clear_detail();
  int err = req_check(rq);
  if (err) {
    struct storage_result res = {.err = err};
    storage_answer(done, arg, &res);
    return;
  }
  st->be->submit(st->impl, rq, done, arg);
}

int storage_list(struct storage *st, const char *prefix, storage_list_cb cb, void *arg) {
  int err = prefix_check(prefix);
  if (err) return err;
  return st->be->list(st->impl, prefix ? prefix : "", cb, arg);
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
