/*
 * net_listen: the cause of a failed listen, told in words (see
 * net_listen.h). The probe resolves HOST the way a listener would
 * (AI_PASSIVE, numeric or by name; an empty HOST is every address) and
 * tries the first address it gets, which is the one gRPC and libuv bind.
 */
#include "net_listen.h"

#include <errno.h>
#include <netdb.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Splits "HOST:PORT" or "[V6]:PORT" into host (brackets removed) and port
 * text. False when there is no colon or a part does not fit. */
static bool split(const char *listen, char *host, size_t host_len, char *port, size_t port_len) {
  const char *colon = listen ? strrchr(listen, ':') : NULL;
  if (!colon || !colon[1]) return false;
  const char *h = listen;
  size_t n = (size_t)(colon - listen);
  if (n >= 2 && h[0] == '[' && h[n - 1] == ']') h++, n -= 2;
  if (n >= host_len || strlen(colon + 1) >= port_len) return false;
  memcpy(host, h, n);
  host[n] = '\0';
  snprintf(port, port_len, "%s", colon + 1);
  return true;
}

void net_listen_describe(const char *listen, int errnum, char *out, size_t out_len) {
  char host[256], port[32];
  if (!split(listen, host, sizeof(host), port, sizeof(port))) {
    snprintf(out, out_len, "'%s' is not HOST:PORT", listen ? listen : "");
    return;
  }
  switch (errnum) {
  case EADDRINUSE: {
    char name[32] = "";
    int pid = net_listen_owner(atoi(port), name, sizeof(name));
    if (pid > 0)
      snprintf(out, out_len, "port %s is in use by process %d (%s)", port, pid, name);
    else
      snprintf(out, out_len, "port %s is in use", port);
    break;
  }
  case EADDRNOTAVAIL:
    snprintf(out, out_len, "%s is not an address of this machine", host);
    break;
  case EACCES:
    snprintf(out, out_len, "port %s needs privileges (below 1024) or is forbidden", port);
    break;
  default:
    snprintf(out, out_len, "%s", strerror(errnum));
  }
}

int net_listen_probe(const char *listen, char *out, size_t out_len) {
  char host[256], port[32];
  if (!split(listen, host, sizeof(host), port, sizeof(port))) {
    net_listen_describe(listen, EINVAL, out, out_len);
    return EINVAL;
  }
  struct addrinfo hints = {
      .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
  struct addrinfo *ai = NULL;
  int gai = getaddrinfo(host[0] ? host : NULL, port, &hints, &ai);
  if (gai != 0) {
    snprintf(out, out_len, "cannot resolve %s: %s", listen, gai_strerror(gai));
    return EINVAL;
  }
  int err = 0;
  int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0) {
    err = errno;
  } else {
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) err = errno;
    close(fd);
  }
  freeaddrinfo(ai);
  if (err)
    net_listen_describe(listen, err, out, out_len);
  else
    snprintf(out, out_len, "the address can be bound now (taken only for a moment?)");
  return err;
}
