/*
 * The coordinator core in-process: jobs, validation, rendezvous, leases,
 * fencing, barriers, KV, scale, pause/resume/stop/delete and watches. Real
 * RocksDB in a temporary directory; short intervals (50 ms heartbeats,
 * 100 ms last call) driven by the test's own loop.
 */
#include "coord_test.h"

#define ST(x)  STOKER__V1__JOB_STATE__JOB_STATE_##x
#define ACT(x) STOKER__V1__HEARTBEAT_ACTION__HEARTBEAT_ACTION_##x

static void test_create_get_list(void **state) {
  struct fx *f = *state;
  Stoker__V1__JobSpec s = spec_of("alpha", 1, 4);
  Stoker__V1__JobSpec__LabelsEntry lab = STOKER__V1__JOB_SPEC__LABELS_ENTRY__INIT;
  lab.key = "team";
  lab.value = "nlp";
  Stoker__V1__JobSpec__LabelsEntry *labs[] = {&lab};
  s.n_labels = 1;
  s.labels = labs;
  assert_int_equal(create_spec(f, &s), 0);
  create(f, "beta", 2, 2);
  assert_int_equal(create_spec(f, &s), STK_EEXIST);

  struct res *r = get_job(f, "alpha");
  assert_int_equal(r->err, 0);
  assert_int_equal(JOB(r)->state, ST(WAITING));
  assert_int_equal(JOB(r)->generation, 1);
  assert_int_equal(JOB(r)->world_size, 0);
  assert_int_equal(JOB(r)->spec->max_ranks, 4);
  res_free(r);
  r = get_job(f, "nope");
  assert_int_equal(r->err, STK_ENOENT);
  res_free(r);

  Stoker__V1__ListJobsRequest lr = STOKER__V1__LIST_JOBS_REQUEST__INIT;
  r = res_new();
  coord_list_jobs(f->c, &lr, on_done, r);
  Stoker__V1__ListJobsResponse *l = (Stoker__V1__ListJobsResponse *)wait_res(f, r)->resp;
  assert_int_equal(l->n_jobs, 2);
  assert_string_equal(l->jobs[0]->spec->name, "alpha");
  assert_string_equal(l->jobs[1]->spec->name, "beta");
  res_free(r);
  Stoker__V1__ListJobsRequest__LabelSelectorEntry sel =
      STOKER__V1__LIST_JOBS_REQUEST__LABEL_SELECTOR_ENTRY__INIT;
  sel.key = "team";
  sel.value = "nlp";
  Stoker__V1__ListJobsRequest__LabelSelectorEntry *sels[] = {&sel};
  lr.n_label_selector = 1;
  lr.label_selector = sels;
  r = res_new();
  coord_list_jobs(f->c, &lr, on_done, r);
  l = (Stoker__V1__ListJobsResponse *)wait_res(f, r)->resp;
  assert_int_equal(l->n_jobs, 1);
  assert_string_equal(l->jobs[0]->spec->name, "alpha");
  res_free(r);
}

static void test_validation(void **state) {
  struct fx *f = *state;
  const char *bad_names[] = {
      "",          "Upper", "-lead",
      "has space", "a/b",   "0123456789012345678901234567890123456789012345678901234567890123"};
  for (size_t i = 0; i < sizeof(bad_names) / sizeof(*bad_names); i++) {
    Stoker__V1__JobSpec s = spec_of(bad_names[i], 1, 2);
    assert_int_equal(create_spec(f, &s), STK_EINVAL);
  }
  Stoker__V1__JobSpec s = spec_of("ok", 3, 2); /* min > max */
  assert_int_equal(create_spec(f, &s), STK_EINVAL);
  s = spec_of("ok", 0, 2);
  assert_int_equal(create_spec(f, &s), STK_EINVAL);
  s = spec_of("ok", 1, 100001);
  assert_int_equal(create_spec(f, &s), STK_EINVAL);
  s = spec_of("ok", 1, 2);
  s.heartbeat_interval_ms = 5;
  assert_int_equal(create_spec(f, &s), STK_EINVAL);
  s = spec_of("ok", 1, 2);
  s.heartbeat_misses = 101;
  assert_int_equal(create_spec(f, &s), STK_EINVAL);
  s = spec_of("ok", 1, 2);
  s.last_call_ms = 3600001;
  assert_int_equal(create_spec(f, &s), STK_EINVAL);
  Stoker__V1__JobSpec__LabelsEntry lab = STOKER__V1__JOB_SPEC__LABELS_ENTRY__INIT;
  lab.key = "bad key";
  lab.value = "v";
  Stoker__V1__JobSpec__LabelsEntry *labs[] = {&lab};
  s = spec_of("ok", 1, 2);
  s.n_labels = 1;
  s.labels = labs;
  assert_int_equal(create_spec(f, &s), STK_EINVAL);
  struct res *r = get_job(f, "ok");
  assert_int_equal(r->err, STK_ENOENT); /* Nothing created. */
  res_free(r);
  /* Defaults fill zero fields. */
  s = spec_of("ok", 1, 2);
  s.heartbeat_interval_ms = s.heartbeat_misses = s.last_call_ms = s.join_timeout_ms = 0;
  assert_int_equal(create_spec(f, &s), 0);
  r = get_job(f, "ok");
  assert_int_equal(JOB(r)->spec->heartbeat_interval_ms, 5000);
  assert_int_equal(JOB(r)->spec->heartbeat_misses, 3);
  assert_int_equal(JOB(r)->spec->last_call_ms, 30000);
  assert_int_equal(JOB(r)->spec->join_timeout_ms, 600000);
  res_free(r);
  /* Bad member id on Join. */
  r = join(f, "ok", "bad id!");
  assert_int_equal(wait_res(f, r)->err, STK_EINVAL);
  res_free(r);
}

static void test_rendezvous(void **state) {
  struct fx *f = *state;
  enum { N = 8 };
  create(f, "rdv", N, N);
  struct res *r[N];
  join_all(f, "rdv", N, r);
  bool seen[N] = {0};
  for (int i = 0; i < N; i++) {
    assert_int_equal(r[i]->err, 0);
    assert_int_equal(JOINR(r[i])->generation, 1);
    assert_int_equal(JOINR(r[i])->world_size, N);
    assert_int_equal(JOINR(r[i])->heartbeat_timeout_ms, 2000);
    assert_false(seen[JOINR(r[i])->rank]);
    seen[JOINR(r[i])->rank] = true;
    res_free(r[i]);
  }
  struct res *g = get_job(f, "rdv");
  assert_int_equal(JOB(g)->state, ST(RUNNING));
  assert_int_equal(JOB(g)->n_members, N);
  for (int i = 0; i < N; i++) assert_int_equal(JOB(g)->members[i]->rank, i);
  res_free(g);
}

static void test_last_call_and_cap(void **state) {
  struct fx *f = *state;
  create(f, "lc", 2, 3);
  /* Min reached: the last-call window (100 ms) opens, and the round closes
   * no sooner. Measured from before the joins rather than by looking
   * 40 ms in (a loaded machine ran that look past the window). */
  uv_update_time(&f->loop);
  uint64_t t0 = uv_now(&f->loop);
  struct res *a = join(f, "lc", "a"), *b = join(f, "lc", "b");
  run_until(f, &a->done);
  run_until(f, &b->done);
  assert_true(uv_now(&f->loop) - t0 >= 100);
  assert_int_equal(JOINR(a)->world_size, 2);
  assert_int_equal(JOINR(a)->rank, 0);
  assert_int_equal(JOINR(b)->rank, 1);
  res_free(a);
  res_free(b);

  create(f, "cap", 2, 3);
  struct res *r[4];
  for (int i = 0; i < 4; i++) {
    char id[16];
    snprintf(id, sizeof(id), "x%d", i);
    r[i] = join(f, "cap", id);
  }
  for (int i = 0; i < 3; i++) run_until(f, &r[i]->done); /* Closed at max at once. */
  for (int i = 0; i < 3; i++) assert_int_equal(JOINR(r[i])->world_size, 3);
  run_for(f, 30);
  assert_false(r[3]->done); /* The extra joiner waits for the next round. */
  struct res *g = get_job(f, "cap");
  assert_int_equal(JOB(g)->waiting, 1);
  assert_int_equal(JOB(g)->world_size, 3);
  res_free(g);
  for (int i = 0; i < 3; i++) res_free(r[i]);
  /* Cancel the parked one: answered synchronously with ECANCELED. */
  Stoker__V1__JoinRequest req = STOKER__V1__JOIN_REQUEST__INIT;
  req.job = "cap";
  req.member_id = "x9";
  struct res *x = res_new();
  struct coord_wait *w = coord_join(f->c, &req, on_done, x);
  coord_cancel(f->c, w);
  assert_true(x->done);
  assert_int_equal(x->err, STK_ECANCELED);
  res_free(x);
  /* Joining twice supersedes the older call. */
  struct res *again = join(f, "cap", "x3");
  run_until(f, &r[3]->done);
  assert_int_equal(r[3]->err, STK_EABORTED);
  assert_false(again->done);
  res_free(r[3]);
  assert_int_equal(job_action(f, coord_stop_job, "cap", false), 0);
  assert_int_equal(wait_res(f, again)->err, STK_ESTATE);
  res_free(again);
}

/* Sends heartbeats for the first n members every 20 ms. */
struct beater {
  uv_timer_t t;
  struct fx *f;
  int n;
  uint64_t gen;
  int last[8];
};

static void beat_done(void *arg, int err, const char *msg, const ProtobufCMessage *resp) {
  int *slot = arg;
  *slot = err ? err : (int)((const Stoker__V1__HeartbeatResponse *)resp)->action;
}

static void on_beat(uv_timer_t *t) {
  struct beater *b = t->data;
  for (int i = 0; i < b->n; i++) {
    char id[16];
    snprintf(id, sizeof(id), "m%d", i);
    Stoker__V1__HeartbeatRequest req = STOKER__V1__HEARTBEAT_REQUEST__INIT;
    req.job = "lease";
    req.member_id = id;
    req.generation = b->gen;
    coord_heartbeat(b->f->c, &req, beat_done, &b->last[i]);
  }
}

static void test_lease_expiry(void **state) {
  struct fx *f = *state;
  Stoker__V1__JobSpec s = short_lease_spec_of("lease", 2, 3);
  assert_int_equal(create_spec(f, &s), 0);
  struct res *r[3];
  join_all(f, "lease", 3, r);
  for (int i = 0; i < 3; i++) res_free(r[i]);
  struct beater b = {.f = f, .n = 2, .gen = 1};
  uv_timer_init(&f->loop, &b.t);
  b.t.data = &b;
  uv_timer_start(&b.t, on_beat, 0, 20);
  run_for(f, 60);
  assert_int_equal(b.last[0], ACT(CONTINUE));
  /* m2 is silent: its 100 ms lease expires (waited for as a condition: a
   * loaded machine may take longer than the lease to run the sweep). */
  for (uint64_t end = uv_now(&f->loop) + 10000;
       b.last[1] != ACT(RESTART) && uv_now(&f->loop) < end;)
    run_for(f, 10);
  assert_int_equal(b.last[0], ACT(RESTART));
  assert_int_equal(b.last[1], ACT(RESTART));
  uv_timer_stop(&b.t);
  join_all(f, "lease", 2, r);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(r[i]->err, 0);
    assert_int_equal(JOINR(r[i])->generation, 2);
    assert_int_equal(JOINR(r[i])->world_size, 2);
    assert_int_equal(JOINR(r[i])->rank, i); /* Previous order kept. */
    res_free(r[i]);
  }
  uv_close((uv_handle_t *)&b.t, NULL);
  run_for(f, 1);
}

static void test_fencing(void **state) {
  struct fx *f = *state;
  create(f, "fence", 2, 2);
  struct res *r[2];
  join_all(f, "fence", 2, r);
  res_free(r[0]);
  res_free(r[1]);
  assert_int_equal(heartbeat(f, "fence", "m0", 1), ACT(CONTINUE));
  assert_int_equal(heartbeat(f, "fence", "m0", 2), STK_ESTALE);
  assert_int_equal(heartbeat(f, "fence", "stranger", 1), ACT(RESTART));
  /* m1 restarts and rejoins: generation 2 opens. */
  struct res *j1 = join(f, "fence", "m1");
  assert_int_equal(heartbeat(f, "fence", "m0", 1), ACT(RESTART));
  struct res *j0 = join(f, "fence", "m0");
  run_until(f, &j0->done);
  run_until(f, &j1->done);
  assert_int_equal(JOINR(j0)->generation, 2);
  assert_int_equal(JOINR(j0)->rank, 0);
  res_free(j0);
  res_free(j1);
  assert_int_equal(heartbeat(f, "fence", "m0", 1), ACT(RESTART));
  assert_int_equal(kv_set_(f, "fence", 1, "k", "v"), STK_ESTALE);
  assert_int_equal(kv_set_(f, "fence", 2, "k", "v"), 0);
  Stoker__V1__BarrierRequest br = STOKER__V1__BARRIER_REQUEST__INIT;
  br.job = "fence";
  br.member_id = "m0";
  br.generation = 1;
  br.name = "b";
  struct res *x = res_new();
  coord_barrier(f->c, &br, on_done, x);
  assert_int_equal(wait_res(f, x)->err, STK_ESTALE);
  res_free(x);
}

static struct res *barrier(struct fx *f, const char *member, uint64_t gen, const char *name) {
  return barrier_as(f, "bar", member, gen, name);
}

static void test_barrier(void **state) {
  struct fx *f = *state;
  create(f, "bar", 3, 4);
  Stoker__V1__JobSpec s; /* cap 3 via scale so a 4th joiner opens a round. */
  (void)s;
  Stoker__V1__ScaleJobRequest sr = STOKER__V1__SCALE_JOB_REQUEST__INIT;
  sr.job = "bar";
  sr.ranks = 3;
  struct res *sc = res_new();
  coord_scale_job(f->c, &sr, on_done, sc);
  assert_int_equal(wait_res(f, sc)->err, 0);
  res_free(sc);
  struct res *r[3];
  join_all(f, "bar", 3, r);
  for (int i = 0; i < 3; i++) res_free(r[i]);
  struct res *b0 = barrier(f, "m0", 1, "start"), *b1 = barrier(f, "m1", 1, "start");
  run_for(f, 30);
  assert_false(b0->done);
  struct res *b2 = barrier(f, "m2", 1, "start");
  run_until(f, &b0->done);
  run_until(f, &b1->done);
  run_until(f, &b2->done);
  assert_int_equal(((Stoker__V1__BarrierResponse *)b0->resp)->arrived, 3);
  assert_int_equal(((Stoker__V1__BarrierResponse *)b2->resp)->arrived, 3);
  res_free(b0);
  res_free(b1);
  res_free(b2);
  /* Arriving twice replaces the older call. */
  b0 = barrier(f, "m0", 1, "next");
  struct res *b0b = barrier(f, "m0", 1, "next");
  run_until(f, &b0->done);
  assert_int_equal(b0->err, STK_EABORTED);
  /* A generation change aborts the parked barrier. */
  Stoker__V1__LeaveRequest lr = STOKER__V1__LEAVE_REQUEST__INIT;
  lr.job = "bar";
  lr.member_id = "m2";
  lr.generation = 1;
  struct res *lv = res_new();
  coord_leave(f->c, &lr, on_done, lv);
  assert_int_equal(wait_res(f, lv)->err, 0);
  run_until(f, &b0b->done);
  assert_int_equal(b0b->err, STK_EABORTED);
  res_free(lv);
  res_free(b0);
  res_free(b0b);
}

/* The Store operations of the KV (add, compare_set, delete, count). */
static struct res *kv_add_(struct fx *f, const char *key, int64_t delta) {
  Stoker__V1__KvAddRequest req = STOKER__V1__KV_ADD_REQUEST__INIT;
  req.job = "st";
  req.generation = 1;
  req.key = (char *)key;
  req.delta = delta;
  struct res *r = res_new();
  coord_kv_add(f->c, &req, on_done, r);
  return wait_res(f, r);
}

static struct res *kv_cas_(struct fx *f, const char *key, const char *expected,
                           const char *desired) {
  Stoker__V1__KvCompareSetRequest req = STOKER__V1__KV_COMPARE_SET_REQUEST__INIT;
  req.job = "st";
  req.generation = 1;
  req.key = (char *)key;
  req.expected.data = (uint8_t *)expected;
  req.expected.len = strlen(expected);
  req.desired.data = (uint8_t *)desired;
  req.desired.len = strlen(desired);
  struct res *r = res_new();
  coord_kv_compare_set(f->c, &req, on_done, r);
  return wait_res(f, r);
}

static void assert_value(struct res *r, const char *want) {
  assert_int_equal(r->err, 0);
  const Stoker__V1__KvGetResponse *v = (const Stoker__V1__KvGetResponse *)r->resp;
  assert_int_equal(v->value.len, strlen(want));
  if (v->value.len) assert_memory_equal(v->value.data, want, v->value.len);
  res_free(r);
}

static int kv_delete_(struct fx *f, const char *key, bool *ret_deleted) {
  Stoker__V1__KvDeleteRequest req = STOKER__V1__KV_DELETE_REQUEST__INIT;
  req.job = "st";
  req.generation = 1;
  req.key = (char *)key;
  struct res *r = res_new();
  coord_kv_delete(f->c, &req, on_done, r);
  int err = wait_res(f, r)->err;
  if (!err) *ret_deleted = ((Stoker__V1__KvDeleteResponse *)r->resp)->deleted;
  res_free(r);
  return err;
}

static uint64_t kv_count_(struct fx *f) {
  Stoker__V1__KvCountRequest req = STOKER__V1__KV_COUNT_REQUEST__INIT;
  req.job = "st";
  req.generation = 1;
  struct res *r = res_new();
  coord_kv_count(f->c, &req, on_done, r);
  assert_int_equal(wait_res(f, r)->err, 0);
  uint64_t n = ((Stoker__V1__KvCountResponse *)r->resp)->keys;
  res_free(r);
  return n;
}

static void test_kv_store_ops(void **state) {
  struct fx *f = *state;
  create(f, "st", 1, 1);
  struct res *r[1];
  join_all(f, "st", 1, r);
  res_free(r[0]);
  assert_int_equal(kv_count_(f), 0);
  /* add: a decimal counter from 0, stored as text (Store.get reads "5"). */
  struct res *a = kv_add_(f, "ctr", 5);
  assert_int_equal(a->err, 0);
  assert_int_equal(((Stoker__V1__KvAddResponse *)a->resp)->value, 5);
  res_free(a);
  a = kv_add_(f, "ctr", -7);
  assert_int_equal(((Stoker__V1__KvAddResponse *)a->resp)->value, -2);
  res_free(a);
  assert_value(wait_res(f, kv_get_(f, "st", 1, "ctr", false, NULL)), "-2");
  assert_int_equal(kv_set_(f, "st", 1, "text", "abc"), 0);
  a = kv_add_(f, "text", 1);
  assert_int_equal(a->err, STK_EINVAL);
  res_free(a);
  assert_value(wait_res(f, kv_get_(f, "st", 1, "text", false, NULL)), "abc");
  assert_int_equal(kv_set_(f, "st", 1, "big", "9223372036854775807"), 0);
  a = kv_add_(f, "big", 1);
  assert_int_equal(a->err, STK_ERANGE);
  res_free(a);
  /* add wakes a parked get of its key. */
  struct res *g = kv_get_(f, "st", 1, "woken", true, NULL);
  run_for(f, 10);
  assert_false(g->done);
  res_free(kv_add_(f, "woken", 3));
  run_until(f, &g->done);
  assert_value(g, "3");
  /* compare_set, as torch.distributed.Store defines it. */
  assert_value(kv_cas_(f, "cas", "", "first"), "first");        /* absent, expected "" */
  assert_value(kv_cas_(f, "cas", "wrong", "second"), "first");  /* mismatch: current */
  assert_value(kv_cas_(f, "cas", "first", "second"), "second"); /* match: desired */
  assert_value(kv_cas_(f, "none", "exp", "des"), "exp");        /* absent, expected set */
  struct res *none = wait_res(f, kv_get_(f, "st", 1, "none", false, NULL));
  assert_int_equal(none->err, STK_ENOENT);
  res_free(none);
  /* delete and count. */
  assert_int_equal(kv_count_(f), 5); /* ctr text big woken cas */
  bool deleted = false;
  assert_int_equal(kv_delete_(f, "cas", &deleted), 0);
  assert_true(deleted);
  assert_int_equal(kv_delete_(f, "cas", &deleted), 0);
  assert_false(deleted);
  assert_int_equal(kv_count_(f), 4);
  /* A get parked on a key that is deleted keeps waiting for a new value. */
  g = kv_get_(f, "st", 1, "ctr2", true, NULL);
  assert_int_equal(kv_set_(f, "st", 1, "ctr2", "1"), 0);
  run_until(f, &g->done);
  assert_value(g, "1");
  g = kv_get_(f, "st", 1, "gone", true, NULL);
  assert_int_equal(kv_set_(f, "st", 1, "gone", "x"), 0);
  run_until(f, &g->done);
  res_free(g);
  assert_int_equal(kv_delete_(f, "gone", &deleted), 0);
  g = kv_get_(f, "st", 1, "gone", true, NULL);
  run_for(f, 10);
  assert_false(g->done);
  assert_int_equal(kv_set_(f, "st", 1, "gone", "back"), 0);
  run_until(f, &g->done);
  assert_value(g, "back");
  /* Every change is durable: after a reopen the same values and count. */
  fx_close(f);
  fx_open(f);
  assert_value(wait_res(f, kv_get_(f, "st", 1, "ctr", false, NULL)), "-2");
  assert_value(wait_res(f, kv_get_(f, "st", 1, "woken", false, NULL)), "3");
  none = wait_res(f, kv_get_(f, "st", 1, "cas", false, NULL)); /* deleted */
  assert_int_equal(none->err, STK_ENOENT);
  res_free(none);
  assert_int_equal(kv_count_(f), 6); /* ctr text big woken ctr2 gone */
  /* Bad input changes nothing. */
  a = kv_add_(f, "bad key!", 1);
  assert_int_equal(a->err, STK_EINVAL);
  res_free(a);
  assert_int_equal(kv_count_(f), 6);
}

/* KvSet of a 1000-byte value under key k: the error, and the message in msg. */
static int kv_set_big(struct fx *f, const char *job, const char *key, char msg[256]) {
  static char value[1001];
  memset(value, 'v', 1000);
  Stoker__V1__KvSetRequest req = STOKER__V1__KV_SET_REQUEST__INIT;
  req.job = (char *)job;
  req.generation = 1;
  req.key = (char *)key;
  req.value.data = (uint8_t *)value;
  req.value.len = 1000;
  struct res *r = res_new();
  coord_kv_set(f->c, &req, on_done, r);
  int err = wait_res(f, r)->err;
  snprintf(msg, 256, "%s", r->msg);
  res_free(r);
  return err;
}

/* Key-value budgets (issue 25, item 4): one job holds at most
 * kv_bytes_per_job, all jobs at most kv_bytes; refusals are STK_EBUSY
 * naming the flag and change nothing; an overwrite is charged the
 * difference, a delete gives back; the charges survive a restart. */
static void test_kv_budgets(void **state) {
  struct fx *f = *state;
  fx_close(f);
  f->opts.kv_bytes_per_job = 8192; /* 7 entries of ~1067 bytes */
  f->opts.kv_bytes = 12288;        /* 11 of them */
  fx_open(f);
  create(f, "st", 1, 1);
  create(f, "other", 1, 1);
  struct res *r[1];
  join_all(f, "st", 1, r);
  res_free(r[0]);
  join_all(f, "other", 1, r);
  res_free(r[0]);
  char key[16], msg[256];
  for (int i = 0; i < 7; i++) {
    snprintf(key, sizeof key, "k%d", i);
    assert_int_equal(kv_set_big(f, "st", key, msg), 0);
  }
  assert_int_equal(kv_set_big(f, "st", "k7", msg), STK_EBUSY);
  assert_non_null(strstr(msg, "--kv-bytes-per-job"));
  assert_int_equal(kv_count_(f), 7);
  assert_int_equal(kv_set_big(f, "st", "k3", msg), 0); /* Same size again: fits. */
  bool deleted = false;
  assert_int_equal(kv_delete_(f, "k3", &deleted), 0);
  assert_true(deleted);
  assert_int_equal(kv_set_big(f, "st", "k7", msg), 0); /* Given back, taken again. */
  for (int i = 0; i < 4; i++) {
    snprintf(key, sizeof key, "o%d", i);
    assert_int_equal(kv_set_big(f, "other", key, msg), 0);
  }
  assert_int_equal(kv_set_big(f, "other", "o4", msg), STK_EBUSY);
  assert_non_null(strstr(msg, "(--kv-bytes)"));
  struct coord_stats st;
  coord_get_stats(f->c, &st);
  assert_int_equal(st.kv_bytes, 11 * (2 + 1000 + 64));
  fx_close(f); /* A restart charges what it reads back. */
  fx_open(f);
  coord_get_stats(f->c, &st);
  assert_int_equal(st.kv_bytes, 11 * (2 + 1000 + 64));
  assert_int_equal(kv_set_big(f, "st", "k8", msg), STK_EBUSY);
}

static void test_kv(void **state) {
  struct fx *f = *state;
  create(f, "kv", 1, 2);
  struct res *r[1];
  join_all(f, "kv", 1, r);
  res_free(r[0]); /* last call closes with world 1 */
  assert_int_equal(kv_set_(f, "kv", 1, "nccl/id", "abc"), 0);
  struct res *g = wait_res(f, kv_get_(f, "kv", 1, "nccl/id", false, NULL));
  assert_int_equal(g->err, 0);
  Stoker__V1__KvGetResponse *v = (Stoker__V1__KvGetResponse *)g->resp;
  assert_int_equal(v->value.len, 3);
  assert_memory_equal(v->value.data, "abc", 3);
  res_free(g);
  g = wait_res(f, kv_get_(f, "kv", 1, "missing", false, NULL));
  assert_int_equal(g->err, STK_ENOENT);
  res_free(g);
  assert_int_equal(kv_set_(f, "kv", 1, "bad key!", "x"), STK_EINVAL);
  /* Wait woken by a set. */
  g = kv_get_(f, "kv", 1, "later", true, NULL);
  run_for(f, 20);
  assert_false(g->done);
  assert_int_equal(kv_set_(f, "kv", 1, "later", "42"), 0);
  run_until(f, &g->done);
  assert_int_equal(g->err, 0);
  assert_memory_equal(((Stoker__V1__KvGetResponse *)g->resp)->value.data, "42", 2);
  res_free(g);
  /* Wait aborted by a generation change (a new member joins; m0 joins the
   * new round at once, so it closes full, whatever the last call). */
  g = kv_get_(f, "kv", 1, "never", true, NULL);
  struct res *j = join(f, "kv", "newcomer");
  struct res *j0 = join(f, "kv", "m0");
  run_until(f, &g->done);
  assert_int_equal(g->err, STK_EABORTED);
  res_free(g);
  /* The old generation's keys are gone. */
  run_until(f, &j->done);
  run_until(f, &j0->done);
  assert_int_equal(JOINR(j)->generation, 2);
  g = wait_res(f, kv_get_(f, "kv", 2, "nccl/id", false, NULL));
  assert_int_equal(g->err, STK_ENOENT);
  res_free(g);
  res_free(j);
  res_free(j0);
}

static void test_scale(void **state) {
  struct fx *f = *state;
  create(f, "sc", 1, 4);
  struct res *r[2];
  join_all(f, "sc", 2, r);
  assert_int_equal(JOINR(r[0])->world_size, 2);
  res_free(r[0]);
  res_free(r[1]);
  Stoker__V1__ScaleJobRequest sr = STOKER__V1__SCALE_JOB_REQUEST__INIT;
  sr.job = "sc";
  sr.ranks = 5;
  struct res *x = res_new();
  coord_scale_job(f->c, &sr, on_done, x);
  assert_int_equal(wait_res(f, x)->err, STK_EINVAL);
  res_free(x);
  sr.ranks = 1;
  x = res_new();
  coord_scale_job(f->c, &sr, on_done, x);
  assert_int_equal(wait_res(f, x)->err, 0);
  assert_int_equal(JOB(x)->target_ranks, 1);
  res_free(x);
  assert_int_equal(heartbeat(f, "sc", "m0", 1), ACT(CHECKPOINT_NOW));
  assert_int_equal(heartbeat(f, "sc", "m0", 1), ACT(CONTINUE));
  assert_int_equal(heartbeat(f, "sc", "m1", 1), ACT(CHECKPOINT_NOW));
  say_stop(f, "sc", 1, 2, 10);
  assert_int_equal(report_ckpt(f, "sc", 10, 1), 0);
  assert_int_equal(heartbeat(f, "sc", "m0", 1), ACT(RESTART));
  join_all(f, "sc", 1, r); /* cap 1: closes at once */
  assert_int_equal(JOINR(r[0])->world_size, 1);
  assert_int_equal(JOINR(r[0])->generation, 2);
  assert_int_equal(JOINR(r[0])->latest_checkpoint->step, 10);
  res_free(r[0]);
}

static void test_pause_resume_stop_delete(void **state) {
  struct fx *f = *state;
  create(f, "pr", 2, 2);
  struct res *r[2];
  join_all(f, "pr", 2, r);
  res_free(r[0]);
  res_free(r[1]);
  assert_int_equal(job_action(f, coord_pause_job, "pr", false), 0);
  assert_int_equal(heartbeat(f, "pr", "m0", 1), ACT(CHECKPOINT_NOW));
  assert_int_equal(report_ckpt(f, "pr", 7, 1), 0);
  assert_int_equal(heartbeat(f, "pr", "m0", 1), ACT(STOP));
  struct res *g = get_job(f, "pr");
  assert_int_equal(JOB(g)->state, ST(PAUSING));
  res_free(g);
  assert_int_equal(heartbeat(f, "pr", "m1", 1), ACT(STOP));
  g = get_job(f, "pr"); /* A pause's STOP leaves the seats until the members leave. */
  assert_int_equal(JOB(g)->state, ST(PAUSING));
  res_free(g);
  assert_int_equal(leave_as(f, "pr", "m0", 1, false), 0);
  assert_int_equal(leave_as(f, "pr", "m1", 1, false), 0);
  g = get_job(f, "pr");
  assert_int_equal(JOB(g)->state, ST(PAUSED));
  assert_int_equal(JOB(g)->n_members, 0);
  uint64_t gen = JOB(g)->generation;
  res_free(g);
  assert_int_equal(job_action(f, coord_delete_job, "pr", false) == 0, true); /* PAUSED: ok */
  create(f, "pr", 2, 2);
  struct res *a = join(f, "pr", "a");
  assert_int_equal(job_action(f, coord_pause_job, "pr", false), 0);
  struct res *b = join(f, "pr", "b");
  run_for(f, 150);
  assert_false(a->done || b->done); /* Parked while paused. */
  assert_int_equal(job_action(f, coord_resume_job, "pr", false), 0);
  run_until(f, &a->done);
  run_until(f, &b->done);
  assert_int_equal(a->err, 0);
  assert_true(JOINR(a)->generation > 1);
  res_free(a);
  res_free(b);
  (void)gen;
  assert_int_equal(job_action(f, coord_delete_job, "pr", false), STK_ESTATE);
  struct res *c = join(f, "pr", "c");
  assert_int_equal(job_action(f, coord_stop_job, "pr", false), 0);
  assert_int_equal(wait_res(f, c)->err, STK_ESTATE);
  res_free(c);
  assert_int_equal(heartbeat(f, "pr", "a", 2), ACT(STOP));
  c = join(f, "pr", "d");
  assert_int_equal(wait_res(f, c)->err, STK_ESTATE);
  res_free(c);
  assert_int_equal(job_action(f, coord_delete_job, "pr", false), 0);
  g = get_job(f, "pr");
  assert_int_equal(g->err, STK_ENOENT);
  res_free(g);
}

struct watch_log {
  int n;
  uint64_t seq[64];
  int type[64];
};

static bool on_event(void *arg, const Stoker__V1__JobEvent *ev) {
  struct watch_log *l = arg;
  assert_true(l->n < 64);
  l->seq[l->n] = ev->seq;
  l->type[l->n++] = ev->type;
  return true;
}

struct watch_ctx {
  struct watch_log log;
  struct res end;
};

static void watch_done(void *arg, int err, const char *msg, const ProtobufCMessage *resp) {
  struct watch_ctx *w = arg;
  on_done(&w->end, err, msg, resp);
}

#define EV(x) STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_##x

static void test_events_watch(void **state) {
  struct fx *f = *state;
  create(f, "ev", 1, 1);
  struct res *r[1];
  join_all(f, "ev", 1, r);
  res_free(r[0]);
  struct watch_ctx w = {0};
  Stoker__V1__WatchJobRequest req = STOKER__V1__WATCH_JOB_REQUEST__INIT;
  req.job = "ev";
  coord_watch_job(f->c, &req, on_event, watch_done, &w);
  run_for(f, 20);
  /* Backlog: CREATED, MEMBER_JOINED, ROUND_CLOSED. */
  assert_int_equal(w.log.n, 3);
  assert_int_equal(w.log.type[0], EV(CREATED));
  assert_int_equal(w.log.type[1], EV(MEMBER_JOINED));
  assert_int_equal(w.log.type[2], EV(ROUND_CLOSED));
  assert_int_equal(report_ckpt(f, "ev", 5, 0), 0);
  run_for(f, 20);
  assert_int_equal(w.log.n, 4);
  assert_int_equal(w.log.type[3], EV(CHECKPOINT));
  for (int i = 0; i < 4; i++) assert_int_equal(w.log.seq[i], (uint64_t)i + 1);
  /* A second watcher from after_seq 3. */
  struct watch_ctx w2 = {0};
  req.after_seq = 3;
  struct coord_wait *h2 = coord_watch_job(f->c, &req, on_event, watch_done, &w2);
  run_for(f, 20);
  assert_int_equal(w2.log.n, 1);
  assert_int_equal(w2.log.seq[0], 4);
  coord_cancel(f->c, h2);
  assert_int_equal(w2.end.err, STK_ECANCELED);
  assert_int_equal(job_action(f, coord_delete_job, "ev", true), 0);
  run_until(f, &w.end.done);
  assert_int_equal(w.end.err, 0);
  assert_int_equal(w.log.type[w.log.n - 1], EV(DELETED));
}

static Stoker__V1__JobState state_of(struct fx *f, const char *job, uint64_t *ret_gen) {
  struct res *g = get_job(f, job);
  Stoker__V1__JobState st = JOB(g)->state;
  if (ret_gen) *ret_gen = JOB(g)->generation;
  res_free(g);
  return st;
}

/* Members that finish (torchrun's agents after their exit barrier) leave
 * with finished: the first one's Leave opens no round under the others,
 * whose generation and KV go on, and the job ends FINISHED once all did. */
static void test_members_finish(void **state) {
  struct fx *f = *state;
  create(f, "fin", 3, 3);
  struct res *r[3];
  join_all(f, "fin", 3, r);
  for (int i = 0; i < 3; i++) res_free(r[i]);
  struct watch_ctx w = {0};
  Stoker__V1__WatchJobRequest req = STOKER__V1__WATCH_JOB_REQUEST__INIT;
  req.job = "fin";
  req.after_seq = 5; /* After CREATED, 3 MEMBER_JOINED, ROUND_CLOSED. */
  coord_watch_job(f->c, &req, on_event, watch_done, &w);
  assert_int_equal(leave_as(f, "fin", "m0", 1, true), 0);
  uint64_t gen;
  assert_int_equal(state_of(f, "fin", &gen), ST(RUNNING));
  assert_int_equal(gen, 1);
  assert_int_equal(kv_set_(f, "fin", 1, "exit/num_members", "1"), 0); /* The others' barrier. */
  assert_int_equal(heartbeat(f, "fin", "m1", 1), ACT(CONTINUE));
  assert_int_equal(heartbeat(f, "fin", "m0", 1), ACT(STOP));
  struct res *again = join(f, "fin", "m0"); /* Finishing: no round opens. */
  assert_int_equal(wait_res(f, again)->err, STK_ESTATE);
  res_free(again);
  assert_int_equal(leave_as(f, "fin", "m1", 1, true), 0);
  assert_int_equal(state_of(f, "fin", NULL), ST(RUNNING));
  assert_int_equal(leave_as(f, "fin", "m2", 1, true), 0);
  assert_int_equal(state_of(f, "fin", &gen), ST(FINISHED));
  assert_int_equal(gen, 1);
  run_for(f, 20);
  assert_int_equal(w.log.n, 4);
  for (int i = 0; i < 3; i++) assert_int_equal(w.log.type[i], EV(MEMBER_LEFT));
  assert_int_equal(w.log.type[3], EV(FINISHED));
  assert_int_equal(heartbeat(f, "fin", "m1", 1), ACT(STOP));
  assert_int_equal(kv_set_(f, "fin", 1, "k", "v"), STK_ESTATE);
  assert_int_equal(job_action(f, coord_resume_job, "fin", false), STK_ESTATE);
  assert_int_equal(job_action(f, coord_stop_job, "fin", false), 0);
  assert_int_equal(state_of(f, "fin", NULL), ST(FINISHED));           /* Stays finished. */
  assert_int_equal(job_action(f, coord_delete_job, "fin", false), 0); /* Ended: no force. */
  run_until(f, &w.end.done);
}

/* While a job is finishing, a barrier waits only for the members that have
 * not finished: one that finished never arrives. */
static void test_barrier_while_finishing(void **state) {
  struct fx *f = *state;
  create(f, "bar", 3, 3);
  struct res *r[3];
  join_all(f, "bar", 3, r);
  for (int i = 0; i < 3; i++) res_free(r[i]);
  struct res *b1 = barrier(f, "m1", 1, "b");
  assert_int_equal(leave_as(f, "bar", "m0", 1, true), 0);
  run_for(f, 20);
  assert_false(b1->done); /* m2 is still to come. */
  struct res *b2 = barrier(f, "m2", 1, "b");
  run_until(f, &b1->done);
  run_until(f, &b2->done);
  assert_int_equal(b1->err, 0);
  assert_int_equal(((Stoker__V1__BarrierResponse *)b2->resp)->arrived, 2);
  res_free(b1);
  res_free(b2);
  struct res *c1 = barrier(f, "m1", 1, "c");
  run_for(f, 20);
  assert_false(c1->done);
  assert_int_equal(leave_as(f, "bar", "m2", 1, true), 0); /* Now m1 is the last. */
  run_until(f, &c1->done);
  assert_int_equal(c1->err, 0);
  res_free(c1);
}

/* A member lost while the job is finishing opens no round either: once the
 * others finished, the job ends. A plain Leave still opens one. */
static void test_member_lost_while_finishing(void **state) {
  struct fx *f = *state;
  Stoker__V1__JobSpec s = short_lease_spec_of("finl", 2, 2);
  s.heartbeat_interval_ms = 250; /* A 500 ms lease: m0 leaves well within it. */
  assert_int_equal(create_spec(f, &s), 0);
  struct res *r[2];
  join_all(f, "finl", 2, r);
  for (int i = 0; i < 2; i++) res_free(r[i]);
  assert_int_equal(leave_as(f, "finl", "m0", 1, true), 0);
  /* m1 is silent: its lease expires; m0 holds none. */
  uint64_t gen;
  for (uint64_t end = uv_now(&f->loop) + 10000;
       state_of(f, "finl", NULL) == ST(RUNNING) && uv_now(&f->loop) < end;)
    run_for(f, 20);
  assert_int_equal(state_of(f, "finl", &gen), ST(FINISHED));
  assert_int_equal(gen, 1);
  create(f, "plain", 2, 2);
  join_all(f, "plain", 2, r);
  for (int i = 0; i < 2; i++) res_free(r[i]);
  assert_int_equal(leave_as(f, "plain", "m0", 1, false), 0);
  assert_int_equal(state_of(f, "plain", &gen), ST(WAITING));
  assert_int_equal(gen, 2);
}

/* A parked Join's MEMBER_JOINED is written unsynced: the join forces no
 * synced write, yet watchers get the event at once while the round stays
 * open; the close is the synced write. */
static void test_join_event_unsynced(void **state) {
  struct fx *f = *state;
  create(f, "lz", 2, 2);
  struct watch_ctx w = {0};
  Stoker__V1__WatchJobRequest req = STOKER__V1__WATCH_JOB_REQUEST__INIT;
  req.job = "lz";
  coord_watch_job(f->c, &req, on_event, watch_done, &w);
  run_for(f, 20);
  assert_int_equal(w.log.n, 1); /* CREATED */
  struct coord_stats before, after;
  coord_get_stats(f->c, &before);
  struct res *first = join(f, "lz", "m0");
  for (int i = 0; i < 400 && w.log.n < 2; i++) run_for(f, 5);
  assert_int_equal(w.log.n, 2);
  assert_int_equal(w.log.type[1], EV(MEMBER_JOINED));
  assert_false(first->done);
  coord_get_stats(f->c, &after);
  assert_int_equal(after.synced_writes, before.synced_writes);
  assert_true(after.writes > before.writes);
  struct res *second = join(f, "lz", "m1");
  wait_res(f, first);
  wait_res(f, second);
  assert_int_equal(first->err, 0);
  assert_int_equal(second->err, 0);
  coord_get_stats(f->c, &after);
  assert_int_equal(after.synced_writes, before.synced_writes + 1);
  run_for(f, 20);
  assert_int_equal(w.log.n, 4);
  assert_int_equal(w.log.type[2], EV(MEMBER_JOINED));
  assert_int_equal(w.log.type[3], EV(ROUND_CLOSED));
  for (int i = 0; i < 4; i++) assert_int_equal(w.log.seq[i], (uint64_t)i + 1);
  res_free(first);
  res_free(second);
  assert_int_equal(job_action(f, coord_delete_job, "lz", true), 0);
  run_until(f, &w.end.done);
}

static bool on_event_once(void *arg, const Stoker__V1__JobEvent *ev) {
  on_event(arg, ev);
  return false;
}

static void test_watch_overflow(void **state) {
  struct fx *f = *state;
  fx_close(f);
  f->opts.watch_queue_max = 4;
  fx_open(f);
  create(f, "ov", 1, 1);
  Stoker__V1__WatchJobRequest req = STOKER__V1__WATCH_JOB_REQUEST__INIT;
  req.job = "ov";
  struct watch_ctx fast = {0}, slow = {0};
  coord_watch_job(f->c, &req, on_event, watch_done, &fast);
  struct coord_wait *hs = coord_watch_job(f->c, &req, on_event_once, watch_done, &slow);
  run_for(f, 10);
  assert_int_equal(fast.log.n, 1);
  assert_int_equal(slow.log.n, 1); /* Then it holds delivery. */
  for (int i = 1; i <= 3; i++) assert_int_equal(report_ckpt(f, "ov", i, 0), 0);
  run_for(f, 10);
  assert_int_equal(slow.log.n, 1);
  coord_watch_resume(f->c, hs); /* Takes one more, holds again. */
  run_for(f, 10);
  assert_int_equal(slow.log.n, 2);
  assert_false(slow.end.done);
  for (int i = 4; i <= 10; i++) assert_int_equal(report_ckpt(f, "ov", i, 0), 0);
  run_until(f, &slow.end.done);
  assert_int_equal(slow.end.err, STK_EBUSY);
  assert_int_equal(fast.log.n, 11);
  bool closed = false;
  coord_close(f->c, on_closed, &closed);
  run_until(f, &closed);
  f->c = NULL;
  assert_int_equal(fast.end.err, STK_EUNAVAIL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_create_get_list, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_validation, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_rendezvous, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_last_call_and_cap, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_lease_expiry, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_fencing, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_barrier, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_kv, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_kv_store_ops, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_kv_budgets, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_scale, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_pause_resume_stop_delete, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_events_watch, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_join_event_unsynced, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_watch_overflow, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_members_finish, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_member_lost_while_finishing, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_barrier_while_finishing, fx_setup, fx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
