/*
 * The checkpoint service's unary calls (begin, commit, list, manifest,
 * delete, verify) and the small box helpers the write and read paths share.
 * Each call is one client_call: the blocking shell over the async rpc call.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"
#include "client_internal.h"

int stk_ckpt_connect(const struct stk_client_opts *opts, struct stk_client **ret_client) {
  struct stk_client_opts o = {0};
  if (opts) o = *opts;
  if (!o.address || !o.address[0]) o.address = getenv(STK_CKPT_ENV);
  if (!o.address || !o.address[0]) o.address = STK_CKPT_DEFAULT_ADDRESS;
  return stk_client_new(&o, ret_client);
}

size_t stk_ckpt_dtype_size(Stoker__V1__DType dtype) {
  switch (dtype) {
  case STOKER__V1__DTYPE__DTYPE_F32:
  case STOKER__V1__DTYPE__DTYPE_I32:
  case STOKER__V1__DTYPE__DTYPE_U32:
    return 4;
  case STOKER__V1__DTYPE__DTYPE_BF16:
  case STOKER__V1__DTYPE__DTYPE_F16:
  case STOKER__V1__DTYPE__DTYPE_I16:
  case STOKER__V1__DTYPE__DTYPE_U16:
    return 2;
  case STOKER__V1__DTYPE__DTYPE_I64:
  case STOKER__V1__DTYPE__DTYPE_F64:
  case STOKER__V1__DTYPE__DTYPE_U64:
    return 8;
  case STOKER__V1__DTYPE__DTYPE_U8:
  case STOKER__V1__DTYPE__DTYPE_I8:
  case STOKER__V1__DTYPE__DTYPE_BOOL:
  case STOKER__V1__DTYPE__DTYPE_BYTES:
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

int stk_ckpt_begin(struct stk_client *c, const char *job, int64_t step, uint32_t world,
                   int64_t timeout_ms, char ret_attempt[STK_CKPT_ATTEMPT_MAX]) {
  if (!job || !ret_attempt || world == 0 || step < 0) return client_fail(STK_EINVAL, "begin");
  Stoker__V1__BeginRequest req = STOKER__V1__BEGIN_REQUEST__INIT;
  req.job = (char *)job;
  req.step = step;
  req.world = world;
  ProtobufCMessage *resp = NULL;
  int err = client_call(c, CKPT_METHOD("Begin"), &req.base, &stoker__v1__begin_response__descriptor,
                        timeout_ms, &resp);
  if (err < 0) return err;
  const char *id = ((Stoker__V1__BeginResponse *)resp)->attempt;
  if (!id[0] || strlen(id) >= STK_CKPT_ATTEMPT_MAX) err = STK_ECORRUPT;
  if (err == 0) snprintf(ret_attempt, STK_CKPT_ATTEMPT_MAX, "%s", id);
  protobuf_c_message_free_unpacked(resp, NULL);
  return err < 0 ? client_fail(err, "begin: bad attempt id") : 0;
}

int stk_ckpt_commit(struct stk_client *c, const char *attempt, int64_t timeout_ms,
                    Stoker__V1__CheckpointRef **ret_ref) {
  if (!attempt || !attempt[0]) return client_fail(STK_EINVAL, "commit");
  Stoker__V1__CommitCheckpointRequest req = STOKER__V1__COMMIT_CHECKPOINT_REQUEST__INIT;
  req.attempt = (char *)attempt;
  return client_call(c, CKPT_METHOD("Commit"), &req.base, &stoker__v1__checkpoint_ref__descriptor,
                     timeout_ms, (ProtobufCMessage **)ret_ref);
}

int stk_ckpt_list(struct stk_client *c, const char *job, int64_t timeout_ms,
                  Stoker__V1__ListCheckpointsResponse **ret_resp) {
  if (!job || !ret_resp) return client_fail(STK_EINVAL, "list");
  Stoker__V1__ListCheckpointsRequest req = STOKER__V1__LIST_CHECKPOINTS_REQUEST__INIT;
  req.job = (char *)job;
  return client_call(c, CKPT_METHOD("List"), &req.base,
                     &stoker__v1__list_checkpoints_response__descriptor, timeout_ms,
                     (ProtobufCMessage **)ret_resp);
}

int stk_ckpt_get_manifest(struct stk_client *c, const char *job, int64_t step, int64_t timeout_ms,
                          Stoker__V1__Manifest **ret_manifest) {
  if (!job || !ret_manifest) return client_fail(STK_EINVAL, "get manifest");
  Stoker__V1__GetManifestRequest req = STOKER__V1__GET_MANIFEST_REQUEST__INIT;
  req.job = (char *)job;
  req.step = step;
  return client_call(c, CKPT_METHOD("GetManifest"), &req.base, &stoker__v1__manifest__descriptor,
                     timeout_ms, (ProtobufCMessage **)ret_manifest);
}

int stk_ckpt_delete(struct stk_client *c, const char *job, int64_t step, int64_t timeout_ms) {
  if (!job) return client_fail(STK_EINVAL, "delete");
  Stoker__V1__DeleteCheckpointRequest req = STOKER__V1__DELETE_CHECKPOINT_REQUEST__INIT;
  req.job = (char *)job;
  req.step = step;
  return client_call(c, CKPT_METHOD("Delete"), &req.base, &stoker__v1__empty__descriptor,
                     timeout_ms, NULL);
}

int stk_ckpt_verify(struct stk_client *c, const char *job, int64_t step, int64_t timeout_ms,
                    Stoker__V1__VerifyCheckpointResponse **ret_resp) {
  if (!job || !ret_resp) return client_fail(STK_EINVAL, "verify");
  Stoker__V1__VerifyCheckpointRequest req = STOKER__V1__VERIFY_CHECKPOINT_REQUEST__INIT;
  req.job = (char *)job;
  req.step = step;
  return client_call(c, CKPT_METHOD("Verify"), &req.base,
                     &stoker__v1__verify_checkpoint_response__descriptor, timeout_ms,
                     (ProtobufCMessage **)ret_resp);
}
