/*
 * The checkpoint service's catalogue calls (stoker_admin.h, not
 * installed): list, manifest, delete and verify, what stokerctl and the
 * tests use. Each is one client_call answering a protobuf-c message the
 * caller frees.
 */
#include "ckpt_internal.h"
#include "client_internal.h"
#include "stoker_admin.h"

int stk_ckpt_list(struct stk_client *c, const char *job, int64_t timeout_ms,
                  Stoker__V1__ListCheckpointsResponse **ret_resp) {
  if (!job || !ret_resp) return client_fail(STK_EINVAL, "list");
  Stoker__V1__ListCheckpointsRequest req = STOKER__V1__LIST_CHECKPOINTS_REQUEST__INIT;
  req.job = (char *)job;
  return CLIENT_LIST_ALL(stoker__v1__checkpoint, c, list, &req, timeout_ms, ret_resp);
}

int stk_ckpt_get_manifest(struct stk_client *c, const char *job, int64_t step, int64_t timeout_ms,
                          Stoker__V1__Manifest **ret_manifest) {
  if (!job || !ret_manifest) return client_fail(STK_EINVAL, "get manifest");
  Stoker__V1__GetManifestRequest req = STOKER__V1__GET_MANIFEST_REQUEST__INIT;
  req.job = (char *)job;
  req.step = step;
  return CKPT_CALL(c, get_manifest, &req, timeout_ms, ret_manifest);
}

int stk_ckpt_delete(struct stk_client *c, const char *job, int64_t step, int64_t timeout_ms) {
  if (!job) return client_fail(STK_EINVAL, "delete");
  Stoker__V1__DeleteCheckpointRequest req = STOKER__V1__DELETE_CHECKPOINT_REQUEST__INIT;
  req.job = (char *)job;
  req.step = step;
  return CKPT_CALL(c, delete, &req, timeout_ms, (Stoker__V1__Empty **)NULL);
}

int stk_ckpt_verify(struct stk_client *c, const char *job, int64_t step, int64_t timeout_ms,
                    Stoker__V1__VerifyCheckpointResponse **ret_resp) {
  if (!job || !ret_resp) return client_fail(STK_EINVAL, "verify");
  Stoker__V1__VerifyCheckpointRequest req = STOKER__V1__VERIFY_CHECKPOINT_REQUEST__INIT;
  req.job = (char *)job;
  req.step = step;
  return CKPT_CALL(c, verify, &req, timeout_ms, ret_resp);
}
