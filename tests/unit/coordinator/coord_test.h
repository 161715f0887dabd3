/*
 * Helpers shared by the coordinator unit tests: a fixture owning a libuv
 * loop, a temporary RocksDB directory and an open core; answer capture;
 * blocking wrappers that run the loop until a call completes.
 */
#ifndef STK_COORD_TEST_H
#define STK_COORD_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coord.h"
#include "stk_error.h"

#define UNUSED __attribute__((unused))

struct fx {
  uv_loop_t loop;
  char dir[64];
  struct coord *c;
  struct coord_opts opts;
};

/* One captured answer; resp is an owned copy. */
struct res {
  bool done;
  int err;
  char msg[256];
  ProtobufCMessage *resp;
};

static UNUSED ProtobufCMessage *msg_copy(const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(n ? n : 1);
  protobuf_c_message_pack(m, buf);
  ProtobufCMessage *out = protobuf_c_message_unpack(m->descriptor, NULL, n, buf);
  free(buf);
  return out;
}

static UNUSED void on_done(void *arg, int err, const char *msg, const ProtobufCMessage *resp) {
  struct res *r = arg;
  assert_false(r->done); /* Exactly once. */
  r->done = true;
  r->err = err;
  snprintf(r->msg, sizeof(r->msg), "%s", msg ? msg : "");
  if (resp) r->resp = msg_copy(resp);
}

static UNUSED struct res *res_new(void) {
  return calloc(1, sizeof(struct res));
}

static UNUSED void res_free(struct res *r) {
  if (!r) return;
  if (r->resp) protobuf_c_message_free_unpacked(r->resp, NULL);
  free(r);
}

/* Runs child(dir, fd) in a forked process, waits until it writes one byte
 * to fd (its change was acknowledged), then SIGKILLs it: a crash right
 * after an acknowledgement. */
static UNUSED void kill_after_ack(const char *dir, void (*child)(const char *dir, int fd)) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    child(dir, fds[1]);
    _exit(0);
  }
  close(fds[1]);
  char ok = 0;
  assert_int_equal(read(fds[0], &ok, 1), 1);
  kill(pid, SIGKILL);
  int status;
  waitpid(pid, &status, 0);
  assert_true(WIFSIGNALED(status));
  close(fds[0]);
}

static UNUSED void run_until(struct fx *f, const bool *flag) {
  for (int i = 0; !*flag; i++) {
    uv_run(&f->loop, UV_RUN_ONCE);
    assert_true(i < 10000000);
  }
}

static UNUSED void run_for(struct fx *f, uint64_t ms) {
  uint64_t end = uv_now(&f->loop) + ms;
  while (uv_now(&f->loop) < end) uv_run(&f->loop, UV_RUN_ONCE);
}

static UNUSED void fx_open(struct fx *f) {
  assert_int_equal(coord_open(&f->loop, &f->opts, &f->c), 0);
}

static UNUSED void on_closed(void *arg) {
  *(bool *)arg = true;
}

static UNUSED void fx_close(struct fx *f) {
  bool closed = false;
  coord_close(f->c, on_closed, &closed);
  run_until(f, &closed);
  f->c = NULL;
}

static UNUSED int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  return remove(path);
}

static UNUSED int fx_setup(void **state) {
  struct fx *f = calloc(1, sizeof(*f));
  snprintf(f->dir, sizeof(f->dir), "/tmp/stk-coord-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  assert_int_equal(uv_loop_init(&f->loop), 0);
  f->opts.dir = f->dir;
  f->opts.tick_ms = 5;
  fx_open(f);
  *state = f;
  return 0;
}

static UNUSED int fx_teardown(void **state) {
  struct fx *f = *state;
  if (f->c) fx_close(f);
  assert_int_equal(uv_loop_close(&f->loop), 0);
  nftw(f->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  free(f);
  return 0;
}

/* ---- Blocking wrappers (run the loop until the answer arrives) ---------- */

static UNUSED struct res *wait_res(struct fx *f, struct res *r) {
  run_until(f, &r->done);
  return r;
}

/* A job whose members keep their lease for 2 s without a heartbeat: long
 * enough that a test not about expiry never loses a member when a loaded
 * machine stalls it. Tests about expiry use short_lease_spec_of. */
static UNUSED Stoker__V1__JobSpec spec_of(const char *name, uint32_t min, uint32_t max) {
  Stoker__V1__JobSpec s = STOKER__V1__JOB_SPEC__INIT;
  s.name = (char *)name;
  s.min_ranks = min;
  s.max_ranks = max;
  s.heartbeat_interval_ms = 1000;
  s.heartbeat_misses = 2;
  s.last_call_ms = 100;
  s.join_timeout_ms = 60000;
  return s;
}

/* The same with a 100 ms lease (50 ms interval, 2 misses): for the tests
 * that watch a lease run out. */
static UNUSED Stoker__V1__JobSpec short_lease_spec_of(const char *name, uint32_t min,
                                                      uint32_t max) {
  Stoker__V1__JobSpec s = spec_of(name, min, max);
  s.heartbeat_interval_ms = 50;
  return s;
}

static UNUSED int create_spec(struct fx *f, Stoker__V1__JobSpec *s) {
  Stoker__V1__CreateJobRequest req = STOKER__V1__CREATE_JOB_REQUEST__INIT;
  req.spec = s;
  struct res *r = res_new();
  coord_create_job(f->c, &req, on_done, r);
  int err = wait_res(f, r)->err;
  res_free(r);
  return err;
}

static UNUSED void create(struct fx *f, const char *name, uint32_t min, uint32_t max) {
  Stoker__V1__JobSpec s = spec_of(name, min, max);
  assert_int_equal(create_spec(f, &s), 0);
}

/* Members m0..m(n-1) of generation gen say their ranks stop at stop_step
 * (HeartbeatRequest.stop_step, as trainers do after their vote): a resize's
 * round opens on its checkpoint only once all of them did. */
static UNUSED void say_stop(struct fx *f, const char *job, uint64_t gen, int n, int64_t stop_step) {
  for (int i = 0; i < n; i++) {
    char id[16];
    snprintf(id, sizeof(id), "m%d", i);
    Stoker__V1__HeartbeatRequest req = STOKER__V1__HEARTBEAT_REQUEST__INIT;
    req.job = (char *)job, req.member_id = id, req.generation = gen;
    req.step = (uint64_t)stop_step, req.stop_step = stop_step;
    req.health = STOKER__V1__RANK_HEALTH__RANK_HEALTH_OK;
    struct res *r = res_new();
    coord_heartbeat(f->c, &req, on_done, r);
    assert_int_equal(wait_res(f, r)->err, 0);
    res_free(r);
  }
}

/* GetJob; the caller frees the result. */
static UNUSED struct res *get_job(struct fx *f, const char *name) {
  Stoker__V1__GetJobRequest req = STOKER__V1__GET_JOB_REQUEST__INIT;
  req.job = (char *)name;
  struct res *r = res_new();
  coord_get_job(f->c, &req, on_done, r);
  return wait_res(f, r);
}

#define JOB(r)   ((Stoker__V1__Job *)(r)->resp)
#define JOINR(r) ((Stoker__V1__JoinResponse *)(r)->resp)

/* Starts a Join; the answer lands in the returned res. */
static UNUSED struct res *join(struct fx *f, const char *job, const char *member) {
  Stoker__V1__JoinRequest req = STOKER__V1__JOIN_REQUEST__INIT;
  req.job = (char *)job;
  req.member_id = (char *)member;
  req.address = "127.0.0.1:1";
  req.host = "localhost";
  struct res *r = res_new();
  assert_non_null(coord_join(f->c, &req, on_done, r));
  return r;
}

/* Heartbeat; returns the action, or the error when negative. */
static UNUSED int heartbeat(struct fx *f, const char *job, const char *member, uint64_t gen) {
  Stoker__V1__HeartbeatRequest req = STOKER__V1__HEARTBEAT_REQUEST__INIT;
  req.job = (char *)job;
  req.member_id = (char *)member;
  req.generation = gen;
  req.health = STOKER__V1__RANK_HEALTH__RANK_HEALTH_OK;
  struct res *r = res_new();
  coord_heartbeat(f->c, &req, on_done, r);
  wait_res(f, r);
  int out = r->err ? r->err : (int)((Stoker__V1__HeartbeatResponse *)r->resp)->action;
  res_free(r);
  return out;
}

static UNUSED int kv_set_(struct fx *f, const char *job, uint64_t gen, const char *key,
                          const char *value) {
  Stoker__V1__KvSetRequest req = STOKER__V1__KV_SET_REQUEST__INIT;
  req.job = (char *)job;
  req.generation = gen;
  req.key = (char *)key;
  req.value.data = (uint8_t *)value;
  req.value.len = strlen(value);
  struct res *r = res_new();
  coord_kv_set(f->c, &req, on_done, r);
  int err = wait_res(f, r)->err;
  res_free(r);
  return err;
}

static UNUSED struct res *kv_get_(struct fx *f, const char *job, uint64_t gen, const char *key,
                                  bool wait, struct coord_wait **ret_w) {
  Stoker__V1__KvGetRequest req = STOKER__V1__KV_GET_REQUEST__INIT;
  req.job = (char *)job;
  req.generation = gen;
  req.key = (char *)key;
  req.wait = wait;
  struct res *r = res_new();
  struct coord_wait *w = coord_kv_get(f->c, &req, on_done, r);
  if (ret_w) *ret_w = w;
  return r;
}

static UNUSED int report_ckpt(struct fx *f, const char *job, int64_t step, uint64_t gen) {
  Stoker__V1__ReportCheckpointRequest req = STOKER__V1__REPORT_CHECKPOINT_REQUEST__INIT;
  req.job = (char *)job;
  req.step = step;
  req.uri = "file:///ckpt/1";
  req.generation = gen;
  struct res *r = res_new();
  coord_report_checkpoint(f->c, &req, on_done, r);
  int err = wait_res(f, r)->err;
  res_free(r);
  return err;
}

typedef void (*action_fn)(struct coord *, const Stoker__V1__JobActionRequest *, coord_done_fn,
                          void *);

/* Pause/Resume/Stop/Delete; returns err, the Job (if any) into ret. */
static UNUSED int job_action(struct fx *f, action_fn fn, const char *job, bool force) {
  Stoker__V1__JobActionRequest req = STOKER__V1__JOB_ACTION_REQUEST__INIT;
  req.job = (char *)job;
  req.force = force;
  struct res *r = res_new();
  fn(f->c, &req, on_done, r);
  int err = wait_res(f, r)->err;
  res_free(r);
  return err;
}

/* Leave, finished (its work done) or not; returns the error. */
static UNUSED int leave_as(struct fx *f, const char *job, const char *member, uint64_t gen,
                           bool finished) {
  Stoker__V1__LeaveRequest req = STOKER__V1__LEAVE_REQUEST__INIT;
  req.job = (char *)job;
  req.member_id = (char *)member;
  req.generation = gen;
  req.finished = finished;
  struct res *r = res_new();
  coord_leave(f->c, &req, on_done, r);
  int err = wait_res(f, r)->err;
  res_free(r);
  return err;
}

/* Joins n members m0..m(n-1) and waits for all answers. */
/* Barrier name of job as member in generation gen, parked until answered. */
static UNUSED struct res *barrier_as(struct fx *f, const char *job, const char *member,
                                     uint64_t gen, const char *name) {
  Stoker__V1__BarrierRequest br = STOKER__V1__BARRIER_REQUEST__INIT;
  br.job = (char *)job;
  br.member_id = (char *)member;
  br.generation = gen;
  br.name = (char *)name;
  struct res *x = res_new();
  assert_non_null(coord_barrier(f->c, &br, on_done, x));
  return x;
}

static UNUSED void join_all(struct fx *f, const char *job, int n, struct res **out) {
  char id[32];
  for (int i = 0; i < n; i++) {
    snprintf(id, sizeof(id), "m%d", i);
    out[i] = join(f, job, id);
  }
  for (int i = 0; i < n; i++) run_until(f, &out[i]->done);
}

#endif
