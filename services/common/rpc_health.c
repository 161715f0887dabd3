/*
 * rpc_health: the standard grpc.health.v1.Health service, which gRPC C core
 * does not provide. Every server registers it through the same method table
 * as any service (so it gets the same dispatch, metrics and shutdown), and
 * it is exempt from the bearer token so probes work without one. The server
 * (rpc_server.c, above this file) registers the rows rpc_health_rows gives;
 * this file calls only the call layer below it (rpc_call.c).
 *
 * Check(service) answers the status of a known service ("" is the whole
 * server) or NOT_FOUND. Watch(service) sends the current status, then each
 * change, one send at a time: a change made while a send is outstanding is
 * sent when it completes (only the latest status matters). Shutdown turns
 * everything NOT_SERVING and ends Watch streams once they have said so.
 * Everything runs on the loop thread.
 */
#include "rpc_internal.h"

#include "grpc/health/v1/health.pb-c.h"
#include "stk_error.h"

#include <stdlib.h>
#include <string.h>

typedef Grpc__Health__V1__HealthCheckResponse__ServingStatus health_status;

struct service_status {
  struct service_status *next;
  bool serving;
  char name[];
};

struct watcher {
  struct watcher *next;
  struct rpc_health *h;
  struct rpc_call *call;
  char *service;
  health_status last_sent; /* UNKNOWN (0) before the first send. */
  bool sending;
  bool closing; /* Finish once the latest status has been sent. */
};

struct rpc_health {
  struct rpc_server *s;
  struct service_status *services;
  struct watcher *watchers;
  bool shutting_down;
  unsigned unhealthy; /* enum rpc_unhealthy bits that hold. */
};

static struct service_status *find(struct rpc_health *h, const char *name) {
  for (struct service_status *st = h->services; st; st = st->next)
    if (strcmp(st->name, name) == 0) return st;
  return NULL;
}

static health_status status_of(struct rpc_health *h, const char *name) {
  struct service_status *st = find(h, name);
  if (!st) return GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
  return st->serving ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                     : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
}

/* ---------------------------------------------------------------- Check */

RPC_HANDLER(handle_check, struct rpc_health, Grpc__Health__V1__HealthCheckRequest) {
  health_status st = status_of(svc, req->service);
  if (st == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN) {
    rpc_fail(call, RPC_NOT_FOUND, "unknown service %s", req->service);
    return;
  }
  Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  resp.status = st;
  rpc_reply(call, &resp.base);
}

/* ---------------------------------------------------------------- Watch */

static void watcher_free(struct watcher *w) {
  struct watcher **pp = &w->h->watchers;
  while (*pp != w) pp = &(*pp)->next;
  *pp = w->next;
  free(w->service);
  free(w);
}

static void pump(struct watcher *w);

static void on_watch_sent(struct rpc_call *c, int err, void *arg) {
  struct watcher *w = arg;
  w->sending = false;
  if (!w->call) {    /* Cancelled while this send was out, and left to us: */
    watcher_free(w); /* the send may still have gone through (err 0). */
    return;
  }
  if (err) return; /* The call is gone; the cancel callback finishes it. */
  pump(w);
}

static void pump(struct watcher *w) {
  if (w->sending || !w->call) return;
  health_status now = status_of(w->h, w->service);
  if (now != w->last_sent) {
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    resp.status = now;
    if (rpc_send(w->call, &resp.base, on_watch_sent, w) == 0) {
      w->sending = true;
      w->last_sent = now;
      return;
    }
  }
  if (w->closing) {
    rpc_finish(w->call, RPC_OK, "server shutting down");
    watcher_free(w);
  }
}

static void on_watch_cancel(struct rpc_call *c, void *arg) {
  struct watcher *w = arg;
  rpc_finish(c, RPC_CANCELLED, "watch cancelled");
  w->call = NULL;
  if (!w->sending) watcher_free(w); /* Else on_watch_sent frees it. */
}

RPC_HANDLER(handle_watch, struct rpc_health, Grpc__Health__V1__HealthCheckRequest) {
  struct rpc_health *h = svc;
  struct watcher *w = calloc(1, sizeof(*w));
  if (!w || !(w->service = strdup(req->service))) {
    free(w);
    rpc_fail(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  w->h = h;
  w->call = call;
  w->closing = h->shutting_down;
  w->next = h->watchers;
  h->watchers = w;
  rpc_on_cancel(call, on_watch_cancel, w);
  pump(w);
}

/* ---------------------------------------------------------------- state */

#define HEALTH Grpc__Health__V1__Health_Service

static const struct rpc_method_def health_defs[] = {
    RPC_UNARY_ROW(HEALTH, check, handle_check),
    RPC_SERVER_STREAM_PARKED_ROW(HEALTH, watch, handle_watch),
};

const struct rpc_method_def *rpc_health_rows(size_t *ret_n) {
  *ret_n = RPC_N_ROWS(health_defs);
  return health_defs;
}

int rpc_health_new(struct rpc_server *s) {
  struct rpc_health *h = calloc(1, sizeof(*h));
  if (!h) return STK_ENOMEM;
  h->s = s;
  s->health = h;
  return rpc_health_add(h, ""); /* On error the caller frees s->health. */
}

void rpc_health_free(struct rpc_health *h) {
  if (!h) return;
  while (h->services) {
    struct service_status *next = h->services->next;
    free(h->services);
    h->services = next;
  }
  free(h);
}

int rpc_health_add(struct rpc_health *h, const char *service) {
  if (find(h, service)) return 0;
  size_t n = strlen(service) + 1;
  struct service_status *st = malloc(sizeof(*st) + n);
  if (!st) return STK_ENOMEM;
  memcpy(st->name, service, n);
  st->serving = true;
  st->next = h->services;
  h->services = st;
  return 0;
}

static void notify_watchers(struct rpc_health *h) {
  struct watcher *w = h->watchers;
  while (w) {
    struct watcher *next = w->next; /* pump may free w. */
    pump(w);
    w = next;
  }
}

void rpc_server_set_serving(struct rpc_server *s, const char *service, bool serving) {
  struct rpc_health *h = s->health;
  if (!service) service = "";
  if (h->shutting_down || rpc_health_add(h, service) != 0) return;
  find(h, service)->serving = serving;
  notify_watchers(h);
}

void rpc_server_set_serving_all(struct rpc_server *s, bool serving) {
  struct rpc_health *h = s->health;
  if (h->shutting_down) return;
  for (struct service_status *st = h->services; st; st = st->next) st->serving = serving;
  notify_watchers(h);
}

void rpc_server_set_unhealthy(struct rpc_server *s, enum rpc_unhealthy why, bool holds) {
  struct rpc_health *h = s->health;
  unsigned before = h->unhealthy;
  h->unhealthy = holds ? before | why : before & ~(unsigned)why;
  if ((before == 0) != (h->unhealthy == 0)) rpc_server_set_serving_all(s, h->unhealthy == 0);
}

void rpc_health_shutdown(struct rpc_health *h) {
  h->shutting_down = true;
  for (struct service_status *st = h->services; st; st = st->next) st->serving = false;
  for (struct watcher *w = h->watchers; w; w = w->next) w->closing = true;
  notify_watchers(h);
}
