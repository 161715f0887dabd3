/*
 * The scripted StreamBatches of fake_dl_stream.h: each call logs its
 * request, asks the test's script for its messages, sends them one at a
 * time (the next once the previous was handed to the transport) and ends
 * the stream OK; a peer that cancels ends it early. The messages are built
 * with malloc'd fields, so protobuf_c_message_free_unpacked frees them.
 */
#include "fake_dl_stream.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "stk_error.h"

struct script_call {
  struct fake_dl_stream *f;
  Stoker__V1__Batch *msgs[FAKE_DL_MAX_MSGS];
  int n, next;
};

static void free_from(struct script_call *sc, int i) {
  for (; i < sc->n; i++) protobuf_c_message_free_unpacked(&sc->msgs[i]->base, NULL);
  free(sc);
}

static void sent(struct rpc_call *c, int err, void *arg);

/* Sends the next scripted message, or ends the stream OK. */
static void send_next(struct rpc_call *c, struct script_call *sc) {
  if (sc->next == sc->n) {
    rpc_finish(c, RPC_OK, NULL);
    free_from(sc, sc->n);
    return;
  }
  int err = rpc_send(c, &sc->msgs[sc->next]->base, sent, sc);
  if (err < 0) sent(c, err, sc);
}

static void sent(struct rpc_call *c, int err, void *arg) {
  struct script_call *sc = arg;
  protobuf_c_message_free_unpacked(&sc->msgs[sc->next]->base, NULL);
  sc->next++;
  if (err < 0) {
    rpc_finish(c, RPC_CANCELLED, "gone");
    free_from(sc, sc->next);
    return;
  }
  send_next(c, sc);
}

static void handle_stream(struct rpc_call *c, const ProtobufCMessage *m, void *data) {
  struct fake_dl_stream *f = data;
  const Stoker__V1__StreamBatchesRequest *req = (const Stoker__V1__StreamBatchesRequest *)m;
  pthread_mutex_lock(&f->mu);
  int call = f->calls++;
  if (call < FAKE_DL_MAX_CALLS)
    f->log[call] = (struct fake_dl_call){req->from_step, req->shm_nonce.len};
  pthread_mutex_unlock(&f->mu);
  struct script_call *sc = calloc(1, sizeof(*sc));
  assert_non_null(sc);
  sc->f = f;
  sc->n = f->script(f, call, req, sc->msgs);
  assert_in_range(sc->n, 0, FAKE_DL_MAX_MSGS);
  send_next(c, sc);
}

#define SVC Stoker__V1__Dataloader_Service

/* Only the stream; the rest answer UNIMPLEMENTED. */
static const struct rpc_method_def defs[] = {
    RPC_SERVER_STREAM_ROW(SVC, stream_batches, handle_stream),
    RPC_UNSERVED_ROW(SVC, create_loader),
    RPC_UNSERVED_ROW(SVC, get_loader),
    RPC_UNSERVED_ROW(SVC, get_batch),
    RPC_UNSERVED_ROW(SVC, update_mixture),
    RPC_UNSERVED_ROW(SVC, commit),
    RPC_UNSERVED_ROW(SVC, export_state),
    RPC_UNSERVED_ROW(SVC, import_state),
    RPC_UNSERVED_ROW(SVC, explain),
    RPC_UNSERVED_ROW(SVC, list_loaders),
    RPC_UNSERVED_ROW(SVC, delete_loader),
};

void fake_dl_start(struct fake_dl_stream *f, fake_dl_script_fn script) {
  memset(f, 0, sizeof(*f));
  pthread_mutex_init(&f->mu, NULL);
  f->script = script;
  snprintf(f->dir, sizeof(f->dir), "/tmp/fake-dl-stream-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  assert_int_equal(shm_ring_dir_open(f->dir, NULL, &f->dirfd), 0);
  fake_server_init(&f->server, f);
  fake_server_start(&f->server, NULL, &stoker__v1__dataloader__descriptor, defs,
                    sizeof(defs) / sizeof(defs[0]), f);
}

void fake_dl_stop(struct fake_dl_stream *f) {
  fake_server_stop(&f->server);
  for (int i = 0; i < f->n_rings; i++) shm_ring_free(f->rings[i]);
  shm_ring_dir_close(f->dir, f->dirfd);
  assert_int_equal(access(f->dir, F_OK), -1);
  pthread_mutex_destroy(&f->mu);
}

int fake_dl_calls(struct fake_dl_stream *f) {
  pthread_mutex_lock(&f->mu);
  int n = f->calls;
  pthread_mutex_unlock(&f->mu);
  return n;
}

struct fake_dl_call fake_dl_call_at(struct fake_dl_stream *f, int i) {
  assert_in_range(i, 0, FAKE_DL_MAX_CALLS - 1);
  pthread_mutex_lock(&f->mu);
  struct fake_dl_call c = f->log[i];
  pthread_mutex_unlock(&f->mu);
  return c;
}

struct shm_ring *fake_dl_ring_at(struct fake_dl_stream *f, int i) {
  pthread_mutex_lock(&f->mu);
  struct shm_ring *r = i < f->n_rings ? f->rings[i] : NULL;
  pthread_mutex_unlock(&f->mu);
  assert_non_null(r);
  return r;
}

uint32_t fake_dl_token(int64_t step, uint64_t i) {
  return (uint32_t)(step * 1000003 + (int64_t)i * 7 + 11);
}

/* Writes n tokens of step as little-endian words (at most max_bytes). */
static void put_tokens(uint8_t *p, int64_t step, uint64_t n, uint64_t max_bytes) {
  for (uint64_t i = 0; i < n && 4 * i + 4 <= max_bytes; i++) {
    uint32_t t = fake_dl_token(step, i);
    for (int k = 0; k < 4; k++) p[4 * i + k] = (uint8_t)(t >> (8 * k));
  }
}

static Stoker__V1__Batch *new_batch(int64_t step, uint32_t lines, uint32_t line_tokens) {
  Stoker__V1__Batch *m = malloc(sizeof(*m));
  assert_non_null(m);
  stoker__v1__batch__init(m);
  m->step = step;
  m->lines = lines;
  m->line_tokens = line_tokens;
  return m;
}

Stoker__V1__Batch *fake_dl_inline(int64_t step, uint32_t lines, uint32_t line_tokens) {
  Stoker__V1__Batch *m = new_batch(step, lines, line_tokens);
  size_t n = (size_t)lines * line_tokens;
  m->tokens.data = malloc(n * 4 + 1);
  assert_non_null(m->tokens.data);
  m->tokens.len = n * 4;
  put_tokens(m->tokens.data, step, n, n * 4);
  return m;
}

struct shm_ring *fake_dl_ring(struct fake_dl_stream *f, const uint8_t *nonce, uint32_t slots,
                              uint64_t slot_bytes) {
  struct shm_ring *r = NULL;
  assert_int_equal(shm_ring_create(f->dirfd, f->dir, nonce, slots, slot_bytes, &r), 0);
  pthread_mutex_lock(&f->mu);
  assert_true(f->n_rings < FAKE_DL_MAX_RINGS);
  f->rings[f->n_rings++] = r;
  pthread_mutex_unlock(&f->mu);
  return r;
}

Stoker__V1__Batch *fake_dl_ring_batch(struct shm_ring *r, bool with_path, int64_t step,
                                      uint64_t seq, uint32_t lines, uint32_t line_tokens) {
  Stoker__V1__Batch *m = new_batch(step, lines, line_tokens);
  m->shm_seq = seq;
  if (with_path) assert_non_null(m->shm_path = strdup(shm_ring_path(r)));
  put_tokens(shm_ring_slot(r, seq), step, (uint64_t)lines * line_tokens, shm_ring_slot_bytes(r));
  shm_ring_written(r, seq);
  return m;
}

void fake_dl_more(Stoker__V1__Batch *m, Stoker__V1__Batch *extra) {
  Stoker__V1__Batch **more = realloc(m->more, (m->n_more + 1) * sizeof(*more));
  assert_non_null(more);
  more[m->n_more++] = extra;
  m->more = more;
}
