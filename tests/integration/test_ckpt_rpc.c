/*
 * The real stoker-checkpoint on loopback (file:// store in the test's temp
 * directory): 4 ranks, each a thread with its own rpc client, write shards
 * and blobs; the checkpoint commits and reads back bit-exactly at 4, 3 and
 * 8 ranks. Hostile input gets clear statuses and commits nothing; a byte
 * flipped in a stored object fails Read with DATA_LOSS and shows in
 * Verify; with --coordinator, a commit reaches the coordinator's GetJob;
 * with --orphan-attempt-grace, an attempt directory no journal record
 * claims is swept from the store and counted in /metrics, and the
 * committed checkpoint beside it stays readable.
 * argv: stoker-checkpoint, stoker-coordinator.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "test_ckpt_helpers.h"

static const char *const ck_args[] = {
    "--part-size", "5MiB", "--staging-budget", "48MiB", "--attempt-timeout", "3s", NULL};

static struct harness_daemon *start_ck(void) {
  struct harness_daemon *d = harness_daemon_start(ck_args);
  assert_non_null(d);
  return d;
}

/* Verify of job's step, asserted to answer OK; free the reply with
 * protobuf_c_message_free_unpacked. */
static Stoker__V1__VerifyCheckpointResponse *verify_ok(struct rpc_client *rc, const char *job,
                                                       int64_t step) {
  Stoker__V1__VerifyCheckpointRequest vr = STOKER__V1__VERIFY_CHECKPOINT_REQUEST__INIT;
  vr.job = (char *)job;
  vr.step = step;
  ProtobufCMessage *resp = NULL;
  char msg[512];
  assert_int_equal(tck_call(rc, "Verify", &vr.base,
                            &stoker__v1__verify_checkpoint_response__descriptor, &resp, msg,
                            sizeof(msg)),
                   RPC_OK);
  return (Stoker__V1__VerifyCheckpointResponse *)resp;
}

static void test_roundtrip_reshard(void **state) {
  struct harness_daemon *d = start_ck();
  struct rpc_client *rc = harness_rpc(d);
  char attempt[64], msg[512];
  assert_int_equal(tck_begin(rc, "train", 100, 4, attempt), RPC_OK);
  assert_int_equal(tck_write_all(d->addr, attempt, 4), RPC_OK);
  int64_t step = -1;
  assert_int_equal(tck_commit(rc, attempt, &step, msg, sizeof(msg)), RPC_OK);
  assert_int_equal(step, 100);
  int64_t steps[4];
  assert_int_equal(tck_list(rc, "train", steps, 4), 1);
  assert_int_equal(steps[0], 100);
  assert_int_equal(tck_read_all(rc, "train", 100, 4, 4), RPC_OK);
  assert_int_equal(tck_read_all(rc, "train", 100, 3, 4), RPC_OK);
  assert_int_equal(tck_read_all(rc, "train", 100, 8, 4), RPC_OK);
  /* The same step again is refused; Verify finds nothing wrong. */
  assert_int_equal(tck_begin(rc, "train", 100, 4, attempt), RPC_ALREADY_EXISTS);
  Stoker__V1__VerifyCheckpointResponse *v = verify_ok(rc, "train", 100);
  assert_int_equal(v->n_problems, 0);
  assert_int_equal(v->objects, 4);
  assert_true(v->bytes > 24u << 20);
  protobuf_c_message_free_unpacked(&v->base, NULL);
  rpc_client_free(rc);
  harness_daemon_free(d);
}

/* A stream of n chunks; returns the Write status, *ret (may be NULL) the
 * reply. */
static int write_stream(struct rpc_client *rc, Stoker__V1__WriteChunk **ch, size_t n,
                        Stoker__V1__WriteResponse **ret, char *msg, size_t len) {
  struct rpc_client_cstream *s = NULL;
  if (rpc_client_cstream_open(rc, "/stoker.v1.Checkpoint/Write",
                              &stoker__v1__write_response__descriptor, 10000, &s) != 0)
    return RPC_UNAVAILABLE;
  for (size_t i = 0; i < n; i++) rpc_client_cstream_write(s, &ch[i]->base);
  struct rpc_status st = {0};
  ProtobufCMessage *resp = NULL;
  rpc_client_cstream_finish(s, &resp, &st);
  if (ret)
    *ret = (Stoker__V1__WriteResponse *)resp;
  else if (resp)
    protobuf_c_message_free_unpacked(resp, NULL);
  snprintf(msg, len, "%s", st.message);
  return st.code;
}

/* A u8 [64] chunk of rank (bytes [32 rank, +32)). */
static void rank_chunk(struct tck_chunk *c, const char *attempt, uint32_t rank, bool last,
                       bool wait_durable) {
  static uint8_t data[32];
  tck_chunk_u8(c, attempt, rank, "t", 64, 32 * (uint64_t)rank, 32);
  c->ch.data.data = data;
  c->ch.data.len = 32;
  c->ch.last = last;
  c->ch.wait_durable = wait_durable;
}

static int abort_call(struct rpc_client *rc, const char *attempt, char *msg, size_t len) {
  Stoker__V1__AbortCheckpointRequest req = STOKER__V1__ABORT_CHECKPOINT_REQUEST__INIT;
  req.attempt = (char *)attempt;
  req.reason = "operator";
  ProtobufCMessage *resp = NULL;
  int rc_ = tck_call(rc, "Abort", &req.base, &stoker__v1__empty__descriptor, &resp, msg, len);
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  return rc_;
}

/* The Write reply says staged and durable; Abort ends an attempt; a stream
 * that switches rank aborts its attempt at once (not at the timeout). */
static void test_write_reply_abort_switch(void **state) {
  struct harness_daemon *d = start_ck();
  struct rpc_client *rc = harness_rpc(d);
  char attempt[64], msg[512];
  struct tck_chunk c0, c1;
  Stoker__V1__WriteChunk *one[1];
  Stoker__V1__WriteResponse *r = NULL;
  assert_int_equal(tck_begin(rc, "w", 1, 2, attempt), RPC_OK);
  rank_chunk(&c0, attempt, 0, true, false);
  one[0] = &c0.ch;
  assert_int_equal(write_stream(rc, one, 1, &r, msg, sizeof(msg)), RPC_OK);
  assert_true(r->staged);
  assert_int_equal(r->bytes_staged, 32);
  protobuf_c_message_free_unpacked(&r->base, NULL);
  rank_chunk(&c1, attempt, 1, true, true);
  one[0] = &c1.ch;
  assert_int_equal(write_stream(rc, one, 1, &r, msg, sizeof(msg)), RPC_OK);
  assert_true(r->staged);
  assert_true(r->durable);
  protobuf_c_message_free_unpacked(&r->base, NULL);
  assert_int_equal(tck_commit(rc, attempt, NULL, msg, sizeof(msg)), RPC_OK);
  assert_int_equal(abort_call(rc, attempt, msg, sizeof(msg)), RPC_FAILED_PRECONDITION);

  /* Abort: Commit then answers ABORTED with the reason; Abort again is OK. */
  assert_int_equal(tck_begin(rc, "w", 2, 2, attempt), RPC_OK);
  rank_chunk(&c0, attempt, 0, true, false);
  one[0] = &c0.ch;
  assert_int_equal(write_stream(rc, one, 1, NULL, msg, sizeof(msg)), RPC_OK);
  assert_int_equal(abort_call(rc, attempt, msg, sizeof(msg)), RPC_OK);
  assert_int_equal(tck_commit(rc, attempt, NULL, msg, sizeof(msg)), RPC_ABORTED);
  assert_non_null(strstr(msg, "aborted by request: operator"));
  assert_int_equal(abort_call(rc, attempt, msg, sizeof(msg)), RPC_OK);
  assert_int_equal(abort_call(rc, "0123456789abcdef0123456789abcdef", msg, sizeof(msg)),
                   RPC_NOT_FOUND);

  /* A stream that switches rank: INVALID_ARGUMENT, and the attempt is over
   * at once (Commit answers the same, well before the 3 s timeout). */
  assert_int_equal(tck_begin(rc, "w", 3, 2, attempt), RPC_OK);
  Stoker__V1__WriteChunk *two[2] = {&c0.ch, &c1.ch};
  rank_chunk(&c0, attempt, 0, false, false);
  rank_chunk(&c1, attempt, 1, true, false);
  assert_int_equal(write_stream(rc, two, 2, NULL, msg, sizeof(msg)), RPC_INVALID_ARGUMENT);
  assert_non_null(strstr(msg, "rank 1 on a stream of rank 0"));
  assert_int_equal(tck_commit(rc, attempt, NULL, msg, sizeof(msg)), RPC_INVALID_ARGUMENT);
  assert_non_null(strstr(msg, "rank 1 on a stream of rank 0"));
  rpc_client_free(rc);
  harness_daemon_free(d);
}

/* One u8 chunk of rank, bytes [off, off + n) of shape (zeros, at most 64
 * sent), on a stream of its own; returns the Write status. */
static int hostile_chunk(struct rpc_client *rc, const char *attempt, uint32_t rank,
                         const char *tensor, uint64_t off, uint64_t n, uint64_t shape, bool last,
                         char *msg, size_t len) {
  uint8_t data[64] = {0};
  struct tck_chunk c;
  tck_chunk_u8(&c, attempt, rank, tensor, shape, off, n);
  c.ch.data.data = data;
  c.ch.data.len = n <= sizeof(data) ? n : sizeof(data);
  c.ch.last = last;
  Stoker__V1__WriteChunk *one[1] = {&c.ch};
  return write_stream(rc, one, 1, NULL, msg, len);
}

static void test_hostile(void **state) {
  struct harness_daemon *d = start_ck();
  struct rpc_client *rc = harness_rpc(d);
  char attempt[64], msg[512];
  assert_int_equal(tck_begin(rc, "../evil", 1, 1, attempt), RPC_INVALID_ARGUMENT);
  assert_int_equal(tck_begin(rc, "ok", -5, 1, attempt), RPC_INVALID_ARGUMENT);
  /* A name escaping its directory: refused, the attempt is aborted. */
  assert_int_equal(tck_begin(rc, "h", 1, 1, attempt), RPC_OK);
  assert_int_equal(hostile_chunk(rc, attempt, 0, "a/../../b", 0, 8, 8, true, msg, sizeof(msg)),
                   RPC_INVALID_ARGUMENT);
  assert_non_null(strstr(msg, ".."));
  assert_int_not_equal(tck_commit(rc, attempt, NULL, msg, sizeof(msg)), RPC_OK);
  /* A box outside its shape. */
  assert_int_equal(tck_begin(rc, "h", 2, 1, attempt), RPC_OK);
  assert_int_equal(hostile_chunk(rc, attempt, 0, "t", 60, 8, 64, true, msg, sizeof(msg)),
                   RPC_INVALID_ARGUMENT);
  assert_int_not_equal(tck_commit(rc, attempt, NULL, msg, sizeof(msg)), RPC_OK);
  /* Overlapping chunks of two ranks: the commit's coverage check refuses. */
  assert_int_equal(tck_begin(rc, "h", 3, 2, attempt), RPC_OK);
  assert_int_equal(hostile_chunk(rc, attempt, 0, "t", 0, 40, 64, true, msg, sizeof(msg)), RPC_OK);
  assert_int_equal(hostile_chunk(rc, attempt, 1, "t", 24, 40, 64, true, msg, sizeof(msg)), RPC_OK);
  assert_int_equal(tck_commit(rc, attempt, NULL, msg, sizeof(msg)), RPC_INVALID_ARGUMENT);
  /* A stream that ends before "last": FAILED_PRECONDITION; the attempt
   * never commits (aborted at the attempt timeout). */
  assert_int_equal(tck_begin(rc, "h", 4, 1, attempt), RPC_OK);
  assert_int_equal(hostile_chunk(rc, attempt, 0, "t", 0, 8, 64, false, msg, sizeof(msg)),
                   RPC_FAILED_PRECONDITION);
  int code = tck_commit(rc, attempt, NULL, msg, sizeof(msg));
  assert_true(code == RPC_ABORTED || code == RPC_DEADLINE_EXCEEDED);
  /* Unknown attempt, rank outside the world. */
  assert_int_equal(hostile_chunk(rc, "0123456789abcdef0123456789abcdef", 0, "t", 0, 8, 8, true, msg,
                                 sizeof(msg)),
                   RPC_NOT_FOUND);
  int64_t steps[8];
  assert_int_equal(tck_list(rc, "h", steps, 8), 0);
  rpc_client_free(rc);
  harness_daemon_free(d);
}

/* Flips one byte of the first object file found under dir. */
static bool flip_object_byte(const char *dir) {
  char cmd[1024], path[1024] = "";
  snprintf(cmd, sizeof(cmd), "find '%s' -name 'rank-00000-0000.bin' | head -1", dir);
  FILE *p = popen(cmd, "r");
  if (!p) return false;
  char *ok = fgets(path, sizeof(path), p);
  pclose(p);
  path[strcspn(path, "\n")] = 0;
  FILE *f = ok && path[0] ? fopen(path, "r+b") : NULL;
  if (!f) return false;
  fseek(f, 100, SEEK_SET);
  int c = fgetc(f);
  fseek(f, 100, SEEK_SET);
  fputc(c ^ 0x5a, f);
  fclose(f);
  return true;
}

static void test_corrupt_object(void **state) {
  struct harness_daemon *d = start_ck();
  struct rpc_client *rc = harness_rpc(d);
  char msg[512];
  tck_save_ok(rc, d->addr, "rot", 7, 2);
  assert_int_equal(tck_read_all(rc, "rot", 7, 2, 2), RPC_OK);
  assert_true(flip_object_byte(d->data_dir));
  assert_int_equal(tck_read_rank(rc, "rot", 7, 0, 2, 2, msg, sizeof(msg)), RPC_DATA_LOSS);
  assert_non_null(strstr(msg, "rank-00000-0000.bin"));
  Stoker__V1__VerifyCheckpointResponse *v = verify_ok(rc, "rot", 7);
  assert_true(v->n_problems >= 1);
  assert_non_null(strstr(v->problems[0], "rank-00000-0000.bin"));
  protobuf_c_message_free_unpacked(&v->base, NULL);
  rpc_client_free(rc);
  harness_daemon_free(d);
}

/* Several pieces a message over gRPC (issue 26, part 2): 48 small boxes
 * (a row of 4 KiB each) come in one message when the Read asks for
 * pack_pieces, and one message per box when it does not (as a client from
 * before the field gets them); both bit-exact. */
static void test_read_packs_pieces(void **state) {
  (void)state;
  struct harness_daemon *d = start_ck();
  struct rpc_client *rc = harness_rpc(d);
  tck_save_ok(rc, d->addr, "pack", 1, 2);
  uint64_t messages, pieces;
  assert_int_equal(tck_read_rows(rc, "pack", 1, 48, TCK_ONE_PER_MESSAGE, &messages, &pieces),
                   RPC_OK);
  assert_int_equal(pieces, 48);
  assert_int_equal(messages, 48);
  assert_int_equal(tck_read_rows(rc, "pack", 1, 48, TCK_PACK_PIECES, &messages, &pieces), RPC_OK);
  assert_int_equal(pieces, 48);
  assert_int_equal(messages, 1); /* 192 KiB: within one message of 4 MiB. */
  rpc_client_free(rc);
  harness_daemon_free(d);
}

/* The pieces' bytes in one field of their message (issue 26, part 2):
 * with pack_data every message carries its pieces' bytes one after the
 * other in packed_data (sent by the service as assembled, borrowed), each
 * piece its run of them; the bytes of a resharded restore (written at 3
 * ranks, read at 2 and at 4) are the same in every form, and a request
 * without pack_data still gets each piece's bytes in its own data. Asked
 * without pack_pieces, or with a read file, it is refused and reads
 * nothing. */
static void test_read_packs_data(void **state) {
  (void)state;
  struct harness_daemon *d = start_ck();
  struct rpc_client *rc = harness_rpc(d);
  tck_save_ok(rc, d->addr, "pdata", 1, 3);
  const enum tck_form forms[] = {TCK_PACK_DATA, TCK_PACK_PIECES, TCK_ONE_PER_MESSAGE};
  char msg[512];
  for (uint32_t world = 2; world <= 4; world += 2)
    for (uint32_t r = 0; r < world; r++)
      for (size_t f = 0; f < sizeof(forms) / sizeof(forms[0]); f++)
        assert_int_equal(
            tck_read_rank_form(rc, "pdata", 1, r, world, 3, forms[f], msg, sizeof(msg)), RPC_OK);
  uint64_t messages, pieces;
  assert_int_equal(tck_read_rows(rc, "pdata", 1, 48, TCK_PACK_DATA, &messages, &pieces), RPC_OK);
  assert_int_equal(pieces, 48);
  assert_int_equal(messages, 1);
  assert_int_equal(
      tck_read_rank_form(rc, "pdata", 1, 0, 2, 3, TCK_PACK_DATA_ALONE, msg, sizeof(msg)),
      RPC_INVALID_ARGUMENT);
  assert_non_null(strstr(msg, "pack_data needs pack_pieces"));
  assert_int_equal(tck_read_rank_form(rc, "pdata", 1, 0, 2, 3, TCK_PACK_DATA_SHM, msg, sizeof(msg)),
                   RPC_INVALID_ARGUMENT);
  assert_non_null(strstr(msg, "pack_data cannot go with shm_name"));
  rpc_client_free(rc);
  harness_daemon_free(d);
}

/* Starts the coordinator: harness_init switched to its binary, then back. */
static struct harness_daemon *start_coordinator(char **argv) {
  char *alt[] = {argv[0], argv[2], NULL};
  harness_init(2, alt);
  struct harness_daemon *co = harness_daemon_start(NULL);
  char *back[] = {argv[0], argv[1], argv[2], NULL};
  harness_init(3, back);
  return co;
}

static char **test_argv;

static void test_coordinator_report(void **state) {
  struct harness_daemon *co = start_coordinator(test_argv);
  assert_non_null(co);
  struct stk_client *cc = harness_client(co);
  assert_int_equal(harness_create_job(cc, "gpt", 1, 4, 1000, 100), 0);
  char arg[160];
  snprintf(arg, sizeof(arg), "--coordinator=%s", co->addr);
  const char *args[] = {"--part-size", "5MiB", arg, NULL};
  struct harness_daemon *d = harness_daemon_start(args);
  assert_non_null(d);
  struct rpc_client *rc = harness_rpc(d);
  tck_save_ok(rc, d->addr, "gpt", 42, 2);
  int64_t seen = 0, deadline = harness_now_ms() + 10000;
  while (seen != 42 && harness_now_ms() < deadline) {
    Stoker__V1__Job *job = harness_get_job(cc, "gpt");
    if (job && job->latest_checkpoint) {
      seen = job->latest_checkpoint->step;
      if (seen == 42) assert_non_null(strstr(job->latest_checkpoint->uri, "manifest.pb"));
    }
    if (job) protobuf_c_message_free_unpacked(&job->base, NULL);
    if (seen != 42) harness_sleep_ms(50);
  }
  assert_int_equal(seen, 42);
  rpc_client_free(rc);
  stk_client_free(cc);
  harness_daemon_free(d);
  harness_daemon_free(co);
}

/* Whether /metrics on port has the line want. */
static bool metrics_have(int port, const char *want) {
  char *page = harness_http_get(port, "/metrics");
  bool found = page && strstr(page, want);
  free(page);
  return found;
}

static void test_orphan_attempt_sweep(void **state) {
  (void)state;
  const char *args[] = {"--attempt-timeout", "3s", "--orphan-attempt-grace", "300ms", NULL};
  int port;
  struct harness_daemon *d = harness_daemon_start_metrics(args, &port);
  assert_non_null(d);
  struct rpc_client *rc = harness_rpc(d);
  tck_save_ok(rc, d->addr, "swept", 5, 2);
  /* Objects of an attempt the journal never heard of (file:// under the
   * data dir, the daemon's default store). */
  char dir[700], obj[800];
  snprintf(dir, sizeof(dir), "%s/objects/swept/step-000000000006", d->data_dir);
  assert_int_equal(mkdir(dir, 0755), 0);
  strcat(dir, "/attempt-0000000000000000000000000000dead");
  assert_int_equal(mkdir(dir, 0755), 0);
  snprintf(obj, sizeof(obj), "%s/rank-00000-0000.bin", dir);
  FILE *fp = fopen(obj, "w");
  assert_non_null(fp);
  fputs("orphan", fp);
  fclose(fp);
  int64_t deadline = harness_now_ms() + 20000;
  while (!metrics_have(port, "\nstoker_checkpoint_orphan_attempts_removed_total 1\n") &&
         harness_now_ms() < deadline)
    harness_sleep_ms(100);
  assert_true(metrics_have(port, "\nstoker_checkpoint_orphan_attempts_removed_total 1\n"));
  assert_true(metrics_have(port, "\nstoker_checkpoint_orphan_attempt_objects_removed_total 1\n"));
  struct stat sb;
  assert_int_equal(stat(obj, &sb), -1);
  int64_t steps[4];
  assert_int_equal(tck_list(rc, "swept", steps, 4), 1);
  assert_int_equal(tck_read_all(rc, "swept", 5, 3, 2), RPC_OK);
  /* The reads' GETs are counted (published twice a second), beside the
   * spans other reads' GETs answered. */
  deadline = harness_now_ms() + 5000;
  while (metrics_have(port, "\nstoker_checkpoint_restore_gets_total 0\n") &&
         harness_now_ms() < deadline)
    harness_sleep_ms(100);
  assert_false(metrics_have(port, "\nstoker_checkpoint_restore_gets_total 0\n"));
  assert_true(metrics_have(port, "\nstoker_checkpoint_restore_gets_total "));
  assert_true(metrics_have(port, "\nstoker_checkpoint_restore_gets_shared_total "));
  rpc_client_free(rc);
  harness_daemon_free(d);
}

int main(int argc, char **argv) {
  if (argc < 3 || harness_init(argc, argv) != 0) {
    fprintf(stderr, "usage: %s STOKER_CHECKPOINT STOKER_COORDINATOR\n", argv[0]);
    return 1;
  }
  test_argv = argv;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip_reshard),        cmocka_unit_test(test_hostile),
      cmocka_unit_test(test_read_packs_pieces),        cmocka_unit_test(test_read_packs_data),
      cmocka_unit_test(test_write_reply_abort_switch), cmocka_unit_test(test_corrupt_object),
      cmocka_unit_test(test_coordinator_report),       cmocka_unit_test(test_orphan_attempt_sweep),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
