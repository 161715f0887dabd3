/*
 * The checkpoint service's unary calls a trainer makes (begin, commit; the
 * catalogue's are in ckpt_admin.c), the dtype sizes and the small box
 * helpers the write and read paths share. Each call is one client_call:
 * the blocking shell over the async rpc call.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt_internal.h"
#include "client_internal.h"

int stk_ckpt_connect(const struct stk_client_opts *opts, struct stk_client **ret_client) {
  struct stk_client_opts o = {0};
  if (opts) o = *opts;
  if (!o.address || !o.address[0]) o.address = getenv(STK_CKPT_ENV);
  if (!o.address || !o.address[0]) o.address = STK_CKPT_DEFAULT_ADDRESS;
  return client_new(&o, true, ret_client);
}

/* The public enum is the proto's numbers, so the two convert by a cast. */
#define SAME_DTYPE(name)                                                                           \
  _Static_assert((int)STK_DTYPE_##name == (int)STOKER__V1__DTYPE__DTYPE_##name, #name)
SAME_DTYPE(UNSPECIFIED);
SAME_DTYPE(F32);
SAME_DTYPE(BF16);
SAME_DTYPE(F16);
SAME_DTYPE(I64);
SAME_DTYPE(U8);
SAME_DTYPE(BYTES);
SAME_DTYPE(F64);
SAME_DTYPE(I32);
SAME_DTYPE(I16);
SAME_DTYPE(I8);
SAME_DTYPE(BOOL);
SAME_DTYPE(U16);
SAME_DTYPE(U32);
SAME_DTYPE(U64);
#undef SAME_DTYPE

size_t stk_ckpt_dtype_size(enum stk_dtype dtype) {
  switch (dtype) {
  case STK_DTYPE_F32:
  case STK_DTYPE_I32:
  case STK_DTYPE_U32:
    return 4;
  case STK_DTYPE_BF16:
  case STK_DTYPE_F16:
  case STK_DTYPE_I16:
  case STK_DTYPE_U16:
    return 2;
  case STK_DTYPE_I64:
  case STK_DTYPE_F64:
  case STK_DTYPE_U64:
    return 8;
  case STK_DTYPE_U8:
  case STK_DTYPE_I8:
  case STK_DTYPE_BOOL:
  case STK_DTYPE_BYTES:
    return 1;
  default:
    return 0;
  }
}

uint64_t stk_ckpt_box_elems(const struct stk_ckpt_box *box) {
  if (!box || box->ndim == 0 || box->ndim > STK_CKPT_MAX_DIMS) return 0;
  uint64_t n = 1;
  for (size_t i = 0; i < box->ndim; i++) {
    if (box->sizes[i] && n > UINT64_MAX / box->sizes[i]) return 0;
    n *= box->sizes[i];
  }
  return n;
}

bool ckpt_box_valid(const struct stk_ckpt_box *box, const uint64_t *shape) {
  if (!box || box->ndim == 0 || box->ndim > STK_CKPT_MAX_DIMS || !box->offsets || !box->sizes)
    return false;
  for (size_t i = 0; i < box->ndim; i++) {
    if (box->sizes[i] == 0) return false;
    if (shape && (box->offsets[i] > shape[i] || box->sizes[i] > shape[i] - box->offsets[i]))
      return false;
  }
  return stk_ckpt_box_elems(box) > 0;
}

void ckpt_box_msg(const struct stk_ckpt_box *box, Stoker__V1__Box *msg) {
  stoker__v1__box__init(msg);
  msg->n_offsets = box->ndim;
  msg->offsets = (uint64_t *)box->offsets;
  msg->n_sizes = box->ndim;
  msg->sizes = (uint64_t *)box->sizes;
}

/* ----------------------------------------------------------- the calls */

static int begin_call(struct stk_client *c, const Stoker__V1__BeginRequest *req, int64_t timeout_ms,
                      ProtobufCMessage **ret_resp);
static int commit(struct stk_client *c, const char *attempt, bool detach, int64_t timeout_ms,
                  struct stk_ckpt_ref *ret_ref);

int stk_ckpt_begin(struct stk_client *c, const char *job, int64_t step, uint32_t world,
                   int64_t timeout_ms, char ret_attempt[STK_CKPT_ATTEMPT_MAX]) {
  if (!job || !ret_attempt || world == 0 || step < 0) return client_fail(STK_EINVAL, "begin");
  Stoker__V1__BeginRequest req = STOKER__V1__BEGIN_REQUEST__INIT;
  req.job = (char *)job;
  req.step = step;
  req.world = world;
  req.generation = __atomic_load_n(&c->ckpt_generation, __ATOMIC_RELAXED);
  ProtobufCMessage *resp = NULL;
  int err = begin_call(c, &req, client_timeout(c, timeout_ms), &resp);
  if (err < 0) return err;
  const Stoker__V1__BeginResponse *r = (const Stoker__V1__BeginResponse *)resp;
  const char *id = r->attempt, *owner = r->owner ? r->owner : "";
  int n = snprintf(ret_attempt, STK_CKPT_ATTEMPT_MAX, owner[0] ? "%s@%s" : "%s", id, owner);
  if (!id[0] || strchr(id, '@')) err = STK_ECORRUPT;
  if (!err && (n < 0 || n >= STK_CKPT_ATTEMPT_MAX)) err = STK_ETOOBIG;
  protobuf_c_message_free_unpacked(resp, NULL);
  if (err == STK_ETOOBIG)
    return client_fail(err, "begin: the owner's address does not fit the attempt handle "
                            "(use a shorter --advertise-host)");
  return err < 0 ? client_fail(err, "begin: bad attempt id") : 0;
}

/* Begin, again while a replica that is leaving (or gone) answers
 * UNAVAILABLE: round robin gives the next try to another replica. A Begin
 * refused so created nothing; one cut off by a lost connection may have
 * left an attempt, which the job's next Begin supersedes. */
static int begin_call(struct stk_client *c, const Stoker__V1__BeginRequest *req, int64_t timeout_ms,
                      ProtobufCMessage **ret_resp) {
  int64_t end = client_now_ms() + timeout_ms, wait_ms = 50;
  for (;;) {
    int64_t left = end - client_now_ms();
    int err = client_call(c, CKPT_METHOD(begin, req), &req->base,
                          &stoker__v1__begin_response__descriptor, left > 1 ? left : 1, ret_resp);
    if (err != STK_EUNAVAIL || client_now_ms() + wait_ms >= end) return err;
    struct timespec ts = {.tv_sec = wait_ms / 1000, .tv_nsec = (wait_ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
    if (wait_ms < 1000) wait_ms *= 2;
  }
}

int ckpt_route(struct stk_client *c, const char *handle, char ret_id[STK_CKPT_ATTEMPT_MAX],
               struct stk_client **ret_client) {
  if (!c || !handle || !handle[0] || strlen(handle) >= STK_CKPT_ATTEMPT_MAX)
    return client_fail(STK_EINVAL, "attempt");
  const char *at = strchr(handle, '@');
  snprintf(ret_id, STK_CKPT_ATTEMPT_MAX, "%.*s",
           (int)(at ? at - handle : (ptrdiff_t)strlen(handle)), handle);
  *ret_client = c;
  if (!at) return 0;
  if (!at[1] || at == handle) return client_fail(STK_EINVAL, "attempt handle without id or owner");
  int err = client_peer(c, at + 1, ret_client);
  return err < 0 ? client_fail(err, "attempt owner") : 0;
}

void stk_ckpt_set_generation(struct stk_client *c, uint64_t generation) {
  if (c) __atomic_store_n(&c->ckpt_generation, generation, __ATOMIC_RELAXED);
}

int stk_ckpt_commit(struct stk_client *c, const char *attempt, int64_t timeout_ms,
                    struct stk_ckpt_ref *ret_ref) {
  return commit(c, attempt, false, timeout_ms, ret_ref);
}

int stk_ckpt_commit_detached(struct stk_client *c, const char *attempt, int64_t timeout_ms,
                             struct stk_ckpt_ref *ret_ref) {
  return commit(c, attempt, true, timeout_ms, ret_ref);
}

static int commit(struct stk_client *c, const char *attempt, bool detach, int64_t timeout_ms,
                  struct stk_ckpt_ref *ret_ref) {
  char id[STK_CKPT_ATTEMPT_MAX];
  int err = ckpt_route(c, attempt, id, &c);
  if (err < 0) return err;
  Stoker__V1__CommitCheckpointRequest req = STOKER__V1__COMMIT_CHECKPOINT_REQUEST__INIT;
  req.attempt = id;
  req.detach = detach;
  Stoker__V1__CheckpointRef *ref = NULL;
  err = CKPT_CALL(c, commit, &req, timeout_ms, &ref);
  if (err < 0) return err;
  if (ret_ref) {
    ret_ref->step = ref->step;
    ret_ref->committed_at_ms = ref->committed_at_ms;
    ret_ref->generation = ref->generation;
    snprintf(ret_ref->uri, sizeof(ret_ref->uri), "%s", ref->uri ? ref->uri : "");
  }
  protobuf_c_message_free_unpacked(&ref->base, NULL);
  return 0;
}

int stk_ckpt_abort(struct stk_client *c, const char *attempt, const char *reason,
                   int64_t timeout_ms) {
  char id[STK_CKPT_ATTEMPT_MAX];
  int err = ckpt_route(c, attempt, id, &c);
  if (err < 0) return err;
  Stoker__V1__AbortCheckpointRequest req = STOKER__V1__ABORT_CHECKPOINT_REQUEST__INIT;
  req.attempt = id;
  req.reason = (char *)(reason ? reason : "");
  return CKPT_CALL(c, abort, &req, timeout_ms, (Stoker__V1__Empty **)NULL);
}
