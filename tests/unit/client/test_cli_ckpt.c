/*
 * stokerctl's checkpoint renderings (cli_ckpt_format.h): dtype names, byte
 * sizes, the progress bar, the per-tensor manifest table and the manifest
 * and verify JSON, on hand-built messages.
 */
#include <cjson/cJSON.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli_ckpt_format.h"

static void test_small_renderings(void **state) {
  (void)state;
  char b[128];
  assert_string_equal(fmt_dtype(2, b, sizeof(b)), "BF16");
  assert_string_equal(fmt_dtype(6, b, sizeof(b)), "BYTES");
  assert_string_equal(fmt_dtype(9, b, sizeof(b)), "I16"); /* The PyTorch dtypes too. */
  assert_string_equal(fmt_dtype(11, b, sizeof(b)), "BOOL");
  assert_string_equal(fmt_dtype(99, b, sizeof(b)), "UNKNOWN(99)");
  fmt_bytes(512, b, sizeof(b));
  assert_string_equal(b, "512 B");
  fmt_bytes(3u << 29, b, sizeof(b));
  assert_string_equal(b, "1.5 GiB");
  fmt_progress(1, 4, 8, b, sizeof(b));
  assert_string_equal(b, "[##......]  25%  1 B / 4 B");
  fmt_progress(9, 4, 4, b, sizeof(b)); /* Clamped. */
  assert_string_equal(b, "[####] 100%  4 B / 4 B");
}

/* Two tensors: "w" in two chunks over two objects, "b" in one. */
static uint64_t shape_w[2] = {4, 3}, shape_b[1] = {5};
static uint64_t off0[2] = {0, 0}, off1[2] = {2, 0}, sz_w[2] = {2, 3}, off_b[1] = {0}, sz_b[1] = {5};
static uint32_t crcs[2] = {1, 4294967295u};

static void build(Stoker__V1__Manifest *m, Stoker__V1__ChunkEntry *c, Stoker__V1__ChunkEntry **cp,
                  Stoker__V1__Box *bx, Stoker__V1__ObjectEntry *o, Stoker__V1__ObjectEntry **op) {
  stoker__v1__manifest__init(m);
  m->job = "j";
  m->step = 7;
  m->world = 2;
  m->attempt = "abc";
  m->format_version = 1;
  m->crc_block_bytes = 1 << 20;
  uint64_t *offs[3] = {off0, off1, off_b}, *szs[3] = {sz_w, sz_w, sz_b};
  const char *objs[3] = {"rank-00000-0000.bin", "rank-00001-0000.bin", "rank-00000-0000.bin"};
  for (int i = 0; i < 3; i++) {
    stoker__v1__chunk_entry__init(&c[i]);
    stoker__v1__box__init(&bx[i]);
    bool w = i < 2;
    c[i].tensor = w ? "w" : "b";
    c[i].dtype = w ? 1 : 5;
    c[i].n_global_shape = w ? 2 : 1;
    c[i].global_shape = w ? shape_w : shape_b;
    bx[i].n_offsets = bx[i].n_sizes = c[i].n_global_shape;
    bx[i].offsets = offs[i];
    bx[i].sizes = szs[i];
    c[i].box = &bx[i];
    c[i].object = (char *)objs[i];
    c[i].object_offset = i == 2 ? 24 : 0;
    c[i].length = w ? 24 : 5;
    cp[i] = &c[i];
  }
  for (int i = 0; i < 2; i++) {
    stoker__v1__object_entry__init(&o[i]);
    o[i].key = (char *)objs[i];
    o[i].size = i == 0 ? 29 : 24;
    o[i].n_block_crc32c = 1;
    o[i].block_crc32c = &crcs[i];
    op[i] = &o[i];
  }
  m->n_chunks = 3;
  m->chunks = cp;
  m->n_objects = 2;
  m->objects = op;
}

static void test_manifest_show_and_json(void **state) {
  (void)state;
  Stoker__V1__Manifest m;
  Stoker__V1__ChunkEntry c[3], *cp[3];
  Stoker__V1__Box bx[3];
  Stoker__V1__ObjectEntry o[2], *op[2];
  build(&m, c, cp, bx, o, op);
  char buf[4096] = {0};
  FILE *f = fmemopen(buf, sizeof(buf) - 1, "w");
  fmt_manifest_show(&m, f);
  fclose(f);
  assert_non_null(strstr(buf, "checkpoint j step 7"));
  assert_non_null(strstr(buf, "2 objects, 53 B, 3 chunks"));
  assert_non_null(strstr(buf, "TENSOR  DTYPE  SHAPE   CHUNKS  OBJECTS  BYTES"));
  assert_non_null(strstr(buf, "w       F32    [4, 3]  2       2        48 B"));
  assert_non_null(strstr(buf, "b       U8     [5]     1       1        5 B"));

  cJSON *j = fmt_manifest_json(&m);
  char *s = cJSON_PrintUnformatted(j);
  cJSON *back = cJSON_Parse(s);
  assert_string_equal(cJSON_GetObjectItem(back, "attempt")->valuestring, "abc");
  cJSON *chunks = cJSON_GetObjectItem(back, "chunks");
  assert_int_equal(cJSON_GetArraySize(chunks), 3);
  cJSON *c1 = cJSON_GetArrayItem(chunks, 1);
  assert_string_equal(cJSON_GetObjectItem(c1, "dtype")->valuestring, "F32");
  cJSON *offs = cJSON_GetObjectItem(cJSON_GetObjectItem(c1, "box"), "offsets");
  assert_int_equal(cJSON_GetArrayItem(offs, 0)->valuedouble, 2);
  cJSON *o1 = cJSON_GetArrayItem(cJSON_GetObjectItem(back, "objects"), 1);
  assert_true(cJSON_GetArrayItem(cJSON_GetObjectItem(o1, "block_crc32c"), 0)->valuedouble ==
              4294967295.0);
  cJSON_Delete(back);
  free(s);
  cJSON_Delete(j);
}

static void test_verify_report(void **state) {
  (void)state;
  Stoker__V1__VerifyCheckpointResponse v = STOKER__V1__VERIFY_CHECKPOINT_RESPONSE__INIT;
  char *probs[1] = {"rank-00000-0000.bin: block 3 crc mismatch"};
  v.objects = 2;
  v.bytes = 2048;
  v.blocks = 2;
  char buf[1024] = {0};
  FILE *f = fmemopen(buf, sizeof(buf) - 1, "w");
  fmt_verify_report("j", 7, &v, f);
  v.n_problems = 1;
  v.problems = probs;
  fmt_verify_report("j", 7, &v, f);
  fclose(f);
  assert_non_null(strstr(buf, "checkpoint j step 7: OK, 2 objects, 2.0 KiB, 2 blocks\n"));
  assert_non_null(strstr(buf, "step 7: CORRUPT, 2 objects"));
  assert_non_null(strstr(buf, "\n  rank-00000-0000.bin: block 3 crc mismatch\n"));
  cJSON *j = fmt_verify_json("j", 7, &v);
  assert_true(cJSON_IsFalse(cJSON_GetObjectItem(j, "ok")));
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "problems")), 1);
  cJSON_Delete(j);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_small_renderings),
      cmocka_unit_test(test_manifest_show_and_json),
      cmocka_unit_test(test_verify_report),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
