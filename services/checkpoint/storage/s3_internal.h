/*
 * Internals shared by the S3 client's files, top first: s3_client.c (queue,
 * concurrency limit, retries), s3_request.c (one HTTP attempt: URL,
 * headers, signature, result parsing) and s3_loop.c (libcurl multi on
 * libuv). Each calls only the files after it.
 */
#ifndef STK_S3_INTERNAL_H
#define STK_S3_INTERNAL_H

#include "s3_client.h"
#include "strbuf.h"

#include <curl/curl.h>

/* One operation, alive from submit until its callback has run. */
struct s3_req {
  struct s3_client *c;
  struct s3_op op; /* Copy of the caller's; pointers borrowed. */
  s3_done_fn done;
  void *arg;
  struct s3_req *next;                /* Wait queue link. */
  struct s3_req *all_prev, *all_next; /* Every live request, for cancellation. */
  char *xml_body;                     /* COMPLETE: the request body we built. */
  const char *send;                   /* Bytes to send and how many. */
  size_t send_len;
  char payload_hash[65]; /* Computed once, reused by every attempt. */
  uv_timer_t backoff;    /* Waits between attempts. */
  bool in_backoff;
  /* Per attempt. */
  CURL *easy;
  struct curl_slist *headers;
  size_t sent;
  struct strbuf resp; /* Buffered response body. */
  uint64_t sink_offset;
  bool sink_failed;
  bool too_big;
  struct s3_result res;
};

struct sock_ctx;

struct s3_client {
  uv_loop_t *loop;
  struct s3_config cfg;
  char *cfg_owned;
  const char *scheme_host; /* "http://127.0.0.1:4568" without a trailing '/'. */
  char *host;              /* "127.0.0.1:4568" */
  CURLM *multi;
  uv_timer_t timer;       /* libcurl's timeout. */
  struct sock_ctx *socks; /* Open poll contexts. */
  struct s3_req *q_head, *q_tail;
  struct s3_req *all;
  int running;
  int limit;
  int streak;         /* Successes since the limit last moved. */
  int pending_closes; /* Handles whose close callback has not run. */
  bool closing;
  struct s3_stats stats;
  /* Runs when an attempt's transfer ends (s3_loop.c calls it; s3_client.c,
   * above the loop, sets it with s3_loop_init). */
  void (*attempt_done)(struct s3_req *r, CURLcode code);
};

/* s3_loop.c (calls no file above it: a finished transfer goes to the
 * attempt_done the client handed to s3_loop_init). */
int s3_loop_init(struct s3_client *c, void (*attempt_done)(struct s3_req *r, CURLcode code));
void s3_loop_close(struct s3_client *c);
/* Frees the client once every handle is closed. */
void s3_loop_maybe_free(struct s3_client *c);

/* s3_request.c */
int s3_request_start(struct s3_req *r);        /* Builds and adds the easy handle. */
void s3_request_reset(struct s3_req *r);       /* Drops per-attempt state. */
int s3_request_prepare(struct s3_req *r);      /* Once per op: body, payload hash. */
int s3_request_parse(struct s3_req *r);        /* 2xx: fills r->res; 0 or STK_E*. */
void s3_request_parse_error(struct s3_req *r); /* Non-2xx: error code from the body. */

#endif
