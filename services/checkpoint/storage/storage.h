/*
 * storage: the small object-store interface the checkpoint core writes
 * through, with two backends: S3 (s3://bucket/prefix, over s3_client) and a
 * local directory (file:///dir, fs_backend.c, the embedded default).
 *
 * Objects are named by keys relative to the backend's root. Keys are
 * validated before use (storage_key_check): no empty, "." or ".." segments,
 * no leading or trailing '/', no control characters, at most
 * STORAGE_KEY_MAX bytes, and no segment starting with ".stk-" (reserved
 * for the file backend's bookkeeping).
 *
 * Object calls are asynchronous (storage_submit: one request, one
 * completion callback); the blocking calls below are thin waits over it for
 * callers that truly wait (startup recovery, commit, the operator calls),
 * and listings block. Every call is thread-safe. A blocking call never runs
 * on a libuv loop thread, nor inside a completion callback; storage_submit
 * may do the I/O inline (file://), so it too is called from worker threads,
 * not from a loop thread. Errors are negative STK_E*:
 * STK_ENOENT (no such key or upload), STK_EEXIST (conditional write refused
 * because the key exists), STK_EINVAL (bad key or arguments), STK_ERANGE
 * (ranged read past the end), STK_EIO / STK_EUNAVAIL (store failures after
 * retries), STK_ENOTSUP (the store lacks the feature).
 */
#ifndef STK_STORAGE_H
#define STK_STORAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define STORAGE_KEY_MAX     1024 /* bytes, S3's limit */
#define STORAGE_SEGMENT_MAX 255  /* bytes per '/'-separated segment (file systems) */
#define STORAGE_PART_MAX    10000

/* storage_put / storage_mpu_complete flags. */
enum storage_flags {
  STORAGE_IF_ABSENT = 1 << 0, /* Fail with STK_EEXIST if the key exists. */
};

/* What the store can do; filled at open (the S3 backend probes). */
struct storage_caps {
  bool conditional_put;        /* STORAGE_IF_ABSENT is enforced atomically by the store. */
  bool multipart_abort;        /* Abort frees the parts. */
  bool multipart_list;         /* ListParts / ListMultipartUploads answer. */
  bool multipart_list_uploads; /* storage_mpu_list works (else it fails STK_ENOTSUP). */
  bool completes_inline;       /* storage_submit answers in the submitting thread, having
                                  done the I/O there (file://): a caller wanting N requests
                                  in flight needs N threads. */
};

/* One uploaded part, for storage_mpu_complete: numbers ascending from 1. */
struct storage_part {
  int number;
  const char *etag;
};

/* Called once per key under a prefix, in no guaranteed order; a non-zero
 * return stops the listing and is returned by storage_list. */
typedef int (*storage_list_cb)(void *arg, const char *key, uint64_t size_bytes);

struct storage;

/* Opens "file:///abs/dir" or "s3://bucket[/prefix]". The S3 backend reads
 * its endpoint, region and credentials from the environment (see
 * s3_config.h) unless storage_open_with or storage_open_s3 is used. S3
 * opens run the capability probe (s3_probe.h) under the prefix. */
int storage_open(const char *url, struct storage **ret);

/* The same with the S3 settings of s3 (NULL: the environment's; fields left
 * NULL or 0 also fall back to it; its bucket is ignored, the URL names it). */
struct s3_config;
int storage_open_with(const char *url, const struct s3_config *s3, struct storage **ret);

/* The S3 backend with an explicit configuration (copied); keys are stored
 * under prefix ("" or ending in '/'). */
int storage_open_s3(const struct s3_config *cfg, const char *prefix, struct storage **ret);
void storage_free(struct storage *st);

const struct storage_caps *storage_caps(const struct storage *st);

/* 0 if key is acceptable, STK_EINVAL (with a detail) otherwise. */
int storage_key_check(const char *key);

/* ---- Asynchronous object calls ---- */

enum storage_op {
  STORAGE_OP_PUT,          /* Whole-object write; visible atomically (never partially). */
  STORAGE_OP_GET,          /* Ranged read (short only at the end of the object). */
  STORAGE_OP_HEAD,         /* The object's size. */
  STORAGE_OP_DELETE,       /* Deleting a missing key succeeds (as on S3). */
  STORAGE_OP_MPU_BEGIN,    /* Multipart upload: its id. */
  STORAGE_OP_MPU_PART,     /* One part: its ETag. */
  STORAGE_OP_MPU_COMPLETE, /* The object visible atomically. */
  STORAGE_OP_MPU_ABORT,    /* The parts discarded. */
};

/* One request. The strings and parts are copied before storage_submit
 * returns; data and buf are borrowed until the callback fires. */
struct storage_req {
  enum storage_op op;
  const char *key;
  const char *upload_id;            /* MPU_PART, MPU_COMPLETE, MPU_ABORT. */
  int number;                       /* MPU_PART: 1..STORAGE_PART_MAX. */
  const void *data;                 /* PUT, MPU_PART: len bytes to write. */
  void *buf;                        /* GET: room for len bytes. */
  size_t len;                       /* PUT, MPU_PART, GET. */
  uint64_t offset;                  /* GET: the first byte. */
  const struct storage_part *parts; /* MPU_COMPLETE: numbers ascending. */
  size_t n_parts;
  unsigned flags; /* PUT, MPU_COMPLETE: enum storage_flags. */
};

/* What a request came to. The callback may move the strings out (set them
 * to NULL); what is left is freed after it returns. */
struct storage_result {
  int err;          /* 0 or STK_E* as above. */
  size_t len;       /* GET: bytes read. */
  uint64_t size;    /* HEAD: the object's size. */
  char *upload_id;  /* MPU_BEGIN. */
  char *etag;       /* MPU_PART. */
  char detail[160]; /* The error's detail (what stk_detail() would say), or "". */
};

/* Fires exactly once per storage_submit: on the S3 engine's thread, or
 * inline in the caller (file://, and bad arguments on any store). It must
 * not block: hand the result to a pool or a loop. */
typedef void (*storage_done_fn)(void *arg, struct storage_result *res);

/* Sends one request; concurrency is bounded by the store's engine (the S3
 * client's limit) and by the caller, who decides how many to keep out. */
void storage_submit(struct storage *st, const struct storage_req *rq, storage_done_fn done,
                    void *arg);

/* Frees what a result owns and zeroes it. */
void storage_result_clear(struct storage_result *res);

/* ---- Blocking calls: a wait over storage_submit (storage_wait.c) ---- */

/* Whole-object write; visible atomically (never partially). */
int storage_put(struct storage *st, const char *key, const void *data, size_t len, unsigned flags);
/* Reads up to len bytes from offset into buf; *ret_len is the count read
 * (short only at the end of the object). */
int storage_get(struct storage *st, const char *key, uint64_t offset, void *buf, size_t len,
                size_t *ret_len);
int storage_head(struct storage *st, const char *key, uint64_t *ret_size_bytes);
/* Deleting a missing key succeeds (as on S3). */
int storage_delete(struct storage *st, const char *key);
int storage_list(struct storage *st, const char *prefix, storage_list_cb cb, void *arg);

/* Multipart upload: begin gives an upload id (free() it); parts may be sent
 * in any order and again (the last one wins); complete makes the object
 * visible atomically; abort discards the parts. */
int storage_mpu_begin(struct storage *st, const char *key, char **ret_upload_id);
int storage_mpu_part(struct storage *st, const char *key, const char *upload_id, int number,
                     const void *data, size_t len, char **ret_etag);
int storage_mpu_complete(struct storage *st, const char *key, const char *upload_id,
                         const struct storage_part *parts, size_t n_parts, unsigned flags);
int storage_mpu_abort(struct storage *st, const char *key, const char *upload_id);

/* One multipart upload in progress; the strings live during the callback. */
struct storage_upload {
  const char *key; /* Relative to the backend's root, as storage_mpu_begin took it. */
  const char *upload_id;
  int64_t initiated_ms; /* Wall clock (ms since the epoch) at begin, by the store's
                           clock; 0 when the store does not say. */
};

/* Called once per upload; a non-zero return stops the listing and is
 * returned by storage_mpu_list. The callback may call into st (abort the
 * upload it was given, for instance). */
typedef int (*storage_upload_cb)(void *arg, const struct storage_upload *u);

/* Lists the multipart uploads begun and neither completed nor aborted whose
 * key starts with prefix ("" or ending in '/', as storage_list), in no
 * guaranteed order (S3 pages through them by key, then upload id). An upload
 * may be reported although it is being completed or aborted meanwhile.
 * Keys the store holds that storage_key_check refuses (the S3 capability
 * probe's, say) are not reported. STK_ENOTSUP where the store cannot list
 * uploads (caps.multipart_list_uploads false); STK_EIO for a listing that
 * does not advance. */
int storage_mpu_list(struct storage *st, const char *prefix, storage_upload_cb cb, void *arg);

#endif
