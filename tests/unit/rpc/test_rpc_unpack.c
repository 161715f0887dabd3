/*
 * rpc_unpack copies large bytes fields once, straight from the received
 * slices (services/common/rpc_unpack.c). These tests feed it messages cut
 * into slices at awkward places and check it returns exactly what
 * protobuf-c's own unpack returns, and refuses what protobuf-c refuses.
 */
#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rpc_internal.h"
#include "stoker/v1/checkpoint.pb-c.h"
#include "stoker/v1/coordinator.pb-c.h"
#include "stoker/v1/dataloader.pb-c.h"

/* bytes cut into slices of `piece` bytes (the last one shorter). */
static grpc_byte_buffer *sliced(const uint8_t *bytes, size_t len, size_t piece) {
  size_t n = len ? (len + piece - 1) / piece : 1;
  grpc_slice *s = calloc(n, sizeof(*s));
  for (size_t i = 0; i < n; i++) {
    size_t at = i * piece, k = len - at < piece ? len - at : piece;
    s[i] = grpc_slice_from_copied_buffer((const char *)bytes + at, len ? k : 0);
  }
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(s, n);
  for (size_t i = 0; i < n; i++) grpc_slice_unref(s[i]);
  free(s);
  return bb;
}

static uint8_t *packed(const ProtobufCMessage *m, size_t *ret_len) {
  *ret_len = protobuf_c_message_get_packed_size(m);
  uint8_t *b = malloc(*ret_len + 1);
  protobuf_c_message_pack(m, b);
  return b;
}

/* rpc_unpack over every slicing gives the message protobuf-c gives. */
static void expect_same(const uint8_t *wire, size_t len, const ProtobufCMessageDescriptor *d) {
  ProtobufCMessage *want = protobuf_c_message_unpack(d, NULL, len, wire);
  assert_non_null(want);
  size_t want_len;
  uint8_t *want_wire = packed(want, &want_len);
  const size_t pieces[] = {1, 3, 7, 4096, 16384, 65537, len ? len : 1};
  for (size_t i = 0; i < sizeof(pieces) / sizeof(pieces[0]); i++) {
    if (pieces[i] < 4096 && len > (1u << 20)) continue; /* Too many slices to be quick. */
    grpc_byte_buffer *bb = sliced(wire, len, pieces[i]);
    ProtobufCMessage *got = rpc_unpack(bb, d, NULL, 0);
    grpc_byte_buffer_destroy(bb);
    assert_non_null(got);
    size_t got_len;
    uint8_t *got_wire = packed(got, &got_len);
    assert_int_equal(got_len, want_len);
    assert_memory_equal(got_wire, want_wire, want_len);
    free(got_wire);
    protobuf_c_message_free_unpacked(got, NULL);
  }
  free(want_wire);
  protobuf_c_message_free_unpacked(want, NULL);
}

static void fill(uint8_t *b, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; i++) b[i] = (uint8_t)((i * 2654435761u + seed) >> 13);
}

static void test_batch_large_tokens(void **state) {
  (void)state;
  Stoker__V1__Batch m = STOKER__V1__BATCH__INIT;
  uint32_t starts[] = {0, 5, 700, 70000};
  size_t n = 3u << 20;
  uint8_t *tokens = malloc(n);
  fill(tokens, n, 1);
  m.step = 123456789;
  m.lines = 3;
  m.line_tokens = (uint32_t)(n / 12);
  m.tokens.data = tokens;
  m.tokens.len = n;
  m.doc_starts = starts;
  m.n_doc_starts = 4;
  size_t len;
  uint8_t *wire = packed(&m.base, &len);
  expect_same(wire, len, &stoker__v1__batch__descriptor);
  /* The bulk field is its own aligned buffer, so tokens can be viewed in place. */
  grpc_byte_buffer *bb = sliced(wire, len, 16384);
  Stoker__V1__Batch *got =
      (Stoker__V1__Batch *)rpc_unpack(bb, &stoker__v1__batch__descriptor, NULL, 0);
  grpc_byte_buffer_destroy(bb);
  assert_non_null(got);
  assert_int_equal((uintptr_t)got->tokens.data % 8, 0);
  assert_memory_equal(got->tokens.data, tokens, n);
  protobuf_c_message_free_unpacked(&got->base, NULL);
  free(wire);
  free(tokens);
}

static void test_small_and_empty(void **state) {
  (void)state;
  Stoker__V1__Batch m = STOKER__V1__BATCH__INIT;
  uint8_t small[100];
  fill(small, sizeof(small), 2);
  m.tokens.data = small;
  m.tokens.len = sizeof(small);
  m.step = -5;
  size_t len;
  uint8_t *wire = packed(&m.base, &len);
  expect_same(wire, len, &stoker__v1__batch__descriptor);
  free(wire);
  Stoker__V1__Batch empty = STOKER__V1__BATCH__INIT;
  wire = packed(&empty.base, &len);
  assert_int_equal(len, 0);
  expect_same(wire, len, &stoker__v1__batch__descriptor);
  free(wire);
}

/* A chunk with strings around a 1 MiB payload, fields in an unusual order. */
static void test_write_chunk_fields_any_order(void **state) {
  (void)state;
  Stoker__V1__WriteChunk m = STOKER__V1__WRITE_CHUNK__INIT;
  uint64_t shape[] = {1024, 256};
  size_t n = 1u << 20;
  uint8_t *data = malloc(n);
  fill(data, n, 3);
  m.attempt = "att";
  m.tensor = "layers.0.w";
  m.global_shape = shape;
  m.n_global_shape = 2;
  m.data.data = data;
  m.data.len = n;
  m.last = true;
  size_t len;
  uint8_t *wire = packed(&m.base, &len);
  expect_same(wire, len, &stoker__v1__write_chunk__descriptor);
  /* The same fields with the payload first and the scalars after it. */
  Stoker__V1__WriteChunk payload_only = STOKER__V1__WRITE_CHUNK__INIT, rest = m;
  payload_only.data = m.data;
  rest.data.data = NULL;
  rest.data.len = 0;
  size_t a_len, b_len;
  uint8_t *a = packed(&payload_only.base, &a_len), *b = packed(&rest.base, &b_len);
  uint8_t *both = malloc(a_len + b_len);
  memcpy(both, a, a_len);
  memcpy(both + a_len, b, b_len);
  expect_same(both, a_len + b_len, &stoker__v1__write_chunk__descriptor);
  free(both);
  free(a);
  free(b);
  free(wire);
  free(data);
}

/* A bytes field given twice: the last value wins, large or small. */
static void test_repeated_occurrence_last_wins(void **state) {
  (void)state;
  size_t big = 200000;
  uint8_t *x = malloc(big);
  fill(x, big, 4);
  Stoker__V1__Batch a = STOKER__V1__BATCH__INIT, b = STOKER__V1__BATCH__INIT;
  a.tokens.data = x;
  a.tokens.len = big;
  uint8_t small[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  b.tokens.data = small;
  b.tokens.len = sizeof(small);
  size_t al, bl;
  uint8_t *aw = packed(&a.base, &al), *bw = packed(&b.base, &bl);
  uint8_t *ab = malloc(al + bl), *ba = malloc(al + bl);
  memcpy(ab, aw, al);
  memcpy(ab + al, bw, bl);
  memcpy(ba, bw, bl);
  memcpy(ba + bl, aw, al);
  expect_same(ab, al + bl, &stoker__v1__batch__descriptor); /* Small wins. */
  expect_same(ba, al + bl, &stoker__v1__batch__descriptor); /* Large wins. */
  free(ab);
  free(ba);
  free(aw);
  free(bw);
  free(x);
}

/* Lengths past the end, truncated varints, bad wire types: NULL, and no
 * allocation of the claimed size (ASan would abort on a huge one). */
static void test_malformed_refused(void **state) {
  (void)state;
  const uint8_t huge_len[] = {0x22, 0xff, 0xff, 0xff, 0xff, 0x0f, 1, 2, 3};
  const uint8_t past_end[] = {0x22, 0x80, 0x80, 0x04, 1, 2, 3}; /* 64 KiB claimed. */
  const uint8_t cut_varint[] = {0x08, 0x80};
  const uint8_t group[] = {0x0b, 0x0c};
  const uint8_t *cases[] = {huge_len, past_end, cut_varint, group};
  const size_t lens[] = {sizeof(huge_len), sizeof(past_end), sizeof(cut_varint), sizeof(group)};
  for (size_t i = 0; i < 4; i++) {
    assert_null(protobuf_c_message_unpack(&stoker__v1__batch__descriptor, NULL, lens[i], cases[i]));
    grpc_byte_buffer *bb = sliced(cases[i], lens[i], 1);
    assert_null(rpc_unpack(bb, &stoker__v1__batch__descriptor, NULL, 0));
    grpc_byte_buffer_destroy(bb);
  }
}

/* A string holding a NUL byte is refused, wherever it sits, and the reason
 * names the field; the same message without the NUL unpacks. */
static void expect_nul_refused(const ProtobufCMessage *m, const char *field, const char *text) {
  size_t len;
  uint8_t *wire = packed(m, &len);
  uint8_t *at = memmem(wire, len, text, strlen(text)); /* The string on the wire; */
  assert_non_null(at);
  uint8_t *nul = memchr(at, '#', strlen(text)); /* its marker byte becomes a NUL. */
  assert_non_null(nul);
  grpc_byte_buffer *bb = sliced(wire, len, 3);
  ProtobufCMessage *ok = rpc_unpack(bb, m->descriptor, NULL, 0);
  assert_non_null(ok);
  protobuf_c_message_free_unpacked(ok, NULL);
  grpc_byte_buffer_destroy(bb);
  *nul = 0;
  bb = sliced(wire, len, 3);
  char why[200];
  assert_null(rpc_unpack(bb, m->descriptor, why, sizeof(why)));
  if (!strstr(why, field)) fail_msg("why: \"%s\", want %s", why, field);
  grpc_byte_buffer_destroy(bb);
  free(wire);
}

static void test_strings_with_nul_refused(void **state) {
  (void)state;
  Stoker__V1__GetBatchRequest get = STOKER__V1__GET_BATCH_REQUEST__INIT;
  get.job = "j#x";
  expect_nul_refused(&get.base, "job", get.job);
  /* Nested: the dataset URI inside a spec inside the request. */
  Stoker__V1__StorageRef ref = STOKER__V1__STORAGE_REF__INIT;
  ref.uri = "file:///data/good#.junk";
  Stoker__V1__DatasetSpec ds = STOKER__V1__DATASET_SPEC__INIT;
  ds.name = "d";
  ds.source = &ref;
  Stoker__V1__DatasetSpec *dss[1] = {&ds};
  Stoker__V1__LoaderSpec spec = STOKER__V1__LOADER_SPEC__INIT;
  spec.job = "j";
  spec.n_datasets = 1; /* A repeated field of messages. */
  spec.datasets = dss;
  Stoker__V1__CreateLoaderRequest create = STOKER__V1__CREATE_LOADER_REQUEST__INIT;
  create.spec = &spec;
  expect_nul_refused(&create.base, "uri", ref.uri);
  /* A repeated string field at depth 2 (ChunkEntry.tensor in ReadRequest). */
  Stoker__V1__ChunkEntry want = STOKER__V1__CHUNK_ENTRY__INIT;
  want.tensor = "w#eight";
  Stoker__V1__ChunkEntry *wants[1] = {&want};
  Stoker__V1__ReadRequest read = STOKER__V1__READ_REQUEST__INIT;
  read.job = "j";
  read.n_wanted = 1;
  read.wanted = wants;
  expect_nul_refused(&read.base, "tensor", want.tensor);
  /* Bytes fields may hold NULs: a blob of tokens is not refused. */
  uint8_t zeros[8] = {0};
  Stoker__V1__Batch b = STOKER__V1__BATCH__INIT;
  b.tokens.data = zeros;
  b.tokens.len = sizeof(zeros);
  size_t len;
  uint8_t *wire = packed(&b.base, &len);
  grpc_byte_buffer *bb = sliced(wire, len, 2);
  ProtobufCMessage *got = rpc_unpack(bb, &stoker__v1__batch__descriptor, NULL, 0);
  assert_non_null(got);
  protobuf_c_message_free_unpacked(got, NULL);
  grpc_byte_buffer_destroy(bb);
  free(wire);
}

/* What a server receives must be UTF-8 in every string field, at any
 * depth (rpc_unpack_request); the reason names the field. A reply is read
 * as it comes (rpc_unpack), so a client can still show what a server
 * stored before this rule. */
static void expect_utf8(const ProtobufCMessage *m, const char *field, bool valid) {
  size_t len;
  uint8_t *wire = packed(m, &len);
  grpc_byte_buffer *bb = sliced(wire, len, 2);
  char why[200];
  ProtobufCMessage *got = rpc_unpack_request(bb, m->descriptor, why, sizeof(why));
  if (valid) {
    assert_non_null(got);
  } else {
    assert_null(got);
    if (!strstr(why, field) || !strstr(why, "UTF-8")) fail_msg("why: \"%s\", want %s", why, field);
  }
  protobuf_c_message_free_unpacked(got, NULL);
  got = rpc_unpack(bb, m->descriptor, NULL, 0);
  assert_non_null(got);
  protobuf_c_message_free_unpacked(got, NULL);
  grpc_byte_buffer_destroy(bb);
  free(wire);
}

static void test_request_strings_not_utf8_refused(void **state) {
  (void)state;
  static const char *const bad[] = {
      "caf\xc3",          /* cut short */
      "\xc3(",            /* a continuation byte missing */
      "\x80x",            /* a lone continuation byte */
      "\xc0\xaf",         /* overlong "/" */
      "\xe0\x80\xaf",     /* overlong, 3 bytes */
      "\xed\xa0\x80",     /* a surrogate */
      "\xf4\x90\x80\x80", /* over U+10FFFF */
      "\xff",             /* never in UTF-8 */
      "ok \xf0\x9f\x94",  /* a 4-byte form cut at the end */
  };
  static const char *const good[] = {"", "plain", "caf\xc3\xa9 \xf0\x9f\x94\xa5", "\xef\xbf\xbd",
                                     "\xf4\x8f\xbf\xbf"};
  Stoker__V1__PreemptJobRequest pre = STOKER__V1__PREEMPT_JOB_REQUEST__INIT;
  pre.job = "j";
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    pre.reason = (char *)bad[i];
    expect_utf8(&pre.base, "reason", false);
  }
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
    pre.reason = (char *)good[i];
    expect_utf8(&pre.base, "reason", true);
  }
  /* Nested and repeated: an argument of a job spec's submission. */
  char *args[2] = {"--lr", "3e-4 \xe2\x82"};
  Stoker__V1__Submission sub = STOKER__V1__SUBMISSION__INIT;
  sub.template_ = "t";
  sub.n_args = 2;
  sub.args = args;
  Stoker__V1__JobSpec spec = STOKER__V1__JOB_SPEC__INIT;
  spec.name = "j";
  spec.submission = &sub;
  Stoker__V1__CreateJobRequest create = STOKER__V1__CREATE_JOB_REQUEST__INIT;
  create.spec = &spec;
  expect_utf8(&create.base, "args", false);
  args[1] = "3e-4";
  expect_utf8(&create.base, "args", true);
}

int main(void) {
  grpc_init();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_batch_large_tokens),
      cmocka_unit_test(test_small_and_empty),
      cmocka_unit_test(test_write_chunk_fields_any_order),
      cmocka_unit_test(test_repeated_occurrence_last_wins),
      cmocka_unit_test(test_malformed_refused),
      cmocka_unit_test(test_strings_with_nul_refused),
      cmocka_unit_test(test_request_strings_not_utf8_refused),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  grpc_shutdown();
  return rc;
}
