/*
 * fake_dl_stream: a stand-in dataloader whose StreamBatches answers with
 * messages a test scripts, so that the client's checks of hostile
 * shared-memory streams (issue 3) can be driven: the real daemon never
 * sends a ring batch out of sequence, a second ring or a batch larger than
 * its slot. It serves on 127.0.0.1 (port 0) through the real rpc layer,
 * handlers on a loop thread of the test process, and creates real rings
 * (shm_ring.h) in a private temporary directory with the nonce the client
 * sent. Every call's request is logged, so that a test sees the client
 * reopen its stream without shared memory.
 */
#ifndef STK_FAKE_DL_STREAM_H
#define STK_FAKE_DL_STREAM_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "fake_server.h"
#include "rpc.h"
#include "shm_ring.h"
#include "stoker/v1/dataloader.pb-c.h"

#define FAKE_DL_MAX_CALLS 8
#define FAKE_DL_MAX_MSGS  16
#define FAKE_DL_MAX_RINGS 8

struct fake_dl_stream;

/* Runs on the loop thread for StreamBatches call number `call` (0, 1, ...):
 * fills msgs (heap messages built with the helpers below, sent in order
 * and freed by the fake) and returns how many; the stream then ends OK. */
typedef int (*fake_dl_script_fn)(struct fake_dl_stream *f, int call,
                                 const Stoker__V1__StreamBatchesRequest *req,
                                 Stoker__V1__Batch *msgs[FAKE_DL_MAX_MSGS]);

struct fake_dl_call {
  int64_t from_step;
  size_t nonce_bytes; /* 0: the client asked for bytes over gRPC. */
};

struct fake_dl_stream {
  struct fake_server server; /* server.addr: where it listens. */
  char dir[64];              /* Private ring directory (0700). */
  int dirfd;
  fake_dl_script_fn script;

  pthread_mutex_t mu; /* Guards what follows. */
  int calls;          /* StreamBatches calls seen. */
  struct fake_dl_call log[FAKE_DL_MAX_CALLS];
  struct shm_ring *rings[FAKE_DL_MAX_RINGS]; /* Created by scripts; unmapped at stop. */
  int n_rings;
};

/* Starts server and loop thread; asserts on failure. */
void fake_dl_start(struct fake_dl_stream *f, fake_dl_script_fn script);
/* Shuts down, joins the thread, unmaps the rings, removes the directory. */
void fake_dl_stop(struct fake_dl_stream *f);
/* How many StreamBatches calls arrived, and what call i asked for. */
int fake_dl_calls(struct fake_dl_stream *f);
struct fake_dl_call fake_dl_call_at(struct fake_dl_stream *f, int i);
/* Ring number i (in creation order). */
struct shm_ring *fake_dl_ring_at(struct fake_dl_stream *f, int i);

/* Token i of every batch of step `step`, inline or in a slot. */
uint32_t fake_dl_token(int64_t step, uint64_t i);

/* For scripts (loop thread). A batch with its tokens inline. */
Stoker__V1__Batch *fake_dl_inline(int64_t step, uint32_t lines, uint32_t line_tokens);
/* A ring of slots x slot_bytes made with nonce (the request's, or a wrong
 * one); asserts on failure. */
struct shm_ring *fake_dl_ring(struct fake_dl_stream *f, const uint8_t *nonce, uint32_t slots,
                              uint64_t slot_bytes);
/* A batch in slot seq of r (as much of its tokens as fits written there),
 * naming r when with_path. */
Stoker__V1__Batch *fake_dl_ring_batch(struct shm_ring *r, bool with_path, int64_t step,
                                      uint64_t seq, uint32_t lines, uint32_t line_tokens);
/* Appends extra to m->more (m takes it). */
void fake_dl_more(Stoker__V1__Batch *m, Stoker__V1__Batch *extra);

#endif
