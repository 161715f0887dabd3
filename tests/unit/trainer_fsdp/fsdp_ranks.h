/*
 * fsdp_ranks.h: runs W trainer ranks as threads of one test process, each
 * with its own ring group on loopback (listeners on ephemeral ports opened
 * first, then every thread joins the ring and runs the test's body).
 */
#ifndef FSDP_RANKS_H
#define FSDP_RANKS_H

#include <stdint.h>

#include "coll.h"

#define RANKS_MAX 8

typedef int (*ranks_body)(int rank, struct coll_group *g, void *arg);

/* Runs body on W ranks with the group's collective timeout; ret_rc[r] is
 * rank r's ring join error, else its body's return value. */
void ranks_run(int W, int64_t timeout_ms, ranks_body body, void *arg, int ret_rc[RANKS_MAX]);

#endif
