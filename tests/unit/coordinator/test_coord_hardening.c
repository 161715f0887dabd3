/*
 * The coordinator's contract on its hard paths: a watcher behind when its
 * job is deleted still gets every event before DELETED; deleting the job,
 * closing the coordinator or cancelling another watch from inside a watch
 * callback answers every watcher exactly once (no use after free); a
 * heartbeat that completes a pause is released only after the PAUSED state
 * is synced; a HEALTH event carries the rank's message in full and GetJob
 * shows it, also after a restart or kill -9 (the health change is synced
 * with its event); event texts stay valid UTF-8, and a label value, storage
 * URI, Join address or host, heartbeat message, checkpoint URI or
 * preemption reason that is not is refused naming the field; a
 * member's lease starts when its Join is answered, not at the round's close.
 */
#include <signal.h>
#include <sys/wait.h>

#include "coord_test.h"

#define ST(x)  STOKER__V1__JOB_STATE__JOB_STATE_##x
#define ACT(x) STOKER__V1__HEARTBEAT_ACTION__HEARTBEAT_ACTION_##x
#define EV(x)  STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_##x

struct watcher {
  struct fx *f;
  struct coord_wait *w;
  int n;
  uint64_t seq[64];
  int type[64];
  char msg[64][1100];
  bool hold;            /* Return false after each event. */
  int delete_at_type;   /* Force-delete the job on this event type. */
  bool close_at_first;  /* Close the coordinator on the first event. */
  struct watcher *peer; /* Cancelled on the first event when set. */
  struct res del, end;
  bool closed;
};

static bool on_event(void *arg, const Stoker__V1__JobEvent *ev) {
  struct watcher *w = arg;
  assert_true(w->n < 64);
  assert_false(w->end.done);
  w->seq[w->n] = ev->seq;
  snprintf(w->msg[w->n], sizeof(w->msg[0]), "%s", ev->message);
  w->type[w->n++] = ev->type;
  if (w->delete_at_type && (int)ev->type == w->delete_at_type) {
    w->delete_at_type = 0;
    Stoker__V1__JobActionRequest req = STOKER__V1__JOB_ACTION_REQUEST__INIT;
    req.job = ev->job;
    req.force = true;
    coord_delete_job(w->f->c, &req, on_done, &w->del);
  }
  if (w->close_at_first) {
    w->close_at_first = false;
    coord_close(w->f->c, on_closed, &w->closed);
  }
  if (w->peer) {
    coord_cancel(w->f->c, w->peer->w);
    w->peer = NULL;
  }
  return !w->hold;
}

static void watch_done(void *arg, int err, const char *msg, const ProtobufCMessage *resp) {
  on_done(&((struct watcher *)arg)->end, err, msg, resp);
}

static void watch(struct fx *f, const char *job, uint64_t after, struct watcher *w) {
  Stoker__V1__WatchJobRequest req = STOKER__V1__WATCH_JOB_REQUEST__INIT;
  req.job = (char *)job;
  req.after_seq = after;
  w->f = f;
  w->w = coord_watch_job(f->c, &req, on_event, watch_done, w);
  assert_non_null(w->w);
}

/* Runs the loop for at most ms or until *flag (never hangs the suite). */
static void run_until_for(struct fx *f, const bool *flag, uint64_t ms) {
  uint64_t end = uv_now(&f->loop) + ms;
  while (!*flag && uv_now(&f->loop) < end) uv_run(&f->loop, UV_RUN_ONCE);
}

/* ---- Gap 3: a watcher behind at delete gets the rest, then DELETED -------- */

static void test_watch_behind_at_delete(void **state) {
  struct fx *f = *state;
  create(f, "wb", 1, 1);
  struct watcher w = {.hold = true};
  watch(f, "wb", 0, &w);
  run_for(f, 20);
  assert_int_equal(w.n, 1); /* CREATED, then delivery is held. */
  for (int i = 1; i <= 3; i++) assert_int_equal(report_ckpt(f, "wb", i, 0), 0);
  assert_int_equal(job_action(f, coord_delete_job, "wb", true), 0);
  while (!w.end.done && w.n < 10) {
    coord_watch_resume(f->c, w.w);
    run_until_for(f, &w.end.done, 20);
  }
  assert_true(w.end.done);
  assert_int_equal(w.end.err, 0);
  assert_int_equal(w.n, 5);
  for (int i = 0; i < 5; i++) assert_int_equal(w.seq[i], (uint64_t)i + 1);
  assert_int_equal(w.type[0], EV(CREATED));
  for (int i = 1; i <= 3; i++) assert_int_equal(w.type[i], EV(CHECKPOINT));
  assert_int_equal(w.type[4], EV(DELETED));
}

/* ---- Gap 4: callbacks that delete, close or cancel ------------------------ */

static void test_delete_inside_watch_callback(void **state) {
  struct fx *f = *state;
  create(f, "wd", 1, 1);
  struct watcher a = {.delete_at_type = EV(CHECKPOINT)}, b = {0};
  watch(f, "wd", 0, &a);
  watch(f, "wd", 0, &b);
  run_for(f, 20);
  assert_int_equal(report_ckpt(f, "wd", 1, 0), 0);
  run_until_for(f, &a.end.done, 500);
  run_until_for(f, &b.end.done, 500);
  assert_true(a.del.done);
  assert_int_equal(a.del.err, 0);
  protobuf_c_message_free_unpacked(a.del.resp, NULL);
  struct watcher *ws[] = {&a, &b};
  for (int k = 0; k < 2; k++) {
    assert_true(ws[k]->end.done);
    assert_int_equal(ws[k]->end.err, 0);
    assert_int_equal(ws[k]->n, 3);
    assert_int_equal(ws[k]->type[0], EV(CREATED));
    assert_int_equal(ws[k]->type[1], EV(CHECKPOINT));
    assert_int_equal(ws[k]->type[2], EV(DELETED));
  }
  struct res *g = get_job(f, "wd");
  assert_int_equal(g->err, STK_ENOENT);
  res_free(g);
}

static void test_close_inside_watch_callback(void **state) {
  struct fx *f = *state;
  create(f, "wc", 1, 1);
  struct watcher a = {.close_at_first = true}, b = {0}, c = {0};
  watch(f, "wc", 0, &a);
  watch(f, "wc", 0, &b);
  watch(f, "wc", 0, &c);
  run_until_for(f, &a.closed, 1000);
  f->c = NULL;
  assert_true(a.closed); /* Close completed: every watcher was answered. */
  struct watcher *ws[] = {&a, &b, &c};
  for (int k = 0; k < 3; k++) {
    assert_true(ws[k]->end.done);
    assert_int_equal(ws[k]->end.err, STK_EUNAVAIL);
  }
}

static void test_cancel_peer_inside_watch_callback(void **state) {
  struct fx *f = *state;
  create(f, "wx", 1, 1);
  struct watcher a = {0}, b = {0};
  watch(f, "wx", 0, &a);
  watch(f, "wx", 0, &b);
  a.peer = &b; /* b is still waiting for its turn in this pass. */
  run_for(f, 20);
  assert_true(b.end.done);
  assert_int_equal(b.end.err, STK_ECANCELED);
  assert_int_equal(b.n, 0);
  assert_int_equal(a.n, 1);
  assert_false(a.end.done);
  struct coord_stats st;
  coord_get_stats(f->c, &st);
  assert_int_equal(st.watchers, 1);
  coord_cancel(f->c, a.w); /* a lives on this stack. */
  assert_int_equal(a.end.err, STK_ECANCELED);
}

/* Cancelling a parked join from inside another call's completion. */
struct cancel_ctx {
  struct fx *f;
  struct coord_wait *victim;
  struct res own;
};

static void cancel_then_done(void *arg, int err, const char *msg, const ProtobufCMessage *resp) {
  struct cancel_ctx *x = arg;
  coord_cancel(x->f->c, x->victim);
  on_done(&x->own, err, msg, resp);
}

static void test_cancel_inside_completion(void **state) {
  struct fx *f = *state;
  create(f, "cj", 1, 1);
  struct res *r[1];
  join_all(f, "cj", 1, r); /* Full: the next join parks. */
  res_free(r[0]);
  Stoker__V1__JoinRequest req = STOKER__V1__JOIN_REQUEST__INIT;
  req.job = "cj";
  req.member_id = "late";
  struct res *parked = res_new();
  struct coord_wait *pw = coord_join(f->c, &req, on_done, parked);
  run_for(f, 20);
  assert_false(parked->done);
  /* An unknown-job failure's completion cancels the parked join. */
  struct cancel_ctx x = {.f = f, .victim = pw};
  Stoker__V1__GetJobRequest gr = STOKER__V1__GET_JOB_REQUEST__INIT;
  gr.job = "nope";
  coord_get_job(f->c, &gr, cancel_then_done, &x);
  run_until(f, &x.own.done);
  assert_int_equal(x.own.err, STK_ENOENT);
  assert_true(parked->done);
  assert_int_equal(parked->err, STK_ECANCELED);
  run_for(f, 20);
  struct res *g = get_job(f, "cj");
  assert_int_equal(JOB(g)->waiting, 0);
  res_free(g);
  res_free(parked);
}

/* The heartbeat that completes a pause reports STOP for a job whose PAUSED
 * state must be synced before the answer is released. */
struct synced_at {
  struct fx *f;
  uint64_t synced;
  struct res r;
};

static void note_synced(void *arg, int err, const char *msg, const ProtobufCMessage *resp) {
  struct synced_at *s = arg;
  struct coord_stats st;
  coord_get_stats(s->f->c, &st);
  s->synced = st.synced_writes;
  on_done(&s->r, err, msg, resp);
}

static void test_pause_completion_synced_first(void **state) {
  struct fx *f = *state;
  create(f, "pz", 1, 1);
  struct res *r[1];
  join_all(f, "pz", 1, r);
  res_free(r[0]);
  assert_int_equal(job_action(f, coord_pause_job, "pz", true), 0);
  run_for(f, 20);
  Stoker__V1__HeartbeatRequest req = STOKER__V1__HEARTBEAT_REQUEST__INIT;
  req.job = "pz";
  req.member_id = "m0";
  req.generation = 1;
  struct synced_at s = {.f = f};
  coord_heartbeat(f->c, &req, note_synced, &s);
  run_until(f, &s.r.done);
  assert_int_equal(((Stoker__V1__HeartbeatResponse *)s.r.resp)->action, ACT(STOP));
  run_for(f, 50);
  struct coord_stats st;
  coord_get_stats(f->c, &st);
  assert_int_equal(st.synced_writes, s.synced); /* Nothing synced after the answer. */
  struct res *g = get_job(f, "pz");
  assert_int_equal(JOB(g)->state, ST(PAUSED));
  res_free(g);
  if (s.r.resp) protobuf_c_message_free_unpacked(s.r.resp, NULL);
}

/* ---- Gap 5: the heartbeat message with a health change -------------------- */

static int beat_health(struct fx *f, const char *member, Stoker__V1__RankHealth h,
                       const char *message) {
  Stoker__V1__HeartbeatRequest req = STOKER__V1__HEARTBEAT_REQUEST__INIT;
  req.job = "h";
  req.member_id = (char *)member;
  req.generation = 1;
  req.step = 12;
  req.health = h;
  req.message = (char *)message;
  struct res *r = res_new();
  coord_heartbeat(f->c, &req, on_done, r);
  int err = wait_res(f, r)->err;
  res_free(r);
  return err;
}

static void check_member(struct fx *f, Stoker__V1__RankHealth h, const char *message) {
  struct res *g = get_job(f, "h");
  assert_int_equal(JOB(g)->n_members, 1);
  assert_int_equal(JOB(g)->members[0]->health, h);
  assert_string_equal(JOB(g)->members[0]->message, message);
  res_free(g);
}

static void test_health_message(void **state) {
  struct fx *f = *state;
  Stoker__V1__JobSpec s = spec_of("h", 1, 1);
  s.heartbeat_interval_ms = 60000;
  assert_int_equal(create_spec(f, &s), 0);
  struct res *r[1];
  join_all(f, "h", 1, r);
  res_free(r[0]);
  struct watcher w = {0};
  watch(f, "h", 0, &w);
  char long_msg[1025];
  for (int i = 0; i < 1024; i++) long_msg[i] = (char)('a' + i % 26);
  long_msg[1024] = 0;
  const Stoker__V1__RankHealth DEG = STOKER__V1__RANK_HEALTH__RANK_HEALTH_DEGRADED;
  assert_int_equal(beat_health(f, "m0", STOKER__V1__RANK_HEALTH__RANK_HEALTH_OK, ""), 0);
  assert_int_equal(beat_health(f, "m0", DEG, long_msg), 0);
  run_for(f, 20);
  int n = w.n;
  assert_int_equal(w.type[n - 1], EV(HEALTH));
  assert_non_null(strstr(w.msg[n - 1], "DEGRADED"));
  assert_non_null(strstr(w.msg[n - 1], long_msg)); /* In full. */
  check_member(f, DEG, long_msg);
  /* Same health, new text: GetJob shows it; no new event. */
  assert_int_equal(beat_health(f, "m0", DEG, "ecc errors on gpu 3"), 0);
  run_for(f, 20);
  assert_int_equal(w.n, n);
  check_member(f, DEG, "ecc errors on gpu 3");
  fx_close(f);
  fx_open(f);
  check_member(f, DEG, "ecc errors on gpu 3");
}

/* The child reports FAILING, tells the parent once that is acknowledged,
 * and runs on until killed (long before a lazy stats flush): the member
 * record must be in the same synced batch as the HEALTH event. */
static void health_child(const char *dir, int fd) {
  struct fx f = {0};
  uv_loop_init(&f.loop);
  snprintf(f.dir, sizeof(f.dir), "%s", dir);
  f.opts.dir = f.dir;
  f.opts.tick_ms = 5;
  f.opts.stats_flush_ms = 60000;
  if (coord_open(&f.loop, &f.opts, &f.c)) _exit(2);
  Stoker__V1__JobSpec s = spec_of("h", 1, 1);
  s.heartbeat_interval_ms = 60000;
  if (create_spec(&f, &s)) _exit(3);
  struct res *r[1];
  join_all(&f, "h", 1, r);
  if (beat_health(&f, "m0", STOKER__V1__RANK_HEALTH__RANK_HEALTH_FAILING, "nic down")) _exit(4);
  char ok = 1;
  if (write(fd, &ok, 1) != 1) _exit(5);
  uv_run(&f.loop, UV_RUN_DEFAULT);
  _exit(0);
}

static void test_health_change_crash(void **state) {
  struct fx *f = *state;
  fx_close(f);
  kill_after_ack(f->dir, health_child);
  fx_open(f);
  check_member(f, STOKER__V1__RANK_HEALTH__RANK_HEALTH_FAILING, "nic down");
}

static bool valid_utf8(const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  while (*p) {
    int n = *p < 0x80 ? 0 : (*p & 0xe0) == 0xc0 ? 1 : (*p & 0xf0) == 0xe0 ? 2 : 3;
    if (*p >= 0x80 && (*p & 0xc0) == 0x80) return false;
    p++;
    for (int i = 0; i < n; i++, p++)
      if ((*p & 0xc0) != 0x80) return false;
  }
  return true;
}

static void test_event_text_utf8(void **state) {
  struct fx *f = *state;
  create(f, "u", 1, 1);
  char uri[1024];
  uri[0] = 'a';
  for (int i = 1; i < 1023; i += 2) memcpy(uri + i, "\xc3\xa9", 2); /* U+00E9 */
  uri[1023] = 0;
  Stoker__V1__ReportCheckpointRequest req = STOKER__V1__REPORT_CHECKPOINT_REQUEST__INIT;
  req.job = "u";
  req.step = 1;
  req.uri = uri;
  struct res *r = res_new();
  coord_report_checkpoint(f->c, &req, on_done, r);
  assert_int_equal(wait_res(f, r)->err, 0);
  res_free(r);
  struct watcher w = {0};
  watch(f, "u", 0, &w);
  run_for(f, 20);
  assert_int_equal(w.type[w.n - 1], EV(CHECKPOINT));
  assert_true(valid_utf8(w.msg[w.n - 1]));
  assert_string_equal(w.msg[w.n - 1], uri);
  coord_cancel(f->c, w.w);
}

/* What ranks and operators send as free text (a Join's address and host, a
 * heartbeat's message, a checkpoint's URI, a preemption's reason) is shown
 * back in the Job or its events: text that is not valid UTF-8 is
 * INVALID_ARGUMENT naming the field, and nothing changes. */
static void test_free_text_utf8(void **state) {
  struct fx *f = *state;
  create(f, "ft", 1, 1);
  Stoker__V1__JoinRequest jr = STOKER__V1__JOIN_REQUEST__INIT;
  jr.job = "ft";
  jr.member_id = "m0";
  jr.address = "127.0.0.1:1";
  jr.host = "node-\xff";
  struct res *r = res_new();
  coord_join(f->c, &jr, on_done, r);
  assert_int_equal(wait_res(f, r)->err, STK_EINVAL);
  assert_non_null(strstr(r->msg, "host not valid UTF-8"));
  res_free(r);
  jr.host = "node";
  jr.address = "10.0.0.1:\xc3";
  r = res_new();
  coord_join(f->c, &jr, on_done, r);
  assert_int_equal(wait_res(f, r)->err, STK_EINVAL);
  assert_non_null(strstr(r->msg, "address not valid UTF-8"));
  res_free(r);
  struct res *g = get_job(f, "ft");
  assert_int_equal(JOB(g)->waiting, 0);
  assert_int_equal(JOB(g)->state, STOKER__V1__JOB_STATE__JOB_STATE_WAITING);
  res_free(g);
  struct res *joined[1];
  join_all(f, "ft", 1, joined);
  assert_int_equal(joined[0]->err, 0);
  res_free(joined[0]);

  Stoker__V1__HeartbeatRequest hb = STOKER__V1__HEARTBEAT_REQUEST__INIT;
  hb.job = "ft";
  hb.member_id = "m0";
  hb.generation = 1;
  hb.health = STOKER__V1__RANK_HEALTH__RANK_HEALTH_FAILING;
  hb.message = "nic \xe9";
  r = res_new();
  coord_heartbeat(f->c, &hb, on_done, r);
  assert_int_equal(wait_res(f, r)->err, STK_EINVAL);
  assert_non_null(strstr(r->msg, "message not valid UTF-8"));
  res_free(r);

  Stoker__V1__ReportCheckpointRequest rc = STOKER__V1__REPORT_CHECKPOINT_REQUEST__INIT;
  rc.job = "ft";
  rc.step = 5;
  rc.uri = "s3://b/\xed\xa0\x80"; /* A surrogate. */
  r = res_new();
  coord_report_checkpoint(f->c, &rc, on_done, r);
  assert_int_equal(wait_res(f, r)->err, STK_EINVAL);
  assert_non_null(strstr(r->msg, "uri not valid UTF-8"));
  res_free(r);

  Stoker__V1__PreemptJobRequest pr = STOKER__V1__PREEMPT_JOB_REQUEST__INIT;
  pr.job = "ft";
  pr.reason = "\xc0\xaf"; /* An overlong '/'. */
  r = res_new();
  coord_preempt_job(f->c, &pr, on_done, r);
  assert_int_equal(wait_res(f, r)->err, STK_EINVAL);
  assert_non_null(strstr(r->msg, "reason not valid UTF-8"));
  res_free(r);

  g = get_job(f, "ft"); /* Nothing changed. */
  assert_int_equal(JOB(g)->state, STOKER__V1__JOB_STATE__JOB_STATE_RUNNING);
  assert_int_equal(JOB(g)->n_members, 1);
  assert_int_equal(JOB(g)->members[0]->health, STOKER__V1__RANK_HEALTH__RANK_HEALTH_UNSPECIFIED);
  assert_string_equal(JOB(g)->members[0]->message, "");
  assert_int_equal(JOB(g)->latest_checkpoint->step, 0);
  res_free(g);
}

/* ---- A lease starts when the member is told its seat ---- */

struct sleeper {
  uv_work_t req;
  bool done;
};

static void sleep_work(uv_work_t *req) {
  (void)req;
  usleep(300 * 1000);
}

static void sleep_done(uv_work_t *req, int status) {
  (void)status;
  ((struct sleeper *)req->data)->done = true;
}

/* The round's close is a synced write on the libuv threadpool; here every
 * pool thread sleeps 300 ms first (three 100 ms leases), so the Joins are
 * answered late, as with a slow disk. The members learn their seats only
 * then, so their leases start then: a heartbeat right after the answers is
 * CONTINUE in generation 1. Before the lease start moved to the answers,
 * the sweep lost both members while the write waited and the job was
 * WAITING for generation 2. */
static void test_lease_starts_when_told(void **state) {
  struct fx *f = *state;
  Stoker__V1__JobSpec s = short_lease_spec_of("told", 2, 2);
  assert_int_equal(create_spec(f, &s), 0);
  const char *env = getenv("UV_THREADPOOL_SIZE");
  int threads = env && atoi(env) > 0 ? atoi(env) : 4;
  struct sleeper *sl = calloc((size_t)threads, sizeof(*sl));
  uint64_t t0 = uv_now(&f->loop);
  for (int i = 0; i < threads; i++) {
    sl[i].req.data = &sl[i];
    assert_int_equal(uv_queue_work(&f->loop, &sl[i].req, sleep_work, sleep_done), 0);
  }
  struct res *a = join(f, "told", "m0"), *b = join(f, "told", "m1"); /* Closes at max. */
  run_until(f, &a->done);
  run_until(f, &b->done);
  assert_true(uv_now(&f->loop) - t0 >= 200); /* The answers came after two leases. */
  assert_int_equal(a->err, 0);
  assert_int_equal(JOINR(a)->generation, 1);
  assert_int_equal(heartbeat(f, "told", "m0", 1), ACT(CONTINUE));
  assert_int_equal(heartbeat(f, "told", "m1", 1), ACT(CONTINUE));
  struct res *g = get_job(f, "told");
  assert_int_equal(JOB(g)->state, STOKER__V1__JOB_STATE__JOB_STATE_RUNNING);
  assert_int_equal(JOB(g)->generation, 1);
  res_free(g);
  /* From then on a lease runs: m1 silent past it is lost. */
  for (int i = 0; i < 40; i++) {
    run_for(f, 20);
    heartbeat(f, "told", "m0", 1);
  }
  assert_int_equal(heartbeat(f, "told", "m0", 1), ACT(RESTART));
  for (int i = 0; i < threads; i++) run_until(f, &sl[i].done);
  free(sl);
  res_free(a);
  res_free(b);
}

/* CreateJob with one label; ret_msg gets the error text. */
static int create_labeled(struct fx *f, const char *key, const char *value, char *ret_msg) {
  Stoker__V1__JobSpec s = spec_of("lab", 1, 2);
  Stoker__V1__JobSpec__LabelsEntry lab = STOKER__V1__JOB_SPEC__LABELS_ENTRY__INIT;
  lab.key = (char *)key;
  lab.value = (char *)value;
  Stoker__V1__JobSpec__LabelsEntry *labs[] = {&lab};
  s.n_labels = 1;
  s.labels = labs;
  Stoker__V1__CreateJobRequest req = STOKER__V1__CREATE_JOB_REQUEST__INIT;
  req.spec = &s;
  struct res *r = res_new();
  coord_create_job(f->c, &req, on_done, r);
  int err = wait_res(f, r)->err;
  snprintf(ret_msg, 256, "%s", r->msg);
  res_free(r);
  return err;
}

/* Label values and storage URIs are echoed in every Job: one that is not
 * valid UTF-8 is refused naming the field, and nothing is created. */
static void test_label_utf8(void **state) {
  struct fx *f = *state;
  char msg[256];
  const char *bad_values[] = {"caf\xc3", "\xed\xa0\x80", "\xc0\xaf", "\xff"};
  for (size_t i = 0; i < sizeof(bad_values) / sizeof(*bad_values); i++) {
    assert_int_equal(create_labeled(f, "team", bad_values[i], msg), STK_EINVAL);
    if (!strstr(msg, "labels[\"team\"] value not valid UTF-8"))
      fail_msg("case %zu: \"%s\"", i, msg);
    struct res *g = get_job(f, "lab");
    assert_int_equal(g->err, STK_ENOENT);
    res_free(g);
  }
  assert_int_equal(create_labeled(f,
                                  "t\xc3\xa9"
                                  "am",
                                  "v", msg),
                   STK_EINVAL);
  assert_non_null(strstr(msg, "labels: a key must match"));
  char long_value[258];
  memset(long_value, 'v', 257), long_value[257] = 0;
  assert_int_equal(create_labeled(f, "team", long_value, msg), STK_EINVAL);
  assert_non_null(strstr(msg, "labels[\"team\"] value over 256 bytes"));
  Stoker__V1__JobSpec s = spec_of("lab", 1, 2);
  Stoker__V1__StorageRef ds = STOKER__V1__STORAGE_REF__INIT;
  ds.uri = "file:///data/\xe9t\xe9";
  s.dataset = &ds;
  assert_int_equal(create_spec(f, &s), STK_EINVAL);
  s.dataset = NULL;
  s.checkpoint_storage = &ds;
  assert_int_equal(create_spec(f, &s), STK_EINVAL);
  struct res *g = get_job(f, "lab");
  assert_int_equal(g->err, STK_ENOENT);
  res_free(g);
  /* Valid UTF-8 passes and reads back as given. */
  assert_int_equal(create_labeled(f, "team", "caf\xc3\xa9 \xf0\x9f\x94\xa5", msg), 0);
  g = get_job(f, "lab");
  assert_string_equal(JOB(g)->spec->labels[0]->value, "caf\xc3\xa9 \xf0\x9f\x94\xa5");
  res_free(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_watch_behind_at_delete, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_delete_inside_watch_callback, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_close_inside_watch_callback, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_cancel_peer_inside_watch_callback, fx_setup,
                                      fx_teardown),
      cmocka_unit_test_setup_teardown(test_cancel_inside_completion, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_pause_completion_synced_first, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_health_message, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_health_change_crash, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_event_text_utf8, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_label_utf8, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_free_text_utf8, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_lease_starts_when_told, fx_setup, fx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
