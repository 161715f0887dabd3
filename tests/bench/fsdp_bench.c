/*
 * fsdp_bench: what the FSDP rate limiter costs and saves, and how the
 * sharded trainer scales with ranks. W ranks run as threads of this process,
 * each with its own ring group on loopback (as tests/unit/trainer_fsdp does).
 *   part "limiter":    RANKS ranks, K = 0 (no limit), 1 (unit 0 as the root
 *                      unit), 2 and 4: time per step, peak unsharded bytes,
 *                      the largest unit, waits.
 *   part "throughput": the trainer's default model at 1 and 4 ranks on the
 *                      same global batch: tokens/s and the 4/1 ratio.
 * Prints JSON lines.
 *   fsdp_bench RANKS STEPS
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_batch.h"
#include "bench_stats.h"
#include "coll.h"
#include "fsdp.h"
#include "ring.h"
#include "stk_error.h"

#define MAX_RANKS 8

/* Limiter part: enough blocks that K bounds something (L + 2 = 8 units). */
static const struct model_config limiter_cfg = {
    .vocab_size = 256, .max_seq_len = 64, .channels = 128, .n_layer = 6, .n_head = 4};
/* Throughput part: stoker-train's default model (trainer/train/train_args.c). */
static const struct model_config reference_cfg = {
    .vocab_size = 256, .max_seq_len = 64, .channels = 64, .n_layer = 2, .n_head = 4};

#define GLOBAL_BATCH 8 /* Divisible by 1, 2 and 4 ranks. */
#define SEQ_LEN      64

struct run {
  const struct model_config *cfg;
  struct fsdp_opts opts;
  int W, steps;
  double step_s;                      /* Rank 0's mean time per timed step. */
  struct fsdp_stats stats[MAX_RANKS]; /* Per rank, timed steps only. */
  int rc[MAX_RANKS];
};

/* One warm-up step, then run->steps timed ones on this rank's slice. */
static int train(struct run *run, int rank, struct fsdp *f) {
  static __thread int32_t tokens[GLOBAL_BATCH * SEQ_LEN], targets[GLOBAL_BATCH * SEQ_LEN];
  int B = GLOBAL_BATCH / run->W;
  size_t at = (size_t)rank * B * SEQ_LEN;
  double t0 = 0.0;
  for (int i = 0; i <= run->steps; i++) {
    if (i == 1) fsdp_reset_stats(f), t0 = bench_now_s();
    bench_batch(i, 0, run->cfg->vocab_size, GLOBAL_BATCH * SEQ_LEN, tokens, targets);
    int rc = fsdp_step(f, tokens + at, targets + at, B, SEQ_LEN, NULL);
    if (rc) return rc;
  }
  if (rank == 0) run->step_s = (bench_now_s() - t0) / run->steps;
  fsdp_get_stats(f, &run->stats[rank]);
  return 0;
}

static int rank_body(struct run *run, int rank, struct coll_group *g) {
  struct fsdp *f = NULL;
  int rc = fsdp_new(run->cfg, g, &run->opts, &f);
  if (rc) return rc;
  rc = train(run, rank, f);
  fsdp_free(f);
  return rc;
}

struct rank_ctx {
  struct run *run;
  int rank, listener;
  const char *const *addrs;
};

static void *rank_main(void *p) {
  struct rank_ctx *c = p;
  struct coll_group *g = NULL;
  int rc = ring_group_new(c->rank, c->run->W, c->addrs, 60000, c->listener, &g);
  if (!rc) rc = rank_body(c->run, c->rank, g);
  coll_free(g);
  c->run->rc[c->rank] = rc;
  return NULL;
}

/* Runs every rank (W = 1: no group); 0 or the first rank's error. */
static int run_ranks(struct run *run) {
  char addr[MAX_RANKS][RING_ADDR_MAX];
  const char *addrs[MAX_RANKS] = {0};
  struct rank_ctx ctx[MAX_RANKS];
  pthread_t th[MAX_RANKS];
  if (run->W == 1) return run->rc[0] = rank_body(run, 0, NULL);
  for (int r = 0; r < run->W; r++) {
    ctx[r] = (struct rank_ctx){.run = run, .rank = r, .addrs = addrs};
    int rc = ring_listen("127.0.0.1", &ctx[r].listener, addr[r]);
    if (rc) return rc;
    addrs[r] = addr[r];
  }
  for (int r = 0; r < run->W; r++) pthread_create(&th[r], NULL, rank_main, &ctx[r]);
  for (int r = 0; r < run->W; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < run->W; r++)
    if (run->rc[r]) return run->rc[r];
  return 0;
}

static size_t largest_unit_bytes(const struct model_config *cfg) {
  size_t most = 0;
  for (int k = 0; k < model_unit_count(cfg); k++)
    if (model_unit_numel(cfg, k) > most) most = model_unit_numel(cfg, k);
  return most * sizeof(float);
}

static int bench_limiter(int W, int steps, int K) {
  struct run run = {.cfg = &limiter_cfg, .W = W, .steps = steps};
  fsdp_opts_default(&run.opts);
  run.opts.max_inflight_units = K;
  int rc = run_ranks(&run);
  if (rc) return fprintf(stderr, "fsdp_bench: K=%d: %s\n", K, stk_strerror(rc)), rc;
  int64_t lim = 0, coll = 0;
  size_t peak = 0;
  int peak_units = 0;
  for (int r = 0; r < W; r++) {
    const struct fsdp_stats *s = &run.stats[r];
    if (s->limiter_wait_ns > lim) lim = s->limiter_wait_ns;
    if (s->coll_wait_ns > coll) coll = s->coll_wait_ns;
    if (s->peak_unsharded_bytes > peak) peak = s->peak_unsharded_bytes;
    if (s->peak_unsharded_units > peak_units) peak_units = s->peak_unsharded_units;
  }
  printf("{\"bench\":\"trainer\",\"part\":\"limiter\",\"ranks\":%d,\"limit_k\":%d,"
         "\"units\":%d,\"params\":%zu,\"global_batch\":%d,\"seq_len\":%d,\"steps\":%d,"
         "\"step_s\":%.4f,\"peak_unsharded_bytes\":%zu,\"peak_unsharded_units\":%d,"
         "\"unit_bytes\":%zu,\"limiter_wait_s_per_step\":%.4f,\"coll_wait_s_per_step\":%.4f}\n",
         W, K, model_unit_count(&limiter_cfg), model_param_count(&limiter_cfg), GLOBAL_BATCH,
         SEQ_LEN, steps, run.step_s, peak, peak_units, largest_unit_bytes(&limiter_cfg),
         lim / 1e9 / steps, coll / 1e9 / steps);
  fflush(stdout);
  return 0;
}

static int bench_throughput(int W, int steps, double base_tps, double *ret_tps) {
  struct run run = {.cfg = &reference_cfg, .W = W, .steps = steps};
  fsdp_opts_default(&run.opts);
  int rc = run_ranks(&run);
  if (rc) return fprintf(stderr, "fsdp_bench: W=%d: %s\n", W, stk_strerror(rc)), rc;
  double tps = *ret_tps = GLOBAL_BATCH * SEQ_LEN / run.step_s;
  printf("{\"bench\":\"trainer\",\"part\":\"throughput\",\"ranks\":%d,\"params\":%zu,"
         "\"global_batch\":%d,\"seq_len\":%d,\"steps\":%d,\"step_s\":%.4f,\"tokens_per_s\":%.0f",
         W, model_param_count(&reference_cfg), GLOBAL_BATCH, SEQ_LEN, steps, run.step_s, tps);
  if (base_tps > 0) printf(",\"ratio_vs_1_rank\":%.3f", tps / base_tps);
  printf("}\n");
  fflush(stdout);
  return 0;
}

int main(int argc, char **argv) {
  int W = argc == 3 ? atoi(argv[1]) : 0, steps = argc == 3 ? atoi(argv[2]) : 0;
  if (W < 2 || W > MAX_RANKS || GLOBAL_BATCH % W || steps < 1) {
    fprintf(stderr, "usage: fsdp_bench RANKS(2 or 4) STEPS\n");
    return 2;
  }
  const int ks[] = {0, 1, 2, 4};
  for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++)
    if (bench_limiter(W, steps, ks[i])) return 1;
  double one = 0.0, four = 0.0;
  if (bench_throughput(1, steps, 0.0, &one) || bench_throughput(4, steps, one, &four)) return 1;
  return 0;
}
