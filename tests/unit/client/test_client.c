/*
 * libstoker-client against a scripted coordinator (fake_coord) over real
 * gRPC on loopback: Join retries UNAVAILABLE and gives up at its timeout,
 * the heartbeat thread carries stk_report figures and delivers actions
 * (callback and poll) and ends on RESTART, barriers map ABORTED, KV gets
 * park until set, server messages reach stk_client_last_error, watch
 * streams end, Leave stops heartbeats.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "fake_coord.h"
#include "stoker_admin.h"

struct env {
  struct fake_coord f;
  struct stk_client *c;
};

static int setup(void **state) {
  struct env *e = calloc(1, sizeof(*e));
  fake_start(&e->f);
  struct stk_client_opts o = {.address = e->f.server.addr, .default_timeout_ms = 5000};
  assert_int_equal(stk_client_new(&o, &e->c), 0);
  *state = e;
  return 0;
}

static int teardown(void **state) {
  struct env *e = *state;
  stk_client_free(e->c);
  fake_stop(&e->f);
  free(e);
  return 0;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void test_join_retries_unavailable(void **state) {
  struct env *e = *state;
  fake_set(&e->f, &e->f.join_unavailable, 2);
  struct stk_membership m;
  assert_int_equal(stk_join(e->c, "x", "m1", "10.0.0.1:9", "h", 5000, &m), 0);
  assert_int_equal(fake_get(&e->f, &e->f.joins), 3);
  assert_int_equal(m.generation, FAKE_GENERATION);
  assert_int_equal(m.rank, 1);
  assert_int_equal(m.world_size, 2);
  assert_int_equal(m.heartbeat_interval_ms, FAKE_INTERVAL_MS);
  assert_int_equal(m.checkpoint_step, 100);
  assert_string_equal(m.checkpoint_uri, "file:///ckpt/100");
  assert_int_equal(stk_generation(e->c), FAKE_GENERATION);
}

static void test_join_gives_up(void **state) {
  struct env *e = *state;
  fake_set(&e->f, &e->f.join_unavailable, 1000000);
  struct stk_membership m;
  int64_t t0 = now_ms();
  assert_int_equal(stk_join(e->c, "x", "m1", "", "", 400, &m), STK_ETIMEDOUT);
  int64_t took = now_ms() - t0;
  assert_true(took >= 400 && took < 2000);
  assert_true(fake_get(&e->f, &e->f.joins) >= 2); /* It did retry. */
  assert_int_equal(stk_generation(e->c), 0);
  int code = 0;
  assert_non_null(strstr(stk_client_last_error(&code), "coordinator restarting"));
  assert_int_equal(code, 4);
}

struct seen {
  int calls;
  enum stk_action last;
  uint64_t gen;
};

static void on_action(void *arg, enum stk_action a, uint64_t gen, const char *reason) {
  struct seen *s = arg;
  __atomic_store_n(&s->gen, gen, __ATOMIC_SEQ_CST);
  __atomic_store_n(&s->last, a, __ATOMIC_SEQ_CST);
  __atomic_add_fetch(&s->calls, 1, __ATOMIC_SEQ_CST);
}

static int wait_calls(struct seen *s, int want) {
  for (int i = 0; i < 400 && __atomic_load_n(&s->calls, __ATOMIC_SEQ_CST) < want; i++) usleep(5000);
  return __atomic_load_n(&s->calls, __ATOMIC_SEQ_CST);
}

static void test_heartbeat_reports_and_actions(void **state) {
  struct env *e = *state;
  static struct seen s;
  memset(&s, 0, sizeof(s));
  stk_on_action(e->c, on_action, &s);
  assert_int_equal(stk_join(e->c, "x", "m1", "", "", 5000, NULL), 0);
  stk_report(e->c, 77, 1234.5, 1.5, STK_RANK_HEALTH_OK);
  int hb = fake_get(&e->f, &e->f.heartbeats);
  assert_true(fake_wait(&e->f, &e->f.heartbeats, hb + 2, 2000) >= hb + 2);
  pthread_mutex_lock(&e->f.mu);
  assert_int_equal(e->f.hb_step, 77);
  assert_true(e->f.hb_loss == 1.5);
  pthread_mutex_unlock(&e->f.mu);
  assert_int_equal(stk_poll_action(e->c), STK_ACTION_NONE);
  assert_int_equal(s.calls, 0); /* CONTINUE is not an action. */

  fake_set(&e->f, &e->f.next_action, STOKER__V1__HEARTBEAT_ACTION__HEARTBEAT_ACTION_CHECKPOINT_NOW);
  assert_true(wait_calls(&s, 1) >= 1);
  assert_int_equal(__atomic_load_n(&s.last, __ATOMIC_SEQ_CST), STK_ACTION_CHECKPOINT_NOW);
  fake_set(&e->f, &e->f.next_action, STOKER__V1__HEARTBEAT_ACTION__HEARTBEAT_ACTION_RESTART);
  for (int i = 0; i < 400 && __atomic_load_n(&s.last, __ATOMIC_SEQ_CST) != STK_ACTION_RESTART; i++)
    usleep(5000);
  assert_int_equal(__atomic_load_n(&s.last, __ATOMIC_SEQ_CST), STK_ACTION_RESTART);
  /* RESTART outranks CHECKPOINT_NOW; a poll clears it. */
  assert_int_equal(stk_poll_action(e->c), STK_ACTION_RESTART);
  assert_int_equal(stk_poll_action(e->c), STK_ACTION_NONE);
  assert_int_equal(s.gen, FAKE_GENERATION + 1);
  /* The generation is over: the heartbeat thread stopped. */
  usleep(20000);
  hb = fake_get(&e->f, &e->f.heartbeats);
  usleep(6 * FAKE_INTERVAL_MS * 1000);
  assert_int_equal(fake_get(&e->f, &e->f.heartbeats), hb);
  /* Rejoining starts beating again. */
  fake_set(&e->f, &e->f.next_action, 0);
  assert_int_equal(stk_join(e->c, "x", "m1", "", "", 5000, NULL), 0);
  assert_true(fake_wait(&e->f, &e->f.heartbeats, hb + 1, 2000) > hb);
}

/* A rank about to be terminated says so in its heartbeats; a reply's
 * pausing reaches stk_job_pausing; the last checkpoint's step rides on the
 * Leave. */
static void test_terminating_and_pausing(void **state) {
  struct env *e = *state;
  assert_int_equal(stk_join(e->c, "x", "m1", "", "", 5000, NULL), 0);
  assert_false(stk_job_pausing(e->c));
  assert_int_equal(fake_get(&e->f, &e->f.hb_terminating), 0);
  stk_notify_terminating(e->c);
  assert_true(fake_wait(&e->f, &e->f.hb_terminating, 1, 2000) >= 1);
  fake_set(&e->f, &e->f.next_pausing, 1);
  fake_set(&e->f, &e->f.next_action, STOKER__V1__HEARTBEAT_ACTION__HEARTBEAT_ACTION_CHECKPOINT_NOW);
  for (int i = 0; i < 400 && stk_poll_action(e->c) != STK_ACTION_CHECKPOINT_NOW; i++) usleep(5000);
  assert_true(stk_job_pausing(e->c));
  assert_false(stk_job_resizing(e->c));
  assert_int_equal(stk_leave_checkpointed(e->c, 0), STK_EINVAL);
  assert_int_equal(stk_leave_checkpointed(e->c, 12), 0);
  pthread_mutex_lock(&e->f.mu);
  assert_int_equal(e->f.leave_checkpoint_step, 12);
  pthread_mutex_unlock(&e->f.mu);
}

static void test_barrier(void **state) {
  struct env *e = *state;
  assert_int_equal(stk_barrier(e->c, "b1", 1000), STK_ESTATE); /* Not joined. */
  assert_int_equal(stk_join(e->c, "x", "m1", "", "", 5000, NULL), 0);
  assert_int_equal(stk_barrier(e->c, "b1", 1000), 0);
  assert_int_equal(stk_barrier(e->c, "abort", 1000), STK_EABORTED);
  int code = 0;
  assert_string_equal(stk_client_last_error(&code), "generation ended");
  assert_int_equal(code, 10);
}

struct kv_result {
  int done;
  int err;
  char value[64];
};

static void on_kv(void *arg, int err, const char *msg, const uint8_t *value, size_t len) {
  struct kv_result *r = arg;
  r->err = err;
  if (!err) memcpy(r->value, value, len < 63 ? len : 63);
  __atomic_store_n(&r->done, 1, __ATOMIC_SEQ_CST);
}

static void test_kv(void **state) {
  struct env *e = *state;
  assert_int_equal(stk_join(e->c, "x", "m1", "", "", 5000, NULL), 0);
  uint8_t *v = NULL;
  size_t len = 0;
  assert_int_equal(stk_kv_get(e->c, "nccl-id", false, 1000, &v, &len), STK_ENOENT);
  assert_non_null(strstr(stk_client_last_error(NULL), "no key"));
  static struct kv_result r;
  memset(&r, 0, sizeof(r));
  assert_int_equal(stk_kv_get_async(e->c, "nccl-id", true, 5000, on_kv, &r), 0);
  usleep(100000);
  assert_int_equal(__atomic_load_n(&r.done, __ATOMIC_SEQ_CST), 0); /* Parked. */
  assert_int_equal(stk_kv_set(e->c, "nccl-id", "abc", 3, 1000), 0);
  for (int i = 0; i < 400 && !__atomic_load_n(&r.done, __ATOMIC_SEQ_CST); i++) usleep(5000);
  assert_int_equal(r.err, 0);
  assert_string_equal(r.value, "abc");
  assert_int_equal(stk_kv_get(e->c, "nccl-id", false, 1000, &v, &len), 0);
  assert_int_equal(len, 3);
  assert_memory_equal(v, "abc", 3);
  assert_int_equal(v[3], 0);
  free(v);
}

static void test_checkpoint_and_leave(void **state) {
  struct env *e = *state;
  assert_int_equal(stk_report_checkpoint(e->c, NULL, 5, "u"), STK_ESTATE);
  assert_int_equal(stk_report_checkpoint(e->c, "x", 7, "file:///c/7"), 0);
  assert_int_equal(stk_join(e->c, "x", "m1", "", "", 5000, NULL), 0);
  assert_int_equal(stk_report_checkpoint(e->c, NULL, 9, "file:///c/9"), 0);
  pthread_mutex_lock(&e->f.mu);
  assert_int_equal(e->f.ckpt_step, 9);
  assert_string_equal(e->f.ckpt_uri, "file:///c/9");
  pthread_mutex_unlock(&e->f.mu);
  assert_true(fake_wait(&e->f, &e->f.heartbeats, 1, 2000) >= 1);
  assert_int_equal(stk_leave(e->c), 0);
  assert_int_equal(fake_get(&e->f, &e->f.leaves), 1);
  assert_int_equal(fake_get(&e->f, &e->f.leaves_finished), 0);
  int hb = fake_get(&e->f, &e->f.heartbeats);
  usleep(4 * FAKE_INTERVAL_MS * 1000);
  assert_int_equal(fake_get(&e->f, &e->f.heartbeats), hb);
  assert_int_equal(stk_leave(e->c), STK_ESTATE);
  /* A member whose work is done says so. */
  assert_int_equal(stk_join(e->c, "x", "m1", "", "", 5000, NULL), 0);
  assert_int_equal(stk_leave_finished(e->c), 0);
  assert_int_equal(fake_get(&e->f, &e->f.leaves_finished), 1);
}

static void test_operator_calls(void **state) {
  struct env *e = *state;
  Stoker__V1__Job *job = NULL;
  assert_int_equal(stk_job_get(e->c, "nope", 1000, &job), STK_ENOENT);
  int code = 0;
  assert_string_equal(stk_client_last_error(&code), "no job named \"nope\"");
  assert_int_equal(code, 5);
  assert_null(job);
  assert_int_equal(stk_job_get(e->c, "x", 1000, &job), 0);
  assert_string_equal(job->spec->name, "x");
  assert_int_equal(job->generation, FAKE_GENERATION);
  protobuf_c_message_free_unpacked(&job->base, NULL);
  /* Methods the server does not have come back UNIMPLEMENTED. */
  assert_int_equal(stk_job_delete(e->c, "x", false, 1000), STK_ENOTSUP);
  int serving = -1;
  assert_int_equal(stk_health_check(e->c, "", 1000, &serving), 0);
  assert_int_equal(serving, STK_SERVING);
}

struct events {
  int n;
  uint64_t seqs[8];
};

static void on_event(void *arg, const Stoker__V1__JobEvent *ev) {
  struct events *s = arg;
  if (s->n < 8) s->seqs[s->n++] = ev->seq;
}

static void test_watch(void **state) {
  struct env *e = *state;
  static struct events s;
  memset(&s, 0, sizeof(s));
  struct stk_watch *w = NULL;
  assert_int_equal(stk_job_watch(e->c, "x", 1, on_event, &s, &w), 0);
  assert_int_equal(stk_watch_wait(w, 5000), 0);
  assert_int_equal(s.n, 2);
  assert_int_equal(s.seqs[0], 2);
  assert_int_equal(s.seqs[1], 3);
  stk_watch_free(w);
}

static void test_bad_client_options(void **state) {
  struct stk_client *c = NULL;
  struct stk_client_opts o = {0};
  assert_int_equal(stk_client_new(&o, &c), STK_EINVAL);
  o.address = "127.0.0.1:1";
  o.token_file = "/nonexistent/token";
  assert_int_equal(stk_client_new(&o, &c), STK_EINVAL);
  assert_non_null(strstr(stk_client_last_error(NULL), "/nonexistent/token"));
  assert_null(c);
  stk_client_free(NULL);
}

int main(void) {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(test_join_retries_unavailable),
      T(test_join_gives_up),
      T(test_heartbeat_reports_and_actions),
      T(test_terminating_and_pausing),
      T(test_barrier),
      T(test_kv),
      T(test_checkpoint_and_leave),
      T(test_operator_calls),
      T(test_watch),
      cmocka_unit_test(test_bad_client_options),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
