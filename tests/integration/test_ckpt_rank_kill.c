/*
 * kill -9 of a trainer rank PROCESS against the real stoker-checkpoint
 * daemon (issue 4: "a trainer that dies after its bytes are staged does not
 * lose them"). Each rank under test is a process of its own: the test
 * forks and re-executes itself ("--rank-child"), so the child starts with
 * no gRPC state inherited from the parent and opens its own client. A rank
 * killed right after its save reported "staged" still gets its checkpoint
 * committed (nobody calls Commit: List is polled), which verifies and
 * restores bit-exactly from a restarted rank process at the same world
 * size and resharded; a rank killed before it finished leaves an attempt
 * that never commits and is aborted and cleaned (no object, no segment,
 * nothing listed) within the daemon's attempt timeout, after which the
 * same step saves and commits normally. Both with shared-memory staging
 * and with STOKER_CKPT_SHM=off (bytes over gRPC).
 * argv: stoker-checkpoint.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "stk_error.h"
#include "stoker_ckpt.h"
#include "test_ckpt_helpers.h"
#include "test_ckpt_shard.h"

#define COLS       262144 /* f32: 1 MiB rows. */
#define ROWS       6      /* Per rank: 6 MiB, more than one 5 MiB part. */
#define BLOB       3000
#define PAD_BYTES  ((uint64_t)12 << 20)
#define CHILD_FLAG "--rank-child"

/* ---- The model: every byte a function of (step, tensor, index) ---- */

static uint8_t byte_at(int64_t step, int tensor, uint64_t i) {
  uint64_t x = (i + 7) * 0xD6E8FEB86659FD93ull ^ (uint64_t)(step * 977 + tensor * 31);
  return (uint8_t)(x >> 33);
}

static const struct tck_model model = {ROWS, COLS, BLOB, byte_at};

/* ---- The rank process (this binary re-executed) ---- */

/* What a rank process does, and where it stops. */
enum act {
  ACT_AT_OPEN, /* Opens its Write stream, then dies: nothing staged. */
  ACT_MID,     /* Sends every chunk but never "last", then dies. */
  ACT_STAGED,  /* Saves; dies by SIGKILL as soon as the bytes are staged. */
  ACT_FULL,    /* Saves and exits 0. */
  ACT_RESTORE, /* Restores its share (a restarted rank) and exits 0. */
};

/* One record through the pipe (under PIPE_BUF: written atomically). */
struct report {
  char code; /* 'k': about to die as planned, 'd': done, 'e': failed. */
  bool shm;  /* The writer staged through shared memory. */
  char msg[240];
};

struct rank_args {
  const char *addr, *job, *attempt, *shm_env;
  int64_t step;
  uint32_t rank, world, write_world;
  enum act act;
};

static void send_report(int fd, char code, bool shm, const char *msg) {
  struct report r = {.code = code, .shm = shm};
  snprintf(r.msg, sizeof(r.msg), "%s", msg ? msg : "");
  if (write(fd, &r, sizeof(r)) != (ssize_t)sizeof(r)) _exit(3);
}

static void die(int fd, bool shm) {
  send_report(fd, 'k', shm, NULL);
  raise(SIGKILL);
  _exit(4); /* Not reached. */
}

/* Saves (or stops early, per act) through a writer. */
static int rank_save(struct stk_client *c, const struct rank_args *a, int fd) {
  struct stk_ckpt_writer *w = NULL;
  struct tck_shard s;
  int err = stk_ckpt_writer_open(c, a->attempt, a->rank, 0, &w);
  if (err) return err;
  if (a->act == ACT_AT_OPEN) die(fd, false);
  tck_shard_init(&s, &model, a->step, a->rank, a->world);
  for (int i = 0; i < 2 && !err; i++)
    err = stk_ckpt_write_chunk(w, s.t[i].name, s.t[i].dtype, s.t[i].global_shape, &s.t[i].box,
                               s.t[i].data, s.t[i].len);
  bool shm = stk_ckpt_writer_shm_active(w);
  if (!err && a->act == ACT_MID) { /* More than a segment's room: one is handed over. */
    uint64_t n = PAD_BYTES, off = 0;
    struct stk_ckpt_box box = {1, &off, &n};
    uint8_t *pad = calloc(1, n);
    err = stk_ckpt_write_chunk(w, "pad", STK_DTYPE_BYTES, &n, &box, pad, n);
    free(pad);
    if (!err) die(fd, shm);
  }
  if (err) {
    stk_ckpt_writer_abort(w);
  } else {
    err = stk_ckpt_writer_finish(w, false, NULL, NULL); /* Returns once staged. */
    if (!err && a->act == ACT_STAGED) die(fd, shm);     /* Client, stream, buffers: all live. */
  }
  tck_shard_free(&s);
  if (!err) send_report(fd, 'd', shm, NULL);
  return err;
}

static int child_main(char **argv) {
  struct rank_args a = {.addr = argv[2],
                        .job = argv[3],
                        .attempt = argv[4],
                        .step = atoll(argv[5]),
                        .rank = (uint32_t)atoi(argv[6]),
                        .world = (uint32_t)atoi(argv[7]),
                        .write_world = (uint32_t)atoi(argv[8]),
                        .act = (enum act)atoi(argv[9]),
                        .shm_env = argv[10]};
  int fd = atoi(argv[11]);
  setenv(STK_CKPT_SHM_ENV, a.shm_env, 1); /* Read by the writer, as in a trainer. */
  struct stk_client_opts o = {.address = a.addr, .default_timeout_ms = 60000};
  struct stk_client *c = NULL;
  char msg[240] = "";
  int err = stk_ckpt_connect(&o, &c);
  if (!err && a.act == ACT_RESTORE) {
    err = tck_shard_restore(c, &model, a.job, a.step, a.rank, a.world, a.write_world, msg,
                            sizeof(msg));
    if (!err) send_report(fd, 'd', false, NULL);
  } else if (!err) {
    err = rank_save(c, &a, fd);
  }
  if (err && !msg[0]) snprintf(msg, sizeof(msg), "%s", stk_client_last_error(NULL));
  if (err) send_report(fd, 'e', false, msg);
  stk_client_free(c);
  close(fd);
  return err ? 1 : 0;
}

/* ---- Spawning rank processes (parent side) ---- */

struct rank_proc {
  pid_t pid;
  int fd; /* Read end of the report pipe. */
  struct report rep;
};

/* fork + exec of this binary as a rank; only async-signal-safe calls
 * between the two (the parent has gRPC threads). */
static void rank_spawn(struct rank_proc *p, const struct rank_args *a) {
  int fds[2];
  assert_int_equal(pipe2(fds, O_CLOEXEC), 0);
  char step[24], rank[12], world[12], ww[12], act[12], fd[12];
  snprintf(step, sizeof(step), "%lld", (long long)a->step);
  snprintf(rank, sizeof(rank), "%u", a->rank);
  snprintf(world, sizeof(world), "%u", a->world);
  snprintf(ww, sizeof(ww), "%u", a->write_world);
  snprintf(act, sizeof(act), "%d", (int)a->act);
  snprintf(fd, sizeof(fd), "%d", fds[1]);
  char *argv[] = {"it_ckpt_rank_kill",
                  CHILD_FLAG,
                  (char *)a->addr,
                  (char *)a->job,
                  (char *)a->attempt,
                  step,
                  rank,
                  world,
                  ww,
                  act,
                  (char *)a->shm_env,
                  fd,
                  NULL};
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    fcntl(fds[1], F_SETFD, 0); /* Only this pipe's write end survives the exec. */
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  close(fds[1]);
  p->pid = pid;
  p->fd = fds[0];
}

/* Waits (60 s at most) for the rank's report and its exit; asserts the
 * report is want_code and that a planned death was by SIGKILL. */
static void rank_wait(struct rank_proc *p, char want_code) {
  struct pollfd pf = {.fd = p->fd, .events = POLLIN};
  memset(&p->rep, 0, sizeof(p->rep));
  int n = poll(&pf, 1, 60000);
  ssize_t got = n == 1 ? read(p->fd, &p->rep, sizeof(p->rep)) : -1;
  close(p->fd);
  if (got != (ssize_t)sizeof(p->rep)) {
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    fail_msg("rank process %d sent no report", (int)p->pid);
  }
  int status = 0;
  assert_int_equal(waitpid(p->pid, &status, 0), p->pid);
  if (p->rep.code != want_code)
    fail_msg("rank process: '%c' (%s), wanted '%c'", p->rep.code, p->rep.msg, want_code);
  if (want_code == 'k') {
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  } else {
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
}

static void rank_run(const struct rank_args *a, char want_code, bool want_shm) {
  struct rank_proc p;
  rank_spawn(&p, a);
  rank_wait(&p, want_code);
  if (a->act != ACT_RESTORE && a->act != ACT_AT_OPEN) assert_int_equal(p.rep.shm, want_shm);
}

/* ---- Parent-side helpers ---- */

/* The parent's own rank: saves normally (staged) through the given mode. */
static void parent_save(struct stk_client *c, const char *attempt, int64_t step, uint32_t rank,
                        uint32_t world, enum stk_ckpt_shm_mode mode, bool want_shm) {
  struct tck_shard s;
  struct stk_ckpt_writer *w = NULL;
  tck_shard_init(&s, &model, step, rank, world);
  assert_int_equal(stk_ckpt_writer_open(c, attempt, rank, 0, &w), 0);
  stk_ckpt_writer_set_shm(w, mode);
  for (int i = 0; i < 2; i++)
    if (stk_ckpt_write_chunk(w, s.t[i].name, s.t[i].dtype, s.t[i].global_shape, &s.t[i].box,
                             s.t[i].data, s.t[i].len) != 0)
      fail_msg("rank %u write: %s", rank, stk_client_last_error(NULL));
  assert_int_equal(stk_ckpt_writer_shm_active(w), want_shm);
  if (stk_ckpt_writer_finish(w, false, NULL, NULL) != 0)
    fail_msg("rank %u finish: %s", rank, stk_client_last_error(NULL));
  tck_shard_free(&s);
}

/* Committed steps of job (at most max) into ret_steps; their count. */
static size_t list_steps(struct stk_client *c, const char *job, int64_t *ret_steps, size_t max) {
  Stoker__V1__ListCheckpointsResponse *r = NULL;
  if (stk_ckpt_list(c, job, 10000, &r) != 0) fail_msg("list: %s", stk_client_last_error(NULL));
  size_t n = r->n_checkpoints;
  for (size_t i = 0; i < n && i < max; i++) ret_steps[i] = r->checkpoints[i]->step;
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return n;
}

/* Polls List until step of job is committed (30 s); nobody calls Commit. */
static void wait_listed(struct stk_client *c, const char *job, int64_t step) {
  int64_t deadline = harness_now_ms() + 30000, steps[8];
  while (harness_now_ms() < deadline) {
    size_t n = list_steps(c, job, steps, 8);
    for (size_t i = 0; i < n && i < 8; i++)
      if (steps[i] == step) return;
    harness_sleep_ms(100);
  }
  fail_msg("step %lld of %s never committed", (long long)step, job);
}

/* Every listed checkpoint of job re-reads clean on the service. */
static void verify_all(struct stk_client *c, const char *job) {
  int64_t steps[8];
  size_t n = list_steps(c, job, steps, 8);
  assert_true(n > 0 && n <= 8);
  for (size_t i = 0; i < n; i++) {
    Stoker__V1__VerifyCheckpointResponse *v = NULL;
    if (stk_ckpt_verify(c, job, steps[i], 60000, &v) != 0)
      fail_msg("verify: %s", stk_client_last_error(NULL));
    if (v->n_problems) fail_msg("step %lld: %s", (long long)steps[i], v->problems[0]);
    assert_true(v->objects > 0 && v->bytes > 0);
    protobuf_c_message_free_unpacked(&v->base, NULL);
  }
}

/* Regular files under dir whose name starts with prefix (recursive). */
static int count_files(const char *dir, const char *prefix) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    char path[1024];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    if (lstat(path, &st) != 0) continue;
    if (S_ISDIR(st.st_mode))
      n += count_files(path, prefix);
    else if (strncmp(e->d_name, prefix, strlen(prefix)) == 0)
      n++;
  }
  closedir(d);
  return n;
}

/* Polls (timeout_ms) until no file of prefix is left under dir. */
static void wait_no_files(const char *dir, const char *prefix, int64_t timeout_ms) {
  int64_t deadline = harness_now_ms() + timeout_ms;
  while (count_files(dir, prefix) > 0 && harness_now_ms() < deadline) harness_sleep_ms(50);
  if (count_files(dir, prefix) > 0)
    fail_msg("%d '%s*' files left under %s", count_files(dir, prefix), prefix, dir);
}

static struct harness_daemon *start(const char *budget) {
  const char *args[] = {"--part-size",
                        "5MiB",
                        "--staging-budget",
                        budget,
                        "--upload-concurrency",
                        "2",
                        "--attempt-timeout",
                        "2s",
                        "--shm-dir",
                        tck_shm_dir,
                        NULL};
  struct harness_daemon *d = harness_daemon_start(args);
  assert_non_null(d);
  return d;
}

/* ---- Tests ---- */

/* World 3: rank 1 dies by SIGKILL right after "staged"; then rank 2 (a
 * process) and rank 0 (this one) save normally. The attempt commits with
 * nobody calling Commit; it verifies, a restarted rank 1 process restores
 * its share bit-exactly at world 3, and everything restores at world 2. */
static void killed_after_staged(bool shm) {
  const char *job = shm ? "kill-staged-shm" : "kill-staged-grpc";
  const char *env = shm ? "on" : "off";
  struct harness_daemon *d = start("64MiB");
  struct stk_client *c = tck_shard_client(d->addr);
  char attempt[STK_CKPT_ATTEMPT_MAX];
  assert_int_equal(stk_ckpt_begin(c, job, 5, 3, 0, attempt), 0);
  struct rank_args a = {d->addr, job, attempt, env, 5, 1, 3, 3, ACT_STAGED};
  rank_run(&a, 'k', shm); /* Dead (uploads in flight) before the others start. */
  struct rank_proc full;
  a.rank = 2;
  a.act = ACT_FULL;
  rank_spawn(&full, &a); /* Rank 2 saves beside this process's rank 0. */
  parent_save(c, attempt, 5, 0, 3, shm ? STK_CKPT_SHM_ON : STK_CKPT_SHM_OFF, shm);
  rank_wait(&full, 'd');
  assert_int_equal(full.rep.shm, shm);
  wait_listed(c, job, 5);
  verify_all(c, job);
  struct rank_args r = {d->addr, job, "-", env, 5, 1, 3, 3, ACT_RESTORE};
  rank_run(&r, 'd', false); /* The restarted rank 1, a fresh process. */
  tck_shard_restore_all(c, &model, job, 5, 3, 3);
  tck_shard_restore_all(c, &model, job, 5, 2, 3);
  if (shm) wait_no_files(tck_shm_dir, "seg-", 5000); /* The service released its segments. */
  stk_client_free(c);
  harness_daemon_free(d);
}

static void test_killed_after_staged_shm(void **state) {
  (void)state;
  killed_after_staged(true);
}

static void test_killed_after_staged_grpc(void **state) {
  (void)state;
  killed_after_staged(false);
}

/* World 3: rank 1 dies having sent its shard and a 12 MiB pad (with shm:
 * a segment handed over, the next one written) but not "last", rank 2 dies
 * right after opening its stream; rank 0 saves. The attempt never commits:
 * Commit fails once the 2 s attempt timeout aborts it, no object or
 * segment is left and nothing is listed. Then the same step saves and
 * commits normally (the dead ranks left nothing behind that blocks it). */
static void killed_before_finishing(bool shm) {
  const char *job = shm ? "kill-mid-shm" : "kill-mid-grpc";
  const char *env = shm ? "on" : "off";
  enum stk_ckpt_shm_mode mode = shm ? STK_CKPT_SHM_ON : STK_CKPT_SHM_OFF;
  struct harness_daemon *d = start("16MiB"); /* Segments of at most 16 MiB. */
  struct stk_client *c = tck_shard_client(d->addr);
  char attempt[STK_CKPT_ATTEMPT_MAX], objects[400];
  snprintf(objects, sizeof(objects), "%s/objects", d->data_dir);
  assert_int_equal(stk_ckpt_begin(c, job, 9, 3, 0, attempt), 0);
  int64_t t0 = harness_now_ms();
  struct rank_args a = {d->addr, job, attempt, env, 9, 1, 3, 3, ACT_MID};
  rank_run(&a, 'k', shm);
  a.rank = 2;
  a.act = ACT_AT_OPEN;
  rank_run(&a, 'k', shm);
  parent_save(c, attempt, 9, 0, 3, mode, shm);
  int err = stk_ckpt_commit(c, attempt, 30000, NULL);
  if (err != STK_ETIMEDOUT && err != STK_EABORTED)
    fail_msg("commit: %d (%s), wanted an abort", err, stk_client_last_error(NULL));
  assert_true(harness_now_ms() - t0 < 15000); /* Within the timeout (2 s) and a sweep. */
  int64_t steps[8];
  assert_int_equal(list_steps(c, job, steps, 8), 0);
  wait_no_files(objects, "", 5000); /* Every object of the attempt deleted. */
  wait_no_files(tck_shm_dir, "seg-", 5000);
  /* The same step again, every rank alive (one of them a process). */
  assert_int_equal(stk_ckpt_begin(c, job, 9, 2, 0, attempt), 0);
  struct rank_args b = {d->addr, job, attempt, env, 9, 1, 2, 2, ACT_FULL};
  rank_run(&b, 'd', shm);
  parent_save(c, attempt, 9, 0, 2, mode, shm);
  if (stk_ckpt_commit(c, attempt, 30000, NULL) != 0)
    fail_msg("commit: %s", stk_client_last_error(NULL));
  assert_int_equal(list_steps(c, job, steps, 8), 1);
  verify_all(c, job);
  tck_shard_restore_all(c, &model, job, 9, 3, 2);
  stk_client_free(c);
  harness_daemon_free(d);
}

static void test_killed_before_finishing_shm(void **state) {
  (void)state;
  killed_before_finishing(true);
}

static void test_killed_before_finishing_grpc(void **state) {
  (void)state;
  killed_before_finishing(false);
}

int main(int argc, char **argv) {
  if (argc == 12 && strcmp(argv[1], CHILD_FLAG) == 0) return child_main(argv);
  if (harness_init(argc, argv) != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_killed_after_staged_shm, tck_shm_setup,
                                      tck_shm_teardown),
      cmocka_unit_test_setup_teardown(test_killed_after_staged_grpc, tck_shm_setup,
                                      tck_shm_teardown),
      cmocka_unit_test_setup_teardown(test_killed_before_finishing_shm, tck_shm_setup,
                                      tck_shm_teardown),
      cmocka_unit_test_setup_teardown(test_killed_before_finishing_grpc, tck_shm_setup,
                                      tck_shm_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
