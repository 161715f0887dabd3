/*
 * The in-process dataloader of fake_loader.h: each Dataloader method is one
 * dl_* call on the loop thread (fine for tests; the daemon does better).
 * StreamBatches sends consecutive steps, one outstanding send at a time,
 * until the peer goes, a batch fails, or the scripted limit is reached.
 */
#include "fake_loader.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "stk_error.h"

static void fail_detail(struct rpc_call *c, int err) {
  const char *d = stk_detail();
  rpc_fail_err(c, err, "%s", d[0] ? d : stk_strerror(err));
}

static void reply_info(struct rpc_call *c, struct dl *dl, const char *job) {
  Stoker__V1__LoaderInfo *info = NULL;
  int err = dl_get_info(dl, job, &info);
  if (err < 0) {
    fail_detail(c, err);
    return;
  }
  rpc_reply(c, &info->base);
  dl_info_free(info);
}

static void handle_create(struct rpc_call *c, const ProtobufCMessage *m, void *data) {
  struct fake_loader *f = data;
  const Stoker__V1__CreateLoaderRequest *req = (const Stoker__V1__CreateLoaderRequest *)m;
  if (!req->spec) {
    rpc_fail(c, RPC_INVALID_ARGUMENT, "spec is required");
    return;
  }
  int err = dl_create_job(f->dl, req->spec);
  if (err < 0) {
    fail_detail(c, err);
    return;
  }
  reply_info(c, f->dl, req->spec->job);
}

static void handle_get(struct rpc_call *c, const ProtobufCMessage *m, void *data) {
  struct fake_loader *f = data;
  reply_info(c, f->dl, ((const Stoker__V1__GetLoaderRequest *)m)->job);
}

/* Packs a core batch into a Batch message and sends or replies it. */
static void batch_msg(const struct dl_batch *b, Stoker__V1__Batch *msg) {
  stoker__v1__batch__init(msg);
  msg->step = b->step;
  msg->lines = b->lines;
  msg->line_tokens = b->line_tokens;
  msg->tokens.data = (uint8_t *)b->tokens;
  msg->tokens.len = (size_t)b->lines * b->line_tokens * sizeof(uint32_t);
  msg->doc_starts = b->doc_starts;
  msg->n_doc_starts = b->n_doc_starts;
}

static void handle_get_batch(struct rpc_call *c, const ProtobufCMessage *m, void *data) {
  struct fake_loader *f = data;
  const Stoker__V1__GetBatchRequest *req = (const Stoker__V1__GetBatchRequest *)m;
  pthread_mutex_lock(&f->mu);
  f->get_batches++;
  bool cancel = f->get_cancels > 0;
  if (cancel) f->get_cancels--;
  pthread_mutex_unlock(&f->mu);
  if (cancel) {
    rpc_fail(c, RPC_CANCELLED, "the server is shutting down");
    return;
  }
  struct dl_batch b;
  int err = dl_get_batch(f->dl, req->job, req->step, req->rank, req->world, &b);
  if (err < 0) {
    fail_detail(c, err);
    return;
  }
  Stoker__V1__Batch msg;
  batch_msg(&b, &msg);
  rpc_reply(c, &msg.base);
  dl_batch_free(&b);
}

struct stream {
  struct fake_loader *f;
  Stoker__V1__StreamBatchesRequest req; /* Strings point into the call's request. */
  int64_t step;
  int sent;
};

static void stream_sent(struct rpc_call *c, int err, void *arg);

static void bump(struct fake_loader *f, int *field) {
  pthread_mutex_lock(&f->mu);
  (*field)++;
  pthread_mutex_unlock(&f->mu);
}

/* Sends the next step, or finishes the stream. */
static void stream_next(struct rpc_call *c, struct stream *s) {
  struct fake_loader *f = s->f;
  pthread_mutex_lock(&f->mu);
  int limit = f->stream_limit;
  pthread_mutex_unlock(&f->mu);
  struct dl_batch b;
  int err = limit > 0 && s->sent >= limit
                ? 1
                : dl_get_batch(f->dl, s->req.job, s->step, s->req.rank, s->req.world, &b);
  if (err != 0) {
    if (err == 1) {
      rpc_finish(c, RPC_OK, NULL);
    } else {
      rpc_finish(c, stk_error_to_grpc(err), "%s", stk_detail());
    }
    bump(f, &f->streams_ended);
    free(s);
    return;
  }
  Stoker__V1__Batch msg;
  batch_msg(&b, &msg);
  err = rpc_send(c, &msg.base, stream_sent, s);
  dl_batch_free(&b);
  if (err < 0) stream_sent(c, err, s);
}

static void stream_sent(struct rpc_call *c, int err, void *arg) {
  struct stream *s = arg;
  struct fake_loader *f = s->f;
  if (err < 0) {
    rpc_finish(c, RPC_CANCELLED, "gone");
    bump(f, &f->streams_ended);
    free(s);
    return;
  }
  s->sent++;
  bump(f, &f->stream_sends);
  s->step++;
  stream_next(c, s);
}

static void handle_stream(struct rpc_call *c, const ProtobufCMessage *m, void *data) {
  struct stream *s = calloc(1, sizeof(*s));
  s->f = data;
  s->req = *(const Stoker__V1__StreamBatchesRequest *)m;
  s->step = s->req.from_step;
  stream_next(c, s);
}

static void handle_mixture(struct rpc_call *c, const ProtobufCMessage *m, void *data) {
  struct fake_loader *f = data;
  const Stoker__V1__UpdateMixtureRequest *req = (const Stoker__V1__UpdateMixtureRequest *)m;
  int err = dl_update_mixture(f->dl, req);
  if (err < 0) {
    fail_detail(c, err);
    return;
  }
  reply_info(c, f->dl, req->job);
}

static void handle_commit(struct rpc_call *c, const ProtobufCMessage *m, void *data) {
  struct fake_loader *f = data;
  const Stoker__V1__CommitRequest *req = (const Stoker__V1__CommitRequest *)m;
  int err = dl_commit(f->dl, req->job, req->step);
  if (err < 0) {
    fail_detail(c, err);
    return;
  }
  Stoker__V1__Empty e = STOKER__V1__EMPTY__INIT;
  rpc_reply(c, &e.base);
}

static void handle_export(struct rpc_call *c, const ProtobufCMessage *m, void *data) {
  struct fake_loader *f = data;
  const Stoker__V1__ExportStateRequest *req = (const Stoker__V1__ExportStateRequest *)m;
  Stoker__V1__LoaderState st = STOKER__V1__LOADER_STATE__INIT;
  int err = dl_export_state(f->dl, req->job, req->step, &st.state.data, &st.state.len);
  if (err < 0) {
    fail_detail(c, err);
    return;
  }
  st.job = req->job;
  st.step = req->step;
  rpc_reply(c, &st.base);
  free(st.state.data);
}

static void handle_import(struct rpc_call *c, const ProtobufCMessage *m, void *data) {
  struct fake_loader *f = data;
  const Stoker__V1__LoaderState *st = (const Stoker__V1__LoaderState *)m;
  int err = dl_import_state(f->dl, st->state.data, st->state.len, NULL);
  if (err < 0) {
    fail_detail(c, err);
    return;
  }
  reply_info(c, f->dl, st->job);
}

static void handle_explain(struct rpc_call *c, const ProtobufCMessage *m, void *data) {
  struct fake_loader *f = data;
  const Stoker__V1__ExplainRequest *req = (const Stoker__V1__ExplainRequest *)m;
  Stoker__V1__ExplainResponse *resp = NULL;
  int err = dl_explain(f->dl, req->job, req->step, req->rank, req->world, &resp);
  if (err < 0) {
    fail_detail(c, err);
    return;
  }
  rpc_reply(c, &resp->base);
  dl_explain_free(resp);
}

static void handle_list(struct rpc_call *c, const ProtobufCMessage *m, void *data) {
  struct fake_loader *f = data;
  Stoker__V1__ListLoadersResponse *resp = NULL;
  int err = dl_list_jobs(f->dl, (const Stoker__V1__ListLoadersRequest *)m, &resp);
  if (err < 0) {
    fail_detail(c, err);
    return;
  }
  rpc_reply(c, &resp->base);
  dl_list_free(resp);
}

static void handle_delete(struct rpc_call *c, const ProtobufCMessage *m, void *data) {
  struct fake_loader *f = data;
  const Stoker__V1__DeleteLoaderRequest *req = (const Stoker__V1__DeleteLoaderRequest *)m;
  int err = dl_delete_job(f->dl, req->job);
  if (err < 0) {
    fail_detail(c, err);
    return;
  }
  Stoker__V1__Empty e = STOKER__V1__EMPTY__INIT;
  rpc_reply(c, &e.base);
}

#define SVC Stoker__V1__Dataloader_Service

static const struct rpc_method_def defs[] = {
    RPC_UNARY_ROW(SVC, create_loader, handle_create),
    RPC_UNARY_ROW(SVC, get_loader, handle_get),
    RPC_UNARY_ROW(SVC, get_batch, handle_get_batch),
    RPC_SERVER_STREAM_ROW(SVC, stream_batches, handle_stream),
    RPC_UNARY_ROW(SVC, update_mixture, handle_mixture),
    RPC_UNARY_ROW(SVC, commit, handle_commit),
    RPC_UNARY_ROW(SVC, export_state, handle_export),
    RPC_UNARY_ROW(SVC, import_state, handle_import),
    RPC_UNARY_ROW(SVC, explain, handle_explain),
    RPC_UNARY_ROW(SVC, list_loaders, handle_list),
    RPC_UNARY_ROW(SVC, delete_loader, handle_delete),
};

void fake_loader_reopen(struct fake_loader *f) {
  dl_close(f->dl);
  struct dl_opts o = {.dir = f->dir};
  assert_int_equal(dl_open(&o, &f->dl), 0);
}

void fake_loader_start(struct fake_loader *f) {
  memset(f, 0, sizeof(*f));
  pthread_mutex_init(&f->mu, NULL);
  snprintf(f->dir, sizeof(f->dir), "/tmp/fake-loader-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  struct dl_opts o = {.dir = f->dir};
  assert_int_equal(dl_open(&o, &f->dl), 0);
  fake_server_init(&f->server, f);
  fake_server_start(&f->server, NULL, &stoker__v1__dataloader__descriptor, defs,
                    sizeof(defs) / sizeof(defs[0]), f);
}

void fake_loader_stop(struct fake_loader *f) {
  fake_server_stop(&f->server);
  dl_close(f->dl);
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", f->dir);
  assert_int_equal(system(cmd), 0);
  pthread_mutex_destroy(&f->mu);
}

int fake_loader_get(struct fake_loader *f, const int *field) {
  pthread_mutex_lock(&f->mu);
  int v = *field;
  pthread_mutex_unlock(&f->mu);
  return v;
}

void fake_loader_set(struct fake_loader *f, int *field, int value) {
  pthread_mutex_lock(&f->mu);
  *field = value;
  pthread_mutex_unlock(&f->mu);
}
