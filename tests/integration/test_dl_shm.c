/*
 * Shared-memory delivery of StreamBatches on the real daemon, through the
 * client library (issue 3): batches from the ring carry exactly GetBatch's
 * bytes, and the daemon counts them as delivered through shared memory;
 * every batch, the first of a stream included, comes through the ring;
 * the ring's name is gone once the client mapped it; a client that holds
 * every slot stops the daemon (a held batch is never overwritten, a freed
 * slot is used while those before it are still held) until it
 * frees one; STOKER_DL_SHM=off and a ring the client cannot open (as from
 * another host) both give the same bytes over gRPC; a nonce of the wrong
 * size is INVALID_ARGUMENT; rings a killed daemon left are removed when it
 * starts again; a clean stop with the default directory leaves nothing in
 * /dev/shm. The stream options (stk_batch_stream_open_opts): int64 tokens
 * are GetBatch's widened, in the ring's slot in place or widened from an
 * inline batch; STK_SHM_OFF never asks for the ring; STK_SHM_REQUIRE ends
 * the stream with FAILED_PRECONDITION where the ring cannot be opened or
 * the daemon has none;
 * bad options are STK_EINVAL.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "stoker_loader.h"
#include "test_dl_helpers.h"

#define SHM_BATCHES "stoker_dataloader_shm_batches_total"

struct fixture {
  struct harness_daemon *d;
  struct rpc_client *rc;
  struct stk_client *c;
  int metrics_port;
  char tmp[256];
  char shm[300];
};

static int setup(void **state) {
  struct fixture *f = calloc(1, sizeof(*f));
  if (harness_tmpdir_new(f->tmp, sizeof(f->tmp)) != 0) return -1;
  snprintf(f->shm, sizeof(f->shm), "%s/shm", f->tmp);
  const char *args[] = {"--shm-dir", f->shm, NULL};
  if (tdl_daemon_open(&f->d, &f->rc, args, &f->metrics_port) != 0) return -1;
  f->c = harness_client(f->d);
  *state = f;
  struct tdl_spec t;
  tdl_spec_init(&t, "s", "synthetic:4000:16:4000:3", 0, 255, 8);
  char msg[512] = "";
  return f->c && tdl_create(f->rc, &t.spec, msg, sizeof(msg)) == RPC_OK ? 0 : -1;
}

static int teardown(void **state) {
  struct fixture *f = *state;
  stk_client_free(f->c);
  tdl_daemon_close(f->d, f->rc);
  harness_tmpdir_remove(f->tmp);
  free(f);
  return 0;
}

/* ring-* entries in dir (-1 when it cannot be read). */
static int rings_in(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) n += strncmp(e->d_name, "ring-", 5) == 0;
  closedir(d);
  return n;
}

/* b holds exactly GetBatch's tokens and document starts for its step. */
static void assert_same_as_get(struct fixture *f, const struct stk_batch *b, uint32_t rank,
                               uint32_t world) {
  Stoker__V1__Batch *want = NULL;
  assert_int_equal(tdl_get_batch(f->rc, "s", b->step, rank, world, &want), RPC_OK);
  assert_int_equal(b->lines, want->lines);
  assert_int_equal(b->line_tokens, want->line_tokens);
  assert_int_equal((size_t)b->lines * b->line_tokens * 4, want->tokens.len);
  assert_memory_equal(b->tokens, want->tokens.data, want->tokens.len);
  assert_int_equal(b->n_doc_starts, want->n_doc_starts);
  if (want->n_doc_starts)
    assert_memory_equal(b->doc_starts, want->doc_starts, want->n_doc_starts * 4);
  tdl_batch_free(want);
}

/* Reads n batches from s, checking each against GetBatch. */
static void read_checked(struct fixture *f, struct stk_batch_stream *s, int64_t first, int n,
                         uint32_t rank, uint32_t world) {
  for (int i = 0; i < n; i++) {
    struct stk_batch b;
    assert_int_equal(stk_batch_stream_next(s, 20000, &b), 0);
    assert_int_equal(b.step, first + i);
    assert_same_as_get(f, &b, rank, world);
    stk_batch_free(&b);
  }
}

static void test_ring_same_bytes(void **state) {
  struct fixture *f = *state;
  double before = tdl_metric(f->metrics_port, SHM_BATCHES);
  struct stk_batch_stream *s = NULL;
  assert_int_equal(stk_batch_stream_open(f->c, "s", 5, 1, 2, 2, &s), 0);
  read_checked(f, s, 5, 12, 1, 2);
  /* Every batch came through the ring, the first (which sized it) too. */
  assert_true(tdl_metric(f->metrics_port, SHM_BATCHES) >= before + 12);
  assert_int_equal(rings_in(f->shm), 0); /* Mapped, name removed. */
  stk_batch_stream_free(s);
}

static void test_held_slots_stop_the_daemon(void **state) {
  struct fixture *f = *state;
  /* Prefetch 1: a ring of 2 x 1 + 2 = 4 slots. */
  struct stk_batch_stream *s = NULL;
  assert_int_equal(stk_batch_stream_open(f->c, "s", 0, 0, 1, 1, &s), 0);
  struct stk_batch held[4];
  for (int i = 0; i < 4; i++) { /* Steps 0..3 in every slot (step 0 too). */
    assert_int_equal(stk_batch_stream_next(s, 20000, &held[i]), 0);
    assert_int_equal(held[i].step, i);
    assert_int_equal(stk_batch_ring_slots(&held[i]), 4);
  }
  struct stk_batch b;
  assert_int_equal(stk_batch_stream_next(s, 1500, &b), STK_ETIMEDOUT);
  for (int i = 0; i < 4; i++) assert_same_as_get(f, &held[i], 0, 1); /* Nothing overwritten. */
  /* Frees the slot of step 2 (the third): the daemon passes over the two
   * before it, still held, and step 4 goes there. */
  stk_batch_free(&held[2]);
  assert_int_equal(stk_batch_stream_next(s, 20000, &b), 0);
  assert_int_equal(b.step, 4);
  assert_same_as_get(f, &b, 0, 1);
  for (int i = 0; i < 4; i++)
    if (i != 2) assert_same_as_get(f, &held[i], 0, 1);
  stk_batch_free(&b);
  for (int i = 0; i < 4; i++)
    if (i != 2) stk_batch_free(&held[i]);
  read_checked(f, s, 5, 6, 0, 1);
  /* A batch kept after its stream is gone stays readable. */
  assert_int_equal(stk_batch_stream_next(s, 20000, &b), 0);
  stk_batch_stream_free(s);
  assert_same_as_get(f, &b, 0, 1);
  stk_batch_free(&b);
}

static void test_off_by_environment(void **state) {
  struct fixture *f = *state;
  setenv("STOKER_DL_SHM", "off", 1);
  double before = tdl_metric(f->metrics_port, SHM_BATCHES);
  struct stk_batch_stream *s = NULL;
  assert_int_equal(stk_batch_stream_open(f->c, "s", 0, 0, 2, 2, &s), 0);
  read_checked(f, s, 0, 8, 0, 2);
  stk_batch_stream_free(s);
  unsetenv("STOKER_DL_SHM");
  assert_true(tdl_metric(f->metrics_port, SHM_BATCHES) == before);
}

static void test_unreachable_ring_falls_back(void **state) {
  struct fixture *f = *state;
  /* The daemon keeps its directory open, so renaming it makes every path
   * it announces wrong here, as on another host. */
  char moved[320];
  snprintf(moved, sizeof(moved), "%s/elsewhere", f->tmp);
  assert_int_equal(rename(f->shm, moved), 0);
  struct stk_batch_stream *s = NULL;
  assert_int_equal(stk_batch_stream_open(f->c, "s", 2, 0, 1, 2, &s), 0);
  read_checked(f, s, 2, 6, 0, 1);
  double after_fallback = tdl_metric(f->metrics_port, SHM_BATCHES);
  read_checked(f, s, 8, 6, 0, 1);
  assert_true(tdl_metric(f->metrics_port, SHM_BATCHES) == after_fallback);
  stk_batch_stream_free(s);
  assert_int_equal(rename(moved, f->shm), 0);
}

/* b (int64 tokens) holds GetBatch's tokens widened and its document starts. */
static void assert_same_as_get_i64(struct fixture *f, const struct stk_batch *b, uint32_t rank,
                                   uint32_t world) {
  Stoker__V1__Batch *want = NULL;
  assert_int_equal(tdl_get_batch(f->rc, "s", b->step, rank, world, &want), RPC_OK);
  assert_int_equal(b->lines, want->lines);
  assert_int_equal(b->line_tokens, want->line_tokens);
  assert_null(b->tokens);
  const int64_t *got = stk_batch_tokens_i64(b);
  assert_non_null(got);
  size_t n = (size_t)b->lines * b->line_tokens;
  assert_int_equal(n * 4, want->tokens.len);
  for (size_t i = 0; i < n; i++) {
    uint32_t w;
    memcpy(&w, want->tokens.data + 4 * i, 4);
    if (got[i] != (int64_t)w) fail_msg("token %zu: %lld, want %u", i, (long long)got[i], w);
  }
  assert_int_equal(b->n_doc_starts, want->n_doc_starts);
  if (want->n_doc_starts)
    assert_memory_equal(b->doc_starts, want->doc_starts, want->n_doc_starts * 4);
  tdl_batch_free(want);
}

static void test_int64_tokens_in_the_ring(void **state) {
  struct fixture *f = *state;
  double before = tdl_metric(f->metrics_port, SHM_BATCHES);
  struct stk_batch_stream_opts o = {.prefetch = 2, .token_bytes = 8};
  struct stk_batch_stream *s = NULL;
  assert_int_equal(stk_batch_stream_open_opts(f->c, "s", 3, 1, 2, &o, &s), 0);
  int in_ring = 0;
  for (int i = 0; i < 12; i++) {
    struct stk_batch b;
    assert_int_equal(stk_batch_stream_next(s, 20000, &b), 0);
    assert_int_equal(b.step, 3 + i);
    assert_same_as_get_i64(f, &b, 1, 2);
    uint32_t slots = stk_batch_ring_slots(&b);
    assert_true(slots == 0 || slots == 2 * 2 + 2); /* Inline, or a slot of the ring. */
    in_ring += slots != 0;
    stk_batch_free(&b);
  }
  /* Every batch, the first (which sized the ring) too. */
  assert_int_equal(in_ring, 12);
  assert_true(tdl_metric(f->metrics_port, SHM_BATCHES) >= before + in_ring);
  stk_batch_stream_free(s);
  /* A uint32 stream's batches have no int64 tokens. */
  assert_int_equal(stk_batch_stream_open(f->c, "s", 0, 0, 1, 2, &s), 0);
  struct stk_batch b;
  assert_int_equal(stk_batch_stream_next(s, 20000, &b), 0);
  assert_null(stk_batch_tokens_i64(&b));
  assert_non_null(b.tokens);
  stk_batch_free(&b);
  stk_batch_stream_free(s);
}

static void test_int64_tokens_inline_with_shm_off(void **state) {
  struct fixture *f = *state;
  double before = tdl_metric(f->metrics_port, SHM_BATCHES);
  struct stk_batch_stream_opts o = {.token_bytes = 8, .shm = STK_SHM_OFF};
  struct stk_batch_stream *s = NULL;
  assert_int_equal(stk_batch_stream_open_opts(f->c, "s", 0, 0, 1, &o, &s), 0);
  for (int i = 0; i < 8; i++) {
    struct stk_batch b;
    assert_int_equal(stk_batch_stream_next(s, 20000, &b), 0);
    assert_same_as_get_i64(f, &b, 0, 1);
    assert_int_equal(stk_batch_ring_slots(&b), 0);
    stk_batch_free(&b);
  }
  stk_batch_stream_free(s);
  assert_true(tdl_metric(f->metrics_port, SHM_BATCHES) == before);
}

static void test_required_ring_that_cannot_be_opened(void **state) {
  struct fixture *f = *state;
  char moved[320];
  snprintf(moved, sizeof(moved), "%s/elsewhere", f->tmp);
  assert_int_equal(rename(f->shm, moved), 0); /* As from another host. */
  struct stk_batch_stream_opts o = {.prefetch = 1, .token_bytes = 8, .shm = STK_SHM_REQUIRE};
  struct stk_batch_stream *s = NULL;
  assert_int_equal(stk_batch_stream_open_opts(f->c, "s", 0, 0, 1, &o, &s), 0);
  struct stk_batch b;
  int err = 0, taken = 0;
  while (taken < 20 && (err = stk_batch_stream_next(s, 20000, &b)) == 0) {
    stk_batch_free(&b);
    taken++;
  }
  assert_int_equal(err, STK_ESTATE);
  assert_int_equal(taken, 0); /* The first batch names the ring: no batch comes inline. */
  int code = 0;
  const char *msg = stk_client_last_error(&code);
  assert_int_equal(code, 9); /* FAILED_PRECONDITION */
  if (!strstr(msg, "shared-memory transport required"))
    fail_msg("last error \"%s\" does not say why", msg);
  stk_batch_stream_free(s);
  assert_int_equal(rename(moved, f->shm), 0);
}

/* A daemon with no ring (shm-dir off) sends every batch inline: a stream
 * that requires the ring ends at its first batch (issue 26), one that does
 * not takes the batches inline. */
static void test_required_ring_from_a_daemon_without_one(void **state) {
  struct fixture *f = *state;
  struct harness_daemon *d = NULL;
  struct rpc_client *rc = NULL;
  const char *args[] = {"--shm-dir", "", NULL};
  assert_int_equal(tdl_daemon_open(&d, &rc, args, NULL), 0);
  struct stk_client *c = harness_client(d);
  assert_non_null(c);
  struct tdl_spec t;
  tdl_spec_init(&t, "s", "synthetic:4000:16:4000:3", 0, 255, 8);
  char msg[512] = "";
  assert_int_equal(tdl_create(rc, &t.spec, msg, sizeof(msg)), RPC_OK);
  struct stk_batch_stream_opts o = {.prefetch = 1, .token_bytes = 8, .shm = STK_SHM_REQUIRE};
  struct stk_batch_stream *s = NULL;
  assert_int_equal(stk_batch_stream_open_opts(c, "s", 0, 0, 1, &o, &s), 0);
  struct stk_batch b;
  assert_int_equal(stk_batch_stream_next(s, 20000, &b), STK_ESTATE);
  int code = 0;
  const char *why = stk_client_last_error(&code);
  assert_int_equal(code, 9); /* FAILED_PRECONDITION */
  if (!strstr(why, "sent step 0 inline")) fail_msg("last error \"%s\" does not say why", why);
  stk_batch_stream_free(s);
  o.shm = STK_SHM_AUTO;
  assert_int_equal(stk_batch_stream_open_opts(c, "s", 0, 0, 1, &o, &s), 0);
  assert_int_equal(stk_batch_stream_next(s, 20000, &b), 0);
  assert_int_equal(stk_batch_ring_slots(&b), 0);
  stk_batch_free(&b);
  stk_batch_stream_free(s);
  stk_client_free(c);
  tdl_daemon_close(d, rc);
  (void)f;
}

static void test_bad_stream_options(void **state) {
  struct fixture *f = *state;
  struct stk_batch_stream *s = NULL;
  struct stk_batch_stream_opts bad_width = {.token_bytes = 2};
  assert_int_equal(stk_batch_stream_open_opts(f->c, "s", 0, 0, 1, &bad_width, &s), STK_EINVAL);
  struct stk_batch_stream_opts bad_mode = {.shm = 3};
  assert_int_equal(stk_batch_stream_open_opts(f->c, "s", 0, 0, 1, &bad_mode, &s), STK_EINVAL);
  assert_null(s);
  /* NULL options: stk_batch_stream_open's defaults. */
  assert_int_equal(stk_batch_stream_open_opts(f->c, "s", 0, 0, 1, NULL, &s), 0);
  read_checked(f, s, 0, 3, 0, 1);
  stk_batch_stream_free(s);
}

static void test_bad_nonce(void **state) {
  struct fixture *f = *state;
  Stoker__V1__StreamBatchesRequest req = STOKER__V1__STREAM_BATCHES_REQUEST__INIT;
  uint8_t nonce[5] = {1, 2, 3, 4, 5};
  req.job = "s";
  req.world = 1;
  req.shm_nonce.data = nonce;
  req.shm_nonce.len = sizeof(nonce);
  struct tdl_stream st;
  assert_int_equal(tdl_stream_run(f->rc, &req, 10, &st), 0);
  assert_int_equal(st.st.code, RPC_INVALID_ARGUMENT);
  assert_int_equal(st.n, 0);
  assert_non_null(strstr(st.st.message, "shm_nonce"));
  tdl_stream_free(&st);
}

static void test_restart_removes_stale_rings(void **state) {
  struct fixture *f = *state;
  harness_daemon_kill(f->d);
  char stale[400];
  snprintf(stale, sizeof(stale), "%s/ring-0000feed", f->shm);
  FILE *fp = fopen(stale, "w");
  assert_non_null(fp);
  fclose(fp);
  assert_int_equal(rings_in(f->shm), 1);
  assert_int_equal(harness_daemon_restart(f->d), 0);
  assert_int_equal(rings_in(f->shm), 0);
  struct stk_batch_stream *s = NULL;
  assert_int_equal(stk_batch_stream_open(f->c, "s", 0, 0, 1, 2, &s), 0);
  read_checked(f, s, 0, 4, 0, 1);
  stk_batch_stream_free(s);
}

/* A clean stop (SIGTERM) with the default directory and a stream still
 * open leaves nothing in /dev/shm: no ring, no owner record, no directory. */
static void test_clean_stop_leaves_nothing(void **state) {
  const char *args[] = {"--shm-dir", "auto", NULL};
  struct harness_daemon *d = harness_daemon_start(args);
  assert_non_null(d);
  char dir[512];
  if (!harness_shm_auto_dir("stoker-dl-", d->data_dir, dir, sizeof(dir))) {
    harness_daemon_free(d);
    skip(); /* No /dev/shm on this host: shared memory is off. */
  }
  struct rpc_client *rc = harness_rpc(d);
  struct stk_client *c = harness_client(d);
  struct tdl_spec t;
  tdl_spec_init(&t, "s", "synthetic:4000:16:4000:3", 0, 255, 8);
  char msg[512] = "";
  assert_int_equal(tdl_create(rc, &t.spec, msg, sizeof(msg)), RPC_OK);
  struct stk_batch_stream *s = NULL;
  assert_int_equal(stk_batch_stream_open(c, "s", 0, 0, 1, 2, &s), 0);
  for (int i = 0; i < 4; i++) {
    struct stk_batch b;
    assert_int_equal(stk_batch_stream_next(s, 20000, &b), 0);
    stk_batch_free(&b);
  }
  int status = -1;
  assert_int_equal(harness_daemon_term(d, 20000, &status), 0);
  assert_int_equal(status, 0);
  struct stat st;
  if (stat(dir, &st) == 0) fail_msg("%s is left after a clean stop", dir);
  stk_batch_stream_free(s);
  stk_client_free(c);
  rpc_client_free(rc);
  harness_daemon_free(d);
}

int main(int argc, char **argv) {
  if (harness_init(argc, argv) != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_ring_same_bytes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_held_slots_stop_the_daemon, setup, teardown),
      cmocka_unit_test_setup_teardown(test_off_by_environment, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unreachable_ring_falls_back, setup, teardown),
      cmocka_unit_test_setup_teardown(test_int64_tokens_in_the_ring, setup, teardown),
      cmocka_unit_test_setup_teardown(test_int64_tokens_inline_with_shm_off, setup, teardown),
      cmocka_unit_test_setup_teardown(test_required_ring_from_a_daemon_without_one, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_required_ring_that_cannot_be_opened, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_stream_options, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_nonce, setup, teardown),
      cmocka_unit_test_setup_teardown(test_restart_removes_stale_rings, setup, teardown),
      cmocka_unit_test(test_clean_stop_leaves_nothing),
  };
  return cmocka_run_group_tests_name("dl_shm", tests, NULL, NULL);
}
