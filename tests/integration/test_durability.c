/*
 * Crash safety of the real daemon: kill -9 in the middle of a rendezvous
 * and restart on the same data directory (and port) keeps the job, its
 * generation, spec, KV of a running generation and latest checkpoint, and
 * the parked joiners (the client retries UNAVAILABLE) complete the round
 * after the restart. Then a loop of kills at random delays while a client
 * issues CreateJob, KvSet and ReportCheckpoint: every change acknowledged
 * before a kill is there after the restart.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "harness.h"
#include "ranks.h"

static int setup(void **state) {
  *state = harness_daemon_start(NULL);
  return *state ? 0 : -1;
}

static int teardown(void **state) {
  harness_daemon_free(*state);
  return 0;
}

static int64_t unix_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Polls GetJob until `waiting` joins are parked. */
static void wait_parked(struct stk_client *op, const char *name, uint32_t waiting) {
  int64_t deadline = harness_now_ms() + 10000;
  for (;;) {
    Stoker__V1__Job *job = harness_get_job(op, name);
    assert_non_null(job);
    uint32_t w = job->waiting;
    protobuf_c_message_free_unpacked(&job->base, NULL);
    if (w == waiting) return;
    assert_true(harness_now_ms() < deadline);
    harness_sleep_ms(20);
  }
}

static void test_kill_mid_rendezvous(void **state) {
  struct harness_daemon *d = *state;
  struct stk_client *op = ranks_operator(d, "mid", 3, 3, 200, 300);
  assert_int_equal(stk_report_checkpoint(op, "mid", 100, "file:///ckpt/100"), 0);
  Stoker__V1__Job *before = harness_get_job(op, "mid");
  assert_non_null(before);
  struct rank r[3];
  assert_int_equal(ranks_new(r, 3, d, "mid", "w"), 0);
  ranks_join_start(r, 2, 30000);
  wait_parked(op, "mid", 2);

  harness_daemon_kill(d);
  assert_int_equal(harness_daemon_restart(d), 0);

  Stoker__V1__Job *after = harness_get_job(op, "mid");
  assert_non_null(after);
  assert_int_equal(after->state, STOKER__V1__JOB_STATE__JOB_STATE_WAITING);
  assert_int_equal(after->generation, before->generation);
  assert_int_equal(after->spec->min_ranks, 3);
  assert_int_equal(after->spec->max_ranks, 3);
  assert_int_equal(after->spec->heartbeat_interval_ms, 200);
  assert_int_equal(after->spec->last_call_ms, 300);
  assert_int_equal(after->created_at_ms, before->created_at_ms);
  assert_non_null(after->latest_checkpoint);
  assert_int_equal(after->latest_checkpoint->step, 100);
  assert_string_equal(after->latest_checkpoint->uri, "file:///ckpt/100");
  protobuf_c_message_free_unpacked(&after->base, NULL);

  /* The parked joiners retry; with the third the round closes. */
  ranks_join_start(&r[2], 1, 30000);
  assert_int_equal(ranks_join_wait(r, 3), 0);
  bool seen[3] = {false};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(r[i].m.generation, before->generation);
    assert_int_equal(r[i].m.world_size, 3);
    assert_int_equal(r[i].m.checkpoint_step, 100);
    assert_false(seen[r[i].m.rank]);
    seen[r[i].m.rank] = true;
  }
  protobuf_c_message_free_unpacked(&before->base, NULL);
  ranks_free(r, 3);
  stk_client_free(op);
}

/* Killed while the last-call window is open (min reached, max not):
 * after the restart the two joiners retry and the round closes with them. */
static void test_kill_during_last_call(void **state) {
  struct harness_daemon *d = *state;
  struct stk_client *op = ranks_operator(d, "lastcall", 2, 3, 200, 1500);
  Stoker__V1__Job *before = harness_get_job(op, "lastcall");
  assert_non_null(before);
  struct rank r[2];
  assert_int_equal(ranks_new(r, 2, d, "lastcall", "w"), 0);
  ranks_join_start(r, 2, 30000);
  wait_parked(op, "lastcall", 2);
  harness_daemon_kill(d);
  assert_int_equal(harness_daemon_restart(d), 0);
  assert_int_equal(ranks_join_wait(r, 2), 0);
  assert_int_equal(r[0].m.generation, before->generation);
  assert_int_equal(r[1].m.generation, before->generation);
  assert_int_equal(r[0].m.world_size, 2);
  assert_int_equal(r[0].m.rank + r[1].m.rank, 1);
  protobuf_c_message_free_unpacked(&before->base, NULL);
  ranks_free(r, 2);
  stk_client_free(op);
}

/* A RUNNING generation survives the crash: members, KV, checkpoint. */
static void test_kill_running_keeps_state(void **state) {
  struct harness_daemon *d = *state;
  struct stk_client *op = ranks_operator(d, "run", 2, 2, 1000, 300);
  struct rank r[2];
  ranks_form(r, 2, d, "run", "w", 30000);
  uint64_t gen = r[0].m.generation;
  assert_int_equal(stk_kv_set(r[0].client, "nccl-id", "id-7", 4, 5000), 0);
  assert_int_equal(stk_report_checkpoint(r[0].client, "run", 50, "file:///ckpt/50"), 0);

  harness_daemon_kill(d);
  int64_t restarted_ms = unix_ms();
  assert_int_equal(harness_daemon_restart(d), 0);

  struct stk_client *fresh = harness_client(d);
  Stoker__V1__Job *job = harness_get_job(fresh, "run");
  assert_non_null(job);
  assert_int_equal(job->state, STOKER__V1__JOB_STATE__JOB_STATE_RUNNING);
  assert_int_equal(job->generation, gen);
  assert_int_equal(job->n_members, 2);
  assert_non_null(job->latest_checkpoint);
  assert_int_equal(job->latest_checkpoint->step, 50);
  assert_int_equal(job->latest_checkpoint->generation, gen);
  protobuf_c_message_free_unpacked(&job->base, NULL);
  struct rpc_client *rc = harness_rpc(d);
  Stoker__V1__KvGetRequest get = STOKER__V1__KV_GET_REQUEST__INIT;
  get.job = "run";
  get.generation = gen;
  get.key = "nccl-id";
  ProtobufCMessage *resp = NULL;
  assert_int_equal(harness_call(rc, "KvGet", &get.base, &stoker__v1__kv_get_response__descriptor,
                                &resp, NULL, 0),
                   RPC_OK);
  Stoker__V1__KvGetResponse *kv = (Stoker__V1__KvGetResponse *)resp;
  assert_int_equal(kv->value.len, 4);
  assert_memory_equal(kv->value.data, "id-7", 4);
  protobuf_c_message_free_unpacked(resp, NULL);

  /* The ranks' heartbeats come back within the grace period and are
   * accepted in the same generation. */
  for (int64_t deadline = harness_now_ms() + 10000;; harness_sleep_ms(50)) {
    job = harness_get_job(fresh, "run");
    assert_non_null(job);
    assert_int_equal(job->generation, gen);
    assert_int_equal(job->state, STOKER__V1__JOB_STATE__JOB_STATE_RUNNING);
    assert_int_equal(job->n_members, 2);
    bool both = job->members[0]->last_heartbeat_ms > restarted_ms &&
                job->members[1]->last_heartbeat_ms > restarted_ms;
    protobuf_c_message_free_unpacked(&job->base, NULL);
    if (both) break;
    if (harness_now_ms() > deadline) fail_msg("no heartbeat from the ranks after the restart");
  }
  assert_int_equal(stk_poll_action(r[0].client), STK_ACTION_NONE);
  assert_int_equal(stk_poll_action(r[1].client), STK_ACTION_NONE);
  rpc_client_free(rc);
  stk_client_free(fresh);
  ranks_free(r, 2);
  stk_client_free(op);
}

/* ---- kill loop: acknowledged changes survive ---------------------------- */

#define MAX_OPS 100000

/* What the writer thread issued and which of it was acknowledged. */
struct writer {
  struct harness_daemon *d;
  uint64_t gen; /* Generation of job "loop" for KvSet. */
  pthread_mutex_t mu;
  bool stop;
  uint32_t acked[MAX_OPS]; /* Op numbers acknowledged, in order. */
  size_t n_acked;
  uint32_t next; /* Next op number. */
};

/* Op i: i % 3 == 0 creates job "acked-i", 1 sets KV "k-i" = "v-i" in
 * job "loop", 2 reports checkpoint step i of job "loop". */
static int issue(struct rpc_client *rc, struct writer *w, uint32_t i) {
  char name[64], val[64];
  if (i % 3 == 0) {
    Stoker__V1__JobSpec spec = STOKER__V1__JOB_SPEC__INIT;
    Stoker__V1__CreateJobRequest req = STOKER__V1__CREATE_JOB_REQUEST__INIT;
    snprintf(name, sizeof(name), "acked-%u", i);
    spec.name = name;
    spec.min_ranks = 1;
    spec.max_ranks = 1;
    req.spec = &spec;
    return harness_call(rc, "CreateJob", &req.base, &stoker__v1__job__descriptor, NULL, NULL, 0);
  }
  if (i % 3 == 1) {
    Stoker__V1__KvSetRequest req = STOKER__V1__KV_SET_REQUEST__INIT;
    snprintf(name, sizeof(name), "k-%u", i);
    int n = snprintf(val, sizeof(val), "v-%u", i);
    req.job = "loop";
    req.generation = w->gen;
    req.key = name;
    req.value.data = (uint8_t *)val;
    req.value.len = (size_t)n;
    return harness_call(rc, "KvSet", &req.base, &stoker__v1__empty__descriptor, NULL, NULL, 0);
  }
  Stoker__V1__ReportCheckpointRequest req = STOKER__V1__REPORT_CHECKPOINT_REQUEST__INIT;
  snprintf(val, sizeof(val), "file:///ckpt/%u", i);
  req.job = "loop";
  req.step = i;
  req.uri = val;
  return harness_call(rc, "ReportCheckpoint", &req.base, &stoker__v1__empty__descriptor, NULL, NULL,
                      0);
}

/* Issues ops one after another; a failed op (the daemon is down) is
 * retried under a new number, so every number is issued once. */
static void *writer_main(void *arg) {
  struct writer *w = arg;
  struct rpc_client *rc = harness_rpc(w->d);
  for (;;) {
    pthread_mutex_lock(&w->mu);
    bool stop = w->stop || w->n_acked == MAX_OPS;
    uint32_t i = w->next++;
    pthread_mutex_unlock(&w->mu);
    if (stop) break;
    if (issue(rc, w, i) == RPC_OK) {
      pthread_mutex_lock(&w->mu);
      w->acked[w->n_acked++] = i;
      pthread_mutex_unlock(&w->mu);
      harness_sleep_ms(1); /* Keeps the re-verification after each kill short. */
    } else {
      harness_sleep_ms(5);
    }
  }
  rpc_client_free(rc);
  return NULL;
}

/* The acknowledged job name is there. Only NOT_FOUND is a loss: a call that
 * ran out of time on a loaded machine is asked again, and any other answer
 * fails naming itself rather than posing as a loss. */
static void check_job_kept(struct stk_client *c, const char *name) {
  int err = STK_ETIMEDOUT;
  for (int attempt = 0; attempt < 3 && (err == STK_ETIMEDOUT || err == STK_EUNAVAIL); attempt++) {
    Stoker__V1__Job *job = NULL;
    err = stk_job_get(c, name, 10000, &job);
    if (job) protobuf_c_message_free_unpacked(&job->base, NULL);
  }
  if (err == STK_ENOENT) fail_msg("acknowledged CreateJob %s lost after kill -9", name);
  if (err != 0) fail_msg("GetJob %s after kill -9: %s", name, stk_strerror(err));
}

/* Every op in acked[0..n) is visible through a fresh client. */
static void verify_acked(struct harness_daemon *d, struct writer *w, size_t n) {
  struct rpc_client *rc = harness_rpc(d);
  struct stk_client *c = harness_client(d);
  uint32_t max_step = 0;
  for (size_t k = 0; k < n; k++) {
    uint32_t i = w->acked[k];
    char name[64], val[64];
    if (i % 3 == 0) {
      snprintf(name, sizeof(name), "acked-%u", i);
      check_job_kept(c, name);
    } else if (i % 3 == 1) {
      Stoker__V1__KvGetRequest req = STOKER__V1__KV_GET_REQUEST__INIT;
      snprintf(name, sizeof(name), "k-%u", i);
      int vn = snprintf(val, sizeof(val), "v-%u", i);
      req.job = "loop";
      req.generation = w->gen;
      req.key = name;
      ProtobufCMessage *resp = NULL;
      int code = RPC_DEADLINE_EXCEEDED;
      /* As check_job_kept: only NOT_FOUND is a loss; a call that ran out of
       * time on a loaded machine is asked again. */
      for (int attempt = 0;
           attempt < 3 && (code == RPC_DEADLINE_EXCEEDED || code == RPC_UNAVAILABLE); attempt++)
        code = harness_call(rc, "KvGet", &req.base, &stoker__v1__kv_get_response__descriptor, &resp,
                            NULL, 0);
      if (code == RPC_NOT_FOUND) fail_msg("acknowledged KvSet %s lost after kill -9", name);
      if (code != RPC_OK) fail_msg("KvGet %s after kill -9: status %d", name, code);
      Stoker__V1__KvGetResponse *kv = (Stoker__V1__KvGetResponse *)resp;
      assert_int_equal(kv->value.len, (size_t)vn);
      assert_memory_equal(kv->value.data, val, (size_t)vn);
      protobuf_c_message_free_unpacked(resp, NULL);
    } else if (i > max_step) {
      max_step = i;
    }
  }
  Stoker__V1__Job *job = harness_get_job(c, "loop");
  assert_non_null(job);
  assert_int_equal(job->generation, w->gen);
  if (max_step) {
    assert_non_null(job->latest_checkpoint);
    if (job->latest_checkpoint->step < (int64_t)max_step)
      fail_msg("acknowledged checkpoint step %u lost: latest is %lld", max_step,
               (long long)job->latest_checkpoint->step);
  }
  protobuf_c_message_free_unpacked(&job->base, NULL);
  stk_client_free(c);
  rpc_client_free(rc);
}

static void test_kill_loop_keeps_acked(void **state) {
  struct harness_daemon *d = *state;
  struct stk_client *op = harness_client(d);
  /* Long leases: the member must outlive every restart of the loop. */
  assert_int_equal(harness_create_job(op, "loop", 1, 1, 10000, 100), 0);
  struct rank r;
  ranks_form(&r, 1, d, "loop", "w", 30000);

  struct writer *w = calloc(1, sizeof(*w));
  w->d = d;
  w->gen = r.m.generation;
  pthread_mutex_init(&w->mu, NULL);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, writer_main, w), 0);
  unsigned seed = (unsigned)harness_now_ms();
  printf("kill loop seed %u\n", seed);
  size_t total = 0;
  for (int round = 0; round < 5; round++) {
    harness_sleep_ms(100 + rand_r(&seed) % 400);
    harness_daemon_kill(d);
    pthread_mutex_lock(&w->mu);
    size_t n = w->n_acked; /* Nothing can be acknowledged while it is dead. */
    pthread_mutex_unlock(&w->mu);
    assert_int_equal(harness_daemon_restart(d), 0);
    verify_acked(d, w, n);
    total = n;
  }
  pthread_mutex_lock(&w->mu);
  w->stop = true;
  pthread_mutex_unlock(&w->mu);
  pthread_join(t, NULL);
  printf("%zu acknowledged changes checked over 5 kills\n", total);
  assert_true(total > 10);
  pthread_mutex_destroy(&w->mu);
  free(w);
  ranks_free(&r, 1);
  stk_client_free(op);
}

int main(int argc, char **argv) {
  if (harness_init(argc, argv)) return 2;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_kill_mid_rendezvous, setup, teardown),
      cmocka_unit_test_setup_teardown(test_kill_during_last_call, setup, teardown),
      cmocka_unit_test_setup_teardown(test_kill_running_keeps_state, setup, teardown),
      cmocka_unit_test_setup_teardown(test_kill_loop_keeps_acked, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
