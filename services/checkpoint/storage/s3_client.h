/*
 * s3_client: an asynchronous S3 client on libcurl's multi interface,
 * driven by a libuv loop (CURLMOPT_SOCKETFUNCTION + uv_poll,
 * CURLMOPT_TIMERFUNCTION + uv_timer). Requests are signed by s3_sigv4.
 *
 * Every operation is idempotent and retried on 5xx, 503 SlowDown, timeouts
 * and connection resets, with exponential backoff and full jitter. At most
 * `limit` requests run at once; a SlowDown halves the limit, and it grows
 * back by one after every `recover_every` successes (up to the configured
 * maximum). Further requests wait in a FIFO queue.
 *
 * Threading: a client belongs to its loop's thread; every call and every
 * callback happens there. s3_thread.h runs it on a thread of its own for callers without a loop.
 * Contract (libuv style): if a submit call fails, its callback never fires;
 * otherwise it fires exactly once.
 */
#ifndef STK_S3_CLIENT_H
#define STK_S3_CLIENT_H

#include "s3_config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

enum s3_op_kind {
  S3_OP_PUT,              /* PutObject (optionally If-None-Match: *) */
  S3_OP_GET,              /* GetObject, ranged or whole */
  S3_OP_HEAD,             /* HeadObject: size and ETag */
  S3_OP_DELETE,           /* DeleteObject */
  S3_OP_MPU_CREATE,       /* CreateMultipartUpload -> upload_id */
  S3_OP_MPU_PART,         /* UploadPart -> etag */
  S3_OP_MPU_COMPLETE,     /* CompleteMultipartUpload (optionally If-None-Match: *) */
  S3_OP_MPU_ABORT,        /* AbortMultipartUpload */
  S3_OP_MPU_LIST_PARTS,   /* ListParts -> entries (number, etag, size) */
  S3_OP_MPU_LIST_UPLOADS, /* ListMultipartUploads -> entries (key, upload_id, initiated) */
  S3_OP_LIST,             /* ListObjectsV2 -> entries (key, size, etag) */
};

/* One part for S3_OP_MPU_COMPLETE. */
struct s3_part {
  int number;
  const char *etag;
};

/* GET body sink: receives the bytes at `offset` (relative to the requested
 * range start). A retried GET delivers from offset 0 again. Non-zero
 * aborts the request (the result is STK_ECANCELED). */
typedef int (*s3_sink_fn)(void *arg, uint64_t offset, const void *data, size_t len);

/* What to do. Pointers are borrowed until the callback fires. */
struct s3_op {
  enum s3_op_kind kind;
  const char *key;       /* Object key (all but LIST and LIST_UPLOADS). */
  const char *upload_id; /* PART, COMPLETE, ABORT, LIST_PARTS. */
  int part_number;       /* PART: 1..10000. */
  const void *body;      /* PUT, PART: the bytes to send. */
  size_t body_len;
  bool if_none_match;          /* PUT, COMPLETE: fail with STK_EEXIST if the key exists. */
  uint64_t range_offset;       /* GET: first byte. */
  uint64_t range_len;          /* GET: byte count; 0 = to the end. */
  const struct s3_part *parts; /* COMPLETE: ascending part numbers. */
  size_t n_parts;
  const char *prefix;           /* LIST, LIST_UPLOADS. */
  const char *marker;           /* LIST: continuation token; LIST_PARTS: part-number marker;
                                   LIST_UPLOADS: key marker. NULL for the first page. */
  const char *upload_id_marker; /* LIST_UPLOADS: with marker, the last upload id seen. */
  int max_keys;                 /* LIST*: page size; 0 = the store's default. */
  s3_sink_fn sink;              /* GET: stream the body here instead of buffering it. */
  void *sink_arg;
};

/* One listed item; the fields that apply to the operation are set. */
struct s3_entry {
  char *key;
  char *upload_id;
  char *etag;
  uint64_t size;
  int part_number;
  int64_t initiated_ms; /* LIST_UPLOADS: <Initiated>, ms since the epoch; 0 if absent. */
};

struct s3_result {
  int err;                 /* 0 or STK_E* (see s3_client.c: status_to_error). */
  long status;             /* Last HTTP status (0: no response). */
  int attempts;            /* Tries made (1 = no retry). */
  char *error_code;        /* S3's <Code> ("SlowDown", "NoSuchKey"), or NULL. */
  char *etag;              /* PUT, PART, HEAD, GET, COMPLETE. */
  char *upload_id;         /* MPU_CREATE. */
  uint64_t content_length; /* HEAD: object size; GET: bytes received. */
  char *body;              /* GET without sink: the bytes (NUL-terminated); else NULL. */
  size_t body_len;
  struct s3_entry *entries; /* LIST*: this page. */
  size_t n_entries;
  bool truncated;              /* LIST*: more pages follow... */
  char *next_marker;           /* ...starting at this marker... */
  char *next_upload_id_marker; /* ...and (LIST_UPLOADS) this upload id marker. */
};

/* Frees what a result owns and zeroes it. */
void s3_result_clear(struct s3_result *res);

/* Fires once per operation on the loop thread. `res` belongs to the client
 * and is cleared after the callback returns; move fields out (set them to
 * NULL) to keep them. */
typedef void (*s3_done_fn)(void *arg, struct s3_result *res);

/* Counters, for tests and metrics. */
struct s3_stats {
  int limit;          /* Current concurrency limit. */
  int min_limit;      /* Lowest it has been. */
  int running;        /* Requests on the wire. */
  int queued;         /* Waiting for a slot (including backoff waits). */
  uint64_t requests;  /* HTTP attempts started. */
  uint64_t retries;   /* Attempts that were retries. */
  uint64_t slowdowns; /* 503 answers seen. */
  uint64_t succeeded; /* Operations finished with 0. */
  uint64_t failed;    /* Operations finished with an error. */
};

struct s3_client;

/* cfg is copied. STK_EINVAL if bucket, credentials or endpoint are missing. */
int s3_client_new(uv_loop_t *loop, const struct s3_config *cfg, struct s3_client **ret);

/* Cancels pending operations (their callbacks fire with STK_ECANCELED),
 * then closes the client's handles; the memory is released from close
 * callbacks, so the caller keeps running the loop until it is idle.
 * Accepts NULL. */
void s3_client_free(struct s3_client *c);

int s3_client_submit(struct s3_client *c, const struct s3_op *op, s3_done_fn done, void *arg);

void s3_client_stats(const struct s3_client *c, struct s3_stats *ret);

#endif
