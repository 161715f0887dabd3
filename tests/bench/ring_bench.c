/*
 * ring_bench: how close the CPU ring collectives come to the wire. The ring
 * all-gather and reduce-scatter (f32) run with RANKS threads on loopback and
 * are reported as bus bandwidth: busbw = (n-1)/n * total bytes / time, the
 * per-link rate a ring needs (the ring cost model).
 *
 * Baselines, all with the ring's socket options (TCP_NODELAY, 8 MiB
 * buffers) and a sender and a receiver thread per stream:
 *   links_mem: n raw streams at once, as the ring's n links run, each moving
 *             its bytes from a buffer of the collective's size into another:
 *             raw TCP doing exactly the ring's data movement. This is the
 *             ring bound and the target (links_mem ratios >= 0.8): on one
 *             machine all links share the cores and the loopback device, and
 *             every byte must come from and land in memory.
 *   links:    the same n streams between 4 MiB buffers that stay in cache
 *             (the receiver never writes to memory): an upper bound no
 *             collective of this size can reach, kept for context.
 *   loopback: one stream alone (best of two), kept for the ratios;
 *             a ring of n links cannot reach it on a machine with few cores.
 * Load from other processes swings every figure, so the collectives and the
 * links baseline alternate for ROUNDS rounds (each round: links, ITERS
 * all-gathers, ITERS reduce-scatters), every ratio is taken within its round
 * and the medians are printed, as one JSON line.
 *   ring_bench RANKS TOTAL_MIB ITERS [ROUNDS]   (ROUNDS default 3)
 */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench_stats.h"
#include "coll.h"
#include "ring.h"

#define MAX_RANKS  16
#define MAX_ROUNDS 15
#define TARGET     0.8

/* --- baselines: raw TCP streams over loopback --- */

#define IO_CHUNK (4u << 20)

/* One stream: the sender walks buffer tx, the receiver buffer rx, each
 * `span` bytes long (IO_CHUNK: stays in cache; the collective's size: every
 * byte comes from and lands in memory, as in a collective). */
struct link {
  int c, a;
  size_t bytes, span;
  uint8_t *tx, *rx;
  pthread_t tx_thread, rx_thread;
};

static void tune(int fd) {
  int one = 1, sz = 8 << 20;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
}

/* Bytes to move at position done: at most IO_CHUNK, not past the span. */
static size_t io_len(const struct link *k, size_t done) {
  size_t left = k->bytes - done, room = k->span - done % k->span;
  size_t n = left < room ? left : room;
  return n < IO_CHUNK ? n : IO_CHUNK;
}

static void *sender(void *p) {
  struct link *k = p;
  size_t done = 0;
  while (done < k->bytes) {
    ssize_t n = send(k->c, k->tx + done % k->span, io_len(k, done), MSG_NOSIGNAL);
    if (n <= 0) break;
    done += (size_t)n;
  }
  return NULL;
}

static void *receiver(void *p) {
  struct link *k = p;
  size_t done = 0;
  while (done < k->bytes) {
    ssize_t n = recv(k->a, k->rx + done % k->span, io_len(k, done), 0);
    if (n <= 0) break;
    done += (size_t)n;
  }
  return NULL;
}

/* Opens one tuned loopback connection: *c connected, *a accepted. */
static int open_link(int *c, int *a) {
  int l;
  char addr[RING_ADDR_MAX];
  if (ring_listen("127.0.0.1", &l, addr) != 0) return -1;
  struct sockaddr_in sa;
  socklen_t len = sizeof sa;
  getsockname(l, (struct sockaddr *)&sa, &len);
  *c = socket(AF_INET, SOCK_STREAM, 0);
  tune(*c);
  if (connect(*c, (struct sockaddr *)&sa, len) != 0) return -1;
  *a = accept(l, NULL, NULL);
  tune(*a);
  close(l);
  return 0;
}

/* n raw streams at once, as a ring's n links run: the per-link rate. The
 * buffers are allocated and touched before the clock starts. */
static double links_mb_per_s(int n, size_t bytes, size_t span) {
  struct link k[MAX_RANKS];
  for (int i = 0; i < n; i++) {
    k[i] = (struct link){.bytes = bytes, .span = span, .tx = malloc(span), .rx = malloc(span)};
    if (!k[i].tx || !k[i].rx || open_link(&k[i].c, &k[i].a) != 0) return 0;
    memset(k[i].tx, 1, span);
    memset(k[i].rx, 0, span);
  }
  double t0 = bench_now_s();
  for (int i = 0; i < n; i++) {
    pthread_create(&k[i].tx_thread, NULL, sender, &k[i]);
    pthread_create(&k[i].rx_thread, NULL, receiver, &k[i]);
  }
  for (int i = 0; i < n; i++) {
    pthread_join(k[i].tx_thread, NULL);
    pthread_join(k[i].rx_thread, NULL);
  }
  double t = bench_now_s() - t0;
  for (int i = 0; i < n; i++) {
    close(k[i].c), close(k[i].a);
    free(k[i].tx), free(k[i].rx);
  }
  return (double)bytes / t / 1e6;
}

/* The baseline: one stream alone, best of two runs. */
static double loopback_mb_per_s(size_t bytes) {
  double a = links_mb_per_s(1, bytes, IO_CHUNK), b = links_mb_per_s(1, bytes, IO_CHUNK);
  return a > b ? a : b;
}

/* --- ring collectives --- */

/* What the rank threads and the main thread share. */
struct bench {
  int n, iters, rounds;
  size_t total_bytes;
  pthread_barrier_t barrier; /* n ranks + the main thread. */
  double ag_s[MAX_ROUNDS], rs_s[MAX_ROUNDS];
  double links[MAX_ROUNDS];     /* Cached buffers. */
  double links_mem[MAX_ROUNDS]; /* Collective-sized buffers: the target's bound. */
};

struct rank {
  int rank, listener;
  const char *const *addrs;
  struct bench *b;
  int rc;
};

/* Runs op iters times between barriers of the ranks (and main); returns
 * seconds per call. */
static double timed(struct rank *r, struct coll_group *g, int rs, int iters, float *small,
                    float *big) {
  size_t count = r->b->total_bytes / sizeof(float) / (size_t)r->b->n;
  pthread_barrier_wait(&r->b->barrier);
  double t0 = bench_now_s();
  for (int i = 0; i < iters && r->rc == 0; i++)
    r->rc = rs ? coll_reduce_scatter(g, big, small, count, COLL_F32)
               : coll_all_gather(g, small, big, count, COLL_F32);
  pthread_barrier_wait(&r->b->barrier);
  return (bench_now_s() - t0) / iters;
}

static void *rank_main(void *p) {
  struct rank *r = p;
  struct bench *b = r->b;
  struct coll_group *g;
  r->rc = ring_group_new(r->rank, b->n, r->addrs, 120000, r->listener, &g);
  if (r->rc) {
    fprintf(stderr, "ring_bench: rank %d join: %d\n", r->rank, r->rc);
    exit(1);
  }
  float *big = calloc(1, b->total_bytes), *small = calloc(1, b->total_bytes / b->n + 4);
  timed(r, g, 0, 1, small, big); /* Warm-up: page in buffers, grow socket windows. */
  timed(r, g, 1, 1, small, big);
  for (int k = 0; k < b->rounds; k++) {
    pthread_barrier_wait(&b->barrier); /* The main thread measures the links. */
    pthread_barrier_wait(&b->barrier);
    double ag = timed(r, g, 0, b->iters, small, big);
    double rs = timed(r, g, 1, b->iters, small, big);
    if (r->rank == 0) b->ag_s[k] = ag, b->rs_s[k] = rs;
  }
  free(big);
  free(small);
  coll_free(g);
  return NULL;
}

/* The main thread's side of the rounds: the two links baselines, then it
 * waits through the ranks' warm-up and timed barriers. */
static void drive_rounds(struct bench *b) {
  for (int i = 0; i < 4; i++) pthread_barrier_wait(&b->barrier); /* Warm-up. */
  for (int k = 0; k < b->rounds; k++) {
    pthread_barrier_wait(&b->barrier);
    b->links[k] = links_mb_per_s(b->n, b->total_bytes, IO_CHUNK);
    b->links_mem[k] = links_mb_per_s(b->n, b->total_bytes, b->total_bytes);
    pthread_barrier_wait(&b->barrier);
    for (int i = 0; i < 4; i++) pthread_barrier_wait(&b->barrier);
  }
}

/* Starts the ranks and runs the rounds; 0 when every rank succeeded. */
static int run_ring(struct bench *b) {
  char addr[MAX_RANKS][RING_ADDR_MAX];
  const char *addrs[MAX_RANKS];
  struct rank r[MAX_RANKS];
  pthread_t th[MAX_RANKS];
  pthread_barrier_init(&b->barrier, NULL, (unsigned)b->n + 1);
  for (int i = 0; i < b->n; i++) {
    r[i] = (struct rank){.rank = i, .addrs = addrs, .b = b};
    if (ring_listen("127.0.0.1", &r[i].listener, addr[i]) != 0) return 1;
    addrs[i] = addr[i];
  }
  for (int i = 0; i < b->n; i++) pthread_create(&th[i], NULL, rank_main, &r[i]);
  drive_rounds(b);
  int rc = 0;
  for (int i = 0; i < b->n; i++) {
    pthread_join(th[i], NULL);
    rc |= r[i].rc;
  }
  pthread_barrier_destroy(&b->barrier);
  return rc ? 1 : 0;
}

static void print_json(const struct bench *b, double base) {
  int n = b->n, m = b->rounds;
  double bus = (double)(n - 1) / n * (double)b->total_bytes / 1e6;
  double ag[MAX_ROUNDS], rs[MAX_ROUNDS], agl[MAX_ROUNDS], rsl[MAX_ROUNDS];
  double agm_r[MAX_ROUNDS], rsm_r[MAX_ROUNDS];
  for (int k = 0; k < m; k++) {
    ag[k] = bus / b->ag_s[k], rs[k] = bus / b->rs_s[k];
    agl[k] = ag[k] / b->links[k], rsl[k] = rs[k] / b->links[k];
    agm_r[k] = ag[k] / b->links_mem[k], rsm_r[k] = rs[k] / b->links_mem[k];
    fprintf(stderr,
            "ring_bench: n=%d round %d: links %.1f MB/s (memory %.1f), all-gather %.1f (%.3f), "
            "reduce-scatter %.1f (%.3f)\n",
            n, k, b->links[k], b->links_mem[k], ag[k], agl[k], rs[k], rsl[k]);
  }
  double agm = bench_median(ag, m), rsm = bench_median(rs, m), agr = bench_median(agl, m),
         rsr = bench_median(rsl, m);
  double agmr = bench_median(agm_r, m), rsmr = bench_median(rsm_r, m);
  printf("{\"bench\":\"trainer\",\"part\":\"ring\",\"ranks\":%d,\"total_bytes\":%zu,"
         "\"iters\":%d,\"rounds\":%d,"
         "\"loopback_mb_per_s\":%.1f,\"allgather_busbw_mb_per_s\":%.1f,"
         "\"reducescatter_busbw_mb_per_s\":%.1f,\"allgather_ratio\":%.3f,"
         "\"reducescatter_ratio\":%.3f,\"loopback_links_mb_per_s\":%.1f,"
         "\"allgather_links_ratio\":%.3f,\"reducescatter_links_ratio\":%.3f,"
         "\"loopback_links_mem_mb_per_s\":%.1f,\"allgather_links_mem_ratio\":%.3f,"
         "\"reducescatter_links_mem_ratio\":%.3f,"
         "\"ring_bound_mb_per_s\":%.1f,\"target_links_ratio\":%.2f,\"target_met\":%s,"
         "\"target\":\"allgather_links_mem_ratio and reducescatter_links_mem_ratio >= %.2f: the "
         "ring bound is loopback_links_mem_mb_per_s, n raw streams at once moving the "
         "collective's bytes memory to memory (they share the cores and the loopback device, "
         "as the ring's links do); one stream alone (loopback_mb_per_s) and streams between "
         "cached buffers (loopback_links_mb_per_s) are not bounds a ring on one machine can "
         "reach\"}\n",
         n, b->total_bytes, b->iters, m, base, agm, rsm, agm / base, rsm / base,
         bench_median(b->links, m), agr, rsr, bench_median(b->links_mem, m), agmr, rsmr,
         bench_median(b->links_mem, m), TARGET, agmr >= TARGET && rsmr >= TARGET ? "true" : "false",
         TARGET);
}

int main(int argc, char **argv) {
  if (argc != 4 && argc != 5) {
    fprintf(stderr, "usage: ring_bench RANKS TOTAL_MIB ITERS [ROUNDS]\n");
    return 2;
  }
  static struct bench b;
  b.n = atoi(argv[1]), b.iters = atoi(argv[3]), b.rounds = argc == 5 ? atoi(argv[4]) : 3;
  b.total_bytes = (size_t)atoi(argv[2]) << 20;
  if (b.n < 2 || b.n > MAX_RANKS || b.iters < 1 || b.total_bytes == 0 || b.rounds < 1 ||
      b.rounds > MAX_ROUNDS)
    return 2;
  b.total_bytes -= b.total_bytes % ((size_t)b.n * sizeof(float));
  double base = loopback_mb_per_s(b.total_bytes * 2);
  if (run_ring(&b) != 0) return 1;
  print_json(&b, base);
  return 0;
}
