/*
 * Joining a generation: stk_join, then the ring rendezvous through the
 * generation's KV store (each rank listens, publishes "ring/<rank>", reads
 * everybody's) and ring_group_new. Also dropping the group on a failure or
 * a RESTART from the coordinator. A refused Join (FAILED_PRECONDITION: the
 * job is stopped, or a scale-down left no seat for this member) means this
 * rank is not needed any more. A SIGTERM while parked in Join exits 75.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ring.h"
#include "train.h"

void train_drop_group(struct train *t) {
  pthread_mutex_lock(&t->group_mu);
  struct coll_group *g = t->group;
  t->group = NULL;
  pthread_mutex_unlock(&t->group_mu);
  if (g) {
    coll_abort(g);
    coll_free(g);
  }
}

/* Reads every rank's ring address (waiting for them) into addrs. */
static int gather_addrs(struct train *t, char (*addrs)[RING_ADDR_MAX]) {
  for (uint32_t r = 0; r < t->m.world_size; r++) {
    char key[32];
    snprintf(key, sizeof(key), "ring/%u", r);
    uint8_t *v = NULL;
    size_t len = 0;
    int err = stk_kv_get(t->coord, key, true, 60000, &v, &len);
    if (err) return err;
    snprintf(addrs[r], RING_ADDR_MAX, "%.*s", (int)len, (const char *)v);
    free(v);
  }
  return 0;
}

static int build_ring(struct train *t) {
  int listener = -1;
  char addr[RING_ADDR_MAX];
  int err = ring_listen(t->o.ring_host, &listener, addr);
  if (err) return err;
  char key[32];
  snprintf(key, sizeof(key), "ring/%u", t->m.rank);
  err = stk_kv_set(t->coord, key, addr, strlen(addr), 10000);
  char(*addrs)[RING_ADDR_MAX] = calloc(t->m.world_size, RING_ADDR_MAX);
  const char **ptrs = calloc(t->m.world_size, sizeof(*ptrs));
  if (!err && (!addrs || !ptrs)) err = STK_ENOMEM;
  if (!err) err = gather_addrs(t, addrs);
  struct coll_group *g = NULL;
  if (!err) {
    for (uint32_t r = 0; r < t->m.world_size; r++) ptrs[r] = addrs[r];
    err = ring_group_new((int)t->m.rank, (int)t->m.world_size, ptrs, t->o.ring_timeout_ms, listener,
                         &g);
    listener = -1;
  }
  if (listener >= 0) close(listener);
  free(addrs);
  free(ptrs);
  if (err) return err;
  pthread_mutex_lock(&t->group_mu);
  t->group = g;
  pthread_mutex_unlock(&t->group_mu);
  return 0;
}

int train_join(struct train *t) {
  train_drop_group(t);
  atomic_store(&t->aborted, false);
  atomic_store(&t->ckpt_wanted, false); /* The restore point is the latest checkpoint. */
  /* A resize's or pause's stop belongs to the generation that asked: a
   * rank that heard it after the others' vote had stopped it (its own
   * CHECKPOINT_NOW late) must not stop the next generation at a step no
   * resize asked for, where it would wait for a round nobody opens. A
   * pausing job asks the new generation again. */
  atomic_store(&t->stop_wanted, false);
  (void)stk_poll_action(t->coord); /* A stale RESTART belongs to the old generation. */
  char host[256] = "localhost"; /* The pod's (or machine's) name, shown by `stokerctl job show`. */
  (void)gethostname(host, sizeof(host) - 1);
  /* Parked in Join a rank holds nothing a checkpoint would save (what it
   * trained after the last one is lost to the restart anyway): a SIGTERM
   * here exits 75 at once instead of waiting out the grace period. */
  train_sigterm_exits = 1;
  if (train_sigterm) _exit(TRAIN_EXIT_RESUMABLE);
  int err = stk_join(t->coord, t->o.job, t->o.member, "", host, 600000, &t->m);
  train_sigterm_exits = 0;
  if (err == STK_ESTATE) {
    t->not_needed = true;
    snprintf(t->not_needed_why, sizeof(t->not_needed_why), "%s", stk_client_last_error(NULL));
  }
  if (err) return err;
  printf("[%s] joined generation %" PRIu64 " as rank %u of %u (latest checkpoint: step %" PRId64
         ")\n",
         t->o.member, t->m.generation, t->m.rank, t->m.world_size, t->m.checkpoint_step);
  return build_ring(t);
}
