/*
 * h2_grpc: unary gRPC calls over plaintext HTTP/2 with nghttp2, for the
 * coordinator bench's simulated ranks. gRPC's own C client costs more CPU
 * per call than the coordinator spends answering it (~140 us), so on this
 * 2-core VM it, not the coordinator, would be measured; this client frames
 * requests itself and coalesces writes, at a few microseconds a call.
 *
 * One connection per h2_grpc, served by a thread of its own: calls may be
 * started from any thread, done callbacks run on the connection's thread
 * (and may start calls). No TLS, no tokens, no deadlines: a bench on
 * loopback only.
 */
#ifndef STK_BENCH_H2_GRPC_H
#define STK_BENCH_H2_GRPC_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

struct h2_grpc;

/* status: the grpc-status (0 OK), or -1 when the stream or connection
 * broke without one. msg/len: the reply message (without gRPC's 5-byte
 * prefix), valid during the call; NULL when none came. */
typedef void (*h2_grpc_done_fn)(void *arg, int status, const uint8_t *msg, size_t len);

/* Connects to "HOST:PORT" (numeric IPv4) and starts the connection's
 * thread. 0, or -1 with a message on stderr. */
int h2_grpc_connect(const char *host_port, struct h2_grpc **ret_conn);

/* Sends req to path ("/pkg.Svc/Method", a string that outlives the call).
 * done runs exactly once, on the connection's thread. Any thread. */
int h2_grpc_call(struct h2_grpc *c, const char *path, const ProtobufCMessage *req,
                 h2_grpc_done_fn done, void *arg);

/* Once no call is open: stops the thread, closes the connection. */
void h2_grpc_close(struct h2_grpc *c);

#endif
