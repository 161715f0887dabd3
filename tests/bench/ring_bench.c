/*
 * ring_bench: how close the CPU ring collectives come to the wire. Baseline:
 * one loopback TCP stream with the ring's socket options (TCP_NODELAY, 8 MiB
 * buffers), a sender thread and a receiver thread, measured here. Then ring
 * all-gather and reduce-scatter (f32) with RANKS threads on loopback, as bus
 * bandwidth: busbw = (n-1)/n * total bytes / time, the per-link rate a ring
 * needs (the ring cost model). Prints one JSON line.
 *   ring_bench RANKS TOTAL_MIB ITERS
 */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "coll.h"
#include "ring.h"

#define MAX_RANKS 16

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* --- baseline: one TCP stream over loopback --- */

struct stream {
  int fd;
  size_t bytes;
};

static void tune(int fd) {
  int one = 1, sz = 8 << 20;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
}

static void *sender(void *p) {
  struct stream *s = p;
  size_t chunk = 4 << 20, done = 0;
  char *buf = calloc(1, chunk);
  while (done < s->bytes) {
    size_t want = s->bytes - done < chunk ? s->bytes - done : chunk;
    ssize_t n = send(s->fd, buf, want, MSG_NOSIGNAL);
    if (n <= 0) break;
    done += (size_t)n;
  }
  free(buf);
  return NULL;
}

struct link {
  int c, a;
  size_t bytes, done;
  pthread_t tx, rx;
};

static void *receiver(void *p) {
  struct link *k = p;
  size_t chunk = 4 << 20;
  char *buf = malloc(chunk);
  while (k->done < k->bytes) {
    ssize_t n = recv(k->a, buf, chunk, 0);
    if (n <= 0) break;
    k->done += (size_t)n;
  }
  free(buf);
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

/* n raw streams at once, as a ring's n links run: the per-link rate. */
static double links_mb_per_s(int n, size_t bytes) {
  struct link k[MAX_RANKS];
  for (int i = 0; i < n; i++) {
    k[i] = (struct link){.bytes = bytes};
    if (open_link(&k[i].c, &k[i].a) != 0) return 0;
  }
  struct stream s[MAX_RANKS];
  double t0 = now_s();
  for (int i = 0; i < n; i++) {
    s[i] = (struct stream){.fd = k[i].c, .bytes = bytes};
    pthread_create(&k[i].tx, NULL, sender, &s[i]);
    pthread_create(&k[i].rx, NULL, receiver, &k[i]);
  }
  for (int i = 0; i < n; i++) {
    pthread_join(k[i].tx, NULL);
    pthread_join(k[i].rx, NULL);
  }
  double t = now_s() - t0;
  for (int i = 0; i < n; i++) close(k[i].c), close(k[i].a);
  return (double)bytes / t / 1e6;
}

/* The baseline: one stream alone, best of two runs. */
static double loopback_mb_per_s(size_t bytes) {
  double a = links_mb_per_s(1, bytes), b = links_mb_per_s(1, bytes);
  return a > b ? a : b;
}

/* --- ring collectives --- */

struct rank {
  int rank, n, listener, iters;
  const char *const *addrs;
  size_t total_bytes;
  pthread_barrier_t *barrier;
  double ag_s, rs_s;
  int rc;
};

/* Runs op iters times between barriers; returns seconds per call. */
static double timed(struct rank *r, struct coll_group *g, int rs, float *small, float *big) {
  size_t count = r->total_bytes / sizeof(float) / (size_t)r->n;
  pthread_barrier_wait(r->barrier);
  double t0 = now_s();
  for (int i = 0; i < r->iters && r->rc == 0; i++)
    r->rc = rs ? coll_reduce_scatter(g, big, small, count, COLL_F32)
               : coll_all_gather(g, small, big, count, COLL_F32);
  pthread_barrier_wait(r->barrier);
  return (now_s() - t0) / r->iters;
}

static void *rank_main(void *p) {
  struct rank *r = p;
  struct coll_group *g;
  r->rc = ring_group_new(r->rank, r->n, r->addrs, 120000, r->listener, &g);
  if (r->rc) {
    fprintf(stderr, "ring_bench: rank %d join: %d\n", r->rank, r->rc);
    exit(1);
  }
  float *big = calloc(1, r->total_bytes), *small = calloc(1, r->total_bytes / r->n + 4);
  int iters = r->iters;
  r->iters = 1; /* Warm-up: page in buffers, grow socket windows. */
  timed(r, g, 0, small, big);
  timed(r, g, 1, small, big);
  r->iters = iters;
  r->ag_s = timed(r, g, 0, small, big);
  r->rs_s = timed(r, g, 1, small, big);
  free(big);
  free(small);
  coll_free(g);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: ring_bench RANKS TOTAL_MIB ITERS\n");
    return 2;
  }
  int n = atoi(argv[1]), iters = atoi(argv[3]);
  size_t total = (size_t)atoi(argv[2]) << 20;
  if (n < 2 || n > MAX_RANKS || iters < 1 || total == 0) return 2;
  total -= total % ((size_t)n * sizeof(float));
  double base = loopback_mb_per_s(total * 2);

  char addr[MAX_RANKS][RING_ADDR_MAX];
  const char *addrs[MAX_RANKS];
  struct rank r[MAX_RANKS];
  pthread_t th[MAX_RANKS];
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, (unsigned)n);
  for (int i = 0; i < n; i++) {
    r[i] = (struct rank){.rank = i,
                         .n = n,
                         .iters = iters,
                         .addrs = addrs,
                         .total_bytes = total,
                         .barrier = &barrier};
    if (ring_listen("127.0.0.1", &r[i].listener, addr[i]) != 0) return 1;
    addrs[i] = addr[i];
  }
  for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, rank_main, &r[i]);
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < n; i++)
    if (r[i].rc) return 1;

  double links = links_mb_per_s(n, total);
  double bus = (double)(n - 1) / n * (double)total / 1e6;
  double ag = bus / r[0].ag_s, rs = bus / r[0].rs_s;
  printf("{\"bench\":\"trainer\",\"part\":\"ring\",\"ranks\":%d,\"total_bytes\":%zu,"
         "\"loopback_mb_per_s\":%.1f,\"allgather_busbw_mb_per_s\":%.1f,"
         "\"reducescatter_busbw_mb_per_s\":%.1f,\"allgather_ratio\":%.3f,"
         "\"reducescatter_ratio\":%.3f,\"loopback_links_mb_per_s\":%.1f,"
         "\"allgather_links_ratio\":%.3f,\"reducescatter_links_ratio\":%.3f}\n",
         n, total, base, ag, rs, ag / base, rs / base, links, ag / links, rs / links);
  return 0;
}
