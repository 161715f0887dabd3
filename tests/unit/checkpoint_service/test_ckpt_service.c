/*
 * The checkpoint service core on the file:// backend: write -> commit ->
 * read back bit-exact at the same and at other world sizes; writers that
 * leave after "staged"; ranks that never finish; the staging budget;
 * object rolling; retention; a new service instance over existing storage.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "ckpt_svc_fixture.h"
#include "stk_error.h"

#define FLAT_NUMEL 3000001 /* 12 MB of f32: 3 MB a rank at 4 ranks. */

static int count_files(const char *dir) {
  char cmd[256];
  snprintf(cmd, sizeof(cmd), "find %s -type f -not -path '*/.stk-*' | wc -l", dir);
  FILE *p = popen(cmd, "r");
  int n = -1;
  if (p && fscanf(p, "%d", &n) != 1) n = -1;
  if (p) pclose(p);
  return n;
}

static void commit_model(struct fx *f, const char *job, int64_t step, const struct model *m,
                         uint32_t world) {
  char att[65];
  assert_int_equal(fx_begin(f, job, step, world, att), 0);
  struct write_opts wo = {.world = world, .skip_last_rank = -1};
  assert_int_equal(fx_write_model(f, att, m, &wo, NULL), 0);
  char msg[256];
  int rc = fx_commit(f, att, msg, sizeof(msg));
  if (rc) fail_msg("commit: %s", msg);
}

static void test_write_commit_read(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  f.opts.part_bytes = 5 << 20;
  assert_int_equal(fx_open(&f), 0);
  struct model *m = model_new(4, 4 * FLAT_NUMEL, 1); /* 48 MB: multipart objects. */
  commit_model(&f, "job1", 100, m, 4);
  assert_int_equal(f.hooks, 1);
  assert_int_equal(f.hook_step, 100);
  int64_t steps[8];
  size_t n;
  assert_int_equal(fx_list(&f, "job1", steps, 8, &n), 0);
  assert_int_equal(n, 1);
  assert_int_equal(steps[0], 100);
  assert_int_equal(fx_read_all(&f, "job1", 100, m, 4), 0);
  assert_int_equal(fx_read_all(&f, "job1", 100, m, 3), 0);
  assert_int_equal(fx_read_all(&f, "job1", 100, m, 8), 0);
  uint64_t problems = 99;
  assert_int_equal(fx_verify(&f, "job1", 100, &problems), 0);
  assert_int_equal(problems, 0);
  struct ckpt_service_stats st;
  ckpt_service_get_stats(f.svc, &st);
  assert_true(st.parts_uploaded > 4); /* Multipart was used. */
  assert_true(st.staged_peak_bytes <= f.opts.staging_budget_bytes);
  assert_int_equal(st.staged_bytes, 0);
  /* The same step again is refused. */
  char att[65];
  assert_int_equal(fx_begin(&f, "job1", 100, 4, att), STK_EEXIST);
  model_free(m);
  fx_fini(&f);
}

static void test_writer_leaves_after_staged(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  assert_int_equal(fx_open(&f), 0);
  struct model *m = model_new(4, FLAT_NUMEL, 2);
  char att[65];
  assert_int_equal(fx_begin(&f, "job2", 7, 4, att), 0);
  struct write_opts wo = {.world = 4, .skip_last_rank = -1, .close_after_staged = true};
  assert_int_equal(fx_write_model(&f, att, m, &wo, NULL), 0);
  /* Every writer is gone; the uploads and the commit go on. */
  assert_int_equal(fx_commit(&f, att, NULL, 0), 0);
  assert_int_equal(fx_read_all(&f, "job2", 7, m, 2), 0);
  model_free(m);
  fx_fini(&f);
}

static void test_rank_never_finishes(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  f.opts.attempt_timeout_ms = 1500;
  assert_int_equal(fx_open(&f), 0);
  struct model *m = model_new(4, FLAT_NUMEL, 3);
  char att[65], msg[256];
  assert_int_equal(fx_begin(&f, "job3", 5, 4, att), 0);
  struct write_opts wo = {.world = 4, .skip_last_rank = 2, .close_after_staged = true};
  assert_int_equal(fx_write_model(&f, att, m, &wo, NULL), 0);
  assert_int_equal(fx_commit(&f, att, msg, sizeof(msg)), STK_ETIMEDOUT);
  assert_non_null(strstr(msg, "not every rank"));
  int64_t steps[4];
  size_t n = 9;
  assert_int_equal(fx_list(&f, "job3", steps, 4, &n), 0);
  assert_int_equal(n, 0);
  assert_int_equal(count_files(f.data), 0); /* Objects cleaned. */
  assert_int_equal(f.hooks, 0);
  model_free(m);
  fx_fini(&f);
}

static void test_budget_backpressure(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  f.opts.staging_budget_bytes = 12 << 20; /* Less than a quarter of the data. */
  f.opts.upload_concurrency = 2;
  assert_int_equal(fx_open(&f), 0);
  struct model *m = model_new(4, 4 * FLAT_NUMEL, 4);
  char att[65];
  assert_int_equal(fx_begin(&f, "job4", 1, 4, att), 0);
  struct write_opts wo = {.world = 4, .skip_last_rank = -1, .max_chunk_bytes = 3 << 20};
  uint64_t waits = 0;
  assert_int_equal(fx_write_model(&f, att, m, &wo, &waits), 0);
  assert_int_equal(fx_commit(&f, att, NULL, 0), 0);
  struct ckpt_service_stats st;
  ckpt_service_get_stats(f.svc, &st);
  assert_true(waits > 0);
  assert_true(st.staged_peak_bytes <= f.opts.staging_budget_bytes);
  assert_int_equal(st.staged_bytes, 0);
  assert_int_equal(fx_read_all(&f, "job4", 1, m, 3), 0);
  model_free(m);
  fx_fini(&f);
}

static void test_objects_roll(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  f.opts.max_parts = 2; /* 10 MiB objects at most. */
  assert_int_equal(fx_open(&f), 0);
  struct model *m = model_new(2, 6 * FLAT_NUMEL, 5); /* 36 MB a rank. */
  commit_model(&f, "job5", 3, m, 2);
  char dir[256];
  snprintf(dir, sizeof(dir), "%s/job5", f.data);
  assert_true(count_files(dir) >= 2 * 4 + 1); /* >= 4 objects a rank + manifest. */
  assert_int_equal(fx_read_all(&f, "job5", 3, m, 5), 0);
  model_free(m);
  fx_fini(&f);
}

static void test_retention(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  f.opts.keep_last = 2;
  f.opts.keep_every = 4;
  assert_int_equal(fx_open(&f), 0);
  struct model *m = model_new(2, 1000, 6);
  for (int64_t s = 1; s <= 9; s++) commit_model(&f, "job6", s, m, 2);
  int64_t steps[16];
  size_t n;
  assert_int_equal(fx_list(&f, "job6", steps, 16, &n), 0);
  assert_int_equal(n, 3);
  assert_int_equal(steps[0], 4);
  assert_int_equal(steps[1], 8);
  assert_int_equal(steps[2], 9);
  char dir[256];
  snprintf(dir, sizeof(dir), "%s/job6/step-000000000003", f.data);
  assert_int_equal(count_files(dir), 0);
  assert_int_equal(fx_read_all(&f, "job6", 4, m, 1), 0);
  /* Delete removes it. */
  assert_int_equal(fx_delete(&f, "job6", 4), 0);
  assert_int_equal(fx_list(&f, "job6", steps, 16, &n), 0);
  assert_int_equal(n, 2);
  assert_int_equal(fx_delete(&f, "job6", 4), STK_ENOENT);
  model_free(m);
  fx_fini(&f);
}

static void test_new_instance_finds_checkpoints(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  assert_int_equal(fx_open(&f), 0);
  struct model *m = model_new(3, 100000, 7);
  commit_model(&f, "job7", 11, m, 3);
  commit_model(&f, "job7", 12, m, 3);
  fx_close(&f);
  /* A fresh journal over the same storage. */
  char db2[160];
  snprintf(db2, sizeof(db2), "%s/db2", f.dir);
  f.opts.db_dir = db2;
  assert_int_equal(fx_open(&f), 0);
  int64_t steps[8];
  size_t n;
  assert_int_equal(fx_list(&f, "job7", steps, 8, &n), 0);
  assert_int_equal(n, 2);
  assert_int_equal(steps[0], 11);
  assert_int_equal(steps[1], 12);
  assert_int_equal(fx_read_all(&f, "job7", 12, m, 2), 0);
  model_free(m);
  fx_fini(&f);
}

/* A read whose caller takes no piece: counts what it was handed. */
struct held_read {
  struct ckpt_reader *r;
  int pieces;
  bool done;
};

static bool hold_piece(void *arg, const Stoker__V1__ReadChunk *p) {
  (void)p;
  ((struct held_read *)arg)->pieces++;
  return false; /* Held: the read waits for ckpt_read_resume. */
}

static void held_done(void *arg, int err, const char *msg, const ProtobufCMessage *resp) {
  (void)err, (void)msg, (void)resp;
  ((struct held_read *)arg)->done = true;
}

/* Read budgets (issue 25, item 4): eight reads of one job whose caller
 * takes no piece hold at most the job's budget and a batch, never all of
 * the service's; another job's reads go on and restore bit-exactly; once
 * the held reads are cancelled nothing stays reserved. */
static void test_read_budgets(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  f.opts.read_batch_bytes = 1 << 20;
  f.opts.read_piece_bytes = 1 << 20;
  f.opts.read_budget_per_job_bytes = 4 << 20;
  f.opts.read_budget_bytes = 64 << 20;
  assert_int_equal(fx_open(&f), 0);
  struct model *m = model_new(4, FLAT_NUMEL, 3);
  commit_model(&f, "greedy", 1, m, 4);
  commit_model(&f, "fine", 1, m, 4);
  const struct tspec *flat = &m->t[2]; /* model/flat0: 12 MB */
  struct ckpt_box whole = {.ndim = 1};
  whole.sizes[0] = flat->shape.dims[0];
  Stoker__V1__Box box = STOKER__V1__BOX__INIT;
  box.n_offsets = box.n_sizes = 1;
  box.offsets = whole.offsets;
  box.sizes = whole.sizes;
  Stoker__V1__ChunkEntry ce = STOKER__V1__CHUNK_ENTRY__INIT, *cep = &ce;
  ce.tensor = (char *)flat->name;
  ce.box = &box;
  Stoker__V1__ReadRequest req = STOKER__V1__READ_REQUEST__INIT;
  req.job = "greedy";
  req.step = 1;
  req.n_wanted = 1;
  req.wanted = &cep;
  struct held_read h[8] = {0};
  for (int i = 0; i < 8; i++) h[i].r = ckpt_read(f.svc, &req, hold_piece, held_done, &h[i]);
  fx_run_for(&f, 500);
  struct ckpt_service_stats st;
  ckpt_service_get_stats(f.svc, &st);
  print_message("held reads reserve %llu bytes\n", (unsigned long long)st.read_reserved_bytes);
  assert_true(st.read_reserved_bytes > 0);
  assert_true(st.read_reserved_bytes <= (4u << 20) + 2 * (1u << 20));
  assert_int_equal(fx_read_all(&f, "fine", 1, m, 3), 0); /* Another job is served. */
  for (int i = 0; i < 8; i++) {
    assert_false(h[i].done);
    ckpt_read_cancel(h[i].r);
    assert_true(h[i].done);
  }
  fx_run_for(&f, 200);
  ckpt_service_get_stats(f.svc, &st);
  assert_int_equal(st.read_reserved_bytes, 0);
  model_free(m);
  fx_fini(&f);
}

/* Where a batch is planned (issue 26, part 2): one whose tensors have few
 * chunks on the loop (a worker's wake-up and the loop's again cost more
 * than its plan), a costlier one on a restore thread; the three ranks of
 * a restore at world 3, read together, get every byte either way. */
static void test_read_plans_on_loop_or_worker(void **state) {
  (void)state;
  const uint32_t limits[2] = {0, 1}; /* The default (4096 chunks), and 1: every batch costly. */
  for (int k = 0; k < 2; k++) {
    struct fx f;
    fx_init(&f);
    f.opts.read_loop_plan_chunks = limits[k];
    assert_int_equal(fx_open(&f), 0);
    struct model *m = model_new_fsdp(64, 48, 96, 7);
    commit_model(&f, "fsdp", 5, m, 4);
    struct fx_read reads[3];
    int rcs[3];
    for (uint32_t r = 0; r < 3; r++) reads[r] = (struct fx_read){"fsdp", 5, m, r, 3};
    assert_int_equal(fx_read_together(&f, reads, 3, rcs), 0);
    struct ckpt_service_stats st;
    ckpt_service_get_stats(f.svc, &st);
    print_message("# limit %u: %llu batches planned on the loop\n", limits[k],
                  (unsigned long long)st.read_loop_plans);
    assert_int_equal(st.read_loop_plans, k == 0 ? 3 : 0); /* One batch a read. */
    model_free(m);
    fx_fini(&f);
  }
}

/* Several pieces a message (issue 26, part 2): an FSDP checkpoint of many
 * small tensors read at world 3 arrives in a few messages when the
 * request asks for pack_pieces, each listing several pieces and packing
 * to at most read_piece_bytes; a request that does not ask gets one piece
 * per message, as before. Both restore bit-exactly (fx_read_rank_counted
 * checks every byte and every message's form). */
static void test_read_packs_pieces(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  f.opts.read_piece_bytes = 64 << 10;
  assert_int_equal(fx_open(&f), 0);
  struct model *m = model_new_fsdp(64, 48, 96, 7); /* 18 KiB a tensor, 4.5 KiB a chunk. */
  commit_model(&f, "fsdp", 5, m, 4);
  for (uint32_t r = 0; r < 3; r++) {
    struct fx_read_counts one, packed;
    assert_int_equal(fx_read_rank_counted(&f, "fsdp", 5, m, r, 3, false, &one), 0);
    assert_int_equal(fx_read_rank_counted(&f, "fsdp", 5, m, r, 3, true, &packed), 0);
    print_message(
        "# rank %u: %llu pieces in %llu messages unpacked, %llu packed (largest %llu B)\n", r,
        (unsigned long long)one.pieces, (unsigned long long)one.messages,
        (unsigned long long)packed.messages, (unsigned long long)packed.max_packed_bytes);
    assert_int_equal(one.pieces, 64); /* A piece per tensor: 6 KiB each. */
    assert_int_equal(one.messages, one.pieces);
    assert_int_equal(packed.pieces, one.pieces);
    /* 384 KiB of pieces in messages of at most 64 KiB: 7 messages. */
    assert_true(packed.messages >= 7 && packed.messages <= 8);
    assert_true(packed.max_packed_bytes > 48 << 10);
    assert_true(packed.max_packed_bytes <= 64 << 10);
  }
  model_free(m);
  fx_fini(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_read_budgets),
      cmocka_unit_test(test_read_packs_pieces),
      cmocka_unit_test(test_read_plans_on_loop_or_worker),
      cmocka_unit_test(test_write_commit_read),
      cmocka_unit_test(test_writer_leaves_after_staged),
      cmocka_unit_test(test_rank_never_finishes),
      cmocka_unit_test(test_budget_backpressure),
      cmocka_unit_test(test_objects_roll),
      cmocka_unit_test(test_retention),
      cmocka_unit_test(test_new_instance_finds_checkpoints),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
