/*
 * fake_ckpt: a stand-in for stoker-checkpoint in the client tests: the real
 * checkpoint core (ckpt_service.h, RocksDB journal and a file:// store in a
 * temporary directory) behind the real rpc layer on 127.0.0.1 (port 0),
 * driven by a loop thread of the test process. Write honours the core's
 * back-pressure (no read while the core says wait), Read sends one piece at
 * a time, so libstoker-client's checkpoint calls and stokerctl's checkpoint
 * commands are tested end to end without the daemon.
 */
#ifndef STK_FAKE_CKPT_H
#define STK_FAKE_CKPT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "ckpt_service.h"
#include "fake_server.h"
#include "rpc.h"

struct fake_ckpt_opts {
  uint64_t staging_budget_bytes; /* 0: the core's default. */
  uint32_t read_piece_bytes;     /* 0: the core's default. */
  bool no_verify;                /* Do not serve Verify (as an older daemon). */
  /* A hostile service: each message with packed_data goes out with its
   * first piece's run starting at the end of the message's bytes. */
  bool damage_packed_data;
};

struct fake_ckpt {
  struct fake_server server; /* server.addr: where it listens. */
  struct ckpt_service *svc;
  char dir[64];                               /* Everything lives under here. */
  char store_dir[128];                        /* The file:// store's root. */
  void (*server_done)(struct fake_server *s); /* Called once the core has closed. */
  uv_async_t stats_req;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool stats_ready;
  struct ckpt_service_stats stats;
  bool damage_packed_data; /* fake_ckpt_opts'. */
};

/* Starts core, server and loop thread; asserts on failure. */
void fake_ckpt_start(struct fake_ckpt *f, const struct fake_ckpt_opts *opts);
/* Shuts down, joins the thread, removes the directory. */
void fake_ckpt_stop(struct fake_ckpt *f);
/* The core's stats, read on the loop thread. Any other thread. */
void fake_ckpt_stats(struct fake_ckpt *f, struct ckpt_service_stats *ret_stats);

#endif
