/*
 * ring: the CPU backend of coll.h. n ranks form a ring over TCP: rank r
 * connects to rank (r+1) mod n and accepts from rank (r-1) mod n. Every
 * collective runs as n-1 ring steps (all-reduce = reduce-scatter followed by
 * all-gather), each step's block cut into segments and pipelined: one thread
 * sends to the next rank while it receives and reduces from the previous one
 * (non-blocking sockets and poll()), and a step's send starts as soon as the
 * first segment it forwards has arrived.
 *
 * Rendezvous: each rank opens a listener (ring_listen, on an ephemeral port),
 * publishes its "HOST:PORT" (the trainer uses the coordinator's KV), gathers
 * everybody's and calls ring_group_new. Failure modes of a collective:
 * STK_ETIMEDOUT when the group's timeout passes, STK_EIO when a peer closes its
 * connection, STK_ECANCELED after coll_abort(), STK_EINVAL when ranks disagree
 * on the collective (op, dtype or count). After any failure the group's
 * sockets are shut down (so neighbours fail fast with STK_EIO) and later calls
 * answer STK_ESTATE: free it and build a new one.
 */
#ifndef STK_RING_H
#define STK_RING_H

#include <stdint.h>

#include "coll.h"

/* Longest "HOST:PORT" ring_listen writes, with its terminating NUL. */
#define RING_ADDR_MAX 80

/*
 * Opens a TCP listener on host (a numeric IPv4/IPv6 address or a name; NULL or
 * "" means 127.0.0.1) with an ephemeral port. *ret_listener is the socket (the
 * caller hands it to ring_group_new, or closes it); ret_addr[RING_ADDR_MAX]
 * receives "HOST:PORT" ("[v6]:PORT" for IPv6) to publish to the other ranks.
 */
int ring_listen(const char *host, int *ret_listener, char *ret_addr);

/*
 * Joins the ring: connects to addrs[(rank+1) % size] and accepts the
 * connection of rank (rank-1) % size on listener (which this call takes: it is
 * closed on return, success or not; -1 opens one on addrs[rank] instead).
 * addrs holds size "HOST:PORT" strings. Connecting is retried until timeout_ms,
 * so the ranks may call this in any order. timeout_ms is also every
 * collective's deadline (coll_group.timeout_ms). size 1 needs no sockets.
 */
int ring_group_new(int rank, int size, const char *const *addrs, int64_t timeout_ms, int listener,
                   struct coll_group **ret_group);

/* Segment size of the pipeline in bytes (default 512 KiB); for tests and
 * benchmarks. Rounded to a multiple of 4; at least 4. */
void ring_set_segment_bytes(struct coll_group *g, size_t segment_bytes);

#endif
