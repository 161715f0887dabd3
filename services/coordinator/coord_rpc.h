/*
 * coord_rpc: the coordinator's gRPC adapter. Maps every method of
 * stoker.v1.Coordinator onto one coord_* call (coord.h) and the call's
 * completion onto rpc_reply / rpc_fail; parked calls are cancelled in the
 * core when their caller goes away.
 */
#ifndef STK_COORD_RPC_H
#define STK_COORD_RPC_H

#include "coord.h"
#include "rpc.h"

/* Registers stoker.v1.Coordinator on s, served by c. */
int coord_rpc_register(struct rpc_server *s, struct coord *c);

#endif
