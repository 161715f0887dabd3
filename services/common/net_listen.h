/*
 * net_listen: why a daemon could not listen on HOST:PORT, in words an
 * operator acts on ("port 7070 is in use") rather than a library's
 * "cannot listen". gRPC core reports a failed bind without its errno, so
 * net_listen_probe binds a plain socket of its own to the same address
 * (with SO_REUSEADDR, as gRPC and libuv do, so that connections lingering
 * in TIME_WAIT do not count) and describes what that bind ran into.
 */
#ifndef STK_NET_LISTEN_H
#define STK_NET_LISTEN_H

#include <stddef.h>

/* One phrase for a failed bind or listen of listen ("HOST:PORT",
 * "[V6]:PORT") with the positive errno errnum: EADDRINUSE gives "port N is
 * in use" (and " by process PID (NAME)" when net_listen_owner finds it), EADDRNOTAVAIL "HOST is not
 * an address of this machine", EACCES "port N needs privileges (below 1024) or is forbidden",
 * others strerror's text. Writes to out (always terminated). */
void net_listen_describe(const char *listen, int errnum, char *out, size_t out_len);

/* Binds (without listening) a TCP socket to listen and closes it again.
 * Returns 0 when the bind works now, or the positive errno it failed with
 * (EINVAL for an address that does not parse or resolve), with the
 * description in out. */
int net_listen_probe(const char *listen, char *out, size_t out_len);

/* The process listening on TCP port (any address), by /proc (net_owner.c):
 * its pid, with its command name in ret_name (may be NULL), or 0 when
 * unknown (not Linux, another user's process, nobody listening). */
int net_listen_owner(int port, char *ret_name, size_t name_len);

#endif
