/*
 * The batch iterator against a hostile dataloader (issue 3): a scripted
 * StreamBatches (fake_dl_stream.h) sends real rings and crafted messages
 * the real daemon never sends, and the client library must deliver the
 * batches before the bad message exactly, then end the stream with
 * STK_ECORRUPT and a clear last error, or (a ring it cannot open) reopen
 * from that step without shared memory. Run under ASan, these also prove
 * that nothing leaks and no batch reads outside its mapping.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "fake_dl_stream.h"
#include "stk_error.h"
#include "stoker_loader.h"

#define FROM       5    /* Every stream starts at this step. */
#define LINES      2    /* Shape of every well-formed batch. */
#define LT         8    /* line_tokens */
#define SLOTS      4    /* Ring geometry: slots x one page. */
#define SLOT_BYTES 4096 /* Holds 1024 tokens. */

static struct fake_dl_stream fake;

/* ------------------------------------------------------------- helpers */

static const uint8_t *nonce_of(const Stoker__V1__StreamBatchesRequest *req) {
  assert_int_equal(req->shm_nonce.len, SHM_RING_NONCE_BYTES);
  return req->shm_nonce.data;
}

/* A ring with the request's nonce, as the daemon makes it. */
static struct shm_ring *ring_for(struct fake_dl_stream *f,
                                 const Stoker__V1__StreamBatchesRequest *req) {
  return fake_dl_ring(f, nonce_of(req), SLOTS, SLOT_BYTES);
}

/* A ring batch of the usual shape. */
static Stoker__V1__Batch *ring_batch(struct shm_ring *r, bool with_path, int64_t step,
                                     uint64_t seq) {
  return fake_dl_ring_batch(r, with_path, step, seq, LINES, LT);
}

/* Gives a batch inline tokens (as well as whatever else it carries). */
static Stoker__V1__Batch *with_tokens(Stoker__V1__Batch *m) {
  size_t len = (size_t)m->lines * m->line_tokens * 4;
  assert_non_null(m->tokens.data = calloc(1, len + 1));
  m->tokens.len = len;
  return m;
}

/* A ring batch whose slot is left as it is, naming path (may be NULL). */
static Stoker__V1__Batch *bare(const char *path, int64_t step, uint64_t seq) {
  Stoker__V1__Batch *m = fake_dl_inline(step, 0, 0);
  m->lines = LINES;
  m->line_tokens = LT;
  m->shm_seq = seq;
  if (path) assert_non_null(m->shm_path = strdup(path));
  return m;
}

static struct stk_client *open_stream(struct stk_batch_stream **ret_s) {
  struct stk_client_opts o = {.address = fake.server.addr};
  struct stk_client *c = NULL;
  assert_int_equal(stk_loader_connect(&o, &c), 0);
  assert_int_equal(stk_batch_stream_open(c, "job", FROM, 0, 1, 4, ret_s), 0);
  return c;
}

/* b is step `step` of the usual shape with the fake's tokens. */
static void check_batch(const struct stk_batch *b, int64_t step) {
  assert_int_equal(b->step, step);
  assert_int_equal(b->lines, LINES);
  assert_int_equal(b->line_tokens, LT);
  for (uint64_t i = 0; i < LINES * LT; i++) assert_int_equal(b->tokens[i], fake_dl_token(step, i));
}

/* The next batch is `step`, checked and freed. */
static void next_ok(struct stk_batch_stream *s, int64_t step) {
  struct stk_batch b;
  assert_int_equal(stk_batch_stream_next(s, 10000, &b), 0);
  check_batch(&b, step);
  stk_batch_free(&b);
}

/* Runs script against a fresh fake: the first n_good batches (from FROM)
 * arrive intact, then the stream ends with STK_ECORRUPT, after `calls`
 * StreamBatches calls, with a last error that says why. */
static void expect_corrupt(fake_dl_script_fn script, int n_good, int calls, const char *why) {
  fake_dl_start(&fake, script);
  struct stk_batch_stream *s = NULL;
  struct stk_client *c = open_stream(&s);
  for (int i = 0; i < n_good; i++) next_ok(s, FROM + i);
  struct stk_batch b;
  assert_int_equal(stk_batch_stream_next(s, 10000, &b), STK_ECORRUPT);
  int code = 0;
  const char *msg = stk_client_last_error(&code);
  assert_int_equal(code, 15); /* DATA_LOSS */
  if (!strstr(msg, why)) fail_msg("last error \"%s\" lacks \"%s\"", msg, why);
  assert_int_equal(stk_batch_stream_next(s, 10000, &b), STK_ECORRUPT); /* Stays ended. */
  stk_batch_stream_free(s);
  stk_client_free(c);
  assert_int_equal(fake_dl_calls(&fake), calls);
  fake_dl_stop(&fake);
}

/* --------------------------------------------------- 1: positive control */

/* Step FROM inline, then the ring on the 2nd message, sequences 1, 2 and
 * 3 (the last coalesced in `more`). */
static int script_good(struct fake_dl_stream *f, int call,
                       const Stoker__V1__StreamBatchesRequest *req, Stoker__V1__Batch **msgs) {
  (void)call;
  struct shm_ring *r = ring_for(f, req);
  msgs[0] = fake_dl_inline(FROM, LINES, LT);
  msgs[1] = ring_batch(r, true, FROM + 1, 1);
  msgs[2] = ring_batch(r, false, FROM + 2, 2);
  fake_dl_more(msgs[2], ring_batch(r, false, FROM + 3, 3));
  return 3;
}

static void test_good_ring(void **state) {
  (void)state;
  fake_dl_start(&fake, script_good);
  struct stk_batch_stream *s = NULL;
  struct stk_client *c = open_stream(&s);
  struct stk_batch b[4];
  for (int i = 0; i < 4; i++) {
    assert_int_equal(stk_batch_stream_next(s, 10000, &b[i]), 0);
    check_batch(&b[i], FROM + i);
  }
  struct stk_batch end;
  assert_int_equal(stk_batch_stream_next(s, 10000, &end), STK_ERANGE); /* Ended OK. */
  struct fake_dl_call call = fake_dl_call_at(&fake, 0);
  assert_int_equal(call.from_step, FROM);
  assert_int_equal(call.nonce_bytes, SHM_RING_NONCE_BYTES);
  stk_batch_stream_free(s); /* Batches outlive the stream and its mapping stays. */
  struct shm_ring *r = fake_dl_ring_at(&fake, 0);
  /* Ring batches view their slot: what the daemon writes there shows. */
  uint8_t *slot = shm_ring_slot(r, 2);
  slot[0] ^= 0xff;
  assert_int_equal(b[2].tokens[0], fake_dl_token(FROM + 2, 0) ^ 0xff);
  slot[0] ^= 0xff;
  /* Held slots are not free (only slot 3, never used, is); freeing a
   * batch releases its slot. */
  assert_int_equal(shm_ring_next_free(r, 0), 4);
  assert_int_equal(shm_ring_next_free(r, 4), 0);
  stk_batch_free(&b[1]);
  assert_int_equal(shm_ring_next_free(r, 4), 1 + SLOTS);
  assert_int_equal(shm_ring_next_free(r, 1 + SLOTS), 0);
  check_batch(&b[0], FROM);
  check_batch(&b[2], FROM + 2);
  check_batch(&b[3], FROM + 3);
  stk_batch_free(&b[0]);
  stk_batch_free(&b[2]);
  stk_batch_free(&b[3]);
  uint64_t seq = 0; /* The fourth free slot of the turn. */
  for (int i = 0; i < 4; i++) seq = shm_ring_next_free(r, seq);
  assert_int_equal(seq, 3 + SLOTS);
  stk_client_free(c);
  assert_int_equal(fake_dl_calls(&fake), 1);
  fake_dl_stop(&fake);
}

/* ------------------------------------------- 2-7, 10: ECORRUPT endings */

/* Case 2: a ring batch before any ring was named. */
static int script_seq_no_ring(struct fake_dl_stream *f, int call,
                              const Stoker__V1__StreamBatchesRequest *req,
                              Stoker__V1__Batch **msgs) {
  (void)call;
  msgs[0] = fake_dl_inline(FROM, LINES, LT);
  msgs[1] = ring_batch(ring_for(f, req), false, FROM + 1, 1);
  return 2;
}

/* Case 3: a second ring. */
static int script_second_ring(struct fake_dl_stream *f, int call,
                              const Stoker__V1__StreamBatchesRequest *req,
                              Stoker__V1__Batch **msgs) {
  (void)call;
  msgs[0] = fake_dl_inline(FROM, LINES, LT);
  msgs[1] = ring_batch(ring_for(f, req), true, FROM + 1, 1);
  msgs[2] = ring_batch(ring_for(f, req), true, FROM + 2, 2);
  return 3;
}

/* Case 4: sequence 1 repeated (sequences only grow), or a sequence in the
 * slot of one whose batch is still in use (1 + SLOTS coalesced with 1, so
 * the client cannot have freed 1 yet); sequence 2 skipped is fine (the
 * daemon passes over slots the client keeps). */
static int script_seq(struct fake_dl_stream *f, const Stoker__V1__StreamBatchesRequest *req,
                      Stoker__V1__Batch **msgs, uint64_t second_seq) {
  struct shm_ring *r = ring_for(f, req);
  msgs[0] = fake_dl_inline(FROM, LINES, LT);
  msgs[1] = ring_batch(r, true, FROM + 1, 1);
  msgs[2] = second_seq == 1 ? bare(NULL, FROM + 2, 1) : ring_batch(r, false, FROM + 2, second_seq);
  return 3;
}

static int script_seq_skipped(struct fake_dl_stream *f, int call,
                              const Stoker__V1__StreamBatchesRequest *req,
                              Stoker__V1__Batch **msgs) {
  (void)call;
  return script_seq(f, req, msgs, 3);
}

static int script_seq_repeated(struct fake_dl_stream *f, int call,
                               const Stoker__V1__StreamBatchesRequest *req,
                               Stoker__V1__Batch **msgs) {
  (void)call;
  return script_seq(f, req, msgs, 1);
}

static int script_slot_in_use(struct fake_dl_stream *f, int call,
                              const Stoker__V1__StreamBatchesRequest *req,
                              Stoker__V1__Batch **msgs) {
  (void)call;
  struct shm_ring *r = ring_for(f, req);
  msgs[0] = fake_dl_inline(FROM, LINES, LT);
  Stoker__V1__Batch *first = ring_batch(r, true, FROM + 1, 1);
  /* The fake writes the slot's tokens before the client reads 1: build the
   * message without touching the slot. */
  fake_dl_more(first, bare(NULL, FROM + 2, 1 + SLOTS));
  msgs[1] = first;
  return 2;
}

/* Case 5: lines x line_tokens x 4 beyond the slot, by a little (2 x 513
 * tokens in 4096 bytes) or by overflowing 32-bit products. */
static int script_too_big(struct fake_dl_stream *f, int call,
                          const Stoker__V1__StreamBatchesRequest *req, Stoker__V1__Batch **msgs) {
  (void)call;
  struct shm_ring *r = ring_for(f, req);
  msgs[0] = fake_dl_inline(FROM, LINES, LT);
  msgs[1] = fake_dl_ring_batch(r, true, FROM + 1, 1, 2, SLOT_BYTES / 8 + 1);
  return 2;
}

static int script_huge(struct fake_dl_stream *f, int call,
                       const Stoker__V1__StreamBatchesRequest *req, Stoker__V1__Batch **msgs) {
  (void)call;
  struct shm_ring *r = ring_for(f, req);
  msgs[0] = fake_dl_inline(FROM, LINES, LT);
  msgs[1] = ring_batch(r, true, FROM + 1, 1);
  msgs[2] = fake_dl_ring_batch(r, false, FROM + 2, 2, UINT32_MAX, UINT32_MAX);
  return 3;
}

/* Case 6: inline tokens and shm_seq together. */
static int script_tokens_and_seq(struct fake_dl_stream *f, int call,
                                 const Stoker__V1__StreamBatchesRequest *req,
                                 Stoker__V1__Batch **msgs) {
  (void)call;
  msgs[0] = fake_dl_inline(FROM, LINES, LT);
  msgs[1] = with_tokens(ring_batch(ring_for(f, req), true, FROM + 1, 1));
  return 2;
}

/* Case 7: the ring on FROM + 1 with FROM + 2 (good) and a bad third batch
 * coalesced; kind picks the fault. */
enum bad_more { MORE_PATH, MORE_INLINE, MORE_TOKENS, MORE_NESTED };

static int script_more(struct fake_dl_stream *f, const Stoker__V1__StreamBatchesRequest *req,
                       Stoker__V1__Batch **msgs, enum bad_more kind) {
  struct shm_ring *r = ring_for(f, req);
  msgs[0] = fake_dl_inline(FROM, LINES, LT);
  msgs[1] = ring_batch(r, true, FROM + 1, 1);
  fake_dl_more(msgs[1], ring_batch(r, false, FROM + 2, 2));
  Stoker__V1__Batch *bad = NULL;
  switch (kind) {
  case MORE_PATH:
    bad = ring_batch(r, true, FROM + 3, 3);
    break;
  case MORE_INLINE:
    bad = fake_dl_inline(FROM + 3, LINES, LT);
    break;
  case MORE_TOKENS:
    bad = with_tokens(ring_batch(r, false, FROM + 3, 3));
    break;
  case MORE_NESTED:
    bad = ring_batch(r, false, FROM + 3, 3);
    fake_dl_more(bad, ring_batch(r, false, FROM + 4, 4));
    break;
  }
  fake_dl_more(msgs[1], bad);
  return 2;
}

static int script_more_path(struct fake_dl_stream *f, int call,
                            const Stoker__V1__StreamBatchesRequest *req, Stoker__V1__Batch **msgs) {
  (void)call;
  return script_more(f, req, msgs, MORE_PATH);
}

static int script_more_inline(struct fake_dl_stream *f, int call,
                              const Stoker__V1__StreamBatchesRequest *req,
                              Stoker__V1__Batch **msgs) {
  (void)call;
  return script_more(f, req, msgs, MORE_INLINE);
}

static int script_more_tokens(struct fake_dl_stream *f, int call,
                              const Stoker__V1__StreamBatchesRequest *req,
                              Stoker__V1__Batch **msgs) {
  (void)call;
  return script_more(f, req, msgs, MORE_TOKENS);
}

static int script_more_nested(struct fake_dl_stream *f, int call,
                              const Stoker__V1__StreamBatchesRequest *req,
                              Stoker__V1__Batch **msgs) {
  (void)call;
  return script_more(f, req, msgs, MORE_NESTED);
}

/* Case 10: inside `more`, step FROM + 3 where FROM + 2 is due. */
static int script_more_step(struct fake_dl_stream *f, int call,
                            const Stoker__V1__StreamBatchesRequest *req, Stoker__V1__Batch **msgs) {
  (void)call;
  struct shm_ring *r = ring_for(f, req);
  msgs[0] = fake_dl_inline(FROM, LINES, LT);
  msgs[1] = ring_batch(r, true, FROM + 1, 1);
  fake_dl_more(msgs[1], ring_batch(r, false, FROM + 3, 2));
  return 2;
}

static void test_seq_without_ring(void **state) {
  (void)state;
  expect_corrupt(script_seq_no_ring, 1, 1, "before any ring");
}

static void test_second_ring(void **state) {
  (void)state;
  expect_corrupt(script_second_ring, 2, 1, "a second shared-memory ring");
}

static void test_seq_out_of_order(void **state) {
  (void)state;
  expect_corrupt(script_seq_repeated, 2, 1, "sequence 1 after 1");
  expect_corrupt(script_slot_in_use, 2, 1, "which a batch still uses");
}

static void test_seq_skipped_is_fine(void **state) {
  (void)state;
  fake_dl_start(&fake, script_seq_skipped);
  struct stk_batch_stream *s = NULL;
  struct stk_client *c = open_stream(&s);
  for (int i = 0; i < 3; i++) next_ok(s, FROM + i);
  struct stk_batch end;
  assert_int_equal(stk_batch_stream_next(s, 10000, &end), STK_ERANGE);
  stk_batch_stream_free(s);
  stk_client_free(c);
  fake_dl_stop(&fake);
}

static void test_batch_beyond_slot(void **state) {
  (void)state;
  expect_corrupt(script_too_big, 1, 1, "malformed batch");
  expect_corrupt(script_huge, 2, 1, "malformed batch");
}

static void test_tokens_and_seq(void **state) {
  (void)state;
  expect_corrupt(script_tokens_and_seq, 1, 1, "malformed batch");
}

static void test_bad_coalesced(void **state) {
  (void)state;
  expect_corrupt(script_more_path, 3, 1, "coalesced");
  expect_corrupt(script_more_inline, 3, 1, "coalesced");
  expect_corrupt(script_more_tokens, 3, 1, "malformed batch");
  expect_corrupt(script_more_nested, 3, 1, "coalesced");
}

static void test_step_out_of_order_in_more(void **state) {
  (void)state;
  expect_corrupt(script_more_step, 2, 1, "step 8, expected step 7");
}

/* ----------------------------------------------- 8, 9: the fallback */

enum bad_ring { RING_MISSING, RING_WRONG_NONCE, RING_WRONG_MAGIC };

/* Call 0 names a ring the client cannot use on FROM + 1; later calls send
 * two inline batches from where they are asked to. */
static int script_fallback(struct fake_dl_stream *f, int call,
                           const Stoker__V1__StreamBatchesRequest *req, Stoker__V1__Batch **msgs,
                           enum bad_ring kind) {
  if (call > 0) {
    msgs[0] = fake_dl_inline(req->from_step, LINES, LT);
    msgs[1] = fake_dl_inline(req->from_step + 1, LINES, LT);
    return 2;
  }
  msgs[0] = fake_dl_inline(FROM, LINES, LT);
  char path[SHM_RING_PATH_MAX];
  snprintf(path, sizeof(path), "%s/ring-missing", f->dir);
  if (kind == RING_WRONG_NONCE) {
    uint8_t wrong[SHM_RING_NONCE_BYTES];
    memcpy(wrong, nonce_of(req), sizeof(wrong));
    wrong[3] ^= 1;
    snprintf(path, sizeof(path), "%s", shm_ring_path(fake_dl_ring(f, wrong, SLOTS, SLOT_BYTES)));
  } else if (kind == RING_WRONG_MAGIC) {
    snprintf(path, sizeof(path), "%s", shm_ring_path(ring_for(f, req)));
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, "XTKRING1", 8, 0), 8);
    close(fd);
  }
  msgs[1] = bare(path, FROM + 1, 1);
  return 2;
}

static int script_missing(struct fake_dl_stream *f, int call,
                          const Stoker__V1__StreamBatchesRequest *req, Stoker__V1__Batch **msgs) {
  return script_fallback(f, call, req, msgs, RING_MISSING);
}

static int script_wrong_nonce(struct fake_dl_stream *f, int call,
                              const Stoker__V1__StreamBatchesRequest *req,
                              Stoker__V1__Batch **msgs) {
  return script_fallback(f, call, req, msgs, RING_WRONG_NONCE);
}

static int script_wrong_magic(struct fake_dl_stream *f, int call,
                              const Stoker__V1__StreamBatchesRequest *req,
                              Stoker__V1__Batch **msgs) {
  return script_fallback(f, call, req, msgs, RING_WRONG_MAGIC);
}

/* FROM, then the reopened call (no nonce, from FROM + 1) delivers FROM + 1
 * and FROM + 2 inline, then ends. */
static void expect_fallback(fake_dl_script_fn script) {
  fake_dl_start(&fake, script);
  struct stk_batch_stream *s = NULL;
  struct stk_client *c = open_stream(&s);
  for (int i = 0; i < 3; i++) next_ok(s, FROM + i);
  struct stk_batch b;
  assert_int_equal(stk_batch_stream_next(s, 10000, &b), STK_ERANGE);
  stk_batch_stream_free(s);
  stk_client_free(c);
  assert_int_equal(fake_dl_calls(&fake), 2);
  struct fake_dl_call first = fake_dl_call_at(&fake, 0), second = fake_dl_call_at(&fake, 1);
  assert_int_equal(first.from_step, FROM);
  assert_int_equal(first.nonce_bytes, SHM_RING_NONCE_BYTES);
  assert_int_equal(second.from_step, FROM + 1);
  assert_int_equal(second.nonce_bytes, 0);
  fake_dl_stop(&fake);
}

static void test_missing_ring_falls_back(void **state) {
  (void)state;
  expect_fallback(script_missing);
}

/* A ring with another nonce or magic is a file of this host that is not
 * this stream's ring: treated as "not the daemon's host", as a missing one. */
static void test_foreign_ring_falls_back(void **state) {
  (void)state;
  expect_fallback(script_wrong_nonce);
  expect_fallback(script_wrong_magic);
}

/* After falling back, a ring the client no longer asked for is corrupt. */
static int script_unasked_ring(struct fake_dl_stream *f, int call,
                               const Stoker__V1__StreamBatchesRequest *req,
                               Stoker__V1__Batch **msgs) {
  if (call == 0) return script_missing(f, call, req, msgs);
  static const uint8_t zero[SHM_RING_NONCE_BYTES];
  msgs[0] = fake_dl_inline(req->from_step, LINES, LT);
  msgs[1] = ring_batch(fake_dl_ring(f, zero, SLOTS, SLOT_BYTES), true, req->from_step + 1, 1);
  return 2;
}

static void test_unasked_ring_after_fallback(void **state) {
  (void)state;
  expect_corrupt(script_unasked_ring, 2, 2, "not asked for");
}

int main(void) {
  unsetenv("STOKER_DL_SHM");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_good_ring),
      cmocka_unit_test(test_seq_without_ring),
      cmocka_unit_test(test_second_ring),
      cmocka_unit_test(test_seq_out_of_order),
      cmocka_unit_test(test_seq_skipped_is_fine),
      cmocka_unit_test(test_batch_beyond_slot),
      cmocka_unit_test(test_tokens_and_seq),
      cmocka_unit_test(test_bad_coalesced),
      cmocka_unit_test(test_missing_ring_falls_back),
      cmocka_unit_test(test_foreign_ring_falls_back),
      cmocka_unit_test(test_step_out_of_order_in_more),
      cmocka_unit_test(test_unasked_ring_after_fallback),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
