/*
 * fault_proxy: a TCP proxy in front of the S3 server that misbehaves on
 * purpose. Each new connection consumes one fault while any remain: it
 * reads the request (headers and Content-Length body) and either answers
 * 503 SlowDown and closes, or resets the connection (RST, no answer).
 * Connections past the faults are relayed to the upstream unchanged.
 */
#ifndef STK_TEST_FAULT_PROXY_H
#define STK_TEST_FAULT_PROXY_H

#include <stdatomic.h>
#include <stdbool.h>

enum fault_kind { FAULT_SLOWDOWN, FAULT_RESET };

struct fault_proxy;

/* Listens on 127.0.0.1, an ephemeral port. NULL on failure. */
struct fault_proxy *fault_proxy_start(int upstream_port);
void fault_proxy_set(struct fault_proxy *p, enum fault_kind kind, int count);
int fault_proxy_port(const struct fault_proxy *p);
/* Faults injected so far. */
int fault_proxy_injected(const struct fault_proxy *p);
void fault_proxy_stop(struct fault_proxy *p);

#endif
