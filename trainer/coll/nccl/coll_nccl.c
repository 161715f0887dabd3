/*
 * coll_nccl.c: see coll_nccl.h. ncclResult_t and cudaError_t are translated
 * to STK_E* here and nowhere else. One thread drives the group; abort from
 * another thread only raises a flag, and the driving thread (or free) calls
 * ncclCommAbort, so the communicator is never destroyed under a caller.
 */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll_nccl.h"
#include "stk_error.h"

_Static_assert(COLL_NCCL_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "NCCL unique id size");

struct nccl_group {
  struct coll_group base;
  ncclComm_t comm;
  cudaStream_t stream;
  int own_stream;
  int device;
  atomic_int aborted;
  int broken; /* Error that broke the group (communicator aborted), or 0. */
};

static const struct coll_ops nccl_ops;

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void pause_briefly(void) {
  struct timespec ts = {.tv_nsec = 100000};
  nanosleep(&ts, NULL);
}

static int from_nccl(ncclResult_t r, const char *what) {
  if (r == ncclSuccess) return 0;
  stk_set_detail("nccl: %s: %s", what, ncclGetErrorString(r));
  switch (r) {
  case ncclInvalidArgument:
  case ncclInvalidUsage:
    return STK_EINVAL;
  case ncclSystemError:
  case ncclRemoteError:
    return STK_EIO;
  default:
    return STK_EINTERNAL;
  }
}

static int from_cuda(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return 0;
  stk_set_detail("cuda: %s: %s", what, cudaGetErrorString(e));
  return e == cudaErrorInvalidValue || e == cudaErrorInvalidDevice ? STK_EINVAL : STK_EINTERNAL;
}

int coll_nccl_unique_id(uint8_t ret_id[COLL_NCCL_ID_BYTES]) {
  ncclUniqueId id;
  int rc = from_nccl(ncclGetUniqueId(&id), "get unique id");
  if (rc == 0) memcpy(ret_id, id.internal, COLL_NCCL_ID_BYTES);
  return rc;
}

/* Fails the group for good: aborts the communicator (idempotent). */
static int fail(struct nccl_group *g, int rc) {
  if (!g->broken) {
    g->broken = rc;
    if (g->comm) ncclCommAbort(g->comm);
    g->comm = NULL;
  }
  return rc;
}

/* Checks the communicator's async state, the abort flag and the deadline;
 * 1 while still in progress, 0 when done, or a negative error. */
static int poll_comm(struct nccl_group *g, int64_t deadline_ms) {
  ncclResult_t st;
  ncclResult_t r = ncclCommGetAsyncError(g->comm, &st);
  if (r != ncclSuccess) return fail(g, from_nccl(r, "get async error"));
  if (st != ncclSuccess && st != ncclInProgress) return fail(g, from_nccl(st, "communicator"));
  if (atomic_load(&g->aborted)) {
    stk_set_detail("nccl: group aborted");
    return fail(g, STK_ECANCELED);
  }
  if (now_ms() >= deadline_ms) {
    stk_set_detail("nccl: deadline exceeded");
    return fail(g, STK_ETIMEDOUT);
  }
  return st == ncclInProgress;
}

/* Waits for the communicator to leave ncclInProgress (init, enqueue). */
static int wait_comm(struct nccl_group *g, int64_t deadline_ms) {
  int rc;
  while ((rc = poll_comm(g, deadline_ms)) == 1) pause_briefly();
  return rc;
}

/* Waits for the stream, watching the communicator for remote failures. */
static int wait_stream(struct nccl_group *g, int64_t deadline_ms) {
  for (;;) {
    cudaError_t e = cudaStreamQuery(g->stream);
    if (e == cudaSuccess) return 0;
    if (e != cudaErrorNotReady) return fail(g, from_cuda(e, "stream"));
    int rc = poll_comm(g, deadline_ms);
    if (rc < 0) return rc;
    pause_briefly();
  }
}

static int begin(struct nccl_group *g, enum coll_dtype dt, ncclDataType_t *ret_type) {
  if (g->broken) {
    stk_set_detail("nccl: group broken by an earlier failure (%s)", stk_strerror(g->broken));
    return g->broken == STK_ECANCELED ? STK_ECANCELED : STK_ESTATE;
  }
  if (atomic_load(&g->aborted)) return fail(g, STK_ECANCELED);
  if (dt != COLL_F32 && dt != COLL_BF16) return STK_EINVAL;
  *ret_type = dt == COLL_F32 ? ncclFloat32 : ncclBfloat16;
  return from_cuda(cudaSetDevice(g->device), "set device");
}

/* Completes a call whose enqueue returned r: enqueue, then the stream. */
static int complete(struct nccl_group *g, ncclResult_t r, const char *what) {
  int64_t deadline = now_ms() + g->base.timeout_ms;
  if (r != ncclSuccess && r != ncclInProgress) return fail(g, from_nccl(r, what));
  int rc = wait_comm(g, deadline);
  return rc ? rc : wait_stream(g, deadline);
}

static int nccl_all_gather(struct coll_group *cg, const void *send, void *recv, size_t count,
                           enum coll_dtype dt) {
  struct nccl_group *g = (struct nccl_group *)cg;
  ncclDataType_t t;
  int rc = begin(g, dt, &t);
  if (rc) return rc;
  return complete(g, ncclAllGather(send, recv, count, t, g->comm, g->stream), "all-gather");
}

static int nccl_reduce_scatter(struct coll_group *cg, const void *send, void *recv, size_t count,
                               enum coll_dtype dt) {
  struct nccl_group *g = (struct nccl_group *)cg;
  ncclDataType_t t;
  int rc = begin(g, dt, &t);
  if (rc) return rc;
  return complete(g, ncclReduceScatter(send, recv, count, t, ncclSum, g->comm, g->stream),
                  "reduce-scatter");
}

static int nccl_all_reduce(struct coll_group *cg, void *buf, size_t count, enum coll_dtype dt) {
  struct nccl_group *g = (struct nccl_group *)cg;
  ncclDataType_t t;
  int rc = begin(g, dt, &t);
  if (rc) return rc;
  return complete(g, ncclAllReduce(buf, buf, count, t, ncclSum, g->comm, g->stream), "all-reduce");
}

/* Any thread: raises the flag; the driving thread aborts the communicator
 * within a poll interval, free() does it when nobody is driving. */
static void nccl_abort(struct coll_group *cg) {
  atomic_store(&((struct nccl_group *)cg)->aborted, 1);
}

static void nccl_free(struct coll_group *cg) {
  struct nccl_group *g = (struct nccl_group *)cg;
  if (!g) return;
  cudaSetDevice(g->device);
  if (g->comm && !atomic_load(&g->aborted)) {
    ncclResult_t r = ncclCommFinalize(g->comm);
    if (r == ncclSuccess || r == ncclInProgress)
      wait_comm(g, now_ms() + g->base.timeout_ms); /* On failure it aborts. */
    else
      fail(g, STK_EIO);
    if (g->comm) ncclCommDestroy(g->comm);
  } else if (g->comm) {
    ncclCommAbort(g->comm);
  }
  if (g->own_stream && g->stream) cudaStreamDestroy(g->stream);
  free(g);
}

static const struct coll_ops nccl_ops = {
    .name = "nccl",
    .all_gather = nccl_all_gather,
    .reduce_scatter = nccl_reduce_scatter,
    .all_reduce = nccl_all_reduce,
    .abort = nccl_abort,
    .free = nccl_free,
};

static int init_comm(struct nccl_group *g, const uint8_t id[COLL_NCCL_ID_BYTES]) {
  ncclUniqueId uid;
  memcpy(uid.internal, id, COLL_NCCL_ID_BYTES);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&g->comm, g->base.size, uid, g->base.rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    int rc = from_nccl(r, "init rank");
    if (g->comm) ncclCommAbort(g->comm);
    g->comm = NULL;
    return rc;
  }
  return wait_comm(g, now_ms() + g->base.timeout_ms);
}

int coll_nccl_group_new(int rank, int size, const uint8_t id[COLL_NCCL_ID_BYTES], int device,
                        void *stream, int64_t timeout_ms, struct coll_group **ret_group) {
  if (size < 1 || rank < 0 || rank >= size || timeout_ms <= 0 || !id) return STK_EINVAL;
  struct nccl_group *g = calloc(1, sizeof *g);
  if (!g) return STK_ENOMEM;
  g->base =
      (struct coll_group){.ops = &nccl_ops, .rank = rank, .size = size, .timeout_ms = timeout_ms};
  g->device = device;
  g->stream = stream;
  int rc = from_cuda(cudaSetDevice(device), "set device");
  if (rc == 0 && !stream) {
    rc = from_cuda(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking), "stream");
    g->own_stream = rc == 0;
  }
  if (rc == 0) rc = init_comm(g, id);
  if (rc) {
    g->broken = rc;
    atomic_store(&g->aborted, 1); /* free() aborts instead of finalizing. */
    nccl_free(&g->base);
    return rc;
  }
  *ret_group = &g->base;
  return 0;
}
