/*
 * ckpt_rpc_internal: what the unary handlers (ckpt_rpc.c), Write
 * (ckpt_rpc_write.c) and Read (ckpt_rpc_read.c) share: the adapter and its
 * metrics.
 */
#ifndef STK_CKPT_RPC_INTERNAL_H
#define STK_CKPT_RPC_INTERNAL_H

#include <stdbool.h>

#include "ckpt_rpc.h"

struct ckpt_rpc_unary;
struct ckpt_rpc_writer;

struct ckpt_rpc {
  struct ckpt_service *svc;
  struct metric_counter *bytes_staged;   /* Chunk bytes the core consumed. */
  struct metric_counter *bytes_uploaded; /* Bytes of ranks that became durable. */
  struct metric_histogram *commit_seconds;
  struct ckpt_rpc_unary *unary;    /* Unary calls waiting for the core (list). */
  struct ckpt_rpc_writer *writers; /* Write streams and lingering writers (list). */
  bool draining;
  bool leaving; /* A replica draining: Begin refused, its attempts served. */
  char *owner;  /* ckpt_rpc_set_owner; NULL: one replica. */
};

/* The stream calls, started by their handlers in ckpt_rpc.c. */
void ckpt_rpc_write(struct rpc_call *call, struct ckpt_rpc *a);
void ckpt_rpc_read(struct rpc_call *call, struct ckpt_rpc *a, const Stoker__V1__ReadRequest *req);
void ckpt_rpc_writers_detach(struct ckpt_rpc *a);

#endif
