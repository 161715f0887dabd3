/*
 * Background staging (stk_ckpt_stage_*) against the real stoker-checkpoint
 * daemon (file:// storage, loopback), through shared memory and over gRPC:
 * the checkpoint holds exactly the buffers' contents when staging started,
 * whatever the caller writes into them once the fence returned. The
 * interleavings are forced with the stage's before-tensor hook, which
 * holds the staging thread at a gate: before the first tensor, at the
 * middle one and after the last (the fence must block in each, and must
 * not return before the gate opens), and staging done before the "update"
 * (the fence does not wait). The update then overwrites every buffer; the
 * test commits and reads every tensor back at the world size saved,
 * comparing byte for byte with the values of the step staged. Also: the
 * stage copies the caller's metadata (the caller poisons it right after
 * start), a save that fails (unknown attempt) still releases the buffers
 * and finish tells the service's reason, and low priority (nice 19) gives
 * the same bytes. argv: stoker-checkpoint.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "stoker_ckpt.h"
#include "test_ckpt_helpers.h"

#define WORLD      2
#define TENSORS    5       /* Per rank; the middle one is index 2. */
#define ELEMS      1000000 /* f32 per tensor and rank: 4 MB. */
#define GATE_OPEN  (-1)
#define HOLD_AFTER TENSORS /* The hook's index after the last tensor. */

static float value_at(int64_t step, int tensor, uint64_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(step * 131 + tensor);
  return (float)(x >> 40) * 0.5f; /* Exact in f32 (24 bits). */
}

/* One rank's state: TENSORS 1-D tensors of ELEMS f32, box [rank*ELEMS, ...). */
struct rank_state {
  float *buf[TENSORS];
  char names[TENSORS][16];
  uint64_t shape[1], off[1], sz[1];
  struct stk_ckpt_tensor t[TENSORS];
};

static void state_fill(struct rank_state *s, int64_t step, uint32_t rank) {
  for (int k = 0; k < TENSORS; k++) {
    if (!s->buf[k]) s->buf[k] = malloc(ELEMS * sizeof(float));
    assert_non_null(s->buf[k]);
    for (uint64_t i = 0; i < ELEMS; i++)
      s->buf[k][i] = value_at(step, k, (uint64_t)rank * ELEMS + i);
  }
}

static void state_tensors(struct rank_state *s, uint32_t rank) {
  s->shape[0] = (uint64_t)WORLD * ELEMS, s->off[0] = (uint64_t)rank * ELEMS, s->sz[0] = ELEMS;
  for (int k = 0; k < TENSORS; k++) {
    snprintf(s->names[k], sizeof(s->names[k]), "t%d", k);
    s->t[k] = (struct stk_ckpt_tensor){s->names[k],        STK_DTYPE_F32, s->shape,
                                       {1, s->off, s->sz}, s->buf[k],     ELEMS * sizeof(float)};
  }
}

static void state_free(struct rank_state *s) {
  for (int k = 0; k < TENSORS; k++) free(s->buf[k]), s->buf[k] = NULL;
}

/* ---- The gate the hook holds the staging thread at ---- */

struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int hold_at;  /* Index the hook stops at; GATE_OPEN: never. */
  bool reached; /* The staging thread is waiting at hold_at. */
  size_t calls; /* Hook calls so far. */
  bool fenced;  /* The fencing thread returned. */
  int fence_rc; /* What its fence returned. */
  struct stk_ckpt_stage *stage;
};

static void gate_hook(void *arg, size_t i) {
  struct gate *g = arg;
  pthread_mutex_lock(&g->mu);
  g->calls++;
  if ((int)i == g->hold_at) {
    g->reached = true;
    pthread_cond_broadcast(&g->cv);
    while (g->hold_at != GATE_OPEN) pthread_cond_wait(&g->cv, &g->mu);
  }
  pthread_mutex_unlock(&g->mu);
}

static void *fence_main(void *arg) {
  struct gate *g = arg;
  int rc = stk_ckpt_stage_fence(g->stage); /* Asserted on the test's thread. */
  pthread_mutex_lock(&g->mu);
  g->fence_rc = rc;
  g->fenced = true;
  pthread_mutex_unlock(&g->mu);
  return NULL;
}

/* ---- Helpers ---- */

static struct stk_client *client_of(const struct harness_daemon *d) {
  struct stk_client_opts o = {.address = d->addr, .default_timeout_ms = 60000};
  struct stk_client *c = NULL;
  assert_int_equal(stk_ckpt_connect(&o, &c), 0);
  return c;
}

static struct harness_daemon *start_daemon(void) {
  const char *args[] = {"--staging-budget", "256MiB", "--shm-dir", tck_shm_dir, NULL};
  struct harness_daemon *d = harness_daemon_start(args);
  assert_non_null(d);
  return d;
}

/* Every tensor of step read back whole and compared with the step's values. */
static void check_restore(struct stk_client *c, const char *job, int64_t step) {
  uint64_t n = (uint64_t)WORLD * ELEMS, off[1] = {0}, sz[1] = {n};
  float *got = malloc(n * sizeof(float));
  assert_non_null(got);
  for (int k = 0; k < TENSORS; k++) {
    char name[16];
    snprintf(name, sizeof(name), "t%d", k);
    struct stk_ckpt_want w = {name, {1, off, sz}, got, n * sizeof(float)};
    if (stk_ckpt_read(c, job, step, &w, 1, 60000, NULL) != 0)
      fail_msg("read %s: %s", name, stk_client_last_error(NULL));
    for (uint64_t i = 0; i < n; i++) {
      float want = value_at(step, k, i);
      if (memcmp(&got[i], &want, sizeof(float)) != 0)
        fail_msg("step %lld tensor %d element %llu: %g, want %g", (long long)step, k,
                 (unsigned long long)i, (double)got[i], (double)want);
    }
  }
  free(got);
}

static bool wait_until(struct gate *g, bool *flag, int64_t timeout_ms) {
  int64_t end = harness_now_ms() + timeout_ms;
  pthread_mutex_lock(&g->mu);
  while (!*flag && harness_now_ms() < end) {
    pthread_mutex_unlock(&g->mu);
    harness_sleep_ms(5);
    pthread_mutex_lock(&g->mu);
  }
  bool r = *flag;
  pthread_mutex_unlock(&g->mu);
  return r;
}

/*
 * One checkpoint at step by WORLD stages (one per rank, from this thread),
 * rank 0 held at hold_at (GATE_OPEN: none held; then the test waits until
 * staging released the buffers before the update). Every rank's buffers
 * are overwritten with step + 1's values as soon as its fence returned
 * (the optimizer update), before its stage finished.
 */
static void checkpoint_once(const struct harness_daemon *d, const char *job, int64_t step,
                            int hold_at, bool low_priority) {
  struct stk_client *c = client_of(d);
  char attempt[STK_CKPT_ATTEMPT_MAX];
  if (stk_ckpt_begin(c, job, step, WORLD, 30000, attempt) != 0)
    fail_msg("begin: %s", stk_client_last_error(NULL));
  struct rank_state st[WORLD];
  memset(st, 0, sizeof(st));
  struct gate g = {.hold_at = hold_at};
  pthread_mutex_init(&g.mu, NULL);
  pthread_cond_init(&g.cv, NULL);
  struct stk_ckpt_stage *stage[WORLD];
  for (uint32_t r = 0; r < WORLD; r++) {
    state_fill(&st[r], step, r);
    state_tensors(&st[r], r);
    struct stk_ckpt_stage_opts so = {.low_priority = low_priority};
    if (r == 0) so.before_tensor = gate_hook, so.hook_arg = &g;
    assert_int_equal(stk_ckpt_stage_start(c, attempt, r, st[r].t, TENSORS, &so, &stage[r]), 0);
  }
  g.stage = stage[0];
  if (hold_at != GATE_OPEN) {
    assert_true(wait_until(&g, &g.reached, 30000));
    pthread_t fencer;
    pthread_create(&fencer, NULL, fence_main, &g);
    harness_sleep_ms(200); /* The fence must still be waiting for the gate. */
    pthread_mutex_lock(&g.mu);
    bool early = g.fenced;
    pthread_mutex_unlock(&g.mu);
    assert_false(early);
    assert_false(stk_ckpt_stage_released(stage[0]));
    pthread_mutex_lock(&g.mu);
    g.hold_at = GATE_OPEN;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    pthread_join(fencer, NULL);
    assert_int_equal(g.fence_rc, 0);
  } else {
    int64_t end = harness_now_ms() + 30000; /* Staging done before the update comes. */
    while (!stk_ckpt_stage_released(stage[0]) && harness_now_ms() < end) harness_sleep_ms(5);
    assert_true(stk_ckpt_stage_released(stage[0]));
  }
  assert_true(stk_ckpt_stage_released(stage[0]));
  for (uint32_t r = 0; r < WORLD; r++) {
    assert_int_equal(stk_ckpt_stage_fence(stage[r]), 0);
    state_fill(&st[r], step + 1, r); /* The update: every byte changes. */
  }
  for (uint32_t r = 0; r < WORLD; r++) {
    uint64_t bytes = 0;
    if (stk_ckpt_stage_finish(stage[r], &bytes) != 0)
      fail_msg("rank %u: %s", r, stk_client_last_error(NULL));
    assert_int_equal(bytes, (uint64_t)TENSORS * ELEMS * sizeof(float));
    state_free(&st[r]);
  }
  assert_int_equal(g.calls, TENSORS + 1);
  if (stk_ckpt_commit(c, attempt, 60000, NULL) != 0)
    fail_msg("commit: %s", stk_client_last_error(NULL));
  check_restore(c, job, step);
  pthread_mutex_destroy(&g.mu);
  pthread_cond_destroy(&g.cv);
  stk_client_free(c);
}

/* ---- Tests ---- */

static void run_interleavings(const char *job_prefix) {
  struct harness_daemon *d = start_daemon();
  const int holds[] = {0, TENSORS / 2, HOLD_AFTER, GATE_OPEN};
  char job[64];
  snprintf(job, sizeof(job), "%s-stage", job_prefix);
  for (size_t i = 0; i < sizeof(holds) / sizeof(holds[0]); i++)
    checkpoint_once(d, job, (int64_t)i + 1, holds[i], false);
  checkpoint_once(d, job, 10, TENSORS / 2, true); /* Low priority, raised by the fence. */
  harness_daemon_free(d);
}

static void test_interleavings_shm(void **state) {
  setenv(STK_CKPT_SHM_ENV, "on", 1);
  run_interleavings("shm");
  unsetenv(STK_CKPT_SHM_ENV);
}

static void test_interleavings_grpc(void **state) {
  setenv(STK_CKPT_SHM_ENV, "off", 1);
  run_interleavings("grpc");
  unsetenv(STK_CKPT_SHM_ENV);
}

/* The tensor array, names, shapes and boxes may change once start returned. */
static void test_metadata_copied(void **state) {
  struct harness_daemon *d = start_daemon();
  struct stk_client *c = client_of(d);
  char attempt[STK_CKPT_ATTEMPT_MAX];
  assert_int_equal(stk_ckpt_begin(c, "meta", 1, WORLD, 30000, attempt), 0);
  struct rank_state st[WORLD];
  memset(st, 0, sizeof(st));
  struct stk_ckpt_stage *stage[WORLD];
  struct gate g = {.hold_at = 0};
  pthread_mutex_init(&g.mu, NULL);
  pthread_cond_init(&g.cv, NULL);
  for (uint32_t r = 0; r < WORLD; r++) {
    state_fill(&st[r], 1, r);
    state_tensors(&st[r], r);
    struct stk_ckpt_stage_opts so = {.before_tensor = gate_hook, .hook_arg = &g};
    assert_int_equal(stk_ckpt_stage_start(c, attempt, r, st[r].t, TENSORS, &so, &stage[r]), 0);
    /* Poison everything but the data while the stage is held. */
    memset(st[r].names, 'x', sizeof(st[r].names));
    st[r].shape[0] = st[r].off[0] = st[r].sz[0] = 7;
    memset(st[r].t, 0, sizeof(st[r].t));
  }
  assert_true(wait_until(&g, &g.reached, 30000));
  pthread_mutex_lock(&g.mu);
  g.hold_at = GATE_OPEN;
  pthread_cond_broadcast(&g.cv);
  pthread_mutex_unlock(&g.mu);
  for (uint32_t r = 0; r < WORLD; r++) {
    if (stk_ckpt_stage_finish(stage[r], NULL) != 0)
      fail_msg("rank %u: %s", r, stk_client_last_error(NULL));
    state_free(&st[r]);
  }
  assert_int_equal(stk_ckpt_commit(c, attempt, 60000, NULL), 0);
  check_restore(c, "meta", 1);
  pthread_mutex_destroy(&g.mu);
  pthread_cond_destroy(&g.cv);
  stk_client_free(c);
  harness_daemon_free(d);
}

/* A save the service refuses: the fence lets go, finish says why. */
static void test_failed_stage_releases(void **state) {
  struct harness_daemon *d = start_daemon();
  struct stk_client *c = client_of(d);
  struct rank_state st = {0};
  state_fill(&st, 1, 0);
  state_tensors(&st, 0);
  struct stk_ckpt_stage *stage = NULL;
  assert_int_equal(stk_ckpt_stage_start(c, "no-such-attempt", 0, st.t, TENSORS, NULL, &stage), 0);
  assert_int_equal(stk_ckpt_stage_fence(stage), 0);
  assert_true(stk_ckpt_stage_released(stage));
  assert_int_not_equal(stk_ckpt_stage_finish(stage, NULL), 0);
  assert_true(strlen(stk_client_last_error(NULL)) > 0);
  /* Bad arguments change nothing and start no thread. */
  assert_int_equal(stk_ckpt_stage_start(c, "", 0, st.t, TENSORS, NULL, &stage), STK_EINVAL);
  assert_int_equal(stk_ckpt_stage_start(c, "a", 0, NULL, 1, NULL, &stage), STK_EINVAL);
  st.t[1].box.ndim = 0;
  assert_int_equal(stk_ckpt_stage_start(c, "a", 0, st.t, TENSORS, NULL, &stage), STK_EINVAL);
  assert_int_equal(stk_ckpt_stage_finish(NULL, NULL), 0);
  state_free(&st);
  stk_client_free(c);
  harness_daemon_free(d);
}

int main(int argc, char **argv) {
  if (harness_init(argc, argv) != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_interleavings_shm, tck_shm_setup, tck_shm_teardown),
      cmocka_unit_test_setup_teardown(test_interleavings_grpc, tck_shm_setup, tck_shm_teardown),
      cmocka_unit_test_setup_teardown(test_metadata_copied, tck_shm_setup, tck_shm_teardown),
      cmocka_unit_test_setup_teardown(test_failed_stage_releases, tck_shm_setup, tck_shm_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
