/*
 * ring_harness.c: see ring_harness.h. Threads, not processes: the ring code
 * keeps no global state, so n groups in one process are n independent ranks.
 */
#include "ring_harness.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "ring.h"

void (*harness_before_join)(const char *const *addrs, int n);

struct rank_ctx {
  int rank, n, listener;
  int64_t timeout_ms;
  const char *const *addrs;
  harness_body body;
  void *arg;
  int join_rc, body_rc;
  int64_t elapsed_ms;
};

int64_t harness_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void *rank_main(void *p) {
  struct rank_ctx *c = p;
  struct coll_group *g = NULL;
  c->join_rc = ring_group_new(c->rank, c->n, c->addrs, c->timeout_ms, c->listener, &g);
  if (c->join_rc) return NULL;
  int64_t t0 = harness_now_ms();
  c->body_rc = c->body(g, c->arg);
  c->elapsed_ms = harness_now_ms() - t0;
  coll_free(g);
  return NULL;
}

void harness_run(int n, int64_t timeout_ms, harness_body body, void **args,
                 struct harness_result *ret) {
  char addr[HARNESS_MAX_RANKS][RING_ADDR_MAX];
  const char *addrs[HARNESS_MAX_RANKS] = {0};
  struct rank_ctx ctx[HARNESS_MAX_RANKS];
  pthread_t th[HARNESS_MAX_RANKS];
  for (int r = 0; r < n; r++) {
    ctx[r] = (struct rank_ctx){.rank = r,
                               .n = n,
                               .timeout_ms = timeout_ms,
                               .addrs = addrs,
                               .body = body,
                               .arg = args ? args[r] : NULL,
                               .join_rc = -1};
    if (ring_listen("127.0.0.1", &ctx[r].listener, addr[r]) != 0) abort();
    addrs[r] = addr[r];
  }
  if (harness_before_join) harness_before_join(addrs, n);
  for (int r = 0; r < n; r++) pthread_create(&th[r], NULL, rank_main, &ctx[r]);
  for (int r = 0; r < n; r++) {
    pthread_join(th[r], NULL);
    ret->join_rc[r] = ctx[r].join_rc;
    ret->body_rc[r] = ctx[r].body_rc;
    ret->elapsed_ms[r] = ctx[r].elapsed_ms;
  }
}
