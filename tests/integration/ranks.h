/*
 * ranks: simulated trainer ranks for the integration tests. Each rank is a
 * libstoker-client of its own; since Join parks until the rendezvous round
 * closes, every rank joins on a thread of its own and the test waits for
 * all of them. ranks_operator and ranks_form assert (cmocka) as they go.
 */
#ifndef STK_RANKS_H
#define STK_RANKS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "harness.h"

struct rank {
  struct stk_client *client; /* Owned; set by ranks_new. */
  char member_id[64];
  char job[64];
  int64_t timeout_ms;
  struct stk_membership m; /* Filled by a successful join. */
  int err;                 /* Result of the last join. */
  pthread_t thread;
  bool running;
};

/* Makes n ranks of job, member ids "<prefix>-<i>", each with its own
 * client on d. Returns 0 or STK_E*. */
int ranks_new(struct rank *r, size_t n, const struct harness_daemon *d, const char *job,
              const char *prefix);
/* An operator's client on d (asserted non-NULL, cmocka) that created job
 * with harness_create_job's arguments (asserted to succeed). */
struct stk_client *ranks_operator(const struct harness_daemon *d, const char *job,
                                  uint32_t min_ranks, uint32_t max_ranks, uint32_t interval_ms,
                                  uint32_t last_call_ms);
/* ranks_new (asserted to succeed, cmocka), then every rank joined with
 * timeout_ms and waited for (asserted: none failed). */
void ranks_form(struct rank *r, size_t n, const struct harness_daemon *d, const char *job,
                const char *prefix, int64_t timeout_ms);

/* Starts stk_join on a thread per rank (timeout_ms each). */
void ranks_join_start(struct rank *r, size_t n, int64_t timeout_ms);
/* Waits for every join started; returns how many failed. */
size_t ranks_join_wait(struct rank *r, size_t n);
/* Frees every client (no Leave: the membership just stops). */
void ranks_free(struct rank *r, size_t n);

/* Polls stk_poll_action until it returns want or timeout_ms passes;
 * returns the last action seen. */
enum stk_action ranks_wait_action(struct rank *r, enum stk_action want, int64_t timeout_ms);

/* A one-shot completion for the client's asynchronous calls: pass
 * ranks_latch_done / ranks_latch_kv_done as the callback and the latch as
 * its argument, then wait. */
struct ranks_latch {
  pthread_mutex_t mu;
  bool done;
  int err;
  char msg[256];
  char value[256]; /* kv: the value, NUL-terminated (truncated). */
  size_t len;
};

void ranks_latch_init(struct ranks_latch *l);
void ranks_latch_close(struct ranks_latch *l);
void ranks_latch_done(void *arg, int err, const char *msg);
void ranks_latch_kv_done(void *arg, int err, const char *msg, const uint8_t *value, size_t len);
/* True when the call completed within timeout_ms. */
bool ranks_latch_wait(struct ranks_latch *l, int64_t timeout_ms);

#endif
