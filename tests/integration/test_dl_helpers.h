/*
 * test_dl_helpers: what the dataloader integration tests share on top of
 * harness.h: the daemon and an rpc client for a setup, loader specs over
 * synthetic, Megatron and llm.c datasets, Dataloader calls through the rpc client, global batches
 * gathered from every rank, the same batches from the core in-process (embedded mode) for
 * comparison, and a metrics scrape.
 */
#ifndef STK_TEST_DL_HELPERS_H
#define STK_TEST_DL_HELPERS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dl_core.h"
#include "harness.h"
#include "stoker/v1/dataloader.pb-c.h"

/* The daemon under test (harness_daemon_start with args, NULL-terminated,
 * may be NULL; with ret_metrics_port, harness_daemon_start_metrics) and an
 * rpc client on it, for a test's setup: 0, or -1 when either fails. */
int tdl_daemon_open(struct harness_daemon **ret_d, struct rpc_client **ret_rc,
                    const char *const *args, int *ret_metrics_port);
/* Frees the client and the daemon (either may be NULL), for a teardown. */
void tdl_daemon_close(struct harness_daemon *d, struct rpc_client *rc);

/* A one-dataset LoaderSpec in caller storage. */
struct tdl_spec {
  Stoker__V1__LoaderSpec spec;
  Stoker__V1__DatasetSpec ds;
  Stoker__V1__DatasetSpec *dsp[1];
  Stoker__V1__StorageRef ref;
  char uri[512];
};

/* seq_len, global_batch, 64 shards, 4 lanes, seed 7; uri "synthetic:..." or
 * "file:///..." with the given format (0 for synthetic). */
void tdl_spec_init(struct tdl_spec *t, const char *job, const char *uri, int format,
                   uint32_t seq_len, uint32_t global_batch);

/* A Dataloader method ("GetBatch") with a 10 s deadline; returns the gRPC
 * status code as harness_call does. */
int tdl_call(struct rpc_client *rc, const char *method, const ProtobufCMessage *req,
             const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **ret_resp,
             char *ret_msg, size_t msg_len);

int tdl_create(struct rpc_client *rc, const Stoker__V1__LoaderSpec *spec, char *ret_msg,
               size_t msg_len);
/* GetBatch; *ret_batch (free with tdl_batch_free) on RPC_OK. */
int tdl_get_batch(struct rpc_client *rc, const char *job, int64_t step, uint32_t rank,
                  uint32_t world, Stoker__V1__Batch **ret_batch);
void tdl_batch_free(Stoker__V1__Batch *b);
int tdl_commit(struct rpc_client *rc, const char *job, int64_t step);
/* GetLoader's committed_step (INT64_MIN when the call fails). */
int64_t tdl_committed_step(struct rpc_client *rc, const char *job);

/* The global batch of a step gathered from `world` ranks through gRPC: the
 * ranks' token bytes concatenated (malloc'd); NULL if a call fails. */
uint8_t *tdl_global(struct rpc_client *rc, const char *job, int64_t step, uint32_t world,
                    size_t *ret_len);

/* The core in-process on a fresh temporary store, with the same spec. */
struct tdl_embedded {
  struct dl *dl;
  char dir[256];
};
int tdl_embedded_open(struct tdl_embedded *e, const Stoker__V1__LoaderSpec *spec);
void tdl_embedded_close(struct tdl_embedded *e);
/* A slice as little-endian bytes, as the daemon sends it (malloc'd). */
uint8_t *tdl_embedded_slice(struct tdl_embedded *e, const char *job, int64_t step, uint32_t rank,
                            uint32_t world, size_t *ret_len);

/* StreamBatches run to its end (or until max_msgs arrived: then cancelled).
 * Messages are kept in ret_msgs (free with tdl_stream_free). */
struct tdl_stream {
  Stoker__V1__Batch **msgs;
  size_t n;
  struct rpc_status st;
};
int tdl_stream_run(struct rpc_client *rc, const Stoker__V1__StreamBatchesRequest *req,
                   size_t max_msgs, struct tdl_stream *ret);
void tdl_stream_free(struct tdl_stream *s);
/* StreamBatches of job's rank at world from from_step, count batches with
 * prefetch, run to its end: asserted (cmocka) to run, end OK and carry
 * count messages. */
void tdl_stream_count(struct rpc_client *rc, const char *job, int64_t from_step, uint32_t rank,
                      uint32_t world, uint32_t prefetch, uint32_t count, struct tdl_stream *ret);

/* StreamBatches calls whose client stops reading until the gate opens:
 * every message callback counts the message, then waits while the gate is
 * closed, so the daemon's sends stall (flow control) and its queue fills. */
struct tdl_gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool open;
  size_t got; /* Messages that arrived, over every call. */
  int done;   /* Calls that ended. */
  int code;   /* The status code of the last call that ended. */
};
void tdl_gate_init(struct tdl_gate *g, bool open);
void tdl_gate_destroy(struct tdl_gate *g);
/* Starts StreamBatches behind the gate (60 s deadline; asserted to start). */
struct rpc_client_call *tdl_gate_stream(struct rpc_client *rc, struct tdl_gate *g,
                                        const Stoker__V1__StreamBatchesRequest *req);
/* Opens the gate: every waiting callback goes on. */
void tdl_gate_release(struct tdl_gate *g);
/* Waits until at least got messages arrived / done calls ended. */
void tdl_gate_wait_got(struct tdl_gate *g, size_t got);
void tdl_gate_wait_done(struct tdl_gate *g, int done);

/* Asserts a reply equals the bytes expected. */
void tdl_assert_batch(const Stoker__V1__Batch *b, const uint8_t *want, size_t want_len);

/* The value of a metric series in the daemon's /metrics on that port (-1
 * when absent). */
double tdl_metric(int port, const char *series);

#endif
