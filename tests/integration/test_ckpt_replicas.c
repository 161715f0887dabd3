/*
 * Three checkpoint replicas behind one address (issue 26, part 3), real
 * daemons: each started with --advertise-host 127.0.0.1 --shared-storage
 * over one file:// store, each with its own journal. The ranks know only
 * one address, the gRPC target "ipv4:127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3"
 * (what a headless Service's name resolving to three A records gives the
 * client: one channel, round robin over the addresses; only the resolver
 * differs, static here instead of DNS). Begin lands on any replica, whose
 * answer names it as the attempt's owner; every rank's writes and the
 * commit follow the handle ("ID@OWNER") to it; List and restores go to any
 * replica. Proved here:
 * - jobs spread over the replicas, save and restore bit-exact, every
 *   replica lists every checkpoint, and a committed step is refused to a
 *   Begin on every replica (no second attempt of a step);
 * - a replica drained (SIGTERM) mid-attempt refuses Begin (UNAVAILABLE,
 *   "draining"), takes the rest of its attempt's writes and the commit,
 *   then exits; nothing committed is lost and the job's next checkpoints
 *   go to the others;
 * - a replica killed (SIGKILL) mid-attempt loses that attempt (no replica
 *   lists or serves it), the job's next attempt of the same step commits
 *   on another replica, and both checkpoints restore bit-exact.
 * argv: stoker-checkpoint.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "stk_error.h"
#include "stoker/v1/checkpoint.pb-c.h"
#include "stoker_ckpt.h"
#include "test_ckpt_helpers.h"
#include "test_ckpt_shard.h"

#define N     3
#define WORLD 2
#define ROWS  3
#define COLS  65536 /* f32: 256 KiB rows. */
#define BLOB  777

static uint8_t byte_at(int64_t step, int tensor, uint64_t i) {
  uint64_t x = (i + 3) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(step * 1231 + tensor * 17);
  return (uint8_t)(x >> 29);
}

static const struct tck_model model = {ROWS, COLS, BLOB, byte_at};

struct group {
  char store[256]; /* Shared file:// storage root. */
  char url[300];
  struct harness_daemon *d[N];
  char one[3 * 40 + 8]; /* The one address. */
};

static struct group g;

static int group_setup(void **state) {
  (void)state;
  memset(&g, 0, sizeof(g));
  if (harness_tmpdir_new(g.store, sizeof(g.store)) != 0) return -1;
  snprintf(g.url, sizeof(g.url), "file://%s", g.store);
  const char *args[] = {
      "--storage", g.url, "--advertise-host", "127.0.0.1", "--shared-storage", "--shutdown-grace",
      "20s",       NULL};
  size_t at = 0;
  at += (size_t)snprintf(g.one, sizeof(g.one), "ipv4:");
  for (int i = 0; i < N; i++) {
    if (!(g.d[i] = harness_daemon_start(args))) return -1;
    at += (size_t)snprintf(g.one + at, sizeof(g.one) - at, "%s%s", i ? "," : "", g.d[i]->addr);
  }
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  for (int i = 0; i < N; i++) harness_daemon_free(g.d[i]);
  harness_tmpdir_remove(g.store);
  return 0;
}

/* The replica index a handle's owner names; -1 when none. */
static int owner_of(const char *handle) {
  const char *at = strchr(handle, '@');
  for (int i = 0; at && i < N; i++)
    if (strcmp(at + 1, g.d[i]->addr) == 0) return i;
  return -1;
}

struct rank_job {
  struct stk_client *c;
  const char *handle;
  int64_t step;
  uint32_t rank;
  int err;
  char msg[256]; /* The save's error (the thread's last error). */
};

static void *rank_save(void *arg) {
  struct rank_job *r = arg;
  struct tck_shard s;
  tck_shard_init(&s, &model, r->step, r->rank, WORLD);
  uint64_t bytes = 0;
  r->err = stk_ckpt_save(r->c, r->handle, r->rank, s.t, 2, &bytes);
  if (r->err) snprintf(r->msg, sizeof(r->msg), "%s", stk_client_last_error(NULL));
  tck_shard_free(&s);
  return NULL;
}

/* Rank rank saves its shard of step with its own client on the one
 * address; returns the save's error (its message in ret_msg, 256 bytes,
 * when not NULL). */
static int save_rank(const char *handle, int64_t step, uint32_t rank, char *ret_msg) {
  struct stk_client *c = tck_shard_client(g.one);
  struct rank_job r = {.c = c, .handle = handle, .step = step, .rank = rank};
  rank_save(&r);
  stk_client_free(c);
  if (ret_msg) snprintf(ret_msg, 256, "%s", r.msg);
  return r.err;
}

/* Every rank of step (threads, each its own client on the one address),
 * then the commit; the handle in ret_handle. */
static void save_ok(struct stk_client *c, const char *job, int64_t step, char *ret_handle) {
  assert_int_equal(stk_ckpt_begin(c, job, step, WORLD, 0, ret_handle), 0);
  pthread_t th[WORLD];
  struct rank_job r[WORLD];
  for (uint32_t i = 0; i < WORLD; i++) {
    r[i] = (struct rank_job){
        .c = tck_shard_client(g.one), .handle = ret_handle, .step = step, .rank = i};
    assert_int_equal(pthread_create(&th[i], NULL, rank_save, &r[i]), 0);
  }
  for (uint32_t i = 0; i < WORLD; i++) {
    pthread_join(th[i], NULL);
    stk_client_free(r[i].c);
    if (r[i].err) fail_msg("rank %u of %s step %lld: %s", i, job, (long long)step, r[i].msg);
  }
  struct stk_ckpt_ref ref;
  if (stk_ckpt_commit(c, ret_handle, 0, &ref) != 0)
    fail_msg("commit %s: %s", ret_handle, stk_client_last_error(NULL));
  assert_int_equal(ref.step, step);
}

/* Whether replica i lists exactly the steps want[0..n) of job. */
static void lists(int i, const char *job, const int64_t *want, int n) {
  struct rpc_client *rc = harness_rpc(g.d[i]);
  int64_t steps[8];
  int got = tck_list(rc, job, steps, 8);
  rpc_client_free(rc);
  if (got != n) fail_msg("replica %d lists %d steps of %s, wanted %d", i, got, job, n);
  for (int k = 0; k < n; k++) assert_int_equal(steps[k], want[k]);
}

static void test_spread_save_restore(void **state) {
  (void)state;
  struct stk_client *c = tck_shard_client(g.one);
  int per[N] = {0};
  char job[32], handle[STK_CKPT_ATTEMPT_MAX];
  for (int j = 0; j < 6; j++) {
    snprintf(job, sizeof(job), "spread-%d", j);
    save_ok(c, job, 10, handle);
    int o = owner_of(handle);
    if (o < 0) fail_msg("handle %s names no replica", handle);
    per[o]++;
  }
  int used = 0;
  for (int i = 0; i < N; i++) used += per[i] > 0;
  if (used < 2) fail_msg("6 jobs all began on one replica (%d %d %d)", per[0], per[1], per[2]);
  /* A committed step is refused by every replica, not begun again (first:
   * before anything else made the replicas look at the job). */
  for (int i = 0; i < N; i++) {
    struct stk_client *one = tck_shard_client(g.d[i]->addr);
    assert_int_equal(stk_ckpt_begin(one, "spread-0", 10, WORLD, 0, handle), STK_EEXIST);
    stk_client_free(one);
  }
  /* Restores through the one address (any replica serves them, the
   * others know the checkpoints from storage alone), at the same world and
   * resharded; then every replica lists each. */
  for (int j = 0; j < 6; j++) {
    snprintf(job, sizeof(job), "spread-%d", j);
    tck_shard_restore_all(c, &model, job, 10, WORLD, WORLD);
    tck_shard_restore_all(c, &model, job, 10, 3, WORLD);
    for (int i = 0; i < N; i++) lists(i, job, (const int64_t[]){10}, 1);
  }
  stk_client_free(c);
}

struct term_job {
  struct harness_daemon *d;
  int rc, status;
};

static void *term_thread(void *arg) {
  struct term_job *t = arg;
  t->rc = harness_daemon_term(t->d, 30000, &t->status);
  return NULL;
}

static void test_drain_mid_attempt(void **state) {
  (void)state;
  struct stk_client *c = tck_shard_client(g.one);
  char h1[STK_CKPT_ATTEMPT_MAX], h2[STK_CKPT_ATTEMPT_MAX], h3[STK_CKPT_ATTEMPT_MAX];
  save_ok(c, "drain", 1, h1);
  int x = owner_of(h1);
  assert_true(x >= 0);
  /* Step 2 begun on the same replica (set up by its own address), one rank
   * written, then the replica is told to leave. */
  struct stk_client *cx = tck_shard_client(g.d[x]->addr);
  assert_int_equal(stk_ckpt_begin(cx, "drain", 2, WORLD, 0, h2), 0);
  assert_int_equal(owner_of(h2), x);
  assert_int_equal(save_rank(h2, 2, 0, NULL), 0);
  struct term_job t = {.d = g.d[x]};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, term_thread, &t), 0);
  /* Draining (health NOT_SERVING from the signal on): Begin refused with
   * UNAVAILABLE naming the drain. */
  assert_int_equal(harness_health_becomes(cx, STK_NOT_SERVING, 10000), STK_NOT_SERVING);
  int code = 0;
  char scratch[STK_CKPT_ATTEMPT_MAX];
  assert_int_equal(stk_ckpt_begin(cx, "drain-other", 1, WORLD, 500, scratch), STK_EUNAVAIL);
  const char *why = stk_client_last_error(&code);
  assert_int_equal(code, 14);
  if (!strstr(why, "draining")) fail_msg("refusal: %s", why);
  assert_true(harness_daemon_alive(g.d[x])); /* Held by the open attempt. */
  /* The attempt it holds still takes its last rank and commits. */
  char msg[256];
  if (save_rank(h2, 2, 1, msg) != 0) fail_msg("rank 1 on the draining replica: %s", msg);
  struct stk_ckpt_ref ref;
  if (stk_ckpt_commit(c, h2, 0, &ref) != 0)
    fail_msg("commit on the draining replica: %s", stk_client_last_error(NULL));
  pthread_join(th, NULL);
  assert_int_equal(t.rc, 0);
  assert_int_equal(t.status, 0);
  stk_client_free(cx);
  /* The next checkpoints go to the others; nothing committed is lost. */
  for (int64_t step = 3; step <= 4; step++) {
    save_ok(c, "drain", step, h3);
    int o = owner_of(h3);
    if (o < 0 || o == x) fail_msg("step %lld began on %d (drained: %d)", (long long)step, o, x);
  }
  for (int i = 0; i < N; i++)
    if (i != x) lists(i, "drain", (const int64_t[]){1, 2, 3, 4}, 4);
  for (int64_t step = 1; step <= 4; step++)
    tck_shard_restore_all(c, &model, "drain", step, WORLD, WORLD);
  stk_client_free(c);
}

static void test_kill_mid_attempt(void **state) {
  (void)state;
  struct stk_client *c = tck_shard_client(g.one);
  char h1[STK_CKPT_ATTEMPT_MAX], h2[STK_CKPT_ATTEMPT_MAX], h3[STK_CKPT_ATTEMPT_MAX];
  save_ok(c, "kill", 1, h1);
  int z = (owner_of(h1) + 1) % N; /* Step 2's attempt on another replica than step 1's. */
  struct stk_client *cz = tck_shard_client(g.d[z]->addr);
  assert_int_equal(stk_ckpt_begin(cz, "kill", 2, WORLD, 0, h2), 0);
  stk_client_free(cz);
  assert_int_equal(save_rank(h2, 2, 0, NULL), 0); /* Staged on z. */
  harness_daemon_kill(g.d[z]);
  /* The attempt is lost: its last rank and its commit fail, and no
   * replica lists or serves step 2. */
  assert_int_not_equal(save_rank(h2, 2, 1, NULL), 0);
  struct stk_ckpt_ref ref;
  assert_int_not_equal(stk_ckpt_commit(c, h2, 5000, &ref), 0);
  for (int i = 0; i < N; i++) {
    if (i == z) continue;
    lists(i, "kill", (const int64_t[]){1}, 1);
    struct rpc_client *rc = harness_rpc(g.d[i]);
    assert_int_equal(tck_read_rank(rc, "kill", 2, 0, WORLD, WORLD, NULL, 0), RPC_NOT_FOUND);
    rpc_client_free(rc);
  }
  /* The job's next attempt of the step commits on another replica. */
  save_ok(c, "kill", 2, h3);
  int o = owner_of(h3);
  if (o < 0 || o == z) fail_msg("the retry began on %d (killed: %d)", o, z);
  for (int i = 0; i < N; i++)
    if (i != z) lists(i, "kill", (const int64_t[]){1, 2}, 2);
  tck_shard_restore_all(c, &model, "kill", 1, WORLD, WORLD);
  tck_shard_restore_all(c, &model, "kill", 2, WORLD, WORLD);
  tck_shard_restore_all(c, &model, "kill", 2, 1, WORLD);
  stk_client_free(c);
}

int main(int argc, char **argv) {
  if (harness_init(argc, argv) != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_spread_save_restore, group_setup, group_teardown),
      cmocka_unit_test_setup_teardown(test_drain_mid_attempt, group_setup, group_teardown),
      cmocka_unit_test_setup_teardown(test_kill_mid_attempt, group_setup, group_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
