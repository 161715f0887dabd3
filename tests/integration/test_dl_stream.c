/*
 * StreamBatches on the real daemon: the stream carries exactly the bytes
 * GetBatch returns, in step order, and ends OK after `count`; while the
 * client does not read, the daemon generates at most `prefetch` batches
 * ahead of what it sent (seen in its metrics) and then waits; a cancel
 * stops generation and frees the prefetched batches; bad requests end the
 * stream with a clear status.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_dl_helpers.h"

#define GEN_COUNT  "stoker_dataloader_batch_generation_seconds_count"
#define SERVED     "stoker_dataloader_batches_total"
#define PREFETCHED "stoker_dataloader_prefetched_batches"

struct fixture {
  struct harness_daemon *d;
  struct rpc_client *rc;
  int metrics_port;
};

static int setup(void **state) {
  struct fixture *f = calloc(1, sizeof(*f));
  const char *args[] = {"--max-prefetch", "8", NULL};
  *state = f;
  return tdl_daemon_open(&f->d, &f->rc, args, &f->metrics_port);
}

/* A daemon whose streams of one job may hold 12 MiB ahead of their clients. */
static int setup_budget(void **state) {
  struct fixture *f = calloc(1, sizeof(*f));
  const char *args[] = {"--max-prefetch", "8", "--stream-bytes-per-job", "12MiB", NULL};
  *state = f;
  return tdl_daemon_open(&f->d, &f->rc, args, &f->metrics_port);
}

static int teardown(void **state) {
  struct fixture *f = *state;
  tdl_daemon_close(f->d, f->rc);
  free(f);
  return 0;
}

static void create(struct fixture *f, const char *job, uint32_t seq_len, uint32_t global_batch) {
  struct tdl_spec t;
  tdl_spec_init(&t, job, "synthetic:4000:16:4000:3", 0, seq_len, global_batch);
  char msg[512] = "";
  assert_int_equal(tdl_create(f->rc, &t.spec, msg, sizeof(msg)), RPC_OK);
}

static void test_stream_equals_get_batch(void **state) {
  struct fixture *f = *state;
  create(f, "s", 63, 8);
  struct tdl_stream s;
  tdl_stream_count(f->rc, "s", 3, 1, 2, 2, 6, &s);
  for (size_t i = 0; i < s.n; i++) {
    Stoker__V1__Batch *b = NULL;
    assert_int_equal(tdl_get_batch(f->rc, "s", 3 + (int64_t)i, 1, 2, &b), RPC_OK);
    assert_int_equal(s.msgs[i]->step, 3 + (int64_t)i);
    assert_int_equal(s.msgs[i]->lines, 4);
    assert_int_equal(s.msgs[i]->line_tokens, 64);
    tdl_assert_batch(s.msgs[i], b->tokens.data, b->tokens.len);
    assert_int_equal(s.msgs[i]->n_doc_starts, b->n_doc_starts);
    if (b->n_doc_starts)
      assert_memory_equal(s.msgs[i]->doc_starts, b->doc_starts, b->n_doc_starts * 4);
    tdl_batch_free(b);
  }
  tdl_stream_free(&s);
}

/* Polls the generation count until it stays put for 500 ms. */
static double wait_generation_stalls(struct fixture *f) {
  double last = -2;
  int64_t deadline = harness_now_ms() + 15000;
  for (;;) {
    double now = tdl_metric(f->metrics_port, GEN_COUNT);
    if (now == last && now > 0) return now;
    assert_true(harness_now_ms() < deadline);
    last = now;
    harness_sleep_ms(500);
  }
}

static void test_prefetch_bound_and_cancel(void **state) {
  struct fixture *f = *state;
  create(f, "big", 4095, 256); /* 4 MiB a batch: the transport's windows fill quickly. */
  struct tdl_gate g;
  tdl_gate_init(&g, false);
  Stoker__V1__StreamBatchesRequest req = STOKER__V1__STREAM_BATCHES_REQUEST__INIT;
  req.job = "big";
  req.world = 1;
  req.prefetch = 3;
  struct rpc_client_call *call = tdl_gate_stream(f->rc, &g, &req);
  double generated = wait_generation_stalls(f);
  double served = tdl_metric(f->metrics_port, SERVED);
  double ahead = tdl_metric(f->metrics_port, PREFETCHED);
  print_message("stalled: generated %.0f served %.0f prefetched %.0f\n", generated, served, ahead);
  assert_true(ahead == 3);                  /* Prefetched up to the bound ... */
  assert_true(generated - served == ahead); /* ... and no further. */

  tdl_gate_release(&g);
  rpc_client_call_cancel(call);
  tdl_gate_wait_done(&g, 1);
  assert_int_equal(g.code, RPC_CANCELLED);

  /* The daemon stopped generating and dropped what it had prefetched. */
  double after = wait_generation_stalls(f);
  harness_sleep_ms(300);
  assert_true(tdl_metric(f->metrics_port, GEN_COUNT) == after);
  int64_t deadline = harness_now_ms() + 5000;
  while (tdl_metric(f->metrics_port, PREFETCHED) != 0) {
    assert_true(harness_now_ms() < deadline);
    harness_sleep_ms(50);
  }
  Stoker__V1__Batch *b = NULL;
  assert_int_equal(tdl_get_batch(f->rc, "big", 0, 0, 4, &b), RPC_OK);
  tdl_batch_free(b);
  tdl_gate_destroy(&g);
}

static int stream_status(struct fixture *f, Stoker__V1__StreamBatchesRequest *req, size_t *ret_n) {
  struct tdl_stream s;
  assert_int_equal(tdl_stream_run(f->rc, req, 100, &s), 0);
  *ret_n = s.n;
  tdl_stream_free(&s);
  return s.st.code;
}

static void test_bad_streams(void **state) {
  struct fixture *f = *state;
  create(f, "bad", 63, 8);
  Stoker__V1__StreamBatchesRequest req = STOKER__V1__STREAM_BATCHES_REQUEST__INIT;
  size_t n;
  req.job = "bad";
  req.world = 1;
  req.prefetch = 9; /* Over --max-prefetch 8. */
  assert_int_equal(stream_status(f, &req, &n), RPC_INVALID_ARGUMENT);
  req.prefetch = 2;
  req.world = 3; /* 8 lines do not split over 3 ranks. */
  assert_int_equal(stream_status(f, &req, &n), RPC_INVALID_ARGUMENT);
  assert_int_equal(n, 0);
  req.world = 2;
  req.rank = 2;
  assert_int_equal(stream_status(f, &req, &n), RPC_INVALID_ARGUMENT);
  req.rank = 0;
  req.from_step = -1;
  assert_int_equal(stream_status(f, &req, &n), RPC_INVALID_ARGUMENT);
  req.from_step = 0;
  req.job = "nope";
  assert_int_equal(stream_status(f, &req, &n), RPC_NOT_FOUND);
  /* A step too far from any saved state to regenerate. */
  req.job = "bad";
  req.from_step = (int64_t)1 << 39;
  req.count = 5;
  assert_int_equal(stream_status(f, &req, &n), RPC_OUT_OF_RANGE);
  assert_int_equal(n, 0);
}

/* SIGTERM with a stream open: the stream ends UNAVAILABLE naming the step
 * to resume from, and the daemon exits 0 (with state flushed). */
static void test_sigterm_ends_streams(void **state) {
  struct fixture *f = *state;
  create(f, "term", 4095, 256);
  struct tdl_gate g;
  tdl_gate_init(&g, true);
  Stoker__V1__StreamBatchesRequest req = STOKER__V1__STREAM_BATCHES_REQUEST__INIT;
  req.job = "term";
  req.world = 1;
  tdl_gate_stream(f->rc, &g, &req);
  tdl_gate_wait_got(&g, 2);
  int status = -1;
  assert_int_equal(harness_daemon_term(f->d, 20000, &status), 0);
  assert_int_equal(status, 0);
  tdl_gate_wait_done(&g, 1);
  assert_int_equal(g.code, RPC_UNAVAILABLE);
  tdl_gate_destroy(&g);
}

/* StreamBatches with prefetch 8 of 4 MiB batches whose client never reads:
 * status of a further stream of the same job once the first one stalled
 * (RESOURCE_EXHAUSTED naming the flag, within 20 s), and that the first
 * one holds no more than the job's budget and a batch. */
static int refused_stream(struct rpc_client *rc, const char *job, char *msg, size_t msg_len) {
  Stoker__V1__StreamBatchesRequest req = STOKER__V1__STREAM_BATCHES_REQUEST__INIT;
  req.job = (char *)job;
  req.world = 1;
  req.prefetch = 8;
  req.count = 1;
  for (int64_t until = harness_now_ms() + 20000; harness_now_ms() < until; harness_sleep_ms(100)) {
    struct tdl_stream s;
    assert_int_equal(tdl_stream_run(rc, &req, 100, &s), 0);
    int code = s.st.code;
    snprintf(msg, msg_len, "%s", s.st.message);
    tdl_stream_free(&s);
    if (code != RPC_OK) return code;
  }
  return RPC_OK;
}

/* Issue 25, item 4: a job whose client opens a stream and never reads
 * holds at most its budget; its next stream is refused with a clear
 * answer, another job's stream and GetBatch are served meanwhile, and the
 * job streams again once the greedy stream is cancelled. */
static void test_unread_streams_hold_at_most_the_jobs_budget(void **state) {
  struct fixture *f = *state;
  create(f, "greedy", 4095, 256); /* 4 MiB a batch */
  create(f, "fine", 63, 8);
  struct tdl_gate g;
  tdl_gate_init(&g, false);
  Stoker__V1__StreamBatchesRequest req = STOKER__V1__STREAM_BATCHES_REQUEST__INIT;
  req.job = "greedy";
  req.world = 1;
  req.prefetch = 8;
  struct rpc_client_call *call = tdl_gate_stream(f->rc, &g, &req);
  struct rpc_client *other = harness_rpc(f->d); /* f->rc's thread waits at the gate */
  char msg[512];
  assert_int_equal(refused_stream(other, "greedy", msg, sizeof msg), RPC_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(msg, "--stream-bytes-per-job"));
  double ahead = tdl_metric(f->metrics_port, PREFETCHED);
  print_message("greedy stream: %.0f batches of 4 MiB ready (budget 12 MiB)\n", ahead);
  assert_true(ahead <= 4); /* 12 MiB and the batch that was in hand */
  struct tdl_stream s;
  tdl_stream_count(other, "fine", 0, 0, 1, 2, 5, &s);
  assert_int_equal(s.n, 5);
  tdl_stream_free(&s);
  tdl_gate_release(&g);
  rpc_client_call_cancel(call);
  tdl_gate_wait_done(&g, 1);
  tdl_gate_destroy(&g);
  int64_t until = harness_now_ms() + 10000;
  while (refused_stream(other, "greedy", msg, sizeof msg) != RPC_OK)
    assert_true(harness_now_ms() < until);
  rpc_client_free(other);
}

int main(int argc, char **argv) {
  if (harness_init(argc, argv) != 0) return 2;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_stream_equals_get_batch, setup, teardown),
      cmocka_unit_test_setup_teardown(test_prefetch_bound_and_cancel, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_streams, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sigterm_ends_streams, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unread_streams_hold_at_most_the_jobs_budget,
                                      setup_budget, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
