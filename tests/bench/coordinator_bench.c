/*
 * Coordinator benchmark: simulated ranks against one real coordinator on
 * loopback. For each rank count N it measures the rendezvous time of N
 * concurrent Joins, then drives heartbeats open-loop at N / interval per
 * second (each rank once per interval, evenly spread) and records the
 * latency of every heartbeat. The baseline, measured in the same run on the
 * same server, is a grpc.health.v1 Check round trip: a call that touches no
 * job state. The heartbeat phase runs ROUNDS windows of SECONDS after a
 * settling second; p50 and p99 are the medians of the windows' figures
 * (this VM's speed drifts within a minute), p99_all_ms pools every window.
 * Then one rank leaves and the heartbeats go on: each survivor told to
 * rejoin joins again, and generation_propagation_s is the time from the
 * Leave's reply to the last survivor holding the new generation.
 * With BENCH_COORD_PID set, the coordinator's CPU per heartbeat and its
 * memory per rank come from /proc; the bench's own CPU from getrusage.
 * The simulated ranks' calls go over HTTP/2 connections of our own
 * (h2_grpc.h, nghttp2), far cheaper than gRPC's C client, so that on a
 * 2-core machine the coordinator rather than the client is measured; the
 * job is created and the Leave sent with gRPC's client (rpc.h).
 * Prints one JSON line per rank count.
 *
 * Usage: coordinator_bench ADDR RANKS [HEARTBEAT_INTERVAL_MS] [SECONDS] [ROUNDS]
 */
#include "bench_stats.h"
#include "h2_grpc.h"
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
#include <sys/resource.h>
#include <time.h>

#define CHANNELS             8      /* HTTP/2 connections the ranks share. */
#define SETTLE_MS            1000.0 /* Heartbeats sent right after the rendezvous: not counted. */
#define LAST_CALL_MS         3000 /* min_ranks is ranks - 1: how long a round waits for the last. */
#define PROPAGATION_LIMIT_MS 120000.0
#define CALL_TIMEOUT_MS      300000 /* A 100,000-rank rendezvous on a loaded VM is slow. */
/* Before the memory baseline: the coordinator gives back what an earlier
 * shape's parked calls left within two seconds of their end (issue 26). */
#define MEMORY_SETTLE_MS 3000.0

struct latencies {
  pthread_mutex_t lock;
  double *ms; /* One entry per completed call. */
  size_t n, cap;
  atomic_long errors;
  atomic_long outstanding;
};

struct pending {
  struct latencies *lat;
  const ProtobufCMessageDescriptor *resp_desc;
  double start_ms;
  uint64_t *ret_generation; /* Join: where to store the generation. */
  struct propagation *prop; /* Set in the propagation phase. */
  uint32_t rank;
};

/* The propagation phase: each rank heartbeats (HB) until told to rejoin,
 * joins (JOINING), and holds the new generation (DONE). */
enum { RANK_HB, RANK_JOINING, RANK_DONE };

struct propagation {
  struct h2_grpc **conns;
  char **members;
  const char *job;
  uint64_t old_generation;
  _Atomic unsigned char *state;
  uint64_t *generation;
  atomic_long told;         /* Survivors whose heartbeat carried the new generation. */
  atomic_long last_told_us; /* Since t0, of the latest of them. */
  atomic_long done;         /* Survivors that rejoined into it. */
  atomic_long last_done_us; /* Since t0, of the latest survivor to finish. */
  double t0_ms;
  struct latencies lat;
};

static void record(struct latencies *lat, double ms) {
  pthread_mutex_lock(&lat->lock);
  if (lat->n == lat->cap) {
    lat->cap = lat->cap ? lat->cap * 2 : 4096;
    lat->ms = realloc(lat->ms, lat->cap * sizeof(double));
  }
  lat->ms[lat->n++] = ms;
  pthread_mutex_unlock(&lat->lock);
}

static void start_call(struct h2_grpc *c, struct latencies *lat, const char *method,
                       const ProtobufCMessage *req, const ProtobufCMessageDescriptor *resp_desc,
                       uint64_t *ret_generation);
static void propagation_reply(struct pending *p, ProtobufCMessage *resp);

/* On a connection's thread: the reply, unpacked, or a failed call. */
static void call_done(void *arg, int status, const uint8_t *msg, size_t len) {
  struct pending *p = arg;
  ProtobufCMessage *resp = NULL;
  if (status == RPC_OK && !(resp = protobuf_c_message_unpack(p->resp_desc, NULL, len, msg)))
    status = RPC_INTERNAL;
  if (p->prop && status == RPC_OK) propagation_reply(p, resp);
  if (status != RPC_OK) {
    if (atomic_fetch_add(&p->lat->errors, 1) < 5)
      fprintf(stderr, "bench: call failed: %s\n",
              status < 0 ? "connection broke" : rpc_code_name(status));
  } else {
    record(p->lat, bench_now_ms() - p->start_ms);
    if (p->ret_generation) *p->ret_generation = ((Stoker__V1__JoinResponse *)resp)->generation;
  }
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  atomic_fetch_sub(&p->lat->outstanding, 1);
  free(p);
}

static void start_call_for(struct h2_grpc *c, struct latencies *lat, const char *method,
                           const ProtobufCMessage *req, const ProtobufCMessageDescriptor *resp_desc,
                           uint64_t *ret_generation, struct propagation *prop, uint32_t rank) {
  struct pending *p = calloc(1, sizeof(*p));
  p->lat = lat;
  p->resp_desc = resp_desc;
  p->start_ms = bench_now_ms();
  p->ret_generation = ret_generation;
  p->prop = prop;
  p->rank = rank;
  atomic_fetch_add(&lat->outstanding, 1);
  /* No call has a deadline: Joins wait for the round (the job's
   * join_timeout_ms bounds them), so the server arms no timer per call. */
  if (h2_grpc_call(c, method, req, call_done, p) != 0) {
    atomic_fetch_add(&lat->errors, 1);
    atomic_fetch_sub(&lat->outstanding, 1);
    free(p);
  }
}

static void start_call(struct h2_grpc *c, struct latencies *lat, const char *method,
                       const ProtobufCMessage *req, const ProtobufCMessageDescriptor *resp_desc,
                       uint64_t *ret_generation) {
  start_call_for(c, lat, method, req, resp_desc, ret_generation, NULL, 0);
}

/* On a client completion thread: a heartbeat that says rejoin starts the
 * rank's Join; a Join's reply with a newer generation finishes the rank. */
static void propagation_reply(struct pending *p, ProtobufCMessage *resp) {
  struct propagation *pr = p->prop;
  uint32_t r = p->rank;
  if (resp->descriptor == &stoker__v1__heartbeat_response__descriptor) {
    Stoker__V1__HeartbeatResponse *hb = (Stoker__V1__HeartbeatResponse *)resp;
    bool told = hb->action == STOKER__V1__HEARTBEAT_ACTION__HEARTBEAT_ACTION_RESTART ||
                hb->generation != pr->old_generation;
    unsigned char hb_state = RANK_HB;
    if (!told || !atomic_compare_exchange_strong(&pr->state[r], &hb_state, RANK_JOINING)) return;
    atomic_store(&pr->last_told_us, (long)((bench_now_ms() - pr->t0_ms) * 1e3));
    atomic_fetch_add(&pr->told, 1);
    Stoker__V1__JoinRequest jr = STOKER__V1__JOIN_REQUEST__INIT;
    jr.job = (char *)pr->job;
    jr.host = "bench";
    jr.member_id = pr->members[r];
    jr.address = pr->members[r];
    start_call_for(pr->conns[r % CHANNELS], &pr->lat,
                   RPC_METHOD_PATH(stoker__v1__coordinator, join, &jr), &jr.base,
                   &stoker__v1__join_response__descriptor, NULL, pr, r);
  } else if (resp->descriptor == &stoker__v1__join_response__descriptor) {
    uint64_t gen = ((Stoker__V1__JoinResponse *)resp)->generation;
    if (gen <= pr->old_generation) return;
    pr->generation[r] = gen;
    atomic_store(&pr->state[r], RANK_DONE);
    atomic_store(&pr->last_done_us, (long)((bench_now_ms() - pr->t0_ms) * 1e3));
    atomic_fetch_add(&pr->done, 1);
  }
}

static void wait_outstanding(struct latencies *lat) {
  while (atomic_load(&lat->outstanding) > 0) {
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
  }
}

static void sleep_until(double t_ms) {
  double d = t_ms - bench_now_ms();
  if (d <= 0) return;
  struct timespec ts = {(time_t)(d / 1e3), (long)((d - (time_t)(d / 1e3) * 1e3) * 1e6)};
  nanosleep(&ts, NULL);
}

/* Open-loop pacing with a slack of TICK_MS: a call goes out up to TICK_MS
 * before it is due, so the calls due within a millisecond leave together
 * and the connection threads wake about once per millisecond rather than
 * once per call (at 10,000/s, a tenth as often). The rate is unchanged; a
 * call's latency is measured from when it is sent. */
#define TICK_MS 1.0

static void sleep_until_tick(double t_ms) {
  double now = bench_now_ms();
  if (t_ms - now >= TICK_MS) sleep_until(t_ms - TICK_MS);
}

/* The machine's CPU time from /proc/stat: the share stolen by the
 * hypervisor shows how noisy a window was (zero where unknown). */
struct cpu_times {
  unsigned long long total, steal;
};

static struct cpu_times read_cpu_times(void) {
  struct cpu_times t = {0};
  FILE *f = fopen("/proc/stat", "r");
  if (!f) return t;
  unsigned long long v[8] = {0};
  if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4],
             &v[5], &v[6], &v[7]) == 8) {
    for (int i = 0; i < 8; i++) t.total += v[i];
    t.steal = v[7];
  }
  fclose(f);
  return t;
}

static double steal_pct(const struct cpu_times *a, const struct cpu_times *b) {
  unsigned long long total = b->total - a->total;
  return total ? 100.0 * (double)(b->steal - a->steal) / (double)total : 0;
}

static int create_job(struct rpc_client *c, const char *name, uint32_t ranks, uint32_t hb_ms) {
  Stoker__V1__JobSpec spec = STOKER__V1__JOB_SPEC__INIT;
  spec.name = (char *)name;
  spec.min_ranks = ranks - 1; /* The round after one loss closes without it. */
  spec.max_ranks = ranks;
  spec.heartbeat_interval_ms = hb_ms;
  spec.heartbeat_misses = 3;
  spec.last_call_ms = LAST_CALL_MS;
  spec.join_timeout_ms = CALL_TIMEOUT_MS;
  Stoker__V1__CreateJobRequest req = STOKER__V1__CREATE_JOB_REQUEST__INIT;
  req.spec = &spec;
  ProtobufCMessage *resp = NULL;
  struct rpc_status st;
  int err = rpc_client_unary(c, RPC_METHOD_PATH(stoker__v1__coordinator, create_job, &req),
                             &req.base, &stoker__v1__job__descriptor, 10000, &resp, &st);
  if (err) fprintf(stderr, "bench: CreateJob: %s\n", st.message);
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  return err;
}

/* The coordinator's process figures (BENCH_COORD_PID); zero without. */
static FILE *coord_proc_open(const char *name) {
  const char *pid = getenv("BENCH_COORD_PID");
  char path[64];
  if (!pid) return NULL;
  snprintf(path, sizeof(path), "/proc/%s/%s", pid, name);
  return fopen(path, "r");
}

static double coord_cpu_s(void) {
  char buf[1024];
  FILE *f = coord_proc_open("stat");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')');
  unsigned long long ut = 0, st = 0;
  if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
    return 0;
  return (double)(ut + st) / 100.0; /* USER_HZ */
}

static double coord_rss_bytes(void) {
  char line[256];
  FILE *f = coord_proc_open("status");
  if (!f) return 0;
  double kb = 0;
  while (fgets(line, sizeof(line), f))
    if (sscanf(line, "VmRSS: %lf", &kb) == 1) break;
  fclose(f);
  return kb * 1024;
}

static double self_cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec / 1e6;
}

/* Health Check round trips, one at a time: the baseline latency. */
static void measure_baseline(struct h2_grpc *c, struct latencies *lat, int calls) {
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  req.service = "";
  for (int i = 0; i < calls; i++) {
    start_call(c, lat, RPC_METHOD_PATH(grpc__health__v1__health, check, &req), &req.base,
               &grpc__health__v1__health_check_response__descriptor, NULL);
    wait_outstanding(lat);
  }
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s ADDR RANKS [HEARTBEAT_INTERVAL_MS] [SECONDS] [ROUNDS]\n", argv[0]);
    return 1;
  }
  const char *addr = argv[1];
  uint32_t ranks = (uint32_t)strtoul(argv[2], NULL, 10);
  if (ranks < 2) {
    fprintf(stderr, "bench: RANKS must be at least 2\n");
    return 1;
  }
  uint32_t hb_ms = argc > 3 ? (uint32_t)strtoul(argv[3], NULL, 10) : 5000;
  double seconds = argc > 4 ? strtod(argv[4], NULL) : 10;
  int rounds = argc > 5 ? atoi(argv[5]) : 3;
  if (rounds < 1 || seconds <= 0) {
    fprintf(stderr, "bench: SECONDS and ROUNDS must be positive\n");
    return 1;
  }

  struct rpc_client *admin; /* CreateJob and Leave. */
  struct rpc_client_opts o = {.target = addr};
  if (rpc_client_new(&o, &admin) != 0) {
    fprintf(stderr, "bench: cannot connect to %s\n", addr);
    return 1;
  }
  struct h2_grpc *clients[CHANNELS];
  for (int i = 0; i < CHANNELS; i++)
    if (h2_grpc_connect(addr, &clients[i]) != 0) return 1;
  char job[64];
  snprintf(job, sizeof(job), "bench-%" PRIu32 "-%ld", ranks, (long)time(NULL));
  if (create_job(admin, job, ranks, hb_ms) != 0) return 1;

  if (getenv("BENCH_COORD_PID")) sleep_until(bench_now_ms() + MEMORY_SETTLE_MS);
  double rss_before = coord_rss_bytes();
  /* Rendezvous: N concurrent Joins, all answered when the round closes. */
  struct latencies join_lat = {.lock = PTHREAD_MUTEX_INITIALIZER};
  uint64_t *generation = calloc(ranks, sizeof(uint64_t));
  char **members = calloc(ranks, sizeof(char *));
  Stoker__V1__JoinRequest jr = STOKER__V1__JOIN_REQUEST__INIT;
  jr.job = job;
  jr.host = "bench";
  double t0 = bench_now_ms(), rdv_coord_cpu = coord_cpu_s(), rdv_self_cpu = self_cpu_s();
  for (uint32_t r = 0; r < ranks; r++) {
    members[r] = malloc(32);
    snprintf(members[r], 32, "rank-%" PRIu32, r);
    jr.member_id = members[r];
    jr.address = members[r];
    start_call(clients[r % CHANNELS], &join_lat,
               RPC_METHOD_PATH(stoker__v1__coordinator, join, &jr), &jr.base,
               &stoker__v1__join_response__descriptor, &generation[r]);
  }
  wait_outstanding(&join_lat);
  double rendezvous_s = (bench_now_ms() - t0) / 1e3;
  rdv_coord_cpu = coord_cpu_s() - rdv_coord_cpu;
  rdv_self_cpu = self_cpu_s() - rdv_self_cpu;
  if (atomic_load(&join_lat.errors) > 0) return 1;

  /* Heartbeats, open loop: rank r at offsets r * interval / N in each
   * interval, without pause, for a settling second and then `rounds`
   * windows of `seconds`. Each call counts in the window it was sent in. */
  struct latencies warm_lat = {.lock = PTHREAD_MUTEX_INITIALIZER};
  struct latencies *round_lat = calloc(rounds, sizeof(*round_lat));
  double *round_steal = calloc(rounds, sizeof(double));
  for (int i = 0; i < rounds; i++) pthread_mutex_init(&round_lat[i].lock, NULL);
  Stoker__V1__HeartbeatRequest hr = STOKER__V1__HEARTBEAT_REQUEST__INIT;
  hr.job = job;
  hr.health = STOKER__V1__RANK_HEALTH__RANK_HEALTH_OK;
  double start = bench_now_ms(), gap_ms = (double)hb_ms / ranks;
  double window_ms = seconds * 1e3, end_ms = SETTLE_MS + rounds * window_ms;
  struct cpu_times window_cpu = {0};
  double coord_cpu_start = 0, self_cpu_start = 0;
  int window = -1;
  uint64_t sent = 0;
  for (;;) {
    double due = (double)sent * gap_ms;
    if (due >= end_ms) break;
    sleep_until_tick(start + due);
    int w = due < SETTLE_MS ? -1 : (int)((due - SETTLE_MS) / window_ms);
    if (w != window) { /* A window begins: close the steal figure of the last. */
      struct cpu_times now = read_cpu_times();
      if (window >= 0) round_steal[window] = steal_pct(&window_cpu, &now);
      window_cpu = now;
      if (window < 0) {
        coord_cpu_start = coord_cpu_s();
        self_cpu_start = self_cpu_s();
      }
      window = w;
    }
    uint32_t r = (uint32_t)(sent % ranks);
    hr.member_id = members[r];
    hr.generation = generation[r];
    hr.step = sent / ranks;
    hr.tokens_per_s = 1000;
    start_call(clients[r % CHANNELS], w < 0 ? &warm_lat : &round_lat[w],
               RPC_METHOD_PATH(stoker__v1__coordinator, heartbeat, &hr), &hr.base,
               &stoker__v1__heartbeat_response__descriptor, NULL);
    sent++;
  }
  struct cpu_times end_cpu = read_cpu_times();
  round_steal[rounds - 1] = steal_pct(&window_cpu, &end_cpu);
  double coord_cpu_hb = coord_cpu_s() - coord_cpu_start,
         self_cpu_hb = self_cpu_s() - self_cpu_start;
  double rss_after = coord_rss_bytes();
  wait_outstanding(&warm_lat);
  struct latencies all_lat = {.lock = PTHREAD_MUTEX_INITIALIZER};
  long hb_errors = atomic_load(&warm_lat.errors);
  double *round_p50 = calloc(rounds, sizeof(double)), *round_p99 = calloc(rounds, sizeof(double));
  for (int i = 0; i < rounds; i++) {
    wait_outstanding(&round_lat[i]);
    hb_errors += atomic_load(&round_lat[i].errors);
    for (size_t k = 0; k < round_lat[i].n; k++) record(&all_lat, round_lat[i].ms[k]);
    round_p50[i] = bench_quantile_sort(round_lat[i].ms, round_lat[i].n, 0.50);
    round_p99[i] = bench_quantile_sort(round_lat[i].ms, round_lat[i].n, 0.99);
    fprintf(stderr,
            "bench: %" PRIu32 " ranks, window %d: %zu heartbeats, p50 %.3f ms, p99 %.3f ms, "
            "steal %.1f%%\n",
            ranks, i + 1, round_lat[i].n, round_p50[i], round_p99[i], round_steal[i]);
  }
  double elapsed_s = (bench_now_ms() - start - SETTLE_MS) / 1e3;

  /* Saturation: keep 256 heartbeats in flight for a while; the rate the
   * coordinator sustains with no pacing is its headroom over the target. */
  struct latencies sat_lat = {.lock = PTHREAD_MUTEX_INITIALIZER};
  double sat_start = bench_now_ms();
  for (uint64_t i = 0; bench_now_ms() - sat_start < 3000; i++) {
    while (atomic_load(&sat_lat.outstanding) >= 256) sleep_until(bench_now_ms() + 0.05);
    uint32_t r = (uint32_t)(i % ranks);
    hr.member_id = members[r];
    hr.generation = generation[r];
    start_call(clients[r % CHANNELS], &sat_lat,
               RPC_METHOD_PATH(stoker__v1__coordinator, heartbeat, &hr), &hr.base,
               &stoker__v1__heartbeat_response__descriptor, NULL);
  }
  wait_outstanding(&sat_lat);
  double max_per_s = (double)sat_lat.n / ((bench_now_ms() - sat_start) / 1e3);

  /* Propagation: rank 0 leaves; the others keep heartbeating on schedule
   * until each has rejoined and holds the new generation. */
  struct propagation prop = {.conns = clients,
                             .members = members,
                             .job = job,
                             .old_generation = generation[1],
                             .generation = generation,
                             .lat = {.lock = PTHREAD_MUTEX_INITIALIZER}};
  prop.state = calloc(ranks, sizeof(*prop.state));
  prop.state[0] = RANK_DONE;
  Stoker__V1__LeaveRequest lr = STOKER__V1__LEAVE_REQUEST__INIT;
  lr.job = job;
  lr.member_id = members[0];
  lr.generation = generation[0];
  ProtobufCMessage *lresp = NULL;
  struct rpc_status lst;
  if (rpc_client_unary(admin, RPC_METHOD_PATH(stoker__v1__coordinator, leave, &lr), &lr.base,
                       &stoker__v1__empty__descriptor, 10000, &lresp, &lst) != 0) {
    fprintf(stderr, "bench: Leave: %s\n", lst.message);
    return 1;
  }
  if (lresp) protobuf_c_message_free_unpacked(lresp, NULL);
  struct latencies prop_hb_lat = {.lock = PTHREAD_MUTEX_INITIALIZER};
  prop.t0_ms = bench_now_ms();
  double coord_cpu_prop = coord_cpu_s();
  for (uint64_t k = 0; atomic_load(&prop.done) < (long)ranks - 1; k++) {
    double due = (double)k * gap_ms;
    if (due >= PROPAGATION_LIMIT_MS) break;
    sleep_until_tick(prop.t0_ms + due);
    uint32_t r = (uint32_t)(k % ranks);
    if (atomic_load(&prop.state[r]) == RANK_JOINING || r == 0) continue;
    hr.member_id = members[r];
    hr.generation = generation[r];
    start_call_for(clients[r % CHANNELS], &prop_hb_lat,
                   RPC_METHOD_PATH(stoker__v1__coordinator, heartbeat, &hr), &hr.base,
                   &stoker__v1__heartbeat_response__descriptor, NULL, &prop, r);
  }
  coord_cpu_prop = coord_cpu_s() - coord_cpu_prop;
  wait_outstanding(&prop_hb_lat);
  wait_outstanding(&prop.lat);
  double propagation_s = atomic_load(&prop.told) == (long)ranks - 1
                             ? (double)atomic_load(&prop.last_told_us) / 1e6
                             : -1;
  double rejoin_s = atomic_load(&prop.done) == (long)ranks - 1
                        ? (double)atomic_load(&prop.last_done_us) / 1e6
                        : -1;
  fprintf(stderr,
          "bench: %" PRIu32 " ranks: rank 0 left; %ld survivors had the new generation, the "
          "last %.3f s after; %ld rejoined, the last %.3f s after; coordinator CPU %.2f s\n",
          ranks, atomic_load(&prop.told), propagation_s, atomic_load(&prop.done), rejoin_s,
          coord_cpu_prop);

  struct latencies base_lat = {.lock = PTHREAD_MUTEX_INITIALIZER};
  measure_baseline(clients[0], &base_lat, 2000);

  double p50 = bench_median(round_p50, rounds), p99 = bench_median(round_p99, rounds);
  double p99_all = bench_quantile_sort(all_lat.ms, all_lat.n, 0.99),
         steal = bench_median(round_steal, rounds);
  double b50 = bench_quantile_sort(base_lat.ms, base_lat.n, 0.50),
         b99 = bench_quantile_sort(base_lat.ms, base_lat.n, 0.99);
  printf("{\"bench\":\"coordinator\",\"ranks\":%" PRIu32 ",\"heartbeat_interval_ms\":%" PRIu32
         ",\"heartbeats\":%zu,\"errors\":%ld,\"heartbeats_per_s\":%.1f,\"target_per_s\":%.1f,\"max_"
         "heartbeats_per_s\":%.1f,"
         "\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"rendezvous_s\":%.3f,\"baseline_health_p50_ms\":%.3f,"
         "\"baseline_health_p99_ms\":%.3f,\"p50_ratio\":%.2f,\"p99_ratio\":%.2f,\"rounds\":%d,"
         "\"p99_all_ms\":%.3f,\"steal_pct\":%.1f,\"generation_propagation_s\":%.3f,"
         "\"rejoin_s\":%.3f,\"bytes_per_rank\":%.0f,\"coordinator_cpu_us_per_heartbeat\":%.1f,"
         "\"client_cpu_us_per_heartbeat\":%.1f,\"rendezvous_coordinator_cpu_s\":%.2f,"
         "\"rendezvous_client_cpu_s\":%.2f}\n",
         ranks, hb_ms, all_lat.n, hb_errors + atomic_load(&join_lat.errors),
         (double)all_lat.n / elapsed_s, ranks * 1000.0 / hb_ms, max_per_s, p50, p99, rendezvous_s,
         b50, b99, b50 > 0 ? p50 / b50 : 0, b99 > 0 ? p99 / b99 : 0, rounds, p99_all, steal,
         propagation_s, rejoin_s, (rss_after - rss_before) / ranks,
         all_lat.n ? coord_cpu_hb * 1e6 / (double)all_lat.n : 0,
         all_lat.n ? self_cpu_hb * 1e6 / (double)all_lat.n : 0, rdv_coord_cpu, rdv_self_cpu);

  for (uint32_t r = 0; r < ranks; r++) free(members[r]);
  free(members);
  free(generation);
  free(join_lat.ms);
  for (int i = 0; i < rounds; i++) free(round_lat[i].ms);
  free(round_lat);
  free(all_lat.ms);
  free(warm_lat.ms);
  free(round_steal);
  free(round_p50);
  free(round_p99);
  free(base_lat.ms);
  free(sat_lat.ms);
  free(prop_hb_lat.ms);
  free(prop.lat.ms);
  free((void *)prop.state);
  for (int i = 0; i < CHANNELS; i++) h2_grpc_close(clients[i]);
  rpc_client_free(admin);
  return 0;
}
