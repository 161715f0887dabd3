/*
 * Tests for ckpt_manifest: build a 4-rank checkpoint (row-sharded f32, FSDP
 * flat bf16, a rank-0 blob) with real bytes and CRCs, round-trip it through
 * protobuf, render it as JSON, restore a tensor at 3 ranks through the
 * planner with CRC-verified block-aligned reads, find every tensor's chunks
 * alike with and without the tensor index, and reject hostile
 * manifests (offsets outside shapes, overflowing sizes, chunks past object
 * ends, missing CRCs, overlaps, gaps, bad names, garbage).
 */
#include <cjson/cJSON.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ckpt_crc.h"
#include "ckpt_manifest.h"
#include "ckpt_names.h"
#include "ckpt_plan.h"
#include "stk_error.h"
#include "stoker/v1/checkpoint.pb-c.h"

#define WORLD 4
#define F32   STOKER__V1__DTYPE__DTYPE_F32
#define BF16  STOKER__V1__DTYPE__DTYPE_BF16
#define BYTES STOKER__V1__DTYPE__DTYPE_BYTES

static const struct ckpt_shape w_shape = {2, {8, 6}}; /* f32, rows over ranks. */
static const struct ckpt_shape b_shape = {1, {10}};   /* bf16, FSDP flat shards. */
static const struct ckpt_shape dl_shape = {1, {5}};   /* Rank 0's dataloader blob. */

/* The checkpoint's objects, kept in memory for restores. */
static unsigned char *objects[WORLD];
static uint64_t object_sizes[WORLD];

/* Appends the bytes of a box (synthetic values) to rank r's object. */
static uint64_t put(uint32_t r, uint64_t at, uint64_t len, unsigned char seed) {
  for (uint64_t i = 0; i < len; i++) objects[r][at + i] = (unsigned char)(seed + i * 7);
  return at + len;
}

static struct ckpt_manifest *build(void) {
  struct ckpt_manifest *m;
  assert_int_equal(ckpt_manifest_new("job1", 100, WORLD, "a1b2", &m), 0);
  m->created_at_ms = 1700000000000;
  for (uint32_t r = 0; r < WORLD; r++) {
    struct ckpt_box wb, bb, db = {1, {0}, {5}};
    uint64_t shard;
    assert_int_equal(ckpt_shard_dim0(&w_shape, r, WORLD, &wb), 0);
    assert_int_equal(ckpt_shard_flat(10, r, WORLD, &bb, &shard), 0);
    object_sizes[r] = r == 0 ? CKPT_CRC_BLOCK_BYTES * 3 / 2 : 64;
    objects[r] = calloc(1, object_sizes[r]);
    uint64_t at = put(r, 0, ckpt_box_numel(&wb) * 4, (unsigned char)(r * 48));
    uint64_t b_at = at;
    at = put(r, at, ckpt_box_numel(&bb) * 2, 200);
    if (r == 0) put(r, at, 5, 99);
    uint32_t crcs[2];
    size_t n = ckpt_crc_block_count(object_sizes[r]);
    for (size_t i = 0; i < n; i++) {
      uint64_t off = i * CKPT_CRC_BLOCK_BYTES, left = object_sizes[r] - off;
      crcs[i] =
          ckpt_crc32c(objects[r] + off, left < CKPT_CRC_BLOCK_BYTES ? left : CKPT_CRC_BLOCK_BYTES);
    }
    char name[CKPT_OBJECT_MAX_BYTES + 1];
    ckpt_object_name(r, 0, name);
    uint32_t idx;
    assert_int_equal(ckpt_manifest_add_object(m, name, object_sizes[r], crcs, n, &idx), 0);
    assert_int_equal(ckpt_manifest_add_chunk(m, "layers.0/w", F32, &w_shape, &wb, idx, 0), 0);
    assert_int_equal(ckpt_manifest_add_chunk(m, "layers.0/b", BF16, &b_shape, &bb, idx, b_at), 0);
    if (r == 0)
      assert_int_equal(ckpt_manifest_add_chunk(m, "dataloader", BYTES, &dl_shape, &db, idx, at), 0);
  }
  assert_int_equal(ckpt_manifest_check(m), 0);
  return m;
}

static void drop_objects(void) {
  for (uint32_t r = 0; r < WORLD; r++) free(objects[r]);
}

static void assert_same(const struct ckpt_manifest *a, const struct ckpt_manifest *b) {
  assert_string_equal(a->job, b->job);
  assert_string_equal(a->attempt, b->attempt);
  assert_int_equal(a->step, b->step);
  assert_int_equal(a->world, b->world);
  assert_int_equal(a->created_at_ms, b->created_at_ms);
  assert_int_equal(a->n_objects, b->n_objects);
  assert_int_equal(a->n_chunks, b->n_chunks);
  for (size_t i = 0; i < a->n_objects; i++) {
    assert_string_equal(a->objects[i].key, b->objects[i].key);
    assert_int_equal(a->objects[i].size_bytes, b->objects[i].size_bytes);
    assert_int_equal(a->objects[i].n_blocks, b->objects[i].n_blocks);
    assert_memory_equal(a->objects[i].block_crc32c, b->objects[i].block_crc32c,
                        a->objects[i].n_blocks * 4);
  }
  for (size_t i = 0; i < a->n_chunks; i++) {
    const struct ckpt_chunk *x = &a->chunks[i], *y = &b->chunks[i];
    assert_string_equal(x->tensor, y->tensor);
    assert_int_equal(x->dtype, y->dtype);
    assert_memory_equal(&x->shape, &y->shape, sizeof(x->shape));
    assert_int_equal(x->box.ndim, y->box.ndim);
    assert_memory_equal(x->box.offsets, y->box.offsets, x->box.ndim * 8);
    assert_memory_equal(x->box.sizes, y->box.sizes, x->box.ndim * 8);
    assert_int_equal(x->object, y->object);
    assert_int_equal(x->object_offset, y->object_offset);
    assert_int_equal(x->length, y->length);
  }
}

static void test_round_trip(void **state) {
  struct ckpt_manifest *m = build(), *back;
  uint8_t *buf;
  size_t len;
  assert_int_equal(ckpt_manifest_pack(m, &buf, &len), 0);
  assert_int_equal(ckpt_manifest_parse(buf, len, &back), 0);
  assert_same(m, back);
  free(buf);
  ckpt_manifest_free(back);
  ckpt_manifest_free(m);
  drop_objects();
}

static void test_json(void **state) {
  struct ckpt_manifest *m = build();
  char *text;
  assert_int_equal(ckpt_manifest_to_json(m, true, &text), 0);
  cJSON *j = cJSON_Parse(text);
  assert_non_null(j);
  assert_string_equal(cJSON_GetObjectItem(j, "job")->valuestring, "job1");
  assert_int_equal(cJSON_GetObjectItem(j, "step")->valuedouble, 100);
  assert_int_equal(cJSON_GetObjectItem(j, "total_bytes")->valuedouble, 8 * 6 * 4 + 10 * 2 + 5);
  cJSON *tensors = cJSON_GetObjectItem(j, "tensors");
  assert_int_equal(cJSON_GetArraySize(tensors), 3);
  cJSON *w = cJSON_GetArrayItem(tensors, 2); /* Sorted by name. */
  assert_string_equal(cJSON_GetObjectItem(w, "name")->valuestring, "layers.0/w");
  assert_string_equal(cJSON_GetObjectItem(w, "dtype")->valuestring, "f32");
  assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(w, "shape"), 1)->valuedouble, 6);
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(w, "chunks")), 4);
  cJSON *o0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "objects"), 0);
  assert_int_equal(cJSON_GetObjectItem(o0, "blocks")->valuedouble, 2);
  char hex[9];
  snprintf(hex, sizeof(hex), "%08x", m->objects[0].block_crc32c[1]);
  assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(o0, "block_crc32c"), 1)->valuestring,
                      hex);
  cJSON_Delete(j);
  free(text);
  assert_int_equal(ckpt_manifest_to_json(m, false, &text), 0);
  assert_null(strstr(text, "block_crc32c"));
  free(text);
  ckpt_manifest_free(m);
  drop_objects();
}

/* Restores "layers.0/w" at 3 ranks with 1 MiB-aligned, CRC-verified reads. */
static void test_restore_through_manifest(void **state) {
  struct ckpt_manifest *m = build();
  struct ckpt_stored_chunk *chunks;
  size_t n;
  int dtype;
  struct ckpt_shape shape;
  assert_int_equal(ckpt_manifest_tensor(m, "layers.0/w", &chunks, &n, &dtype, &shape), 0);
  assert_int_equal(n, WORLD);
  assert_int_equal(dtype, F32);
  struct ckpt_plan_opts o = {.align_bytes = CKPT_CRC_BLOCK_BYTES};
  for (uint32_t r = 0; r < 3; r++) {
    struct ckpt_box want;
    struct ckpt_plan plan;
    assert_int_equal(ckpt_shard_dim0(&shape, r, 3, &want), 0);
    assert_int_equal(ckpt_plan_build(chunks, n, 4, &want, &o, &plan), 0);
    unsigned char dst[8 * 6 * 4];
    for (size_t i = 0; i < plan.n_reads; i++) {
      const struct ckpt_read *rd = &plan.reads[i];
      const struct ckpt_object *ob = &m->objects[rd->object];
      assert_int_equal(ckpt_crc_verify(ob->block_crc32c, ob->n_blocks, ob->size_bytes, rd->offset,
                                       objects[rd->object] + rd->offset, rd->len),
                       0);
      ckpt_plan_apply(&plan, i, objects[rd->object] + rd->offset, dst);
    }
    /* Row i of w came from rank i/2, value seed (rank*48) + byte index * 7. */
    for (uint64_t e = 0; e < plan.want_bytes; e++) {
      uint64_t row = want.offsets[0] + e / 24, src_rank = row / 2,
               in_chunk = (row % 2) * 24 + e % 24;
      assert_int_equal(dst[e], (unsigned char)(src_rank * 48 + in_chunk * 7));
    }
    ckpt_plan_close(&plan);
  }
  free(chunks);
  assert_int_equal(ckpt_manifest_tensor(m, "nope", &chunks, &n, &dtype, &shape), STK_ENOENT);
  ckpt_manifest_free(m);
  drop_objects();
}

/* The tensor's chunks (as ckpt_manifest_tensor gives them) equal want[0..n). */
static void expect_chunks(const struct ckpt_manifest *m, const char *tensor,
                          const struct ckpt_stored_chunk *want, size_t n, int dtype) {
  struct ckpt_stored_chunk *got;
  size_t count;
  int dt;
  struct ckpt_shape shape;
  assert_int_equal(ckpt_manifest_tensor(m, tensor, &got, &count, &dt, &shape), 0);
  assert_int_equal(count, n);
  assert_int_equal(dt, dtype);
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(got[i].object, want[i].object);
    assert_int_equal(got[i].object_offset, want[i].object_offset);
    assert_int_equal(got[i].object_bytes, want[i].object_bytes);
    assert_int_equal(got[i].box.ndim, want[i].box.ndim);
    for (uint32_t d = 0; d < want[i].box.ndim; d++) {
      assert_int_equal(got[i].box.offsets[d], want[i].box.offsets[d]);
      assert_int_equal(got[i].box.sizes[d], want[i].box.sizes[d]);
    }
  }
  free(got);
}

/* The index (a binary search by tensor name) answers what a pass over every
 * chunk answers: the same chunks in manifest order, the same dtype and
 * shape, STK_ENOENT for names before, between and after the stored ones;
 * a chunk added later drops it, so lookups never miss the new chunk. */
static void test_tensor_index(void **state) {
  (void)state;
  struct ckpt_manifest *m = build();
  const char *names[] = {"layers.0/w", "layers.0/b", "dataloader"};
  const int dtypes[] = {F32, BF16, BYTES};
  struct ckpt_stored_chunk *linear[3];
  size_t n[3];
  for (int t = 0; t < 3; t++) {
    int dt;
    struct ckpt_shape shape;
    assert_int_equal(ckpt_manifest_tensor(m, names[t], &linear[t], &n[t], &dt, &shape), 0);
  }
  assert_null(m->by_tensor);
  assert_int_equal(ckpt_manifest_index(m), 0);
  assert_non_null(m->by_tensor);
  for (int t = 0; t < 3; t++) expect_chunks(m, names[t], linear[t], n[t], dtypes[t]);
  assert_int_equal(n[0], WORLD); /* One chunk per rank, by rank: */
  for (uint32_t r = 0; r < WORLD; r++) assert_int_equal(linear[0][r].object, r);
  struct ckpt_stored_chunk *c;
  size_t k;
  int dt;
  struct ckpt_shape shape;
  const char *absent[] = {"a", "dataloadeq", "layers.0/a", "layers.0/bb", "zz"};
  for (int i = 0; i < 5; i++)
    assert_int_equal(ckpt_manifest_tensor(m, absent[i], &c, &k, &dt, &shape), STK_ENOENT);
  struct ckpt_box eb = {1, {0}, {1}};
  const struct ckpt_shape e_shape = {1, {1}};
  assert_int_equal(ckpt_manifest_add_chunk(m, "extra", BYTES, &e_shape, &eb, 1, 60), 0);
  assert_null(m->by_tensor);
  assert_int_equal(ckpt_manifest_tensor(m, "extra", &c, &k, &dt, &shape), 0);
  assert_int_equal(k, 1);
  free(c);
  assert_int_equal(ckpt_manifest_index(m), 0);
  assert_int_equal(ckpt_manifest_tensor(m, "extra", &c, &k, &dt, &shape), 0);
  assert_int_equal(k, 1);
  free(c);
  for (int t = 0; t < 3; t++) {
    expect_chunks(m, names[t], linear[t], n[t], dtypes[t]);
    free(linear[t]);
  }
  ckpt_manifest_free(m);
  drop_objects();
}

/* Packs m as is (no check) and expects parse to refuse it naming `phrase`. */
static void expect_refused(const struct ckpt_manifest *m, int want_rc, const char *phrase) {
  uint8_t *buf;
  size_t len;
  struct ckpt_manifest *back = NULL;
  assert_int_equal(ckpt_manifest_pack(m, &buf, &len), 0);
  int rc = ckpt_manifest_parse(buf, len, &back);
  free(buf);
  if (rc != want_rc || !strstr(stk_detail(), phrase))
    fail_msg("rc %d (%s), detail \"%s\"; wanted %d and \"%s\"", rc, stk_errname(rc), stk_detail(),
             want_rc, phrase);
  assert_null(back);
}

static void test_hostile_geometry(void **state) {
  struct ckpt_manifest *m = build();
  struct ckpt_chunk *c = &m->chunks[3]; /* Rank 1's w: rows 2..4. */
  /* An offset outside the shape. */
  c->box.offsets[0] = 7;
  expect_refused(m, STK_ECORRUPT, "outside");
  /* offset + size wrapping around 2^64. */
  c->box.offsets[0] = UINT64_MAX - 1;
  expect_refused(m, STK_ECORRUPT, "outside");
  c->box.offsets[0] = 2;
  /* A shape whose byte size overflows. */
  c->shape.dims[0] = UINT64_C(1) << 62;
  expect_refused(m, STK_ECORRUPT, "overflow");
  c->shape.dims[0] = 8;
  /* A chunk past its object's end. */
  c->object_offset = object_sizes[1] - 10;
  expect_refused(m, STK_ECORRUPT, "past the end");
  /* ... or wrapping around when added to its length. */
  c->object_offset = UINT64_MAX - 5;
  expect_refused(m, STK_ECORRUPT, "past the end");
  c->object_offset = 0;
  /* A length that does not match its box. */
  c->length += 4;
  expect_refused(m, STK_ECORRUPT, "length");
  c->length -= 4;
  /* Overlapping chunks (rank 1 claims rank 0's rows too). */
  c->box.offsets[0] = 1;
  expect_refused(m, STK_ECORRUPT, "overlap");
  c->box.offsets[0] = 2;
  /* A gap: rank 1's w rows shrink. */
  c->box.sizes[0] = 1;
  c->length = 24;
  expect_refused(m, STK_ECORRUPT, "cover 42 of 48");
  c->box.sizes[0] = 2;
  c->length = 48;
  /* Disagreeing shapes within one tensor. */
  c->shape.dims[1] = 7;
  expect_refused(m, STK_ECORRUPT, "disagree");
  c->shape.dims[1] = 6;
  /* An unknown dtype. */
  c->dtype = 77;
  expect_refused(m, STK_ECORRUPT, "dtype");
  c->dtype = F32;
  assert_int_equal(ckpt_manifest_check(m), 0);
  ckpt_manifest_free(m);
  drop_objects();
}

static void test_hostile_objects_and_names(void **state) {
  struct ckpt_manifest *m = build();
  /* Missing CRCs. */
  m->objects[0].n_blocks = 1;
  expect_refused(m, STK_ECORRUPT, "block CRCs");
  m->objects[0].n_blocks = 2;
  /* Two chunks sharing object bytes. */
  m->chunks[1].object_offset = 10;
  expect_refused(m, STK_ECORRUPT, "share bytes");
  m->chunks[1].object_offset = 48;
  /* Names that would escape or are malformed. */
  char *saved = m->objects[1].key;
  m->objects[1].key = "../../other-job/x.bin";
  expect_refused(m, STK_ECORRUPT, "..");
  m->objects[1].key = "manifest.pb";
  expect_refused(m, STK_ECORRUPT, "manifest");
  m->objects[1].key = m->objects[0].key;
  expect_refused(m, STK_ECORRUPT, "twice");
  m->objects[1].key = saved;
  saved = m->chunks[0].tensor;
  m->chunks[0].tensor = "/abs/w";
  expect_refused(m, STK_ECORRUPT, "tensor name");
  m->chunks[0].tensor = "w\x01";
  expect_refused(m, STK_ECORRUPT, "0x01");
  m->chunks[0].tensor = saved;
  saved = m->job;
  m->job = "..";
  expect_refused(m, STK_ECORRUPT, "job");
  m->job = saved;
  m->step = -3;
  expect_refused(m, STK_ECORRUPT, "step");
  m->step = 100;
  m->world = 0;
  expect_refused(m, STK_ECORRUPT, "world");
  m->world = WORLD;
  assert_int_equal(ckpt_manifest_check(m), 0);
  ckpt_manifest_free(m);
  drop_objects();
}

/* Protobuf-level damage the in-memory form cannot express. */
static void test_hostile_encoding(void **state) {
  struct ckpt_manifest *m = build(), *back = NULL;
  uint8_t *buf;
  size_t len;
  assert_int_equal(ckpt_manifest_pack(m, &buf, &len), 0);
  Stoker__V1__Manifest *pm = stoker__v1__manifest__unpack(NULL, len, buf);
  assert_non_null(pm);
  uint8_t out[4096];
  Stoker__V1__ChunkEntry *c = pm->chunks[0];
  char *object = c->object;
  c->object = "rank-99999-0000.bin"; /* Not listed. */
  size_t n = stoker__v1__manifest__pack(pm, out);
  c->object = object;
  assert_int_equal(ckpt_manifest_parse(out, n, &back), STK_ECORRUPT);
  assert_non_null(strstr(stk_detail(), "does not list"));
  c->box->n_sizes = 1; /* Offsets and sizes of different counts. */
  n = stoker__v1__manifest__pack(pm, out);
  c->box->n_sizes = 2;
  assert_int_equal(ckpt_manifest_parse(out, n, &back), STK_ECORRUPT);
  uint64_t dims[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  uint64_t *shape = c->global_shape;
  size_t ndim = c->n_global_shape;
  c->global_shape = dims;
  c->n_global_shape = 9;
  n = stoker__v1__manifest__pack(pm, out);
  c->global_shape = shape;
  c->n_global_shape = ndim;
  assert_int_equal(ckpt_manifest_parse(out, n, &back), STK_ECORRUPT);
  assert_non_null(strstr(stk_detail(), "dims"));
  pm->format_version = 2;
  n = stoker__v1__manifest__pack(pm, out);
  assert_int_equal(ckpt_manifest_parse(out, n, &back), STK_ENOTSUP);
  pm->format_version = 1;
  pm->crc_block_bytes = 4096;
  n = stoker__v1__manifest__pack(pm, out);
  assert_int_equal(ckpt_manifest_parse(out, n, &back), STK_ECORRUPT);
  stoker__v1__manifest__free_unpacked(pm, NULL);
  /* Truncated and garbage input; oversized input is refused unread. */
  assert_int_equal(ckpt_manifest_parse(buf, len / 2, &back), STK_ECORRUPT);
  memset(buf, 0xFF, len);
  assert_int_equal(ckpt_manifest_parse(buf, len, &back), STK_ECORRUPT);
  assert_int_equal(ckpt_manifest_parse(buf, CKPT_MANIFEST_MAX_BYTES + 1, &back), STK_ETOOBIG);
  assert_null(back);
  free(buf);
  ckpt_manifest_free(m);
  drop_objects();
}

static void test_builder_refuses(void **state) {
  struct ckpt_manifest *m;
  assert_int_equal(ckpt_manifest_new("a/b", 1, 1, "x", &m), STK_EINVAL);
  assert_int_equal(ckpt_manifest_new("a", -1, 1, "x", &m), STK_EINVAL);
  assert_int_equal(ckpt_manifest_new("a", 1, 0, "x", &m), STK_EINVAL);
  assert_int_equal(ckpt_manifest_new("a", 1, 2, "x", &m), 0);
  uint32_t crc = 0, idx;
  assert_int_equal(ckpt_manifest_add_object(m, "o.bin", 10, &crc, 0, &idx), STK_EINVAL);
  assert_int_equal(ckpt_manifest_add_object(m, "../o.bin", 10, &crc, 1, &idx), STK_EINVAL);
  assert_int_equal(ckpt_manifest_add_object(m, "o.bin", 10, &crc, 1, &idx), 0);
  struct ckpt_shape s = {1, {4}};
  struct ckpt_box b = {1, {0}, {4}};
  assert_int_equal(ckpt_manifest_add_chunk(m, "t", F32, &s, &b, idx, 0), STK_EINVAL); /* 16 > 10 */
  assert_int_equal(ckpt_manifest_add_chunk(m, "t", BF16, &s, &b, idx + 1, 0), STK_EINVAL);
  assert_int_equal(ckpt_manifest_add_chunk(m, "t", BF16, &s, &b, idx, 2), 0);
  assert_int_equal(m->chunks[0].length, 8);
  assert_int_equal(ckpt_manifest_check(m), 0);
  ckpt_manifest_free(m);
  ckpt_manifest_free(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_json),
      cmocka_unit_test(test_restore_through_manifest),
      cmocka_unit_test(test_tensor_index),
      cmocka_unit_test(test_hostile_geometry),
      cmocka_unit_test(test_hostile_objects_and_names),
      cmocka_unit_test(test_hostile_encoding),
      cmocka_unit_test(test_builder_refuses),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
