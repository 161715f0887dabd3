/*
 * coord_rpc: the coordinator's gRPC adapter. Maps every method of
 * stoker.v1.Coordinator onto one coord_* call (coord.h) and the call's
 * completion onto rpc_reply / rpc_fail; parked calls are cancelled in the
 * core when their caller goes away, and answered UNAVAILABLE when the
 * daemon drains for shutdown.
 */
#ifndef STK_COORD_RPC_H
#define STK_COORD_RPC_H

#include "coord.h"
#include "rpc.h"

struct coord_rpc;

/* Registers stoker.v1.Coordinator on s, served by c. The adapter lives
 * until coord_rpc_free (after the server has shut down). */
int coord_rpc_register(struct rpc_server *s, struct coord *c, struct coord_rpc **ret_adapter);

/* Answers every parked call and open watch UNAVAILABLE ("shutting down;
 * retry") now; later calls are served as usual until the server stops. */
void coord_rpc_drain(struct coord_rpc *a);

/* Parked calls and open watches now (*ret_now) and the most open at once
 * since the previous call (*ret_peak), whose span starts anew here. */
void coord_rpc_parked_span(struct coord_rpc *a, uint64_t *ret_now, uint64_t *ret_peak);

void coord_rpc_free(struct coord_rpc *a);

#endif
