/*
 * The in-process checkpoint service of fake_ckpt.h: each Checkpoint method
 * is one ckpt_* call of the real core on the loop thread. Write feeds each
 * received chunk to the core and asks for the next only once it was taken
 * (a chunk the core cannot stage yet is held until CKPT_WRITE_RESUME), so a
 * full staging budget stops the reading and gRPC flow control reaches the
 * client. Read forwards one piece at a time.
 */
#include "fake_ckpt.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "stk_error.h"

/* ---------------------------------------------------------- unary calls */

static void unary_done(void *arg, int err, const char *errmsg, const ProtobufCMessage *resp) {
  struct rpc_call *c = arg;
  if (resp) {
    rpc_reply(c, resp); /* Verify answers its report even with problems. */
  } else {
    rpc_fail_err(c, err, "%s", errmsg && errmsg[0] ? errmsg : stk_strerror(err));
  }
}

#define UNARY(fn, call, type)                                                                      \
  static void fn(struct rpc_call *c, const ProtobufCMessage *m, void *data) {                      \
    struct fake_ckpt *f = data;                                                                    \
    call(f->svc, (const type *)m, unary_done, c);                                                  \
  }
UNARY(handle_begin, ckpt_begin, Stoker__V1__BeginRequest)
UNARY(handle_commit, ckpt_commit, Stoker__V1__CommitCheckpointRequest)
UNARY(handle_list, ckpt_list, Stoker__V1__ListCheckpointsRequest)
UNARY(handle_manifest, ckpt_get_manifest, Stoker__V1__GetManifestRequest)
UNARY(handle_delete, ckpt_delete, Stoker__V1__DeleteCheckpointRequest)
UNARY(handle_abort, ckpt_abort, Stoker__V1__AbortCheckpointRequest)
UNARY(handle_verify, ckpt_verify, Stoker__V1__VerifyCheckpointRequest)

/* ---------------------------------------------------------------- Write */

struct wstream {
  struct fake_ckpt *f;
  struct rpc_call *c;
  struct ckpt_writer *w;
  ProtobufCMessage *held; /* A chunk the core said WAIT to. */
  bool wait_durable;
  bool recv_pending;
};

static void w_got(struct rpc_call *c, ProtobufCMessage *msg, int err, void *arg);

static void w_end(struct wstream *ws, int err, const char *msg, bool durable) {
  if (err == 0) {
    Stoker__V1__WriteResponse r = STOKER__V1__WRITE_RESPONSE__INIT;
    r.bytes_staged = ws->w ? ckpt_write_bytes(ws->w) : 0;
    r.durable = durable;
    rpc_reply(ws->c, &r.base);
  } else {
    rpc_fail_err(ws->c, err, "%s", msg && msg[0] ? msg : stk_strerror(err));
  }
  if (ws->w) ckpt_write_close(ws->w);
  if (ws->held) protobuf_c_message_free_unpacked(ws->held, NULL);
  free(ws);
}

static void w_next(struct wstream *ws) {
  ws->recv_pending = true;
  int err = rpc_recv(ws->c, w_got, ws);
  if (err < 0) {
    ws->recv_pending = false;
    w_end(ws, err, "receive", false);
  }
}

/* Feeds msg to the core; takes msg. */
static void w_feed(struct wstream *ws, ProtobufCMessage *msg) {
  const Stoker__V1__WriteChunk *ch = (const Stoker__V1__WriteChunk *)msg;
  int r = ckpt_write_feed(ws->w, ch);
  if (r == CKPT_WRITE_WAIT) {
    ws->held = msg;
    return;
  }
  bool last = ch->last;
  ws->wait_durable = ch->wait_durable;
  protobuf_c_message_free_unpacked(msg, NULL);
  if (r < 0) {
    w_end(ws, r, stk_detail(), false);
  } else if (!last) {
    w_next(ws);
  } /* else: the STAGED / DURABLE event answers. */
}

static void w_event(void *arg, enum ckpt_write_event ev, int err, const char *errmsg) {
  struct wstream *ws = arg;
  if (ev == CKPT_WRITE_RESUME && ws->held) {
    ProtobufCMessage *m = ws->held;
    ws->held = NULL;
    w_feed(ws, m);
  } else if (ev == CKPT_WRITE_STAGED && !ws->wait_durable) {
    w_end(ws, 0, NULL, false);
  } else if (ev == CKPT_WRITE_DURABLE && ws->wait_durable) {
    w_end(ws, 0, NULL, true);
  } else if (ev == CKPT_WRITE_FAILED && !ws->recv_pending) {
    w_end(ws, err, errmsg, false);
  }
}

static void w_got(struct rpc_call *c, ProtobufCMessage *msg, int err, void *arg) {
  (void)c;
  struct wstream *ws = arg;
  ws->recv_pending = false;
  if (err < 0 || !msg) {
    w_end(ws, err < 0 ? err : STK_EINVAL, err < 0 ? "stream failed" : "stream ended without last",
          false);
    return;
  }
  if (!ws->w) {
    const Stoker__V1__WriteChunk *ch = (const Stoker__V1__WriteChunk *)msg;
    int e = ckpt_write_open(ws->f->svc, ch->attempt, ch->rank, w_event, ws, &ws->w);
    if (e < 0) {
      protobuf_c_message_free_unpacked(msg, NULL);
      w_end(ws, e, stk_detail(), false);
      return;
    }
  }
  w_feed(ws, msg);
}

static void handle_write(struct rpc_call *c, const ProtobufCMessage *m, void *data) {
  (void)m;
  struct wstream *ws = calloc(1, sizeof(*ws));
  ws->f = data;
  ws->c = c;
  w_next(ws);
}

/* ----------------------------------------------------------------- Read */

struct rstream {
  struct rpc_call *c;
  struct fake_ckpt *f;
  struct ckpt_reader *r;
  bool send_pending, ended;
  int end_err;
  char end_msg[256];
};

static void r_finish(struct rstream *rs) {
  if (rs->end_err == 0) {
    rpc_finish(rs->c, RPC_OK, NULL);
  } else {
    rpc_finish(rs->c, stk_error_to_grpc(rs->end_err), "%s", rs->end_msg);
  }
  free(rs);
}

static void r_sent(struct rpc_call *c, int err, void *arg) {
  (void)c;
  struct rstream *rs = arg;
  rs->send_pending = false;
  if (rs->ended) {
    r_finish(rs);
  } else if (err < 0) {
    ckpt_read_cancel(rs->r); /* done runs now and finishes. */
  } else {
    ckpt_read_resume(rs->r);
  }
}

/* piece with its first piece's run moved past the message's bytes. */
static int send_damaged(struct rstream *rs, const Stoker__V1__ReadChunk *piece) {
  Stoker__V1__ReadChunk m = *piece, first = *piece->pieces[0];
  Stoker__V1__ReadChunk **ps = malloc(piece->n_pieces * sizeof(*ps));
  if (!ps) return STK_ENOMEM;
  memcpy(ps, piece->pieces, piece->n_pieces * sizeof(*ps));
  first.data_offset = piece->packed_data.len;
  ps[0] = &first;
  m.pieces = ps;
  int err = rpc_send(rs->c, &m.base, r_sent, rs);
  free(ps);
  return err;
}

static bool r_piece(void *arg, const Stoker__V1__ReadChunk *piece) {
  struct rstream *rs = arg;
  rs->send_pending = true;
  bool damage = rs->f->damage_packed_data && piece->n_pieces > 0 && piece->packed_data.len > 0;
  int err = damage ? send_damaged(rs, piece) : rpc_send(rs->c, &piece->base, r_sent, rs);
  if (err < 0) {
    rs->send_pending = false;
    return true; /* The next piece fails the same way; done follows. */
  }
  return false;
}

static void r_done(void *arg, int err, const char *errmsg, const ProtobufCMessage *resp) {
  (void)resp;
  struct rstream *rs = arg;
  rs->ended = true;
  rs->end_err = err;
  snprintf(rs->end_msg, sizeof(rs->end_msg), "%s", errmsg ? errmsg : "");
  if (!rs->send_pending) r_finish(rs);
}

static void handle_read(struct rpc_call *c, const ProtobufCMessage *m, void *data) {
  struct fake_ckpt *f = data;
  struct rstream *rs = calloc(1, sizeof(*rs));
  rs->c = c;
  rs->f = f;
  rs->r = ckpt_read(f->svc, (const Stoker__V1__ReadRequest *)m, r_piece, r_done, rs);
}

/* ------------------------------------------------------------ lifecycle */

#define SVC Stoker__V1__Checkpoint_Service

/* No shared memory here: GetStagingInfo answers UNIMPLEMENTED, as an older service's. */
static const struct rpc_method_def defs[] = {
    RPC_UNARY_ROW(SVC, begin, handle_begin),
    RPC_CLIENT_STREAM_ROW(SVC, write, handle_write),
    RPC_UNARY_ROW(SVC, commit, handle_commit),
    RPC_UNARY_ROW(SVC, list, handle_list),
    RPC_UNARY_ROW(SVC, get_manifest, handle_manifest),
    RPC_SERVER_STREAM_ROW(SVC, read, handle_read),
    RPC_UNARY_ROW(SVC, delete, handle_delete),
    RPC_UNARY_ROW(SVC, abort, handle_abort),
    RPC_UNARY_ROW(SVC, verify, handle_verify),
    RPC_UNSERVED_ROW(SVC, get_staging_info),
};

static void service_closed(void *arg) {
  struct fake_ckpt *f = arg;
  uv_close((uv_handle_t *)&f->stats_req, NULL);
  f->server_done(&f->server);
}

/* After the server: the core, then the stats handle. */
static void after_shutdown(struct fake_server *s, void (*done)(struct fake_server *s)) {
  struct fake_ckpt *f = s->owner;
  f->server_done = done;
  ckpt_service_close(f->svc, service_closed, f);
}

static void on_stats(uv_async_t *a) {
  struct fake_ckpt *f = a->data;
  pthread_mutex_lock(&f->mu);
  ckpt_service_get_stats(f->svc, &f->stats);
  f->stats_ready = true;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
}

void fake_ckpt_stats(struct fake_ckpt *f, struct ckpt_service_stats *ret_stats) {
  pthread_mutex_lock(&f->mu);
  f->stats_ready = false;
  uv_async_send(&f->stats_req);
  while (!f->stats_ready) pthread_cond_wait(&f->cv, &f->mu);
  *ret_stats = f->stats;
  pthread_mutex_unlock(&f->mu);
}

static void open_core(struct fake_ckpt *f, const struct fake_ckpt_opts *opts) {
  char db[160], url[160];
  snprintf(db, sizeof(db), "%s/db", f->dir);
  snprintf(f->store_dir, sizeof(f->store_dir), "%s/store", f->dir);
  snprintf(url, sizeof(url), "file://%s", f->store_dir);
  struct ckpt_service_opts o = {
      .db_dir = db,
      .storage_url = url,
      .staging_budget_bytes = opts ? opts->staging_budget_bytes : 0,
      .read_piece_bytes = opts ? opts->read_piece_bytes : 0,
      .upload_concurrency = 4,
  };
  assert_int_equal(ckpt_service_open(&f->server.loop, &o, &f->svc), 0);
}

void fake_ckpt_start(struct fake_ckpt *f, const struct fake_ckpt_opts *opts) {
  memset(f, 0, sizeof(*f));
  pthread_mutex_init(&f->mu, NULL);
  pthread_cond_init(&f->cv, NULL);
  snprintf(f->dir, sizeof(f->dir), "/tmp/fake-ckpt-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  fake_server_init(&f->server, f);
  f->server.after_shutdown = after_shutdown;
  assert_int_equal(uv_async_init(&f->server.loop, &f->stats_req, on_stats), 0);
  f->stats_req.data = f;
  open_core(f, opts);
  f->damage_packed_data = opts && opts->damage_packed_data;
  /* Verify only where the service descriptor has it (and not switched off). */
  size_t n = sizeof(defs) / sizeof(defs[0]);
  if ((opts && opts->no_verify) || !protobuf_c_service_descriptor_get_method_by_name(
                                       &stoker__v1__checkpoint__descriptor, "Verify"))
    n--;
  fake_server_start(&f->server, NULL, &stoker__v1__checkpoint__descriptor, defs, n, f);
}

void fake_ckpt_stop(struct fake_ckpt *f) {
  fake_server_stop(&f->server);
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", f->dir);
  assert_int_equal(system(cmd), 0);
  pthread_cond_destroy(&f->cv);
  pthread_mutex_destroy(&f->mu);
}
