/*
 * The dataloader's operator calls (stoker_admin.h, not installed): create,
 * get, list, delete, update the mixture and explain a slice on one process,
 * and create, info, delete and mixture on every part of a scaled-out job (in part order,
 * stopping at the first failure, the message naming the part). Each
 * answers a protobuf-c LoaderInfo (or ExplainResponse) the caller frees.
 */
#include "client_internal.h"
#include "loader_internal.h"
#include "stoker_admin.h"

int stk_loader_create(struct stk_client *c, const Stoker__V1__LoaderSpec *spec, int64_t timeout_ms,
                      Stoker__V1__LoaderInfo **ret_info) {
  if (!spec || !spec->job) return client_fail(STK_EINVAL, "create loader");
  Stoker__V1__CreateLoaderRequest req = STOKER__V1__CREATE_LOADER_REQUEST__INIT;
  req.spec = (Stoker__V1__LoaderSpec *)spec;
  return DL_CALL(c, create_loader, &req, timeout_ms, ret_info);
}

int stk_loader_get(struct stk_client *c, const char *job, int64_t timeout_ms,
                   Stoker__V1__LoaderInfo **ret_info) {
  if (!job) return client_fail(STK_EINVAL, "get loader");
  Stoker__V1__GetLoaderRequest req = STOKER__V1__GET_LOADER_REQUEST__INIT;
  req.job = (char *)job;
  return DL_CALL(c, get_loader, &req, timeout_ms, ret_info);
}

int stk_loader_list(struct stk_client *c, int64_t timeout_ms,
                    Stoker__V1__ListLoadersResponse **ret_resp) {
  Stoker__V1__ListLoadersRequest req = STOKER__V1__LIST_LOADERS_REQUEST__INIT;
  return CLIENT_LIST_ALL(stoker__v1__dataloader, c, list_loaders, &req, timeout_ms, ret_resp);
}

int stk_loader_delete(struct stk_client *c, const char *job, int64_t timeout_ms) {
  if (!job) return client_fail(STK_EINVAL, "delete loader");
  Stoker__V1__DeleteLoaderRequest req = STOKER__V1__DELETE_LOADER_REQUEST__INIT;
  req.job = (char *)job;
  return DL_CALL(c, delete_loader, &req, timeout_ms, (Stoker__V1__Empty **)NULL);
}

int stk_loader_update_mixture(struct stk_client *c, const Stoker__V1__UpdateMixtureRequest *req,
                              int64_t timeout_ms, Stoker__V1__LoaderInfo **ret_info) {
  if (!req || !req->job) return client_fail(STK_EINVAL, "update mixture");
  return DL_CALL(c, update_mixture, req, timeout_ms, ret_info);
}

int stk_loader_explain(struct stk_client *c, const char *job, int64_t step, uint32_t rank,
                       uint32_t world, int64_t timeout_ms, Stoker__V1__ExplainResponse **ret_resp) {
  if (!job) return client_fail(STK_EINVAL, "explain");
  Stoker__V1__ExplainRequest req = STOKER__V1__EXPLAIN_REQUEST__INIT;
  req.job = (char *)job;
  req.step = step;
  req.rank = rank;
  req.world = world;
  return DL_CALL(c, explain, &req, timeout_ms, ret_resp);
}

/* One part's call answering a LoaderInfo (create, update mixture). */
typedef int (*part_info_fn)(struct stk_client *c, const void *req, int64_t timeout_ms,
                            Stoker__V1__LoaderInfo **ret_info);

/* Calls fn on every part in part order, stopping at the first failure (the
 * message names the part); ret_info (may be NULL) gets part 0's answer. */
static int on_every_part(struct stk_loader *l, part_info_fn fn, const void *req, int64_t timeout_ms,
                         Stoker__V1__LoaderInfo **ret_info) {
  Stoker__V1__LoaderInfo *info = NULL;
  for (uint32_t i = 0; i < l->n; i++) {
    int err = fn(l->parts[i], req, timeout_ms, i == 0 ? &info : NULL);
    if (err < 0) {
      if (info) protobuf_c_message_free_unpacked(&info->base, NULL);
      return loader_part_failed(l->n, i, err);
    }
  }
  if (ret_info)
    *ret_info = info;
  else if (info)
    protobuf_c_message_free_unpacked(&info->base, NULL);
  return 0;
}

static int create_part(struct stk_client *c, const void *spec, int64_t timeout_ms,
                       Stoker__V1__LoaderInfo **ret_info) {
  return stk_loader_create(c, spec, timeout_ms, ret_info);
}

static int update_part(struct stk_client *c, const void *req, int64_t timeout_ms,
                       Stoker__V1__LoaderInfo **ret_info) {
  return stk_loader_update_mixture(c, req, timeout_ms, ret_info);
}

int stk_loader_create_all(struct stk_loader *l, const Stoker__V1__LoaderSpec *spec,
                          int64_t timeout_ms, Stoker__V1__LoaderInfo **ret_info) {
  return on_every_part(l, create_part, spec, timeout_ms, ret_info);
}

int stk_loader_info_all(struct stk_loader *l, const char *job, int64_t timeout_ms,
                        Stoker__V1__LoaderInfo **ret_info) {
  Stoker__V1__LoaderInfo *first = NULL;
  for (uint32_t i = 0; i < l->n; i++) {
    Stoker__V1__LoaderInfo *info = NULL;
    int err = stk_loader_get(l->parts[i], job, timeout_ms, &info);
    if (err < 0) {
      if (first) protobuf_c_message_free_unpacked(&first->base, NULL);
      return loader_part_failed(l->n, i, err);
    }
    if (!first) {
      first = info;
      continue;
    }
    if (info->committed_step < first->committed_step) first->committed_step = info->committed_step;
    if (info->failed && !first->failed) { /* the part's reason moves over */
      first->failed = true;
      char *swap = first->failure;
      first->failure = info->failure;
      info->failure = swap;
    }
    protobuf_c_message_free_unpacked(&info->base, NULL);
  }
  *ret_info = first;
  return 0;
}

int stk_loader_delete_all(struct stk_loader *l, const char *job, int64_t timeout_ms) {
  for (uint32_t i = 0; i < l->n; i++) {
    int err = stk_loader_delete(l->parts[i], job, timeout_ms);
    if (err < 0) return loader_part_failed(l->n, i, err);
  }
  return 0;
}

int stk_loader_update_all(struct stk_loader *l, const Stoker__V1__UpdateMixtureRequest *req,
                          int64_t timeout_ms, Stoker__V1__LoaderInfo **ret_info) {
  return on_every_part(l, update_part, req, timeout_ms, ret_info);
}
