/*
 * Crash recovery: a child process runs the service and is SIGKILLed at an
 * exact point of the protocol (the test probe blocks there and tells the
 * parent); the parent reopens the same journal and storage. No committed
 * checkpoint may be incomplete or corrupt, every checkpoint reported
 * committed reads back bit-exact, attempts that were complete when the
 * child died are committed, the others aborted and cleaned.
 */
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ckpt_svc_fixture.h"
#include "stk_error.h"
#include "storage.h"

static int notify_fd = -1;
static const char *kill_point;
static int kill_countdown;
static bool armed;

static void probe(void *arg, const char *point) {
  (void)arg;
  if (!armed || strcmp(point, kill_point) != 0 ||
      __atomic_sub_fetch(&kill_countdown, 1, __ATOMIC_SEQ_CST) != 0)
    return;
  if (write(notify_fd, "x", 1) != 1) _exit(3);
  for (;;) pause(); /* Until SIGKILL. */
}

/* The child: commit step 1, then write step 2 until the probe stops it. */
static void child(struct fx *parent, const struct model *m) {
  struct fx f = *parent;
  uv_loop_init(&f.loop);
  f.opts.probe = probe;
  if (fx_open(&f) != 0) _exit(2);
  char att[65];
  struct write_opts wo = {.world = 4, .skip_last_rank = -1, .close_after_staged = true};
  if (fx_begin(&f, "job", 1, 4, att) || fx_write_model(&f, att, m, &wo, NULL) ||
      fx_commit(&f, att, NULL, 0))
    _exit(4);
  armed = true;
  if (fx_begin(&f, "job", 2, 4, att)) _exit(5);
  char path[160];
  snprintf(path, sizeof(path), "%s/attempt2", f.dir);
  FILE *a = fopen(path, "w");
  if (!a || fputs(att, a) < 0 || fclose(a) != 0) _exit(5);
  if (fx_write_model(&f, att, m, &wo, NULL)) _exit(5);
  fx_commit(&f, att, NULL, 0);
  _exit(6); /* The probe never fired. */
}

static void run_and_kill(struct fx *f, const struct model *m, const char *point, int count) {
  int p[2];
  assert_int_equal(pipe(p), 0);
  kill_point = point;
  kill_countdown = count;
  notify_fd = p[1];
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) child(f, m);
  close(p[1]);
  struct pollfd pfd = {.fd = p[0], .events = POLLIN};
  int ready = poll(&pfd, 1, 120000);
  char c;
  bool fired = ready == 1 && read(p[0], &c, 1) == 1;
  kill(pid, SIGKILL);
  int status;
  waitpid(pid, &status, 0);
  close(p[0]);
  if (!fired) fail_msg("the child never reached %s (status %d)", point, status);
}

static size_t steps_of(struct fx *f, int64_t *steps) {
  size_t n;
  assert_int_equal(fx_list(f, "job", steps, 8, &n), 0);
  return n;
}

static void check_committed(struct fx *f, const struct model *m) {
  int64_t steps[8];
  size_t n = steps_of(f, steps);
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(fx_read_all(f, "job", steps[i], m, 3), 0);
    uint64_t problems = 1;
    assert_int_equal(fx_verify(f, "job", steps[i], &problems), 0);
    assert_int_equal(problems, 0);
  }
}

static int count(const char *dir, const char *type) {
  char cmd[300];
  snprintf(cmd, sizeof(cmd), "find %s -mindepth 1 -type %s 2>/dev/null | wc -l", dir, type);
  FILE *p = popen(cmd, "r");
  int n = -1;
  if (p && fscanf(p, "%d", &n) != 1) n = -1;
  if (p) pclose(p);
  return n;
}

/* A multipart upload begun in step 2's attempt directory that no journal
 * record names, as when the service dies between CreateMultipartUpload's
 * reply and the journal write. Recovery must abort it with the attempt. */
static void plant_unjournaled_upload(struct fx *f) {
  char path[160], att[80] = "";
  snprintf(path, sizeof(path), "%s/attempt2", f->dir);
  FILE *a = fopen(path, "r");
  assert_non_null(a);
  assert_non_null(fgets(att, sizeof(att), a)); /* The child began step 2. */
  fclose(a);
  struct storage *st;
  assert_int_equal(storage_open(f->url, &st), 0);
  char key[340], *upload_id = NULL;
  snprintf(key, sizeof(key), "job/step-000000000002/attempt-%s/rank-00009-0000.bin", att);
  assert_int_equal(storage_mpu_begin(st, key, &upload_id), 0);
  free(upload_id);
  storage_free(st);
}

/* Killed at `point` (the count-th time): step 2 committed or not. */
static void crash_case(const char *point, int nth, bool expect_commit) {
  struct fx f;
  fx_init(&f);
  struct model *m = model_new(4, 6000000, 21); /* 9 MB a rank: multipart. */
  run_and_kill(&f, m, point, nth);
  if (!expect_commit) plant_unjournaled_upload(&f);
  assert_int_equal(fx_open(&f), 0);
  struct ckpt_service_stats st;
  ckpt_service_get_stats(f.svc, &st);
  int64_t steps[8];
  size_t n = steps_of(&f, steps);
  assert_int_equal(n, expect_commit ? 2 : 1);
  assert_int_equal(steps[0], 1);
  assert_int_equal(st.recovered_commits, expect_commit ? 1 : 0);
  assert_int_equal(st.recovered_aborts, expect_commit ? 0 : 1);
  check_committed(&f, m);
  if (!expect_commit) {
    fx_run_for(&f, 200); /* The recovered abort is told (after open, from the loop). */
    assert_int_equal(f.abort_hooks, 1);
    assert_int_equal(f.abort_step, 2);
    assert_non_null(strstr(f.abort_reason, "aborted by recovery"));
    char dir[300];
    snprintf(dir, sizeof(dir), "%s/job/step-000000000002", f.data);
    assert_int_equal(count(dir, "f"), 0); /* The aborted attempt's objects are gone. */
  } else {
    while (f.hooks == 0) uv_run(&f.loop, UV_RUN_ONCE); /* The recovered commit is reported. */
    assert_int_equal(f.hook_step, 2);
  }
  char uploads[300];
  snprintf(uploads, sizeof(uploads), "%s/.stk-uploads", f.data);
  assert_int_equal(count(uploads, "d"), 0); /* No multipart upload left open. */
  model_free(m);
  fx_fini(&f);
}

static void test_kill_during_upload(void **state) {
  (void)state;
  crash_case("part_journaled", 2, false);
}

static void test_kill_after_some_ranks(void **state) {
  (void)state;
  crash_case("rank_finished", 2, false);
}

static void test_kill_before_manifest(void **state) {
  (void)state;
  crash_case("before_manifest", 1, true);
}

static void test_kill_after_manifest(void **state) {
  (void)state;
  crash_case("manifest_written", 1, true);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kill_during_upload),
      cmocka_unit_test(test_kill_after_some_ranks),
      cmocka_unit_test(test_kill_before_manifest),
      cmocka_unit_test(test_kill_after_manifest),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
