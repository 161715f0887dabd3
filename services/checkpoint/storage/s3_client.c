/*
 * The S3 client's engine: a FIFO of operations, a concurrency limit that
 * halves on SlowDown and recovers slowly, and retries with exponential
 * backoff and full jitter (sleep = random(0, min(cap, base * 2^attempt))).
 * Every S3 operation here is idempotent, so every one may be retried.
 */
#include "s3_internal.h"

#include "stk_error.h"

#include <stdlib.h>
#include <string.h>

void s3_result_clear(struct s3_result *res) {
  free(res->error_code);
  free(res->etag);
  free(res->upload_id);
  free(res->body);
  for (size_t i = 0; i < res->n_entries; i++) {
    free(res->entries[i].key);
    free(res->entries[i].upload_id);
    free(res->entries[i].etag);
  }
  free(res->entries);
  free(res->next_marker);
  free(res->next_upload_id_marker);
  memset(res, 0, sizeof(*res));
}

/* The error an HTTP status maps to. */
static int status_to_error(long status) {
  switch (status) {
  case 400:
    return STK_EINVAL;
  case 401:
    return STK_EUNAUTH;
  case 403:
    return STK_EPERM;
  case 404:
    return STK_ENOENT;
  case 405:
  case 501:
    return STK_ENOTSUP;
  case 409:
    return STK_ESTATE;
  case 412:
    return STK_EEXIST;
  case 416:
    return STK_ERANGE;
  default:
    return status >= 500 || status == 429 ? STK_EUNAVAIL : STK_EIO;
  }
}

static bool curl_retryable(CURLcode code) {
  switch (code) {
  case CURLE_COULDNT_CONNECT:
  case CURLE_OPERATION_TIMEDOUT:
  case CURLE_SEND_ERROR:
  case CURLE_RECV_ERROR:
  case CURLE_GOT_NOTHING:
  case CURLE_PARTIAL_FILE:
  case CURLE_SSL_CONNECT_ERROR:
  case CURLE_HTTP2:
  case CURLE_HTTP2_STREAM:
    return true;
  default:
    return false;
  }
}

static int curl_to_error(CURLcode code) {
  switch (code) {
  case CURLE_OPERATION_TIMEDOUT:
    return STK_ETIMEDOUT;
  case CURLE_OUT_OF_MEMORY:
    return STK_ENOMEM;
  case CURLE_COULDNT_RESOLVE_HOST:
  case CURLE_COULDNT_CONNECT:
    return STK_EUNAVAIL;
  default:
    return curl_retryable(code) ? STK_EUNAVAIL : STK_EIO;
  }
}

static void enqueue(struct s3_client *c, struct s3_req *r) {
  r->next = NULL;
  if (c->q_tail)
    c->q_tail->next = r;
  else
    c->q_head = r;
  c->q_tail = r;
  c->stats.queued++;
}

static void req_closed(uv_handle_t *h) {
  struct s3_req *r = h->data;
  struct s3_client *c = r->c;
  free(r);
  c->pending_closes--;
  s3_loop_maybe_free(c);
}

/* Reports the outcome and releases the request (memory goes in its timer's
 * close callback). */
static void finish(struct s3_req *r, int err) {
  struct s3_client *c = r->c;
  r->res.err = err;
  if (err)
    c->stats.failed++;
  else
    c->stats.succeeded++;
  if (r->all_prev)
    r->all_prev->all_next = r->all_next;
  else
    c->all = r->all_next;
  if (r->all_next) r->all_next->all_prev = r->all_prev;
  r->done(r->arg, &r->res);
  s3_result_clear(&r->res);
  s3_request_reset(r);
  free(r->xml_body);
  c->pending_closes++;
  uv_close((uv_handle_t *)&r->backoff, req_closed);
}

static void pump(struct s3_client *c) {
  while (!c->closing && c->q_head && c->running < c->limit) {
    struct s3_req *r = c->q_head;
    c->q_head = r->next;
    if (!c->q_head) c->q_tail = NULL;
    c->stats.queued--;
    r->res.attempts++;
    c->stats.requests++;
    if (r->res.attempts > 1) c->stats.retries++;
    int err = s3_request_start(r);
    if (err) {
      finish(r, err);
      continue;
    }
    c->running++;
  }
}

static void on_backoff(uv_timer_t *t) {
  struct s3_req *r = t->data;
  r->in_backoff = false;
  enqueue(r->c, r);
  pump(r->c);
}

static uint64_t backoff_ms(const struct s3_config *cfg, int attempt) {
  uint64_t cap = (uint64_t)cfg->backoff_max_ms, d = (uint64_t)cfg->backoff_base_ms;
  for (int i = 1; i < attempt && d < cap; i++) d *= 2;
  if (d > cap) d = cap;
  return d ? (uint64_t)random() % (d + 1) : 0;
}

static void slow_down(struct s3_client *c) {
  c->stats.slowdowns++;
  c->limit = c->limit > 1 ? c->limit / 2 : 1;
  if (c->limit < c->stats.min_limit) c->stats.min_limit = c->limit;
  c->streak = 0;
}

static void recover(struct s3_client *c) {
  if (c->limit >= c->cfg.max_concurrency) return;
  if (++c->streak >= c->cfg.recover_every) {
    c->limit++;
    c->streak = 0;
  }
}

/* Retries after a backoff if attempts remain; else fails with err. */
static void retry_or_fail(struct s3_req *r, int err) {
  struct s3_client *c = r->c;
  if (r->res.attempts >= c->cfg.max_attempts || c->closing) {
    finish(r, err);
    return;
  }
  s3_request_reset(r);
  free(r->res.error_code);
  r->res.error_code = NULL;
  r->in_backoff = true;
  c->stats.queued++;
  uv_timer_start(&r->backoff, on_backoff, backoff_ms(&c->cfg, r->res.attempts), 0);
}

static void handle_status(struct s3_req *r, long status) {
  struct s3_client *c = r->c;
  if (status / 100 == 2) {
    int err = s3_request_parse(r);
    bool body_error = r->op.kind == S3_OP_MPU_COMPLETE && err == STK_EUNAVAIL;
    if (body_error) {
      retry_or_fail(r, err);
      return;
    }
    if (!err) recover(c);
    finish(r, err);
    return;
  }
  s3_request_parse_error(r);
  int err = status_to_error(status);
  bool conflict = status == 409 && r->res.error_code &&
                  strcmp(r->res.error_code, "ConditionalRequestConflict") == 0;
  if (status == 503 || status == 429) slow_down(c);
  /* 501 NotImplemented is permanent (the store lacks the operation): asking
   * again cannot change it. */
  if ((status >= 500 && status != 501) || status == 429 || conflict)
    retry_or_fail(r, err);
  else
    finish(r, err);
}

/* The loop's attempt_done: one attempt's transfer ended. */
static void attempt_done(struct s3_req *r, CURLcode code) {
  struct s3_client *c = r->c;
  c->running--;
  long status = 0;
  curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &status);
  r->res.status = status;
  if (code == CURLE_OK) {
    handle_status(r, status);
  } else if (r->sink_failed) {
    finish(r, STK_ECANCELED);
  } else if (r->too_big) {
    finish(r, STK_ETOOBIG);
  } else if (curl_retryable(code)) {
    retry_or_fail(r, curl_to_error(code));
  } else {
    finish(r, curl_to_error(code));
  }
  pump(c);
}

/* ---- Public API. ---- */

static int op_check(const struct s3_op *op) {
  bool keyed = op->kind != S3_OP_LIST && op->kind != S3_OP_MPU_LIST_UPLOADS;
  if (op->kind > S3_OP_LIST) return STK_EINVAL;
  if (keyed && (!op->key || !op->key[0])) return STK_EINVAL;
  bool needs_id = op->kind == S3_OP_MPU_PART || op->kind == S3_OP_MPU_COMPLETE ||
                  op->kind == S3_OP_MPU_ABORT || op->kind == S3_OP_MPU_LIST_PARTS;
  if (needs_id && (!op->upload_id || !op->upload_id[0])) return STK_EINVAL;
  if (op->kind == S3_OP_MPU_PART && (op->part_number < 1 || op->part_number > 10000))
    return STK_EINVAL;
  if (op->kind == S3_OP_MPU_COMPLETE && (op->n_parts == 0 || !op->parts)) return STK_EINVAL;
  if (op->body_len && !op->body) return STK_EINVAL;
  return 0;
}

int s3_client_submit(struct s3_client *c, const struct s3_op *op, s3_done_fn done, void *arg) {
  if (c->closing) return STK_ECANCELED;
  int err = op_check(op);
  if (err) return err;
  struct s3_req *r = calloc(1, sizeof(*r));
  if (!r) return STK_ENOMEM;
  r->c = c;
  r->op = *op;
  r->done = done;
  r->arg = arg;
  err = s3_request_prepare(r);
  if (err) {
    free(r->xml_body);
    free(r);
    return err;
  }
  uv_timer_init(c->loop, &r->backoff);
  r->backoff.data = r;
  r->all_next = c->all;
  if (c->all) c->all->all_prev = r;
  c->all = r;
  enqueue(c, r);
  pump(c);
  return 0;
}

static int split_endpoint(struct s3_client *c) {
  const char *ep = c->cfg.endpoint, *host = strstr(ep, "://") + 3;
  size_t len = strcspn(host, "/?");
  c->host = strndup(host, len);
  if (!c->host || len == 0) return c->host ? STK_EINVAL : STK_ENOMEM;
  c->scheme_host = ep;
  return 0;
}

static void global_init(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
}

int s3_client_new(uv_loop_t *loop, const struct s3_config *cfg, struct s3_client **ret) {
  static uv_once_t once = UV_ONCE_INIT;
  uv_once(&once, global_init);
  struct s3_client *c = calloc(1, sizeof(*c));
  if (!c) return STK_ENOMEM;
  c->loop = loop;
  int err = s3_config_resolve(cfg, &c->cfg, &c->cfg_owned);
  if (!err) err = split_endpoint(c);
  if (!err) err = s3_loop_init(c, attempt_done);
  if (err) {
    free(c->host);
    free(c->cfg_owned);
    free(c);
    return err;
  }
  c->limit = c->cfg.max_concurrency;
  c->stats.min_limit = c->limit;
  *ret = c;
  return 0;
}

void s3_client_free(struct s3_client *c) {
  if (!c) return;
  c->closing = true;
  while (c->all) {
    struct s3_req *r = c->all;
    if (r->easy) {
      curl_multi_remove_handle(c->multi, r->easy);
      c->running--;
    }
    uv_timer_stop(&r->backoff);
    finish(r, STK_ECANCELED);
  }
  c->q_head = c->q_tail = NULL;
  s3_loop_close(c);
}

void s3_client_stats(const struct s3_client *c, struct s3_stats *ret) {
  *ret = c->stats;
  ret->limit = c->limit;
  ret->running = c->running;
}
