/*
 * libstoker-client's dataloader calls against the real dataloader core
 * served in-process over loopback gRPC (fake_loader.h): batches identical on
 * retry and across world sizes, the async call, the batch stream (order,
 * end, flow control without stalling other calls), commit, export/import,
 * mixture updates, explain, and errors mapped to STK_E* with the server's
 * message.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "dl_synthetic.h"
#include "fake_loader.h"
#include "stoker_admin.h"

#define SEQ_LEN 255
#define GLOBAL  8
#define N_DOCS  2000

static struct fake_loader fake;

/* A loader spec over one synthetic dataset (or two with mixed). */
struct spec_buf {
  Stoker__V1__LoaderSpec spec;
  Stoker__V1__DatasetSpec ds[2];
  Stoker__V1__DatasetSpec *dsp[2];
  Stoker__V1__StorageRef src[2];
};

static void dataset(struct spec_buf *b, int i, const char *name, const char *uri, double w) {
  stoker__v1__dataset_spec__init(&b->ds[i]);
  stoker__v1__storage_ref__init(&b->src[i]);
  b->src[i].uri = (char *)uri;
  b->ds[i].name = (char *)name;
  b->ds[i].source = &b->src[i];
  b->ds[i].weight = w;
  b->dsp[i] = &b->ds[i];
}

static void make_spec(struct spec_buf *b, const char *job, uint32_t seq_len, uint32_t global) {
  stoker__v1__loader_spec__init(&b->spec);
  dataset(b, 0, "web", "synthetic:2000:50:400:7", 1.0);
  b->spec.job = (char *)job;
  b->spec.datasets = b->dsp;
  b->spec.n_datasets = 1;
  b->spec.seq_len = seq_len;
  b->spec.global_batch = global;
  b->spec.seed = 42;
  b->spec.logical_shards = 16;
  b->spec.lanes = 4;
}

static struct stk_client *connect_fake(void) {
  struct stk_client_opts o = {.address = fake.server.addr};
  struct stk_client *c = NULL;
  assert_int_equal(stk_loader_connect(&o, &c), 0);
  return c;
}

static void create_job(struct stk_client *c, const char *job, uint32_t seq_len, uint32_t global) {
  struct spec_buf b;
  make_spec(&b, job, seq_len, global);
  Stoker__V1__LoaderInfo *info = NULL;
  assert_int_equal(stk_loader_create(c, &b.spec, 0, &info), 0);
  assert_string_equal(info->spec->job, job);
  assert_int_equal(info->spec->seq_len, seq_len);
  assert_int_equal(info->committed_step, -1);
  protobuf_c_message_free_unpacked(&info->base, NULL);
}

static int setup(void **state) {
  fake_loader_start(&fake);
  return 0;
}

static int teardown(void **state) {
  fake_loader_stop(&fake);
  return 0;
}

static void test_create_get_and_errors(void **state) {
  struct stk_client *c = connect_fake();
  create_job(c, "cg", SEQ_LEN, GLOBAL);
  struct spec_buf b;
  make_spec(&b, "cg", SEQ_LEN, GLOBAL);
  Stoker__V1__LoaderInfo *info = NULL;
  assert_int_equal(stk_loader_create(c, &b.spec, 0, &info), STK_EEXIST);
  assert_int_equal(stk_loader_get(c, "cg", 0, &info), 0);
  assert_int_equal(info->spec->global_batch, GLOBAL);
  assert_int_equal(info->spec->n_datasets, 1);
  assert_string_equal(info->spec->datasets[0]->name, "web");
  protobuf_c_message_free_unpacked(&info->base, NULL);
  int code = 0;
  assert_int_equal(stk_loader_get(c, "nope", 0, &info), STK_ENOENT);
  stk_client_last_error(&code);
  assert_int_equal(code, 5);
  struct stk_batch bt;
  assert_int_equal(stk_loader_get_batch(c, "cg", 0, 2, 2, 0, &bt), STK_EINVAL);
  assert_int_equal(stk_loader_get_batch(c, "cg", 0, 0, 3, 0, &bt), STK_EINVAL); /* 8 % 3 */
  stk_client_free(c);
}

/* ListLoaders answers in pages of at most 100 (services/common/page.h);
 * stk_loader_list follows them: 230 jobs come back in one response, each
 * exactly once, by name. */
static void test_list_follows_pages(void **state) {
  struct stk_client *c = connect_fake();
  char job[32];
  for (int i = 0; i < 230; i++) {
    snprintf(job, sizeof job, "pg-%03d", (i * 7) % 230);
    create_job(c, job, 15, GLOBAL);
  }
  Stoker__V1__ListLoadersResponse *l = NULL;
  assert_int_equal(stk_loader_list(c, 0, &l), 0);
  assert_string_equal(l->next_page_token, "");
  int want = 0;
  for (size_t i = 0; i < l->n_loaders; i++) {
    if (i) assert_true(strcmp(l->loaders[i - 1]->spec->job, l->loaders[i]->spec->job) < 0);
    if (strncmp(l->loaders[i]->spec->job, "pg-", 3) != 0) continue;
    snprintf(job, sizeof job, "pg-%03d", want++);
    assert_string_equal(l->loaders[i]->spec->job, job);
  }
  assert_int_equal(want, 230);
  protobuf_c_message_free_unpacked(&l->base, NULL);
  for (int i = 0; i < 230; i++) {
    snprintf(job, sizeof job, "pg-%03d", i);
    assert_int_equal(stk_loader_delete(c, job, 0), 0);
  }
  stk_client_free(c);
}

static void test_batch_retry_and_world_sizes(void **state) {
  struct stk_client *c = connect_fake();
  create_job(c, "bw", SEQ_LEN, GLOBAL);
  struct stk_batch whole, again, half[2];
  assert_int_equal(stk_loader_get_batch(c, "bw", 3, 0, 1, 0, &whole), 0);
  assert_int_equal(whole.step, 3);
  assert_int_equal(whole.lines, GLOBAL);
  assert_int_equal(whole.line_tokens, SEQ_LEN + 1);
  size_t n = (size_t)GLOBAL * (SEQ_LEN + 1);
  for (size_t i = 0; i < n; i++) {
    uint64_t doc;
    uint32_t pos;
    dl_synthetic_decode(whole.tokens[i], &doc, &pos);
    assert_true(doc < N_DOCS);
  }
  assert_true(whole.n_doc_starts > 0);
  assert_int_equal(stk_loader_get_batch(c, "bw", 3, 0, 1, 0, &again), 0);
  assert_memory_equal(whole.tokens, again.tokens, n * 4);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(stk_loader_get_batch(c, "bw", 3, (uint32_t)r, 2, 0, &half[r]), 0);
    assert_int_equal(half[r].lines, GLOBAL / 2);
    assert_memory_equal(half[r].tokens, whole.tokens + (size_t)r * n / 2, n / 2 * 4);
  }
  stk_batch_free(&whole);
  stk_batch_free(&again);
  stk_batch_free(&half[0]);
  stk_batch_free(&half[1]);
  assert_null(whole.tokens);
  stk_client_free(c);
}

/* A GetBatch the server cancels as it shuts down (its grace ran out with
 * the call in flight) is tried again, as an UNAVAILABLE one is: a held-out
 * batch lost so to a dataloader part's rolling update stopped a trainer. */
static void test_batch_cancelled_by_the_server_is_tried_again(void **state) {
  struct stk_client *c = connect_fake();
  create_job(c, "bc", SEQ_LEN, GLOBAL);
  struct stk_batch first, again;
  assert_int_equal(stk_loader_get_batch(c, "bc", 2, 0, 1, 0, &first), 0);
  int before = fake_loader_get(&fake, &fake.get_batches);
  fake_loader_set(&fake, &fake.get_cancels, 2);
  assert_int_equal(stk_loader_get_batch(c, "bc", 2, 0, 1, 0, &again), 0);
  assert_int_equal(fake_loader_get(&fake, &fake.get_batches) - before, 3);
  assert_memory_equal(first.tokens, again.tokens, (size_t)GLOBAL * (SEQ_LEN + 1) * 4);
  stk_batch_free(&first);
  stk_batch_free(&again);
  stk_client_free(c);
}

struct async_result {
  pthread_mutex_t mu;
  int calls, err;
  struct stk_batch *batch;
};

static void on_batch(void *arg, int err, const char *msg, struct stk_batch *b) {
  struct async_result *r = arg;
  pthread_mutex_lock(&r->mu);
  r->calls++;
  r->err = err;
  r->batch = b;
  pthread_mutex_unlock(&r->mu);
}

static int async_calls(struct async_result *r) {
  pthread_mutex_lock(&r->mu);
  int n = r->calls;
  pthread_mutex_unlock(&r->mu);
  return n;
}

static void test_async_batch(void **state) {
  struct stk_client *c = connect_fake();
  create_job(c, "as", SEQ_LEN, GLOBAL);
  struct async_result r = {.mu = PTHREAD_MUTEX_INITIALIZER};
  assert_int_equal(stk_loader_get_batch_async(c, "as", 5, 1, 4, 0, on_batch, &r), 0);
  for (int i = 0; i < 500 && async_calls(&r) == 0; i++) usleep(10000);
  assert_int_equal(async_calls(&r), 1);
  assert_int_equal(r.err, 0);
  struct stk_batch sync;
  assert_int_equal(stk_loader_get_batch(c, "as", 5, 1, 4, 0, &sync), 0);
  assert_int_equal(r.batch->lines, GLOBAL / 4);
  assert_memory_equal(r.batch->tokens, sync.tokens, (size_t)sync.lines * sync.line_tokens * 4);
  stk_batch_free(r.batch);
  free(r.batch);
  stk_batch_free(&sync);
  r.calls = 0;
  assert_int_equal(stk_loader_get_batch_async(c, "missing", 0, 0, 1, 0, on_batch, &r), 0);
  for (int i = 0; i < 500 && async_calls(&r) == 0; i++) usleep(10000);
  assert_int_equal(r.err, STK_ENOENT);
  assert_null(r.batch);
  stk_client_free(c);
}

static void test_stream_order_and_end(void **state) {
  struct stk_client *c = connect_fake();
  create_job(c, "so", SEQ_LEN, GLOBAL);
  fake_loader_set(&fake, &fake.stream_limit, 6);
  struct stk_batch_stream *s = NULL;
  assert_int_equal(stk_batch_stream_open(c, "so", 10, 1, 2, 3, &s), 0);
  assert_false(stk_batch_stream_ended(s));
  for (int64_t step = 10; step < 16; step++) {
    struct stk_batch b, ref;
    assert_int_equal(stk_batch_stream_next(s, 10000, &b), 0);
    assert_int_equal(b.step, step);
    assert_int_equal(stk_loader_get_batch(c, "so", step, 1, 2, 0, &ref), 0);
    assert_memory_equal(b.tokens, ref.tokens, (size_t)b.lines * b.line_tokens * 4);
    assert_int_equal(b.n_doc_starts, ref.n_doc_starts);
    stk_batch_free(&b);
    stk_batch_free(&ref);
  }
  struct stk_batch b;
  assert_false(stk_batch_stream_ended(s)); /* Not yet reported by next. */
  assert_int_equal(stk_batch_stream_next(s, 10000, &b), STK_ERANGE);
  assert_true(stk_batch_stream_ended(s));
  stk_batch_stream_free(s);
  fake_loader_set(&fake, &fake.stream_limit, 0);
  /* A bad request ends the stream with the server's status. */
  assert_int_equal(stk_batch_stream_open(c, "nope", 0, 0, 1, 2, &s), 0);
  assert_int_equal(stk_batch_stream_next(s, 10000, &b), STK_ENOENT);
  assert_false(stk_batch_stream_ended(s));
  stk_batch_stream_free(s);
  assert_int_equal(stk_batch_stream_open(c, "so", 0, 2, 2, 2, &s), STK_EINVAL);
  stk_client_free(c);
}

/* A trainer that stops reading holds the server back (bounded sends), its
 * other calls still work meanwhile, and it can resume reading. */
static void test_stream_flow_control(void **state) {
  struct stk_client *c = connect_fake();
  create_job(c, "fc", 4095, 64); /* 1 MiB per batch. */
  fake_loader_set(&fake, &fake.stream_sends, 0);
  struct stk_batch_stream *s = NULL;
  assert_int_equal(stk_batch_stream_open(c, "fc", 0, 0, 1, 2, &s), 0);
  usleep(500000);
  int sent = fake_loader_get(&fake, &fake.stream_sends);
  assert_true(sent >= 2);
  assert_true(sent < 40);
  assert_int_equal(stk_loader_commit(c, "fc", 0, 5000), 0); /* Not stalled by the full queue. */
  for (int64_t step = 0; step < 50; step++) {
    struct stk_batch b;
    assert_int_equal(stk_batch_stream_next(s, 10000, &b), 0);
    assert_int_equal(b.step, step);
    stk_batch_free(&b);
  }
  assert_true(fake_loader_get(&fake, &fake.stream_sends) >= 40); /* Sent callbacks may lag. */
  int ended = fake_loader_get(&fake, &fake.streams_ended);
  stk_batch_stream_free(s); /* With batches queued and the server mid-send. */
  for (int i = 0; i < 300 && fake_loader_get(&fake, &fake.streams_ended) == ended; i++)
    usleep(10000);
  assert_int_equal(fake_loader_get(&fake, &fake.streams_ended), ended + 1);
  stk_client_free(c);
}

static void test_commit_export_import_explain(void **state) {
  struct stk_client *c = connect_fake();
  create_job(c, "ex", SEQ_LEN, GLOBAL);
  struct stk_batch before, after;
  assert_int_equal(stk_loader_get_batch(c, "ex", 4, 0, 1, 0, &before), 0);
  assert_int_equal(stk_loader_commit(c, "ex", 3, 0), 0);
  Stoker__V1__LoaderInfo *info = NULL;
  assert_int_equal(stk_loader_get(c, "ex", 0, &info), 0);
  assert_int_equal(info->committed_step, 3);
  protobuf_c_message_free_unpacked(&info->base, NULL);
  uint8_t *blob = NULL;
  size_t len = 0;
  assert_int_equal(stk_loader_export(c, "ex", 3, 0, &blob, &len), 0);
  assert_true(len > 0);
  int64_t committed = -1;
  assert_int_equal(stk_loader_import(c, "ex", 3, blob, len, 0, &committed), 0);
  assert_int_equal(committed, 3);
  assert_int_equal(stk_loader_get_batch(c, "ex", 4, 0, 1, 0, &after), 0);
  assert_memory_equal(before.tokens, after.tokens, (size_t)before.lines * before.line_tokens * 4);
  blob[len / 2] ^= 0xff;
  assert_true(stk_loader_import(c, "ex", 3, blob, len, 0, NULL) < 0);
  free(blob);
  Stoker__V1__ExplainResponse *ex = NULL;
  assert_int_equal(stk_loader_explain(c, "ex", 4, 0, 1, 0, &ex), 0);
  assert_true(ex->n_sources >= GLOBAL);
  uint64_t covered = 0;
  for (size_t i = 0; i < ex->n_sources; i++) {
    assert_true(ex->sources[i]->line < GLOBAL);
    assert_string_equal(ex->sources[i]->dataset, "web");
    covered += ex->sources[i]->token_end - ex->sources[i]->token_begin;
  }
  assert_int_equal(covered, (uint64_t)GLOBAL * (SEQ_LEN + 1));
  protobuf_c_message_free_unpacked(&ex->base, NULL);
  stk_batch_free(&before);
  stk_batch_free(&after);
  stk_client_free(c);
}

static void test_update_mixture(void **state) {
  struct stk_client *c = connect_fake();
  create_job(c, "mx", SEQ_LEN, GLOBAL);
  struct spec_buf b;
  make_spec(&b, "mx", SEQ_LEN, GLOBAL);
  dataset(&b, 1, "code", "synthetic:500:20:100:9", 3.0);
  Stoker__V1__UpdateMixtureRequest req = STOKER__V1__UPDATE_MIXTURE_REQUEST__INIT;
  req.job = "mx";
  req.from_step = 5;
  req.datasets = b.dsp;
  req.n_datasets = 2;
  Stoker__V1__LoaderInfo *info = NULL;
  assert_int_equal(stk_loader_update_mixture(c, &req, 0, &info), 0);
  assert_int_equal(info->spec->n_datasets, 2);
  protobuf_c_message_free_unpacked(&info->base, NULL);
  /* From step 5 on the code dataset (documents < 500, lengths <= 100) shows up. */
  struct stk_batch bt;
  assert_int_equal(stk_loader_get_batch(c, "mx", 6, 0, 1, 0, &bt), 0);
  Stoker__V1__ExplainResponse *ex = NULL;
  assert_int_equal(stk_loader_explain(c, "mx", 6, 0, 1, 0, &ex), 0);
  bool code = false;
  for (size_t i = 0; i < ex->n_sources; i++) code |= strcmp(ex->sources[i]->dataset, "code") == 0;
  assert_true(code);
  protobuf_c_message_free_unpacked(&ex->base, NULL);
  stk_batch_free(&bt);
  req.from_step = -1;
  assert_int_equal(stk_loader_update_mixture(c, &req, 0, &info), STK_EINVAL);
  stk_client_free(c);
}

static void test_connect_from_env(void **state) {
  setenv(STK_LOADER_ENV, fake.server.addr, 1);
  struct stk_client *c = NULL;
  assert_int_equal(stk_loader_connect(NULL, &c), 0);
  create_job(c, "env", SEQ_LEN, GLOBAL);
  stk_client_free(c);
  unsetenv(STK_LOADER_ENV);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_create_get_and_errors),
      cmocka_unit_test(test_list_follows_pages),
      cmocka_unit_test(test_batch_retry_and_world_sizes),
      cmocka_unit_test(test_batch_cancelled_by_the_server_is_tried_again),
      cmocka_unit_test(test_async_batch),
      cmocka_unit_test(test_stream_order_and_end),
      cmocka_unit_test(test_stream_flow_control),
      cmocka_unit_test(test_commit_export_import_explain),
      cmocka_unit_test(test_update_mixture),
      cmocka_unit_test(test_connect_from_env),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
