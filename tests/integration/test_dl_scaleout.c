/*
 * Scale-out of the dataloader end to end: real stoker-dataloader processes
 * on loopback, each started with --part I/P, read through libstoker-client's
 * assembling loader (stk_loader_open with the address list). Two and three
 * processes serving one job give exactly the bytes (tokens and document
 * starts) of one 0/1 process, by GetBatch and by stream, for many (step,
 * rank, world) including world changes; each process generated only its
 * lanes (GetLoader's lane_lines_generated); a job moved from 2 processes to
 * 3 at a committed step (export from both, import into each of the three)
 * continues with identical bytes; bad --part values stop the daemon; a
 * single-address client or a misordered address list is refused rather than
 * handed a partial batch.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "stoker_admin.h"
#include "test_dl_helpers.h"

#define SYNTH "synthetic:2000:8:200:3"
#define JOB   "so"
#define MAXD  4

/* Daemons: [0] the whole job (0/1), then parts 0..n-1 of n. */
struct fleet {
  struct harness_daemon *d[MAXD];
  uint32_t n;
  struct stk_loader *parts; /* every part, in order */
};

static void fleet_start(struct fleet *f, uint32_t n) {
  char list[MAXD * 140] = "";
  f->n = n;
  for (uint32_t i = 0; i < n; i++) {
    char part[32];
    snprintf(part, sizeof part, "%u/%u", i, n);
    const char *args[] = {"--part", part, NULL};
    f->d[i] = harness_daemon_start(args);
    assert_non_null(f->d[i]);
    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? "," : "", f->d[i]->addr);
  }
  struct stk_client_opts o = {.address = list};
  assert_int_equal(stk_loader_open(&o, &f->parts), 0);
  assert_int_equal(stk_loader_n_parts(f->parts), n);
}

static void fleet_stop(struct fleet *f) {
  stk_loader_close(f->parts);
  for (uint32_t i = 0; i < f->n; i++) harness_daemon_free(f->d[i]);
  memset(f, 0, sizeof *f);
}

static struct stk_loader *open_one(const struct harness_daemon *d) {
  struct stk_client_opts o = {.address = d->addr};
  struct stk_loader *l = NULL;
  assert_int_equal(stk_loader_open(&o, &l), 0);
  return l;
}

static void spec_init(struct tdl_spec *t) {
  tdl_spec_init(t, JOB, SYNTH, 0, 31, 12);
  t->spec.lanes = 6;
}

static void assert_same(const struct stk_batch *a, const struct stk_batch *b) {
  assert_int_equal(a->step, b->step);
  assert_int_equal(a->lines, b->lines);
  assert_int_equal(a->line_tokens, b->line_tokens);
  assert_memory_equal(a->tokens, b->tokens, (size_t)a->lines * a->line_tokens * 4);
  assert_int_equal(a->n_doc_starts, b->n_doc_starts);
  if (a->n_doc_starts) assert_memory_equal(a->doc_starts, b->doc_starts, a->n_doc_starts * 4);
}

/* GetBatch of steps [from, to), world changing every step, every rank. */
static void assert_batches(struct stk_loader *whole, struct stk_loader *parts, int64_t from,
                           int64_t to) {
  static const uint32_t worlds[] = {1, 2, 4, 3};
  for (int64_t s = from; s < to; s++) {
    uint32_t world = worlds[s % 4];
    for (uint32_t r = 0; r < world; r++) {
      struct stk_batch want, got;
      assert_int_equal(stk_loader_batch_all(whole, JOB, s, r, world, 0, &want), 0);
      assert_int_equal(stk_loader_batch_all(parts, JOB, s, r, world, 0, &got), 0);
      assert_same(&want, &got);
      stk_batch_free(&want);
      stk_batch_free(&got);
    }
  }
}

/* The assembled stream of n steps from `from` at (rank, world). */
static void assert_stream(struct stk_loader *whole, struct stk_loader *parts, int64_t from,
                          uint32_t rank, uint32_t world, int n) {
  struct stk_batch_stream *s = NULL;
  assert_int_equal(stk_loader_stream_all(parts, JOB, from, rank, world, 3, &s), 0);
  for (int i = 0; i < n; i++) {
    struct stk_batch want, got;
    assert_int_equal(stk_batch_stream_next(s, 20000, &got), 0);
    assert_int_equal(stk_loader_batch_all(whole, JOB, from + i, rank, world, 0, &want), 0);
    assert_same(&want, &got);
    stk_batch_free(&want);
    stk_batch_free(&got);
  }
  stk_batch_stream_free(s);
}

/* Part i of n generated lines only in lanes c with c mod n == i. */
static void assert_own_lanes(struct fleet *f) {
  for (uint32_t i = 0; i < f->n; i++) {
    Stoker__V1__LoaderInfo *info = NULL;
    assert_int_equal(stk_loader_get(stk_loader_part(f->parts, i), JOB, 0, &info), 0);
    assert_int_equal(info->part, i);
    assert_int_equal(info->parts, f->n);
    assert_int_equal(info->n_lane_lines_generated, 6);
    for (uint32_t c = 0; c < 6; c++) {
      if (c % f->n == i)
        assert_true(info->lane_lines_generated[c] > 0);
      else
        assert_int_equal(info->lane_lines_generated[c], 0);
    }
    protobuf_c_message_free_unpacked(&info->base, NULL);
  }
}

/* The whole loader: one daemon (*ret_d) with the job of spec_init (*t)
 * created. */
static struct stk_loader *whole_start(struct harness_daemon **ret_d, struct tdl_spec *t) {
  const char *none[] = {NULL};
  *ret_d = harness_daemon_start(none);
  assert_non_null(*ret_d);
  struct stk_loader *whole = open_one(*ret_d);
  spec_init(t);
  assert_int_equal(stk_loader_create_all(whole, &t->spec, 0, NULL), 0);
  return whole;
}

static void test_parts_match_whole(void **state) {
  (void)state;
  struct harness_daemon *wd;
  struct tdl_spec t;
  struct stk_loader *whole = whole_start(&wd, &t);
  for (uint32_t n = 2; n <= 3; n++) {
    struct fleet f;
    fleet_start(&f, n);
    assert_int_equal(stk_loader_create_all(f.parts, &t.spec, 0, NULL), 0);
    assert_batches(whole, f.parts, 0, 12);
    assert_stream(whole, f.parts, 5, 1, 2, 6);
    assert_stream(whole, f.parts, 11, 2, 3, 4);
    assert_own_lanes(&f);
    fleet_stop(&f);
  }
  stk_loader_close(whole);
  harness_daemon_free(wd);
}

static void test_scale_2_to_3(void **state) {
  (void)state;
  struct harness_daemon *wd;
  struct tdl_spec t;
  struct stk_loader *whole = whole_start(&wd, &t);
  struct fleet two, three;
  fleet_start(&two, 2);
  assert_int_equal(stk_loader_create_all(two.parts, &t.spec, 0, NULL), 0);
  assert_batches(whole, two.parts, 0, 10);
  assert_int_equal(stk_loader_commit_all(two.parts, JOB, 9, 0), 0);
  uint8_t *blob = NULL;
  size_t len = 0;
  assert_int_equal(stk_loader_export_all(two.parts, JOB, 9, 0, &blob, &len), 0);
  fleet_stop(&two); /* the old processes are gone */
  fleet_start(&three, 3);
  int64_t committed = -1;
  assert_int_equal(stk_loader_import_all(three.parts, JOB, 9, blob, len, 0, &committed), 0);
  assert_int_equal(committed, 9);
  Stoker__V1__LoaderInfo *info = NULL;
  assert_int_equal(stk_loader_info_all(three.parts, JOB, 0, &info), 0);
  assert_int_equal(info->committed_step, 9);
  protobuf_c_message_free_unpacked(&info->base, NULL);
  assert_batches(whole, three.parts, 10, 20);
  assert_stream(whole, three.parts, 10, 0, 4, 5);
  assert_own_lanes(&three);
  free(blob);
  fleet_stop(&three);
  stk_loader_close(whole);
  harness_daemon_free(wd);
}

/* Partial batches never reach a trainer by mistake. */
static void test_misuse_refused(void **state) {
  (void)state;
  struct fleet f;
  fleet_start(&f, 2);
  struct tdl_spec t;
  spec_init(&t);
  assert_int_equal(stk_loader_create_all(f.parts, &t.spec, 0, NULL), 0);
  struct stk_batch b;
  assert_int_equal(stk_loader_get_batch(stk_loader_part(f.parts, 1), JOB, 0, 0, 1, 0, &b),
                   STK_EINVAL);
  assert_non_null(strstr(stk_client_last_error(NULL), "part 1 of 2"));
  char list[300];
  snprintf(list, sizeof list, "%s,%s", f.d[1]->addr, f.d[0]->addr);
  struct stk_client_opts o = {.address = list};
  struct stk_loader *swapped = NULL;
  assert_int_equal(stk_loader_open(&o, &swapped), 0);
  assert_int_equal(stk_loader_batch_all(swapped, JOB, 0, 0, 1, 0, &b), STK_EINVAL);
  stk_loader_close(swapped);
  fleet_stop(&f);
}

static void test_bad_part_rejected(void **state) {
  (void)state;
  static const char *const bad[] = {"2/2", "1/0", "a/2", "1", "0/2x", "-1/2", "0/5000"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *args[] = {"--part", bad[i], NULL};
    struct harness_daemon *d = harness_daemon_start(args);
    assert_null(d);
  }
}

int main(int argc, char **argv) {
  if (harness_init(argc, argv) != 0) return 2;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parts_match_whole),
      cmocka_unit_test(test_scale_2_to_3),
      cmocka_unit_test(test_misuse_refused),
      cmocka_unit_test(test_bad_part_rejected),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
