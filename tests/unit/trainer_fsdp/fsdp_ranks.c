/*
 * fsdp_ranks.c: see fsdp_ranks.h. The ring keeps no global state, so W
 * groups in one process are W independent ranks.
 */
#include "fsdp_ranks.h"

#include <pthread.h>
#include <stdlib.h>

#include "ring.h"

struct rank_ctx {
  int rank, W, listener;
  int64_t timeout_ms;
  const char *const *addrs;
  ranks_body body;
  void *arg;
  int rc;
};

static void *rank_main(void *p) {
  struct rank_ctx *c = p;
  struct coll_group *g = NULL;
  c->rc = ring_group_new(c->rank, c->W, c->addrs, c->timeout_ms, c->listener, &g);
  if (c->rc) return NULL;
  c->rc = c->body(c->rank, g, c->arg);
  coll_free(g);
  return NULL;
}

void ranks_run(int W, int64_t timeout_ms, ranks_body body, void *arg, int ret_rc[RANKS_MAX]) {
  char addr[RANKS_MAX][RING_ADDR_MAX];
  const char *addrs[RANKS_MAX] = {0};
  struct rank_ctx ctx[RANKS_MAX];
  pthread_t th[RANKS_MAX];
  if (W < 1 || W > RANKS_MAX) abort();
  for (int r = 0; r < W; r++) {
    ctx[r] = (struct rank_ctx){
        .rank = r, .W = W, .timeout_ms = timeout_ms, .addrs = addrs, .body = body, .arg = arg};
    if (ring_listen("127.0.0.1", &ctx[r].listener, addr[r]) != 0) abort();
    addrs[r] = addr[r];
  }
  for (int r = 0; r < W; r++) pthread_create(&th[r], NULL, rank_main, &ctx[r]);
  for (int r = 0; r < W; r++) {
    pthread_join(th[r], NULL);
    ret_rc[r] = ctx[r].rc;
  }
}
