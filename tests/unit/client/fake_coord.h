/*
 * fake_coord: a scripted stand-in for the coordinator, served by the real
 * rpc layer on 127.0.0.1 (port 0) with its loop on a thread of the test
 * process, so libstoker-client's retries, heartbeat thread, parked calls
 * and streams can be tested without the coordinator daemon. Fields are
 * shared with the loop thread: touch them only under mu.
 */
#ifndef STK_FAKE_COORD_H
#define STK_FAKE_COORD_H

#include <pthread.h>
#include <stdint.h>
#include <uv.h>

#include "fake_server.h"
#include "rpc.h"
#include "stoker/v1/coordinator.pb-c.h"

#define FAKE_GENERATION  5
#define FAKE_INTERVAL_MS 50
#define FAKE_MAX_PARKED  8

struct fake_coord {
  struct fake_server server; /* server.addr: where it listens. */

  pthread_mutex_t mu;
  int join_unavailable; /* Answer Join UNAVAILABLE this many more times. */
  int joins;            /* Join calls seen (failed ones too). */
  int heartbeats;
  uint64_t hb_step;
  double hb_loss;
  int next_action;               /* HeartbeatAction for every following heartbeat. */
  int next_pausing;              /* Their HeartbeatResponse.pausing. */
  int hb_terminating;            /* Heartbeats seen with terminating. */
  int64_t leave_checkpoint_step; /* Of the last Leave. */
  int leaves;
  int leaves_finished; /* Of those, with finished. */
  int64_t ckpt_step;
  char ckpt_uri[128];
  char kv_key[64];
  uint8_t kv_value[64];
  size_t kv_len;                            /* kv_key set when kv_key[0]. */
  struct rpc_call *parked[FAKE_MAX_PARKED]; /* KvGet waiting for kv_key. */
};

/* Starts the server and its loop thread; asserts on failure. */
void fake_start(struct fake_coord *f);
/* The same, demanding the bearer token in token_file. */
void fake_start_auth(struct fake_coord *f, const char *token_file);
/* Shuts down (parked calls are cancelled) and joins the loop thread. */
void fake_stop(struct fake_coord *f);

/* Reads an int field under mu. */
int fake_get(struct fake_coord *f, const int *field);
void fake_set(struct fake_coord *f, int *field, int value);
/* Polls until *field >= want or ms pass; returns the last value. */
int fake_wait(struct fake_coord *f, const int *field, int want, int ms);

#endif
