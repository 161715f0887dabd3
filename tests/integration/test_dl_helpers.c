/*
 * test_dl_helpers: shared plumbing of the dataloader integration tests
 * (see test_dl_helpers.h).
 */
#include "test_dl_helpers.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

int tdl_daemon_open(struct harness_daemon **ret_d, struct rpc_client **ret_rc,
                    const char *const *args, int *ret_metrics_port) {
  *ret_d = ret_metrics_port ? harness_daemon_start_metrics(args, ret_metrics_port)
                            : harness_daemon_start(args);
  *ret_rc = *ret_d ? harness_rpc(*ret_d) : NULL;
  return *ret_rc ? 0 : -1;
}

void tdl_daemon_close(struct harness_daemon *d, struct rpc_client *rc) {
  rpc_client_free(rc);
  harness_daemon_free(d);
}

void tdl_spec_init(struct tdl_spec *t, const char *job, const char *uri, int format,
                   uint32_t seq_len, uint32_t global_batch) {
  stoker__v1__loader_spec__init(&t->spec);
  stoker__v1__dataset_spec__init(&t->ds);
  stoker__v1__storage_ref__init(&t->ref);
  snprintf(t->uri, sizeof(t->uri), "%s", uri);
  t->ref.uri = t->uri;
  t->ds.name = "corpus";
  t->ds.source = &t->ref;
  t->ds.format = format;
  t->ds.weight = 1.0;
  t->dsp[0] = &t->ds;
  t->spec.job = (char *)job;
  t->spec.datasets = t->dsp;
  t->spec.n_datasets = 1;
  t->spec.seq_len = seq_len;
  t->spec.global_batch = global_batch;
  t->spec.seed = 7;
  t->spec.logical_shards = 64;
  t->spec.lanes = 4;
}

int tdl_call(struct rpc_client *rc, const char *method, const ProtobufCMessage *req,
             const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **ret_resp,
             char *ret_msg, size_t msg_len) {
  char path[128];
  harness_method_path(&stoker__v1__dataloader__descriptor, method, path, sizeof(path));
  return harness_call(rc, path, req, resp_desc, ret_resp, ret_msg, msg_len);
}

int tdl_create(struct rpc_client *rc, const Stoker__V1__LoaderSpec *spec, char *ret_msg,
               size_t msg_len) {
  Stoker__V1__CreateLoaderRequest req = STOKER__V1__CREATE_LOADER_REQUEST__INIT;
  req.spec = (Stoker__V1__LoaderSpec *)spec;
  return tdl_call(rc, "CreateLoader", &req.base, &stoker__v1__loader_info__descriptor, NULL,
                  ret_msg, msg_len);
}

int tdl_get_batch(struct rpc_client *rc, const char *job, int64_t step, uint32_t rank,
                  uint32_t world, Stoker__V1__Batch **ret_batch) {
  Stoker__V1__GetBatchRequest req = STOKER__V1__GET_BATCH_REQUEST__INIT;
  req.job = (char *)job;
  req.step = step;
  req.rank = rank;
  req.world = world;
  return tdl_call(rc, "GetBatch", &req.base, &stoker__v1__batch__descriptor,
                  (ProtobufCMessage **)ret_batch, NULL, 0);
}

void tdl_batch_free(Stoker__V1__Batch *b) {
  if (b) protobuf_c_message_free_unpacked(&b->base, NULL);
}

int tdl_commit(struct rpc_client *rc, const char *job, int64_t step) {
  Stoker__V1__CommitRequest req = STOKER__V1__COMMIT_REQUEST__INIT;
  req.job = (char *)job;
  req.step = step;
  return tdl_call(rc, "Commit", &req.base, &stoker__v1__empty__descriptor, NULL, NULL, 0);
}

int64_t tdl_committed_step(struct rpc_client *rc, const char *job) {
  Stoker__V1__GetLoaderRequest req = STOKER__V1__GET_LOADER_REQUEST__INIT;
  req.job = (char *)job;
  Stoker__V1__LoaderInfo *info = NULL;
  if (tdl_call(rc, "GetLoader", &req.base, &stoker__v1__loader_info__descriptor,
               (ProtobufCMessage **)&info, NULL, 0) != RPC_OK)
    return INT64_MIN;
  int64_t step = info->committed_step;
  protobuf_c_message_free_unpacked(&info->base, NULL);
  return step;
}

uint8_t *tdl_global(struct rpc_client *rc, const char *job, int64_t step, uint32_t world,
                    size_t *ret_len) {
  uint8_t *all = NULL;
  size_t len = 0;
  for (uint32_t r = 0; r < world; r++) {
    Stoker__V1__Batch *b = NULL;
    if (tdl_get_batch(rc, job, step, r, world, &b) != RPC_OK) {
      free(all);
      return NULL;
    }
    uint8_t *grown = realloc(all, len + b->tokens.len + 1);
    assert_non_null(grown);
    all = grown;
    memcpy(all + len, b->tokens.data, b->tokens.len);
    len += b->tokens.len;
    tdl_batch_free(b);
  }
  *ret_len = len;
  return all;
}

int tdl_embedded_open(struct tdl_embedded *e, const Stoker__V1__LoaderSpec *spec) {
  int rc = harness_tmpdir_new(e->dir, sizeof(e->dir));
  struct dl_opts o = {.dir = e->dir};
  if (!rc) rc = dl_open(&o, &e->dl);
  if (!rc) rc = dl_create_job(e->dl, spec);
  return rc;
}

void tdl_embedded_close(struct tdl_embedded *e) {
  dl_close(e->dl);
  e->dl = NULL;
  harness_tmpdir_remove(e->dir);
}

uint8_t *tdl_embedded_slice(struct tdl_embedded *e, const char *job, int64_t step, uint32_t rank,
                            uint32_t world, size_t *ret_len) {
  struct dl_batch b;
  if (dl_get_batch(e->dl, job, step, rank, world, &b) != 0) return NULL;
  size_t n = (size_t)b.lines * b.line_tokens;
  uint8_t *out = malloc(n * 4 + 1);
  assert_non_null(out);
  for (size_t i = 0; i < n; i++)
    for (int k = 0; k < 4; k++) out[4 * i + k] = (uint8_t)(b.tokens[i] >> (8 * k));
  dl_batch_free(&b);
  *ret_len = n * 4;
  return out;
}

void tdl_gate_init(struct tdl_gate *g, bool open) {
  *g = (struct tdl_gate){.open = open};
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
}

void tdl_gate_destroy(struct tdl_gate *g) {
  pthread_mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->cv);
}

static void gate_msg(void *arg, ProtobufCMessage *msg) {
  struct tdl_gate *g = arg;
  protobuf_c_message_free_unpacked(msg, NULL);
  pthread_mutex_lock(&g->mu);
  g->got++;
  pthread_cond_broadcast(&g->cv);
  while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

static void gate_done(void *arg, const struct rpc_status *st) {
  struct tdl_gate *g = arg;
  pthread_mutex_lock(&g->mu);
  g->code = st->code;
  g->done++;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

struct rpc_client_call *tdl_gate_stream(struct rpc_client *rc, struct tdl_gate *g,
                                        const Stoker__V1__StreamBatchesRequest *req) {
  struct rpc_client_call *call = NULL;
  assert_int_equal(rpc_client_stream_async(rc, "/stoker.v1.Dataloader/StreamBatches", &req->base,
                                           &stoker__v1__batch__descriptor, 60000, gate_msg,
                                           gate_done, g, &call),
                   0);
  return call;
}

void tdl_gate_release(struct tdl_gate *g) {
  pthread_mutex_lock(&g->mu);
  g->open = true;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

void tdl_gate_wait_got(struct tdl_gate *g, size_t got) {
  pthread_mutex_lock(&g->mu);
  while (g->got < got) pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

void tdl_gate_wait_done(struct tdl_gate *g, int done) {
  pthread_mutex_lock(&g->mu);
  while (g->done < done) pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

void tdl_assert_batch(const Stoker__V1__Batch *b, const uint8_t *want, size_t want_len) {
  assert_non_null(b);
  assert_int_equal(b->tokens.len, want_len);
  assert_memory_equal(b->tokens.data, want, want_len);
}

double tdl_metric(int port, const char *series) {
  char *text = harness_http_get(port, "/metrics");
  double v = -1;
  size_t n = strlen(series);
  for (char *line = text; line && *line;) {
    char *eol = strchr(line, '\n');
    if (strncmp(line, series, n) == 0 && line[n] == ' ') v = strtod(line + n + 1, NULL);
    line = eol ? eol + 1 : NULL;
  }
  free(text);
  return v;
}

struct stream_wait {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct tdl_stream *s;
  size_t max_msgs;
  bool done;
};

static void stream_msg(void *arg, ProtobufCMessage *msg) {
  struct stream_wait *w = arg;
  pthread_mutex_lock(&w->mu);
  struct tdl_stream *s = w->s;
  Stoker__V1__Batch **grown = realloc(s->msgs, (s->n + 1) * sizeof(*grown));
  if (grown) {
    s->msgs = grown;
    s->msgs[s->n++] = (Stoker__V1__Batch *)msg;
  } else {
    protobuf_c_message_free_unpacked(msg, NULL);
  }
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

static void stream_done(void *arg, const struct rpc_status *st) {
  struct stream_wait *w = arg;
  pthread_mutex_lock(&w->mu);
  w->s->st = *st;
  w->done = true;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

int tdl_stream_run(struct rpc_client *rc, const Stoker__V1__StreamBatchesRequest *req,
                   size_t max_msgs, struct tdl_stream *ret) {
  struct stream_wait w = {.s = ret, .max_msgs = max_msgs};
  memset(ret, 0, sizeof(*ret));
  pthread_mutex_init(&w.mu, NULL);
  pthread_cond_init(&w.cv, NULL);
  struct rpc_client_call *call = NULL;
  int rc2 = rpc_client_stream_async(rc, "/stoker.v1.Dataloader/StreamBatches", &req->base,
                                    &stoker__v1__batch__descriptor, 30000, stream_msg, stream_done,
                                    &w, &call);
  if (rc2 == 0) {
    pthread_mutex_lock(&w.mu);
    bool cancelled = false;
    while (!w.done) {
      if (!cancelled && ret->n >= max_msgs) {
        cancelled = true;
        pthread_mutex_unlock(&w.mu);
        rpc_client_call_cancel(call);
        pthread_mutex_lock(&w.mu);
        continue;
      }
      pthread_cond_wait(&w.cv, &w.mu);
    }
    pthread_mutex_unlock(&w.mu);
  }
  pthread_mutex_destroy(&w.mu);
  pthread_cond_destroy(&w.cv);
  return rc2;
}

void tdl_stream_count(struct rpc_client *rc, const char *job, int64_t from_step, uint32_t rank,
                      uint32_t world, uint32_t prefetch, uint32_t count, struct tdl_stream *ret) {
  Stoker__V1__StreamBatchesRequest req = STOKER__V1__STREAM_BATCHES_REQUEST__INIT;
  req.job = (char *)job;
  req.from_step = from_step;
  req.rank = rank;
  req.world = world;
  req.prefetch = prefetch;
  req.count = count;
  assert_int_equal(tdl_stream_run(rc, &req, 100, ret), 0);
  assert_int_equal(ret->st.code, RPC_OK);
  assert_int_equal(ret->n, count);
}

void tdl_stream_free(struct tdl_stream *s) {
  for (size_t i = 0; i < s->n; i++) tdl_batch_free(s->msgs[i]);
  free(s->msgs);
  s->msgs = NULL;
  s->n = 0;
}
