/*
 * Memory per rank against the real daemon (issue 26, part 4). A rendezvous
 * of N ranks holds N Joins open at once, about 14 KB each in gRPC; once the
 * round closed and the calls ended, the daemon must hold at most
 * MAX_BYTES_PER_RANK per rank more than before the Joins (RSS, as
 * `tests/bench/run coordinator` counts bytes_per_rank). Before the daemon
 * gave the freed pages back it held 13-14 KB per rank. The Joins go over
 * HTTP/2 with the coordinator bench's client (tests/bench/h2_grpc.c): one
 * connection carries thousands of pending calls, which libstoker-client
 * would need a thread each for. Not built where nghttp2 is missing, nor
 * under a sanitizer (its allocator keeps freed memory in quarantine).
 * And --write-buffer, the memtable's size (a bounded share of that memory),
 * reaches RocksDB: its OPTIONS file in the data directory says so.
 */
#include <dirent.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "h2_grpc.h"
#include "harness.h"
#include "ranks.h"

#define N                  10000
#define CONNS              4
#define MAX_BYTES_PER_RANK 4096.0 /* About 2,200 measured at 10,000 ranks; 14,000 before. */
#define JOIN_WAIT_MS       120000
#define TRIM_WAIT_MS       10000 /* The daemon trims within two seconds of the round's end. */

static atomic_long ok, failed;

static int setup(void **state) {
  struct harness_daemon *d = harness_daemon_start(NULL);
  if (!d) return -1;
  *state = d;
  return 0;
}

static int teardown(void **state) {
  harness_daemon_free(*state);
  return 0;
}

static double rss_bytes(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  double kb = 0;
  while (fgets(line, sizeof(line), f))
    if (sscanf(line, "VmRSS: %lf", &kb) == 1) break;
  fclose(f);
  return kb * 1024;
}

static int64_t now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000};
  nanosleep(&t, NULL);
}

static void joined(void *arg, int status, const uint8_t *msg, size_t len) {
  (void)arg;
  Stoker__V1__JoinResponse *r =
      status == 0 && msg ? stoker__v1__join_response__unpack(NULL, len, msg) : NULL;
  if (r && r->world_size == N)
    atomic_fetch_add(&ok, 1);
  else
    atomic_fetch_add(&failed, 1);
  if (r) stoker__v1__join_response__free_unpacked(r, NULL);
}

/* N concurrent Joins form one generation; afterwards the daemon holds at
 * most MAX_BYTES_PER_RANK per rank over what it held before them, and the
 * job still has every member. */
static void test_memory_per_rank_after_rendezvous(void **state) {
  struct harness_daemon *d = *state;
  /* A long interval: no lease ends while the test measures. */
  struct stk_client *op = ranks_operator(d, "mem", N, N, 60000, 1000);
  struct h2_grpc *conns[CONNS];
  for (int i = 0; i < CONNS; i++) assert_int_equal(h2_grpc_connect(d->addr, &conns[i]), 0);
  double before = rss_bytes(d->pid);
  assert_true(before > 0);

  static char ids[N][16];
  Stoker__V1__JoinRequest jr = STOKER__V1__JOIN_REQUEST__INIT;
  jr.job = "mem";
  jr.host = "localhost";
  for (int r = 0; r < N; r++) {
    snprintf(ids[r], sizeof(ids[r]), "rank-%d", r);
    jr.member_id = ids[r];
    jr.address = ids[r];
    assert_int_equal(
        h2_grpc_call(conns[r % CONNS], "/stoker.v1.Coordinator/Join", &jr.base, joined, NULL), 0);
  }
  int64_t until = now_ms() + JOIN_WAIT_MS;
  while (atomic_load(&ok) + atomic_load(&failed) < N && now_ms() < until) sleep_ms(20);
  assert_int_equal(atomic_load(&failed), 0);
  assert_int_equal(atomic_load(&ok), N);

  double per_rank = 0;
  until = now_ms() + TRIM_WAIT_MS;
  do {
    sleep_ms(200);
    per_rank = (rss_bytes(d->pid) - before) / N;
  } while (per_rank > MAX_BYTES_PER_RANK && now_ms() < until);
  print_message("coordinator RSS growth: %.0f bytes per rank (%d ranks)\n", per_rank, N);
  assert_true(per_rank <= MAX_BYTES_PER_RANK);

  Stoker__V1__Job *job = harness_get_job(op, "mem");
  assert_non_null(job);
  assert_int_equal(job->n_members, N);
  protobuf_c_message_free_unpacked(&job->base, NULL);
  for (int i = 0; i < CONNS; i++) h2_grpc_close(conns[i]);
  stk_client_free(op);
}

/* The write_buffer_size line of the newest OPTIONS file in dir (RocksDB
 * writes one at every open), or 0 when none. */
static long options_write_buffer(const char *dir) {
  DIR *dh = opendir(dir);
  if (!dh) return 0;
  char newest[256] = "";
  for (struct dirent *e; (e = readdir(dh));)
    if (!strncmp(e->d_name, "OPTIONS-", 8) && strlen(e->d_name) < sizeof(newest) &&
        (strlen(e->d_name) > strlen(newest) ||
         (strlen(e->d_name) == strlen(newest) && strcmp(e->d_name, newest) > 0)))
      snprintf(newest, sizeof(newest), "%s", e->d_name);
  closedir(dh);
  char path[600], line[512];
  snprintf(path, sizeof(path), "%s/%s", dir, newest);
  FILE *f = newest[0] ? fopen(path, "r") : NULL;
  long v = 0;
  while (f && fgets(line, sizeof(line), f))
    if (sscanf(line, " write_buffer_size=%ld", &v) == 1) break;
  if (f) fclose(f);
  return v;
}

/* --write-buffer sizes RocksDB's memtable: 16 MiB by default (RocksDB's
 * own is 64 MiB), 4 MiB when asked. */
static void test_write_buffer_flag(void **state) {
  (void)state;
  struct harness_daemon *d = harness_daemon_start(NULL);
  assert_non_null(d);
  assert_int_equal(options_write_buffer(d->data_dir), 16L << 20);
  harness_daemon_free(d);
  const char *const args[] = {"--write-buffer", "4MiB", NULL};
  d = harness_daemon_start(args);
  assert_non_null(d);
  assert_int_equal(options_write_buffer(d->data_dir), 4L << 20);
  harness_daemon_free(d);
}

int main(int argc, char **argv) {
  if (harness_init(argc, argv) != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_memory_per_rank_after_rendezvous, setup, teardown),
      cmocka_unit_test(test_write_buffer_flag),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
