/*
 * The dataloader daemon's guarantees end to end (real daemon on loopback,
 * real RocksDB, kill -9): a batch is the same bytes on retry, after a crash
 * and restart, and from the core in-process; after a crash a trainer
 * resumes from its commit with exactly the stream an uninterrupted run
 * sees; a rescale from world 4 to 3 at a committed step keeps every global
 * batch; exported state imported into a second daemon serves the same
 * batches. Datasets: the synthetic corpus (tokens encode document and
 * position) and real Megatron and llm.c files written by dl_synthetic.
 * A text dataset switched from bytes to a GPT-2 tokenizer by UpdateMixture
 * serves the same batches after a kill -9 (from a commit inside a resumed
 * unit) and at another world size, GetLoader names the tokenizer, and an
 * update with a tokenizer CreateLoader refuses gets CreateLoader's answer.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "dl_synthetic.h"
#include "test_dl_helpers.h"

#define SYNTH "synthetic:3000:16:300:11"

struct fixture {
  struct harness_daemon *d;
  struct rpc_client *rc;
};

static int setup(void **state) {
  struct fixture *f = calloc(1, sizeof(*f));
  *state = f;
  return tdl_daemon_open(&f->d, &f->rc, NULL, NULL);
}

static int teardown(void **state) {
  struct fixture *f = *state;
  tdl_daemon_close(f->d, f->rc);
  free(f);
  return 0;
}

/* Kills the daemon (SIGKILL) and starts it again on its data and port. */
static void crash_restart(struct fixture *f) {
  harness_daemon_kill(f->d);
  assert_int_equal(harness_daemon_restart(f->d), 0);
}

/* ----------------------------------------------------- same bytes */

struct probe {
  int64_t step;
  uint32_t rank, world;
};
static const struct probe probes[] = {{0, 0, 1}, {1, 1, 2}, {7, 3, 4}, {40, 2, 4}, {3, 0, 2}};
#define N_PROBES (sizeof(probes) / sizeof(probes[0]))

/* Every probe through gRPC equals the embedded core's bytes. */
static void check_probes(struct fixture *f, struct tdl_embedded *e, const char *job) {
  for (size_t i = 0; i < N_PROBES; i++) {
    const struct probe *p = &probes[i];
    size_t len = 0;
    uint8_t *want = tdl_embedded_slice(e, job, p->step, p->rank, p->world, &len);
    assert_non_null(want);
    for (int retry = 0; retry < 2; retry++) {
      Stoker__V1__Batch *b = NULL;
      assert_int_equal(tdl_get_batch(f->rc, job, p->step, p->rank, p->world, &b), RPC_OK);
      assert_int_equal(b->step, p->step);
      tdl_assert_batch(b, want, len);
      tdl_batch_free(b);
    }
    free(want);
  }
}

static void same_bytes_for(struct fixture *f, const struct tdl_spec *t) {
  char msg[512];
  assert_int_equal(tdl_create(f->rc, &t->spec, msg, sizeof(msg)), RPC_OK);
  struct tdl_embedded e;
  assert_int_equal(tdl_embedded_open(&e, &t->spec), 0);
  check_probes(f, &e, t->spec.job);
  crash_restart(f);
  check_probes(f, &e, t->spec.job);
  tdl_embedded_close(&e);
}

static void test_same_bytes_synthetic(void **state) {
  struct fixture *f = *state;
  struct tdl_spec t;
  tdl_spec_init(&t, "synth", SYNTH, 0, 63, 8);
  same_bytes_for(f, &t);
}

static void test_same_bytes_megatron(void **state) {
  struct fixture *f = *state;
  char prefix[400], uri[420];
  snprintf(prefix, sizeof(prefix), "%s/mega", f->d->root);
  assert_int_equal(dl_synthetic_write_megatron(prefix, 800, 16, 300, 5, 4, 128), 0);
  snprintf(uri, sizeof(uri), "file://%s", prefix);
  struct tdl_spec t;
  tdl_spec_init(&t, "mega", uri, STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_MEGATRON, 127, 8);
  same_bytes_for(f, &t);
}

static void test_same_bytes_llmc(void **state) {
  struct fixture *f = *state;
  char path[400], uri[420];
  snprintf(path, sizeof(path), "%s/tokens.bin", f->d->root);
  assert_int_equal(dl_synthetic_write_llmc(path, 0, 800, 16, 300, 5), 0);
  snprintf(uri, sizeof(uri), "file://%s", path);
  struct tdl_spec t;
  tdl_spec_init(&t, "llmc", uri, STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_LLMC, 63, 4);
  same_bytes_for(f, &t);
}

/* ------------------------------------------------------ exact resume */

static void test_exact_resume_after_kill(void **state) {
  struct fixture *f = *state;
  unsigned seed = (unsigned)time(NULL);
  srand(seed);
  print_message("resume seed %u\n", seed);
  struct tdl_spec t;
  tdl_spec_init(&t, "resume", SYNTH, 0, 63, 8);
  assert_int_equal(tdl_create(f->rc, &t.spec, NULL, 0), RPC_OK);
  int64_t commit = 2 + rand() % 20, extra = rand() % 5;
  for (int64_t s = 0; s <= commit + extra; s++) { /* The trainer runs on past its commit. */
    Stoker__V1__Batch *b = NULL;
    assert_int_equal(tdl_get_batch(f->rc, "resume", s, 1, 2, &b), RPC_OK);
    tdl_batch_free(b);
    if (s == commit) assert_int_equal(tdl_commit(f->rc, "resume", commit), RPC_OK);
  }
  crash_restart(f);
  assert_int_equal(tdl_committed_step(f->rc, "resume"), commit);

  struct tdl_embedded e; /* The uninterrupted run. */
  assert_int_equal(tdl_embedded_open(&e, &t.spec), 0);
  struct tdl_stream s;
  tdl_stream_count(f->rc, "resume", commit + 1, 1, 2, 3, 12, &s);
  for (size_t i = 0; i < s.n; i++) {
    size_t len;
    uint8_t *want = tdl_embedded_slice(&e, "resume", commit + 1 + (int64_t)i, 1, 2, &len);
    assert_int_equal(s.msgs[i]->step, commit + 1 + (int64_t)i);
    tdl_assert_batch(s.msgs[i], want, len);
    free(want);
  }
  tdl_stream_free(&s);
  tdl_embedded_close(&e);
}

/* --------------------------------------------------------- rescale */

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* World 4 for steps 0..5, commit 5, crash, world 3 for 6..11: every global
 * batch equals the unrescaled run's, and no token is served twice. */
static void test_rescale_4_to_3(void **state) {
  struct fixture *f = *state;
  struct tdl_spec t;
  tdl_spec_init(&t, "rescale", SYNTH, 0, 63, 12);
  assert_int_equal(tdl_create(f->rc, &t.spec, NULL, 0), RPC_OK);
  struct tdl_embedded e;
  assert_int_equal(tdl_embedded_open(&e, &t.spec), 0);
  size_t step_bytes = 12 * 64 * 4, total = 0;
  uint32_t *seen = malloc(12 * step_bytes);
  assert_non_null(seen);
  for (int64_t s = 0; s < 12; s++) {
    if (s == 6) {
      assert_int_equal(tdl_commit(f->rc, "rescale", 5), RPC_OK);
      crash_restart(f);
    }
    size_t len = 0;
    uint8_t *got = tdl_global(f->rc, "rescale", s, s < 6 ? 4 : 3, &len);
    assert_non_null(got);
    assert_int_equal(len, step_bytes);
    for (uint32_t r = 0; r < 4; r++) { /* The unrescaled run: world 4 throughout. */
      size_t n;
      uint8_t *want = tdl_embedded_slice(&e, "rescale", s, r, 4, &n);
      assert_memory_equal(got + r * n, want, n);
      free(want);
    }
    memcpy((uint8_t *)seen + total, got, len);
    total += len;
    free(got);
  }
  size_t n_tok = total / 4;
  qsort(seen, n_tok, 4, cmp_u32);
  for (size_t i = 1; i < n_tok; i++) assert_true(seen[i] != seen[i - 1]);
  free(seen);
  tdl_embedded_close(&e);
}

/* ---------------------------------------------------- export/import */

static void test_export_import_second_daemon(void **state) {
  struct fixture *f = *state;
  struct tdl_spec t;
  tdl_spec_init(&t, "moved", SYNTH, 0, 63, 8);
  assert_int_equal(tdl_create(f->rc, &t.spec, NULL, 0), RPC_OK);
  Stoker__V1__ExportStateRequest ex = STOKER__V1__EXPORT_STATE_REQUEST__INIT;
  ex.job = "moved";
  ex.step = 4;
  Stoker__V1__LoaderState *st = NULL;
  assert_int_equal(tdl_call(f->rc, "ExportState", &ex.base, &stoker__v1__loader_state__descriptor,
                            (ProtobufCMessage **)&st, NULL, 0),
                   RPC_OK);
  assert_string_equal(st->job, "moved");
  assert_int_equal(st->step, 4);
  assert_true(st->state.len > 0);

  struct harness_daemon *d2 = harness_daemon_start(NULL);
  assert_non_null(d2);
  struct rpc_client *rc2 = harness_rpc(d2);
  Stoker__V1__LoaderInfo *info = NULL;
  assert_int_equal(tdl_call(rc2, "ImportState", &st->base, &stoker__v1__loader_info__descriptor,
                            (ProtobufCMessage **)&info, NULL, 0),
                   RPC_OK);
  assert_int_equal(info->committed_step, 4);
  assert_int_equal(info->spec->seq_len, 63);
  protobuf_c_message_free_unpacked(&info->base, NULL);
  protobuf_c_message_free_unpacked(&st->base, NULL);
  for (int64_t s = 5; s < 10; s++) {
    size_t n1, n2;
    uint8_t *a = tdl_global(f->rc, "moved", s, 2, &n1);
    uint8_t *b = tdl_global(rc2, "moved", s, 2, &n2);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1);
    free(a);
    free(b);
  }
  rpc_client_free(rc2);
  harness_daemon_free(d2);
}

/* ------------------------------------------------- tokenizer switch */

/* A JSONL corpus and a GPT-2 tokenizer under the daemon's root: every byte
 * b is id 1000 + b, plus the merges "t h" and "th e" (ids 2000, 2001). */
static void write_text_and_gpt2(const char *root, char ret_uri[700], char ret_tok[1400]) {
  static const char *const words[] = {"the", "cat", "caf\u00e9", "then", "on", "a"};
  char path[600];
  snprintf(path, sizeof(path), "%s/text.jsonl", root);
  FILE *t = fopen(path, "w");
  assert_non_null(t);
  uint64_t st = 5;
  for (int d = 0; d < 200; d++) {
    fputs("{\"text\": \"", t);
    int n = 2 + (int)((st = st * 6364136223846793005ull + 1) >> 58);
    for (int i = 0; i < n; i++)
      fprintf(t, "%s%s", i ? " " : "", words[(st = st * 6364136223846793005ull + 1) >> 61 & 3]);
    fputs("\"}\n", t);
  }
  assert_int_equal(fclose(t), 0);
  snprintf(ret_uri, 700, "file://%s", path);
  char vocab[600], merges[600];
  snprintf(vocab, sizeof(vocab), "%s/encoder.json", root);
  snprintf(merges, sizeof(merges), "%s/vocab.bpe", root);
  FILE *v = fopen(vocab, "w"), *m = fopen(merges, "w");
  assert_non_null(v);
  assert_non_null(m);
  unsigned extra = 0;
  fputs("{", v);
  for (int b = 0; b < 256; b++) { /* GPT-2's byte-to-unicode spelling */
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    fprintf(v, "\"\\u%04x\": %d, ", printable ? (unsigned)b : 256 + extra++, 1000 + b);
  }
  fputs("\"th\": 2000, \"the\": 2001}\n", v);
  fputs("#version: 0.2\nt h\nth e\n", m);
  assert_int_equal(fclose(v), 0);
  assert_int_equal(fclose(m), 0);
  snprintf(ret_tok, 1400, "gpt2:%s,%s", vocab, merges);
}

static int update_tokenizer(struct fixture *f, const char *job, int64_t from, const char *uri,
                            const char *tokenizer, char *msg, size_t msg_len) {
  Stoker__V1__StorageRef ref = STOKER__V1__STORAGE_REF__INIT;
  Stoker__V1__DatasetSpec ds = STOKER__V1__DATASET_SPEC__INIT, *dsp = &ds;
  ref.uri = (char *)uri;
  ds.name = "text";
  ds.source = &ref;
  ds.format = STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_TEXT;
  ds.weight = 1;
  ds.tokenizer = (char *)tokenizer;
  Stoker__V1__UpdateMixtureRequest u = STOKER__V1__UPDATE_MIXTURE_REQUEST__INIT;
  u.job = (char *)job;
  u.from_step = from;
  u.datasets = &dsp;
  u.n_datasets = 1;
  return tdl_call(f->rc, "UpdateMixture", &u.base, &stoker__v1__loader_info__descriptor, NULL, msg,
                  msg_len);
}

#define TOK_STEPS 24
#define TOK_FROM  5

static void test_tokenizer_switch_after_kill(void **state) {
  struct fixture *f = *state;
  char uri[700], gpt2[1400], msg[1024], create_msg[1024];
  write_text_and_gpt2(f->d->root, uri, gpt2);
  struct tdl_spec t;
  tdl_spec_init(&t, "tok", uri, STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_TEXT, 47, 8);
  t.ds.name = "text";
  t.ds.block_bytes = 256;
  t.ds.tokenizer = "nope"; /* CreateLoader's answer to an unknown tokenizer */
  assert_int_equal(tdl_create(f->rc, &t.spec, create_msg, sizeof(create_msg)),
                   RPC_INVALID_ARGUMENT);
  assert_non_null(strstr(create_msg, "unknown tokenizer"));
  t.ds.tokenizer = "";
  assert_int_equal(tdl_create(f->rc, &t.spec, NULL, 0), RPC_OK);
  assert_int_equal(update_tokenizer(f, "tok", TOK_FROM, uri, "nope", msg, sizeof(msg)),
                   RPC_INVALID_ARGUMENT);
  assert_string_equal(msg, create_msg); /* the same answer, nothing changed */
  assert_int_equal(update_tokenizer(f, "tok", TOK_FROM, uri, gpt2, msg, sizeof(msg)), RPC_OK);

  uint8_t *want[TOK_STEPS];
  size_t n[TOK_STEPS];
  for (int s = 0; s < TOK_STEPS; s++) {
    assert_non_null(want[s] = tdl_global(f->rc, "tok", s, 1, &n[s]));
    uint32_t lo = UINT32_MAX, hi = 0;
    for (size_t i = 0; i + 4 <= n[s]; i += 4) {
      uint32_t id;
      memcpy(&id, want[s] + i, 4);
      lo = id < lo ? id : lo;
      hi = id > hi ? id : hi;
    }
    if (s < TOK_FROM)
      assert_true(hi < 256); /* bytes */
    else
      assert_true(lo >= 1000); /* gpt2 ids only */
  }
  Stoker__V1__GetLoaderRequest g = STOKER__V1__GET_LOADER_REQUEST__INIT;
  g.job = "tok";
  Stoker__V1__LoaderInfo *info = NULL;
  assert_int_equal(tdl_call(f->rc, "GetLoader", &g.base, &stoker__v1__loader_info__descriptor,
                            (ProtobufCMessage **)&info, msg, sizeof(msg)),
                   RPC_OK);
  assert_string_equal(info->spec->datasets[0]->tokenizer, gpt2);
  stoker__v1__loader_info__free_unpacked(info, NULL);

  assert_int_equal(tdl_commit(f->rc, "tok", TOK_FROM + 1), RPC_OK);
  crash_restart(f);
  for (int s = TOK_FROM + 2; s < TOK_STEPS; s++) {
    size_t len;
    uint8_t *got = tdl_global(f->rc, "tok", s, s % 2 ? 4 : 2, &len);
    assert_non_null(got);
    assert_int_equal(len, n[s]);
    assert_memory_equal(got, want[s], len);
    free(got);
  }
  for (int s = 0; s < TOK_STEPS; s++) free(want[s]);
}

int main(int argc, char **argv) {
  if (harness_init(argc, argv) != 0) return 2;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_same_bytes_synthetic, setup, teardown),
      cmocka_unit_test_setup_teardown(test_same_bytes_megatron, setup, teardown),
      cmocka_unit_test_setup_teardown(test_same_bytes_llmc, setup, teardown),
      cmocka_unit_test_setup_teardown(test_exact_resume_after_kill, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rescale_4_to_3, setup, teardown),
      cmocka_unit_test_setup_teardown(test_export_import_second_daemon, setup, teardown),
      cmocka_unit_test_setup_teardown(test_tokenizer_switch_after_kill, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
