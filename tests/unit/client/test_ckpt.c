/*
 * libstoker-client's checkpoint calls against the real checkpoint core
 * served in-process (fake_ckpt.h): save at one world size, commit, list,
 * manifest, restore at another world size byte for byte, async save,
 * back-pressure under a small staging budget, verify, delete, errors.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fake_ckpt.h"
#include "stoker_admin.h"

/* Value of element i of tensor t: every byte traceable. */
static float val(int t, uint64_t i) {
  return (float)(t * 1000003 + (int64_t)i);
}

static struct stk_client *connect_to(struct fake_ckpt *f) {
  struct stk_client_opts o = {.address = f->server.addr, .default_timeout_ms = 30000};
  struct stk_client *c = NULL;
  assert_int_equal(stk_ckpt_connect(&o, &c), 0);
  return c;
}

/* Tensor "w": [R x C] f32 split by rows over world ranks; "e": [4 x 6 x 50]
 * f32 split on dim 1 (inner cut when rows are big); blob "rng-<rank>". */
#define R 12
#define C 1000
static const uint64_t w_shape[2] = {R, C};
static const uint64_t e_shape[3] = {4, 6, 50};

static void save_rank(struct stk_client *c, const char *att, uint32_t rank, uint32_t world,
                      size_t max_chunk) {
  uint64_t rows = R / world, woff[2] = {rank * rows, 0}, wsz[2] = {rows, C};
  float *w = malloc(rows * C * sizeof(float));
  for (uint64_t i = 0; i < rows * C; i++) w[i] = val(1, woff[0] * C + i);
  uint64_t eoff[3] = {0, rank * (6 / world), 0}, esz[3] = {4, 6 / world, 50};
  size_t en = 4 * esz[1] * 50;
  float *e = malloc(en * sizeof(float));
  size_t k = 0;
  for (uint64_t a = 0; a < 4; a++)
    for (uint64_t b = eoff[1]; b < eoff[1] + esz[1]; b++)
      for (uint64_t d = 0; d < 50; d++) e[k++] = val(2, (a * 6 + b) * 50 + d);
  char blob[32], name[16];
  int bl = snprintf(blob, sizeof(blob), "rng state of %u", rank);
  snprintf(name, sizeof(name), "rng-%u", rank);
  uint64_t bshape[1] = {(uint64_t)bl}, boff[1] = {0}, bsz[1] = {(uint64_t)bl};
  struct stk_ckpt_writer *wr;
  assert_int_equal(stk_ckpt_writer_open(c, att, rank, 0, &wr), 0);
  stk_ckpt_writer_set_max_chunk(wr, max_chunk);
  struct stk_ckpt_box wb = {2, woff, wsz}, eb = {3, eoff, esz}, bb = {1, boff, bsz};
  assert_int_equal(
      stk_ckpt_write_chunk(wr, "w", STK_DTYPE_F32, w_shape, &wb, w, rows * C * sizeof(float)), 0);
  assert_int_equal(stk_ckpt_write_chunk(wr, "e", STK_DTYPE_F32, e_shape, &eb, e, en * 4), 0);
  assert_int_equal(stk_ckpt_write_chunk(wr, name, STK_DTYPE_BYTES, bshape, &bb, blob, bl), 0);
  uint64_t bytes = 0;
  bool durable = false;
  assert_int_equal(stk_ckpt_writer_finish(wr, rank == 0, &bytes, &durable), 0);
  assert_int_equal(bytes, (rows * C + en) * 4 + (uint64_t)bl);
  assert_int_equal(durable, rank == 0); /* Rank 0 asked to wait for durable. */
  free(w);
  free(e);
}

/* Restores "w" and "e" at world 3 and checks every element. */
static void check_restore(struct stk_client *c, int64_t step) {
  float *w = malloc(R * C * sizeof(float)), *e = malloc(4 * 6 * 50 * sizeof(float));
  uint64_t off[3][2], sz[3][2], eoff[3] = {1, 1, 10}, esz[3] = {3, 5, 33};
  struct stk_ckpt_want want[4];
  for (int r = 0; r < 3; r++) {
    off[r][0] = (uint64_t)r * 4;
    off[r][1] = 0;
    sz[r][0] = 4;
    sz[r][1] = C;
    want[r] = (struct stk_ckpt_want){"w", {2, off[r], sz[r]}, w + r * 4 * C, 4 * C * sizeof(float)};
  }
  want[3] = (struct stk_ckpt_want){"e", {3, eoff, esz}, e, 3 * 5 * 33 * sizeof(float)};
  uint64_t got = 0;
  assert_int_equal(stk_ckpt_read(c, "j", step, want, 4, 0, &got), 0);
  assert_int_equal(got, (R * C + 3 * 5 * 33) * sizeof(float));
  for (uint64_t i = 0; i < R * C; i++) assert_true(w[i] == val(1, i));
  size_t k = 0;
  for (uint64_t a = 1; a < 4; a++)
    for (uint64_t b = 1; b < 6; b++)
      for (uint64_t d = 10; d < 43; d++) assert_true(e[k++] == val(2, (a * 6 + b) * 50 + d));
  free(w);
  free(e);
}

static void test_save_commit_restore(void **state) {
  (void)state;
  struct fake_ckpt f;
  struct fake_ckpt_opts fo = {.read_piece_bytes = 8192}; /* Many pieces per box. */
  fake_ckpt_start(&f, &fo);
  struct stk_client *c = connect_to(&f);
  char att[STK_CKPT_ATTEMPT_MAX];
  assert_int_equal(stk_ckpt_begin(c, "j", 10, 2, 0, att), 0);
  assert_true(strlen(att) > 0);
  save_rank(c, att, 0, 2, 8000); /* "w" in 2-row pieces, "e" cut inside dim 1. */
  save_rank(c, att, 1, 2, 1 << 20);
  struct stk_ckpt_ref ref;
  assert_int_equal(stk_ckpt_commit(c, att, 0, &ref), 0);
  assert_int_equal(ref.step, 10);

  Stoker__V1__ListCheckpointsResponse *l = NULL;
  assert_int_equal(stk_ckpt_list(c, "j", 0, &l), 0);
  assert_int_equal(l->n_checkpoints, 1);
  assert_int_equal(l->checkpoints[0]->step, 10);
  protobuf_c_message_free_unpacked(&l->base, NULL);

  Stoker__V1__Manifest *m = NULL;
  assert_int_equal(stk_ckpt_get_manifest(c, "j", 10, 0, &m), 0);
  assert_int_equal(m->world, 2);
  assert_string_equal(m->attempt, att);
  assert_true(m->n_chunks > 4); /* Rank 0's boxes arrived cut in pieces. */
  protobuf_c_message_free_unpacked(&m->base, NULL);

  check_restore(c, 10);
  char again[STK_CKPT_ATTEMPT_MAX];
  assert_int_equal(stk_ckpt_begin(c, "j", 10, 2, 0, again), STK_EEXIST);

  assert_int_equal(stk_ckpt_delete(c, "j", 10, 0), 0);
  assert_int_equal(stk_ckpt_get_manifest(c, "j", 10, 0, &m), STK_ENOENT);
  assert_int_equal(stk_ckpt_list(c, "j", 0, &l), 0);
  assert_int_equal(l->n_checkpoints, 0);
  protobuf_c_message_free_unpacked(&l->base, NULL);
  stk_client_free(c);
  fake_ckpt_stop(&f);
}

/* ------------------------------------------------------------ async save */

struct saved {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int n;
  int err;
  uint64_t bytes;
};

static void on_saved(void *arg, int err, const char *msg, uint64_t bytes) {
  (void)msg;
  struct saved *s = arg;
  pthread_mutex_lock(&s->mu);
  s->n++;
  if (err) s->err = err;
  s->bytes += bytes;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* Two ranks write 24 MiB each at once through a 16 MiB staging budget: the
 * service must hold them back (waits: one rank's shard alone is over the
 * budget, so they happen whatever the timing), never exceed the budget,
 * and still store every byte. */
static void test_async_save_backpressure(void **state) {
  (void)state;
  struct fake_ckpt f;
  struct fake_ckpt_opts fo = {.staging_budget_bytes = 16u << 20};
  fake_ckpt_start(&f, &fo);
  struct stk_client *c = connect_to(&f);
  char att[STK_CKPT_ATTEMPT_MAX];
  assert_int_equal(stk_ckpt_begin(c, "big", 3, 2, 0, att), 0);
  const uint64_t rows = 6 << 10, cols = 1024; /* 24 MiB of f32 per rank. */
  static const uint64_t shape[2] = {2 * (6 << 10), 1024};
  float *buf[2];
  uint64_t off[2][2], sz[2][2];
  struct stk_ckpt_tensor t[2];
  for (int r = 0; r < 2; r++) {
    buf[r] = malloc(rows * cols * 4);
    for (uint64_t i = 0; i < rows * cols; i++) buf[r][i] = val(3, r * rows * cols + i);
    off[r][0] = r * rows;
    off[r][1] = 0;
    sz[r][0] = rows;
    sz[r][1] = cols;
    t[r] = (struct stk_ckpt_tensor){"big",  STK_DTYPE_F32,  shape, {2, off[r], sz[r]},
                                    buf[r], rows * cols * 4};
  }
  struct saved s = {.n = 0};
  pthread_mutex_init(&s.mu, NULL);
  pthread_cond_init(&s.cv, NULL);
  for (uint32_t r = 0; r < 2; r++)
    assert_int_equal(stk_ckpt_save_async(c, att, r, &t[r], 1, on_saved, &s), 0);
  pthread_mutex_lock(&s.mu);
  while (s.n < 2) pthread_cond_wait(&s.cv, &s.mu);
  pthread_mutex_unlock(&s.mu);
  assert_int_equal(s.err, 0);
  assert_int_equal(s.bytes, 2 * rows * cols * 4);
  assert_int_equal(stk_ckpt_commit(c, att, 60000, NULL), 0);
  struct ckpt_service_stats st;
  fake_ckpt_stats(&f, &st);
  print_message("backpressure: %llu waits, staged peak %llu bytes\n", (unsigned long long)st.waits,
                (unsigned long long)st.staged_peak_bytes);
  assert_true(st.waits > 0);
  assert_true(st.staged_peak_bytes <= (16u << 20));
  /* Everything arrived: read the whole tensor back in one box. */
  float *all = malloc(2 * rows * cols * 4);
  uint64_t z[2] = {0, 0};
  struct stk_ckpt_want w = {"big", {2, z, shape}, all, 2 * rows * cols * 4};
  assert_int_equal(stk_ckpt_read(c, "big", 3, &w, 1, 0, NULL), 0);
  for (uint64_t i = 0; i < 2 * rows * cols; i++)
    if (all[i] != val(3, i)) fail_msg("element %llu differs", (unsigned long long)i);
  free(all);
  free(buf[0]);
  free(buf[1]);
  pthread_cond_destroy(&s.cv);
  pthread_mutex_destroy(&s.mu);
  stk_client_free(c);
  fake_ckpt_stop(&f);
}

/* ---------------------------------------------------------------- errors */

static void test_errors(void **state) {
  (void)state;
  struct fake_ckpt f;
  fake_ckpt_start(&f, NULL);
  struct stk_client *c = connect_to(&f);
  char att[STK_CKPT_ATTEMPT_MAX];
  assert_int_equal(stk_ckpt_begin(c, "j", -1, 2, 0, att), STK_EINVAL);
  assert_int_equal(stk_ckpt_begin(c, "j", 1, 0, 0, att), STK_EINVAL);
  assert_int_equal(stk_ckpt_begin(c, "bad/name", 1, 1, 0, att), STK_EINVAL);
  assert_int_equal(stk_ckpt_commit(c, "00000000000000000000000000000000", 0, NULL), STK_ENOENT);
  assert_int_equal(stk_ckpt_begin(c, "j", 1, 1, 0, att), 0);
  struct stk_ckpt_writer *w;
  assert_int_equal(stk_ckpt_writer_open(c, att, 0, 0, &w), 0);
  uint64_t shape[1] = {4}, off[1] = {2}, sz[1] = {3}; /* Outside the shape. */
  float data[3] = {0};
  struct stk_ckpt_box b = {1, off, sz};
  assert_int_equal(stk_ckpt_write_chunk(w, "t", STK_DTYPE_F32, shape, &b, data, 12), STK_EINVAL);
  off[0] = 0;
  assert_int_equal(stk_ckpt_write_chunk(w, "t", STK_DTYPE_F32, shape, &b, data, 8),
                   STK_EINVAL); /* Wrong length. */
  stk_ckpt_writer_abort(w);
  /* A rank outside the world: the service refuses the stream. */
  assert_int_equal(stk_ckpt_writer_open(c, att, 5, 0, &w), 0);
  stk_ckpt_write_chunk(w, "t", STK_DTYPE_F32, shape, &b, data, 12);
  assert_int_equal(stk_ckpt_writer_finish(w, false, NULL, NULL), STK_EINVAL);
  int code = 0;
  assert_true(strlen(stk_client_last_error(&code)) > 0);
  assert_int_equal(code, 3);
  uint64_t z[1] = {0};
  struct stk_ckpt_want want = {"t", {1, z, shape}, data, 12};
  assert_int_equal(stk_ckpt_read(c, "j", 99, &want, 1, 0, NULL), STK_ENOENT);
  stk_client_free(c);
  fake_ckpt_stop(&f);
}

/* A service whose message names bytes past its packed_data (issue 26,
 * part 2): the read fails as corrupt, naming the piece, and places nothing
 * from outside the message. */
static void test_read_refuses_runs_outside_message(void **state) {
  (void)state;
  struct fake_ckpt f;
  struct fake_ckpt_opts fo = {.damage_packed_data = true};
  fake_ckpt_start(&f, &fo);
  struct stk_client *c = connect_to(&f);
  char att[STK_CKPT_ATTEMPT_MAX];
  assert_int_equal(stk_ckpt_begin(c, "j", 4, 1, 0, att), 0);
  save_rank(c, att, 0, 1, 1 << 20);
  assert_int_equal(stk_ckpt_commit(c, att, 0, NULL), 0);
  float *w = calloc(R * C, sizeof(float));
  uint64_t z[2] = {0, 0};
  struct stk_ckpt_want want = {"w", {2, z, w_shape}, w, R * C * sizeof(float)};
  assert_int_equal(stk_ckpt_read(c, "j", 4, &want, 1, 0, NULL), STK_ECORRUPT);
  assert_non_null(strstr(stk_client_last_error(NULL), "outside its message's bytes"));
  free(w);
  stk_client_free(c);
  fake_ckpt_stop(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_save_commit_restore),
      cmocka_unit_test(test_async_save_backpressure),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_read_refuses_runs_outside_message),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
