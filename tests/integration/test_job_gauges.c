/*
 * Per-job gauges of the real dataloader and checkpoint daemons under load:
 * two streams of one job whose client does not read keep
 * stoker_dataloader_job_queued_batches at the sum of their prefetch depths
 * (and the series go once the streams end); bytes written to open attempts
 * and not yet uploaded show in stoker_checkpoint_job_staging_bytes, summed
 * over a job's attempts, and drop to 0 when the attempts are aborted. Each
 * loaded /metrics also passes `promtool check metrics` when promtool is on
 * PATH (that half says so and is skipped without it; the values are
 * checked either way). Arguments: the dataloader and checkpoint binaries.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_ckpt_helpers.h"
#include "test_dl_helpers.h"

static char *dl_binary, *ckpt_binary;

/* Starts binary with a metrics endpoint (*ret_port). */
static struct harness_daemon *start(char *binary, const char *const *args, int *ret_port) {
  char *argv[] = {"it_job_gauges", binary, NULL};
  assert_int_equal(harness_init(2, argv), 0);
  struct harness_daemon *d = harness_daemon_start_metrics(args, ret_port);
  assert_non_null(d);
  return d;
}

/* The body of /metrics (headers cut off), malloc'd. */
static char *scrape(int port) {
  char *resp = harness_http_get(port, "/metrics");
  assert_non_null(resp);
  char *body = strstr(resp, "\r\n\r\n");
  assert_non_null(body);
  char *copy = strdup(body + 4);
  free(resp);
  return copy;
}

/* Polls /metrics until every line of want is in it (30 s); returns the body
 * that had them, or fails with the last one. */
static char *wait_lines(int port, const char *const *want, size_t n) {
  for (int64_t deadline = harness_now_ms() + 30000;; harness_sleep_ms(50)) {
    char *body = scrape(port);
    size_t found = 0;
    while (found < n && strstr(body, want[found])) found++;
    if (found == n) return body;
    if (harness_now_ms() > deadline) fail_msg("no \"%s\" in:\n%s", want[found], body);
    free(body);
  }
}

/* promtool check metrics on body: no complaint, exit 0 (skipped without promtool). */
static void promtool_check(const char *body, const char *what) {
  char out[4096];
  int rc = harness_promtool_check(body, out, sizeof(out));
  if (rc < 0)
    print_message("promtool not on PATH: `promtool check metrics` of %s skipped\n", what);
  else if (rc != 0)
    fail_msg("%s: promtool check metrics (%d):\n%s", what, rc, out);
}

/* ------------------------------------------------------------ dataloader */

/* A StreamBatches of job's rank (world 2) behind gate g. */
static struct rpc_client_call *open_stream(struct rpc_client *rc, struct tdl_gate *g,
                                           const char *job, uint32_t rank, uint32_t prefetch) {
  Stoker__V1__StreamBatchesRequest req = STOKER__V1__STREAM_BATCHES_REQUEST__INIT;
  req.job = (char *)job;
  req.rank = rank;
  req.world = 2;
  req.prefetch = prefetch;
  return tdl_gate_stream(rc, g, &req);
}

static void test_dataloader_queue_depth(void **state) {
  (void)state;
  int port;
  const char *args[] = {"--max-prefetch", "8", NULL};
  struct harness_daemon *d = start(dl_binary, args, &port);
  struct rpc_client *rc = harness_rpc(d);
  struct tdl_spec t;
  tdl_spec_init(&t, "slow", "synthetic:4000:16:4000:3", 0, 4095, 256); /* 2 MiB a rank's batch. */
  char msg[512] = "";
  assert_int_equal(tdl_create(rc, &t.spec, msg, sizeof(msg)), RPC_OK);

  struct tdl_gate g;
  tdl_gate_init(&g, false);
  struct rpc_client_call *calls[2] = {open_stream(rc, &g, "slow", 0, 3),
                                      open_stream(rc, &g, "slow", 1, 2)};
  const char *want[] = {
      "# TYPE stoker_dataloader_job_queued_batches gauge\n",
      "\nstoker_dataloader_job_streams{job=\"slow\"} 2\n",
      "\nstoker_dataloader_job_queued_batches{job=\"slow\"} 5\n", /* 3 + 2, both stalled. */
      "\nstoker_dataloader_jobs_unlabelled 0\n",
  };
  char *body = wait_lines(port, want, 4);
  promtool_check(body, "the dataloader's /metrics with two stalled streams");
  free(body);

  tdl_gate_release(&g);
  for (int i = 0; i < 2; i++) rpc_client_call_cancel(calls[i]);
  tdl_gate_wait_done(&g, 2);
  /* The streams ended: the job's series are gone, the families stay. */
  for (int64_t deadline = harness_now_ms() + 30000;; harness_sleep_ms(50)) {
    body = scrape(port);
    if (!strstr(body, "job=\"slow\"")) break;
    if (harness_now_ms() > deadline)
      fail_msg("series of job slow left after its streams:\n%s", body);
    free(body);
  }
  assert_non_null(strstr(body, "# TYPE stoker_dataloader_job_streams gauge\n"));
  free(body);
  rpc_client_free(rc);
  harness_daemon_free(d);
  tdl_gate_destroy(&g);
}

/* ------------------------------------------------------------ checkpoint */

/* Opens a Write stream of attempt's rank and sends bytes of tensor "t"
 * (uint8, global shape {world * bytes}) without "last": they stay staged. */
static struct rpc_client_cstream *write_unfinished(struct rpc_client *rc, const char *attempt,
                                                   uint32_t rank, uint32_t world, size_t bytes) {
  struct rpc_client_cstream *s = NULL;
  assert_int_equal(rpc_client_cstream_open(rc, "/stoker.v1.Checkpoint/Write",
                                           &stoker__v1__write_response__descriptor, 60000, &s),
                   0);
  struct tck_chunk c;
  tck_chunk_u8(&c, attempt, rank, "t", (uint64_t)world * bytes, (uint64_t)rank * bytes, bytes);
  uint8_t *data = calloc(1, bytes);
  assert_non_null(data);
  c.ch.data.data = data;
  c.ch.data.len = bytes;
  assert_int_equal(rpc_client_cstream_write(s, &c.ch.base), 0);
  free(data);
  return s;
}

static void abort_attempt(struct rpc_client *rc, const char *attempt) {
  Stoker__V1__AbortCheckpointRequest req = STOKER__V1__ABORT_CHECKPOINT_REQUEST__INIT;
  req.attempt = (char *)attempt;
  assert_int_equal(tck_call(rc, "Abort", &req.base, &stoker__v1__empty__descriptor, NULL, NULL, 0),
                   RPC_OK);
}

static void test_checkpoint_staged_bytes(void **state) {
  (void)state;
  int port;
  struct harness_daemon *d = start(ckpt_binary, NULL, &port);
  struct rpc_client *rc = harness_rpc(d);
  char a1[64], a2[64], a3[64];
  /* Under one part (16 MiB): staged, not uploaded, until "last". Step 10's
   * stream is attached before step 20 begins (a later Begin of the job
   * supersedes its idle attempts). */
  assert_int_equal(tck_begin(rc, "held", 10, 2, a1), RPC_OK);
  struct rpc_client_cstream *w1 = write_unfinished(rc, a1, 0, 2, 300000);
  const char *attached[] = {"\nstoker_checkpoint_job_staging_bytes{job=\"held\"} 300000\n"};
  free(wait_lines(port, attached, 1));
  assert_int_equal(tck_begin(rc, "held", 20, 2, a2), RPC_OK);
  struct rpc_client_cstream *w2 = write_unfinished(rc, a2, 1, 2, 200000);
  assert_int_equal(tck_begin(rc, "idle", 10, 1, a3), RPC_OK);
  const char *want[] = {
      "# TYPE stoker_checkpoint_job_staging_bytes gauge\n",
      "\nstoker_checkpoint_job_staging_bytes{job=\"held\"} 500000\n",
      "\nstoker_checkpoint_job_staging_bytes{job=\"idle\"} 0\n",
      "\nstoker_checkpoint_job_open_attempts{job=\"held\"} 2\n",
      "\nstoker_checkpoint_job_open_attempts{job=\"idle\"} 1\n",
      "\nstoker_checkpoint_jobs_unlabelled 0\n",
  };
  char *body = wait_lines(port, want, 6);
  promtool_check(body, "the checkpoint daemon's /metrics with staged bytes");
  free(body);

  abort_attempt(rc, a1);
  abort_attempt(rc, a2);
  const char *after[] = {
      "\nstoker_checkpoint_job_staging_bytes{job=\"held\"} 0\n",
      "\nstoker_checkpoint_job_open_attempts{job=\"held\"} 0\n",
      "\nstoker_checkpoint_job_open_attempts{job=\"idle\"} 1\n",
  };
  free(wait_lines(port, after, 3));
  struct rpc_status st = {0};
  ProtobufCMessage *resp = NULL;
  rpc_client_cstream_finish(w1, &resp, &st);
  assert_int_equal(st.code, RPC_ABORTED);
  rpc_client_cstream_finish(w2, &resp, &st);
  assert_int_equal(st.code, RPC_ABORTED);
  rpc_client_free(rc);
  harness_daemon_free(d);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s STOKER_DATALOADER STOKER_CHECKPOINT\n", argv[0]);
    return 2;
  }
  dl_binary = argv[1];
  ckpt_binary = argv[2];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dataloader_queue_depth),
      cmocka_unit_test(test_checkpoint_staged_bytes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
