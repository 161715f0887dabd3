/*
 * A client freed with saves in flight: the client owns every async save and
 * background stage it runs (the save machine on its engine), so
 * stk_client_free cancels them, runs their callbacks (STK_ECANCELED) before
 * it returns, and leaves nothing that touches the freed client; a stage
 * stays the caller's and finishes after the client is gone. The checkpoint
 * service is a stand-in whose Write never answers: it reads a stream to its
 * end and then holds the call (the save waits for the reply), or, for one
 * rank, stops reading after the first chunk (that save's writes wait on
 * flow control, and must hold up no other save on the engine). Saves in
 * flight share the client's one engine thread instead of a thread each.
 * Under build-asan a save that outlived its client shows as a use after
 * free.
 */
#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "fake_server.h"
#include "stoker/v1/checkpoint.pb-c.h"
#include "stoker_ckpt.h"

/* ---- The stand-in service (its handlers run on the fake's loop thread) ---- */

static int64_t stall_rank = -1;   /* This rank's stream stops reading after its first chunk. */
static atomic_int streams_held;   /* Streams read to their end (park) or stalled. */
static atomic_int streams_failed; /* Streams ended by a cancel (the client's). */

struct held {
  struct rpc_call *call;
  bool receiving;
};

static void end_held(struct held *h) {
  atomic_fetch_add(&streams_failed, 1);
  rpc_fail(h->call, RPC_CANCELLED, "cancelled");
  free(h);
}

static void on_chunk(struct rpc_call *call, ProtobufCMessage *msg, int err, void *arg) {
  struct held *h = arg;
  h->receiving = false;
  if (err < 0) { /* The call is gone. */
    end_held(h);
    return;
  }
  bool stall = msg && ((Stoker__V1__WriteChunk *)msg)->rank == stall_rank;
  if (msg) protobuf_c_message_free_unpacked(msg, NULL);
  if (!msg || stall) { /* The end of the stream (or a stalled one): hold the call. */
    atomic_fetch_add(&streams_held, 1);
    return;
  }
  h->receiving = rpc_recv(call, on_chunk, h) == 0;
  if (!h->receiving) end_held(h);
}

static void on_cancel(struct rpc_call *call, void *arg) {
  struct held *h = arg;
  if (!h->receiving) end_held(h); /* Else the receive fails and ends it. */
}

static void handle_write(struct rpc_call *call, const ProtobufCMessage *req, void *svc) {
  struct held *h = calloc(1, sizeof(*h));
  assert_non_null(h);
  h->call = call;
  rpc_on_cancel(call, on_cancel, h);
  h->receiving = rpc_recv(call, on_chunk, h) == 0;
  assert_true(h->receiving);
}

#define SVC Stoker__V1__Checkpoint_Service
static const struct rpc_method_def methods[] = {
    RPC_UNSERVED_ROW(SVC, begin),  RPC_CLIENT_STREAM_ROW(SVC, write, handle_write),
    RPC_UNSERVED_ROW(SVC, commit), RPC_UNSERVED_ROW(SVC, abort),
    RPC_UNSERVED_ROW(SVC, list),   RPC_UNSERVED_ROW(SVC, get_manifest),
    RPC_UNSERVED_ROW(SVC, read),   RPC_UNSERVED_ROW(SVC, delete),
    RPC_UNSERVED_ROW(SVC, verify), RPC_UNSERVED_ROW(SVC, get_staging_info),
};

static void serve(struct fake_server *f, int64_t stall_rank_of) {
  stall_rank = stall_rank_of;
  atomic_store(&streams_held, 0);
  atomic_store(&streams_failed, 0);
  fake_server_init(f, NULL);
  fake_server_start(f, NULL, &stoker__v1__checkpoint__descriptor, methods, RPC_N_ROWS(methods),
                    NULL);
}

static void wait_held(int n) {
  for (int i = 0; i < 3000 && atomic_load(&streams_held) < n; i++)
    nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
  assert_int_equal(atomic_load(&streams_held), n);
}

/* ---- One rank's shard: 32 MiB of f32, so that a stalled stream's writes
 * wait on flow control well before the end. ---- */

#define ELEMS (8u << 20)

struct shard {
  float *buf;
  uint64_t shape[1], off[1], sz[1];
  struct stk_ckpt_tensor t;
};

static void shard_init(struct shard *s) {
  s->buf = calloc(ELEMS, sizeof(float));
  assert_non_null(s->buf);
  s->shape[0] = s->sz[0] = ELEMS, s->off[0] = 0;
  s->t = (struct stk_ckpt_tensor){"w",    STK_DTYPE_F32,        s->shape, {1, s->off, s->sz},
                                  s->buf, ELEMS * sizeof(float)};
}

static struct stk_client *connect_to(const struct fake_server *f) {
  setenv(STK_CKPT_SHM_ENV, "off", 1); /* Bytes over gRPC: no GetStagingInfo. */
  struct stk_client_opts o = {.address = f->addr, .default_timeout_ms = 30000};
  struct stk_client *c = NULL;
  assert_int_equal(stk_ckpt_connect(&o, &c), 0);
  return c;
}

/* What an async save's callback saw. */
struct saved {
  atomic_int calls;
  int err;
  char msg[256];
};

static void on_saved(void *arg, int err, const char *msg, uint64_t bytes) {
  struct saved *s = arg;
  s->err = err;
  snprintf(s->msg, sizeof(s->msg), "%s", msg);
  atomic_fetch_add(&s->calls, 1);
}

/* ---------------------------------------------------------------- tests */

/* Two async saves wait for the service's reply; freeing the client ends
 * both, their callbacks run once each before stk_client_free returns. */
static void test_free_cancels_async_saves(void **state) {
  (void)state;
  struct fake_server f;
  serve(&f, -1);
  struct stk_client *c = connect_to(&f);
  struct shard sh;
  shard_init(&sh);
  struct saved s[2] = {0};
  for (uint32_t r = 0; r < 2; r++)
    assert_int_equal(stk_ckpt_save_async(c, "att", r, &sh.t, 1, on_saved, &s[r]), 0);
  wait_held(2); /* Both sent "last" and wait for the reply that never comes. */
  assert_int_equal(atomic_load(&s[0].calls) + atomic_load(&s[1].calls), 0);
  stk_client_free(c);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(atomic_load(&s[r].calls), 1);
    assert_int_equal(s[r].err, STK_ECANCELED);
    assert_non_null(strstr(s[r].msg, "cancelled"));
  }
  fake_server_stop(&f);
  assert_int_equal(atomic_load(&streams_failed), 2); /* The service saw both calls end. */
  free(sh.buf);
}

/* Threads of this process (/proc/self/task) named name (gRPC names its
 * own; a thread the library or this test starts keeps the process's name
 * unless it sets one). */
static int threads_named(const char *name) {
  DIR *d = opendir("/proc/self/task");
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char path[300], comm[64] = "";
    snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
    FILE *fp = fopen(path, "r");
    if (fp && fgets(comm, sizeof(comm), fp)) comm[strcspn(comm, "\n")] = '\0';
    if (fp) fclose(fp);
    n += strcmp(comm, name) == 0;
  }
  closedir(d);
  return n;
}

static const char *process_name(void) {
  static char comm[64];
  FILE *fp = fopen("/proc/self/comm", "r");
  assert_non_null(fp);
  assert_non_null(fgets(comm, sizeof(comm), fp));
  fclose(fp);
  comm[strcspn(comm, "\n")] = '\0';
  return comm;
}

/* Saves in flight share the client's one engine thread ("stk-engine"): six
 * saves (four async, two stages), all waiting for their reply, start no
 * thread of their own, where a thread per save would add six. */
static void test_saves_share_one_thread(void **state) {
  (void)state;
  struct fake_server f;
  serve(&f, -1);
  struct stk_client *c = connect_to(&f);
  struct shard sh;
  shard_init(&sh);
  const char *proc = process_name();
  int before = threads_named(proc);
  assert_int_equal(threads_named("stk-engine"), 0); /* Started at the first save. */
  struct saved s[4] = {0};
  for (uint32_t r = 0; r < 4; r++)
    assert_int_equal(stk_ckpt_save_async(c, "att", r, &sh.t, 1, on_saved, &s[r]), 0);
  struct stk_ckpt_stage *st[2];
  for (uint32_t r = 0; r < 2; r++)
    assert_int_equal(stk_ckpt_stage_start(c, "att", 4 + r, &sh.t, 1, NULL, &st[r]), 0);
  wait_held(6);
  assert_true(threads_named(proc) <= before); /* gRPC's threads start unnamed: a few less. */
  assert_int_equal(threads_named("stk-engine"), 1);
  stk_client_free(c);
  assert_int_equal(threads_named("stk-engine"), 0); /* Joined. */
  for (int r = 0; r < 4; r++) assert_int_equal(atomic_load(&s[r].calls), 1);
  for (int r = 0; r < 2; r++) assert_int_equal(stk_ckpt_stage_finish(st[r], NULL), STK_ECANCELED);
  fake_server_stop(&f);
  free(sh.buf);
}

/* A save whose writes wait on flow control (the service stopped reading
 * rank 0's stream) holds up no other save on the engine: rank 1's save on
 * the same client still sends every chunk and "last". Freeing the client
 * then ends both: the close cancels rank 0's stream under its write. */
static void test_blocked_write_holds_no_other(void **state) {
  (void)state;
  struct fake_server f;
  serve(&f, 0);
  struct stk_client *c = connect_to(&f);
  struct shard sh;
  shard_init(&sh);
  struct saved s[2] = {0};
  for (uint32_t r = 0; r < 2; r++)
    assert_int_equal(stk_ckpt_save_async(c, "att", r, &sh.t, 1, on_saved, &s[r]), 0);
  wait_held(2); /* Rank 0 stalled, rank 1 at its end. */
  nanosleep(&(struct timespec){0, 200 * 1000 * 1000}, NULL); /* Rank 0's writes fill the window. */
  assert_int_equal(atomic_load(&s[0].calls) + atomic_load(&s[1].calls), 0);
  stk_client_free(c);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(atomic_load(&s[r].calls), 1);
    assert_int_equal(s[r].err, STK_ECANCELED);
  }
  fake_server_stop(&f);
  free(sh.buf);
}

/* A stage in flight when its client is freed: released and done at once,
 * and the caller still fences and finishes it afterwards (no client is
 * touched then). */
static void test_free_cancels_stage(void **state) {
  (void)state;
  struct fake_server f;
  serve(&f, -1);
  struct stk_client *c = connect_to(&f);
  struct shard sh;
  shard_init(&sh);
  struct stk_ckpt_stage *st = NULL;
  assert_int_equal(stk_ckpt_stage_start(c, "att", 0, &sh.t, 1, NULL, &st), 0);
  wait_held(1);
  assert_int_equal(stk_ckpt_stage_fence(st), 0); /* Every byte was sent. */
  stk_client_free(c);
  assert_true(stk_ckpt_stage_released(st));
  assert_int_equal(stk_ckpt_stage_wait(st, NULL), STK_ECANCELED);
  assert_int_equal(stk_ckpt_stage_finish(st, NULL), STK_ECANCELED);
  assert_non_null(strstr(stk_client_last_error(NULL), "cancelled"));
  fake_server_stop(&f);
  free(sh.buf);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_free_cancels_async_saves),
      cmocka_unit_test(test_saves_share_one_thread),
      cmocka_unit_test(test_blocked_write_holds_no_other),
      cmocka_unit_test(test_free_cancels_stage),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
