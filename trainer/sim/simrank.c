/*
 * stoker-simrank: a simulated trainer rank. It does everything a real rank
 * does with the coordinator and nothing else: joins a job, meets the other
 * ranks at a barrier, exchanges "ring addresses" through the generation's
 * key-value store, reports steps and throughput with its heartbeats, writes
 * (pretend) checkpoints when asked or every few steps, and on RESTART
 * rejoins and resumes from the latest committed checkpoint. The main job
 * script runs a few of these until the real trainer exists.
 *
 * Usage: stoker-simrank --coordinator ADDR --job NAME --member ID
 *                       [--steps N] [--step-ms MS] [--checkpoint-every N]
 */
#include "stoker_client.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct sim_opts {
  const char *coordinator;
  const char *job;
  const char *member;
  uint64_t steps;
  unsigned step_ms;
  uint64_t checkpoint_every;
};

static void usage(const char *prog) {
  fprintf(stderr,
          "usage: %s --coordinator ADDR --job NAME --member ID [--steps N] [--step-ms MS]\n"
          "          [--checkpoint-every N]\n",
          prog);
}

static int parse_args(int argc, char **argv, struct sim_opts *o) {
  *o = (struct sim_opts){.steps = 1000000, .step_ms = 100, .checkpoint_every = 20};
  o->coordinator = getenv("STOKER_COORDINATOR");
  for (int i = 1; i + 1 < argc; i += 2) {
    const char *k = argv[i], *v = argv[i + 1];
    if (!strcmp(k, "--coordinator"))
      o->coordinator = v;
    else if (!strcmp(k, "--job"))
      o->job = v;
    else if (!strcmp(k, "--member"))
      o->member = v;
    else if (!strcmp(k, "--steps"))
      o->steps = strtoull(v, NULL, 10);
    else if (!strcmp(k, "--step-ms"))
      o->step_ms = (unsigned)strtoul(v, NULL, 10);
    else if (!strcmp(k, "--checkpoint-every"))
      o->checkpoint_every = strtoull(v, NULL, 10);
    else
      return -1;
  }
  if (argc % 2 == 0 || !o->coordinator || !o->job || !o->member) return -1;
  return 0;
}

static void sleep_ms(unsigned ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Joins, meets the others and swaps addresses; on success *m holds the
 * membership. Returns STK_EABORTED when the round ended meanwhile. */
static int join_generation(struct stk_client *c, const struct sim_opts *o,
                           struct stk_membership *m) {
  char addr[64];
  snprintf(addr, sizeof(addr), "127.0.0.1:%d", 20000 + (int)(getpid() % 20000));
  int err = stk_join(c, o->job, o->member, addr, "localhost", 600000, m);
  if (err) return err;
  printf("[%s] joined generation %" PRIu64 " as rank %u of %u (restore from step %" PRId64 ")\n",
         o->member, m->generation, m->rank, m->world_size, m->checkpoint_step);
  if (m->rank == 0) {
    err = stk_kv_set(c, "ring/rank0", addr, strlen(addr), 10000);
    if (err) return err;
  }
  uint8_t *peer = NULL;
  size_t len = 0;
  err = stk_kv_get(c, "ring/rank0", true, 30000, &peer, &len);
  if (err) return err;
  free(peer);
  return stk_barrier(c, "start", 30000);
}

static int run(struct stk_client *c, const struct sim_opts *o) {
  struct stk_membership m;
  int err;
  while ((err = join_generation(c, o, &m)) == STK_EABORTED) sleep_ms(50);
  if (err) return err;
  uint64_t step = (uint64_t)m.checkpoint_step;
  while (step < o->steps) {
    sleep_ms(o->step_ms);
    step++;
    double loss = 4.0 / (1.0 + 0.01 * (double)step);
    stk_report(c, step, 1000.0 * m.world_size, loss, STK_RANK_HEALTH_OK);
    enum stk_action action = stk_poll_action(c);
    bool periodic = o->checkpoint_every && step % o->checkpoint_every == 0;
    if ((action == STK_ACTION_CHECKPOINT_NOW || periodic) && m.rank == 0) {
      char uri[128];
      snprintf(uri, sizeof(uri), "file:///checkpoints/%s/step-%" PRIu64, o->job, step);
      if (stk_report_checkpoint(c, o->job, (int64_t)step, uri) == 0)
        printf("[%s] checkpoint committed at step %" PRIu64 "\n", o->member, step);
    }
    if (action == STK_ACTION_STOP) break;
    if (action == STK_ACTION_RESTART) {
      printf("[%s] RESTART at step %" PRIu64 ": rejoining\n", o->member, step);
      while ((err = join_generation(c, o, &m)) == STK_EABORTED) sleep_ms(50);
      if (err) return err;
      step = (uint64_t)m.checkpoint_step;
    }
  }
  printf("[%s] done at step %" PRIu64 "\n", o->member, step);
  stk_leave(c);
  return 0;
}

int main(int argc, char **argv) {
  struct sim_opts o;
  if (parse_args(argc, argv, &o) != 0) {
    usage(argv[0]);
    return 1;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  struct stk_client_opts co = {.address = o.coordinator};
  struct stk_client *c = NULL;
  int err = stk_client_new(&co, &c);
  if (!err) err = run(c, &o);
  if (err) {
    fprintf(stderr, "stoker-simrank: %s: %s (%s)\n", o.member, stk_strerror(err),
            stk_client_last_error(NULL));
  }
  stk_client_free(c);
  return err ? 1 : 0;
}
