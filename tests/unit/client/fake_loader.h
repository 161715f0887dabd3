/*
 * fake_loader: a stand-in for stoker-dataloader in the client tests: the
 * real dataloader core (dl_core.h, RocksDB in a temporary directory) behind
 * the real rpc layer on 127.0.0.1 (port 0), handlers run synchronously on a
 * loop thread of the test process. It lets libstoker-client's loader calls
 * and stokerctl's loader commands be tested without the daemon; a stream
 * counts what it sent so tests can see flow control at work.
 */
#ifndef STK_FAKE_LOADER_H
#define STK_FAKE_LOADER_H

#include <pthread.h>
#include <uv.h>

#include "dl_core.h"
#include "fake_server.h"
#include "rpc.h"

struct fake_loader {
  struct fake_server server; /* server.addr: where it listens. */
  struct dl *dl;
  char dir[64];

  pthread_mutex_t mu;
  int stream_sends;  /* Batches handed to the transport by StreamBatches. */
  int stream_limit;  /* > 0: end streams OK after this many batches. */
  int streams_ended; /* Streams finished (any status). */
  int get_batches;   /* GetBatch calls answered (any status). */
  int get_cancels;   /* > 0: answer this many GetBatch calls CANCELLED, as a
                      * server cancels its calls in flight when it shuts down. */
};

/* Starts core, server and loop thread; asserts on failure. */
void fake_loader_start(struct fake_loader *f);
/* Shuts down, joins the thread, closes the core, removes the directory. */
void fake_loader_stop(struct fake_loader *f);
/* Closes and reopens the core on the same store, as a daemon restart does
 * (no call may be in flight: the tests' calls are synchronous). */
void fake_loader_reopen(struct fake_loader *f);
int fake_loader_get(struct fake_loader *f, const int *field);
void fake_loader_set(struct fake_loader *f, int *field, int value);

#endif
