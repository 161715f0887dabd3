/*
 * ring_harness.h: runs n ring ranks as threads of the test process on
 * loopback. Listeners are opened first on ephemeral ports (as the trainer
 * does before publishing addresses), then every rank thread joins the ring
 * and runs the test's body with its group.
 */
#ifndef RING_HARNESS_H
#define RING_HARNESS_H

#include <stdint.h>

#include "coll.h"

#define HARNESS_MAX_RANKS 8

typedef int (*harness_body)(struct coll_group *g, void *arg);

struct harness_result {
  int join_rc[HARNESS_MAX_RANKS];
  int body_rc[HARNESS_MAX_RANKS];
  int64_t elapsed_ms[HARNESS_MAX_RANKS]; /* Of the body. */
};

/* Runs body on n ranks; arg is passed through (args[rank] when per_rank). */
void harness_run(int n, int64_t timeout_ms, harness_body body, void **args,
                 struct harness_result *ret);

int64_t harness_now_ms(void);

/* Called (when set) with every rank's address after the listeners are open
 * and before any rank joins; lets a test meddle with the rendezvous. */
extern void (*harness_before_join)(const char *const *addrs, int n);

#endif
