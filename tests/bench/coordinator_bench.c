/*
 * Coordinator benchmark: simulated ranks against one real coordinator on
 * loopback. For each rank count N it measures the rendezvous time of N
 * concurrent Joins, then drives heartbeats open-loop at N / interval per
 * second (each rank once per interval, evenly spread) and records the
 * latency of every heartbeat. The baseline, measured in the same run on the
 * same server, is a grpc.health.v1 Check round trip: a call that touches no
 * job state. Prints one JSON line per rank count.
 *
 * Usage: coordinator_bench ADDR RANKS [HEARTBEAT_INTERVAL_MS] [SECONDS]
 */
#include "rpc.h"
#include "stk_error.h"

#include "grpc/health/v1/health.pb-c.h"
#include "stoker/v1/coordinator.pb-c.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHANNELS 8

struct latencies {
  pthread_mutex_t lock;
  double *ms; /* One entry per completed call. */
  size_t n, cap;
  atomic_long errors;
  atomic_long outstanding;
};

struct pending {
  struct latencies *lat;
  double start_ms;
  uint64_t *ret_generation; /* Join: where to store the generation. */
};

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void record(struct latencies *lat, double ms) {
  pthread_mutex_lock(&lat->lock);
  if (lat->n == lat->cap) {
    lat->cap = lat->cap ? lat->cap * 2 : 4096;
    lat->ms = realloc(lat->ms, lat->cap * sizeof(double));
  }
  lat->ms[lat->n++] = ms;
  pthread_mutex_unlock(&lat->lock);
}

static void call_done(void *arg, const struct rpc_status *st, ProtobufCMessage *resp) {
  struct pending *p = arg;
  if (st->code != RPC_OK) {
    if (atomic_fetch_add(&p->lat->errors, 1) < 5)
      fprintf(stderr, "bench: call failed: %s %s\n", rpc_code_name(st->code), st->message);
  } else {
    record(p->lat, now_ms() - p->start_ms);
    if (p->ret_generation) *p->ret_generation = ((Stoker__V1__JoinResponse *)resp)->generation;
  }
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  atomic_fetch_sub(&p->lat->outstanding, 1);
  free(p);
}

static void start_call(struct rpc_client *c, struct latencies *lat, const char *method,
                       const ProtobufCMessage *req, const ProtobufCMessageDescriptor *resp_desc,
                       uint64_t *ret_generation) {
  struct pending *p = calloc(1, sizeof(*p));
  p->lat = lat;
  p->start_ms = now_ms();
  p->ret_generation = ret_generation;
  atomic_fetch_add(&lat->outstanding, 1);
  if (rpc_client_unary_async(c, method, req, resp_desc, 60000, call_done, p, NULL) != 0) {
    atomic_fetch_add(&lat->errors, 1);
    atomic_fetch_sub(&lat->outstanding, 1);
    free(p);
  }
}

static void wait_outstanding(struct latencies *lat) {
  while (atomic_load(&lat->outstanding) > 0) {
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double percentile(struct latencies *lat, double q) {
  if (lat->n == 0) return 0;
  qsort(lat->ms, lat->n, sizeof(double), cmp_double);
  size_t i = (size_t)(q * (double)(lat->n - 1));
  return lat->ms[i];
}

static void sleep_until(double t_ms) {
  double d = t_ms - now_ms();
  if (d <= 0) return;
  struct timespec ts = {(time_t)(d / 1e3), (long)((d - (time_t)(d / 1e3) * 1e3) * 1e6)};
  nanosleep(&ts, NULL);
}

static int create_job(struct rpc_client *c, const char *name, uint32_t ranks, uint32_t hb_ms) {
  Stoker__V1__JobSpec spec = STOKER__V1__JOB_SPEC__INIT;
  spec.name = (char *)name;
  spec.min_ranks = ranks;
  spec.max_ranks = ranks;
  spec.heartbeat_interval_ms = hb_ms;
  spec.heartbeat_misses = 3;
  spec.last_call_ms = 0;
  Stoker__V1__CreateJobRequest req = STOKER__V1__CREATE_JOB_REQUEST__INIT;
  req.spec = &spec;
  ProtobufCMessage *resp = NULL;
  struct rpc_status st;
  int err = rpc_client_unary(c, "/stoker.v1.Coordinator/CreateJob", &req.base,
                             &stoker__v1__job__descriptor, 10000, &resp, &st);
  if (err) fprintf(stderr, "bench: CreateJob: %s\n", st.message);
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  return err;
}

/* Health Check round trips, one at a time: the baseline latency. */
static void measure_baseline(struct rpc_client *c, struct latencies *lat, int calls) {
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  req.service = "";
  for (int i = 0; i < calls; i++) {
    start_call(c, lat, "/grpc.health.v1.Health/Check", &req.base,
               &grpc__health__v1__health_check_response__descriptor, NULL);
    wait_outstanding(lat);
  }
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s ADDR RANKS [HEARTBEAT_INTERVAL_MS] [SECONDS]\n", argv[0]);
    return 1;
  }
  const char *addr = argv[1];
  uint32_t ranks = (uint32_t)strtoul(argv[2], NULL, 10);
  uint32_t hb_ms = argc > 3 ? (uint32_t)strtoul(argv[3], NULL, 10) : 5000;
  double seconds = argc > 4 ? strtod(argv[4], NULL) : 15;

  struct rpc_client *clients[CHANNELS];
  for (int i = 0; i < CHANNELS; i++) {
    struct rpc_client_opts o = {.target = addr};
    if (rpc_client_new(&o, &clients[i]) != 0) {
      fprintf(stderr, "bench: cannot connect to %s\n", addr);
      return 1;
    }
  }
  char job[64];
  snprintf(job, sizeof(job), "bench-%" PRIu32 "-%ld", ranks, (long)time(NULL));
  if (create_job(clients[0], job, ranks, hb_ms) != 0) return 1;

  /* Rendezvous: N concurrent Joins, all answered when the round closes. */
  struct latencies join_lat = {.lock = PTHREAD_MUTEX_INITIALIZER};
  uint64_t *generation = calloc(ranks, sizeof(uint64_t));
  char **members = calloc(ranks, sizeof(char *));
  Stoker__V1__JoinRequest jr = STOKER__V1__JOIN_REQUEST__INIT;
  jr.job = job;
  jr.host = "bench";
  double t0 = now_ms();
  for (uint32_t r = 0; r < ranks; r++) {
    members[r] = malloc(32);
    snprintf(members[r], 32, "rank-%" PRIu32, r);
    jr.member_id = members[r];
    jr.address = members[r];
    start_call(clients[r % CHANNELS], &join_lat, "/stoker.v1.Coordinator/Join", &jr.base,
               &stoker__v1__join_response__descriptor, &generation[r]);
  }
  wait_outstanding(&join_lat);
  double rendezvous_s = (now_ms() - t0) / 1e3;
  if (atomic_load(&join_lat.errors) > 0) return 1;

  /* Heartbeats, open loop: rank r at offsets r * interval / N in each interval. */
  struct latencies hb_lat = {.lock = PTHREAD_MUTEX_INITIALIZER};
  Stoker__V1__HeartbeatRequest hr = STOKER__V1__HEARTBEAT_REQUEST__INIT;
  hr.job = job;
  hr.health = STOKER__V1__RANK_HEALTH__RANK_HEALTH_OK;
  double start = now_ms(), gap_ms = (double)hb_ms / ranks;
  uint64_t sent = 0;
  for (;;) {
    double due = start + (double)sent * gap_ms;
    if (due - start >= seconds * 1e3) break;
    sleep_until(due);
    uint32_t r = (uint32_t)(sent % ranks);
    hr.member_id = members[r];
    hr.generation = generation[r];
    hr.step = sent / ranks;
    hr.tokens_per_s = 1000;
    start_call(clients[r % CHANNELS], &hb_lat, "/stoker.v1.Coordinator/Heartbeat", &hr.base,
               &stoker__v1__heartbeat_response__descriptor, NULL);
    sent++;
  }
  wait_outstanding(&hb_lat);
  double elapsed_s = (now_ms() - start) / 1e3;

  /* Saturation: keep 256 heartbeats in flight for a while; the rate the
   * coordinator sustains with no pacing is its headroom over the target. */
  struct latencies sat_lat = {.lock = PTHREAD_MUTEX_INITIALIZER};
  double sat_start = now_ms();
  for (uint64_t i = 0; now_ms() - sat_start < 3000; i++) {
    while (atomic_load(&sat_lat.outstanding) >= 256) sleep_until(now_ms() + 0.05);
    uint32_t r = (uint32_t)(i % ranks);
    hr.member_id = members[r];
    hr.generation = generation[r];
    start_call(clients[r % CHANNELS], &sat_lat, "/stoker.v1.Coordinator/Heartbeat", &hr.base,
               &stoker__v1__heartbeat_response__descriptor, NULL);
  }
  wait_outstanding(&sat_lat);
  double max_per_s = (double)sat_lat.n / ((now_ms() - sat_start) / 1e3);

  struct latencies base_lat = {.lock = PTHREAD_MUTEX_INITIALIZER};
  measure_baseline(clients[0], &base_lat, 2000);

  double p50 = percentile(&hb_lat, 0.50), p99 = percentile(&hb_lat, 0.99);
  double b50 = percentile(&base_lat, 0.50), b99 = percentile(&base_lat, 0.99);
  printf("{\"bench\":\"coordinator\",\"ranks\":%" PRIu32 ",\"heartbeat_interval_ms\":%" PRIu32
         ",\"heartbeats\":%zu,\"errors\":%ld,\"heartbeats_per_s\":%.1f,\"target_per_s\":%.1f,\"max_"
         "heartbeats_per_s\":%.1f,"
         "\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"rendezvous_s\":%.3f,\"baseline_health_p50_ms\":%.3f,"
         "\"baseline_health_p99_ms\":%.3f,\"p50_ratio\":%.2f,\"p99_ratio\":%.2f}\n",
         ranks, hb_ms, hb_lat.n, atomic_load(&hb_lat.errors) + atomic_load(&join_lat.errors),
         (double)hb_lat.n / elapsed_s, ranks * 1000.0 / hb_ms, max_per_s, p50, p99, rendezvous_s,
         b50, b99, b50 > 0 ? p50 / b50 : 0, b99 > 0 ? p99 / b99 : 0);

  for (uint32_t r = 0; r < ranks; r++) free(members[r]);
  free(members);
  free(generation);
  free(join_lat.ms);
  free(hb_lat.ms);
  free(base_lat.ms);
  free(sat_lat.ms);
  for (int i = 0; i < CHANNELS; i++) rpc_client_free(clients[i]);
  return 0;
}
