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
 * With shared-memory staging the stand-in answers GetStagingInfo with a
 * directory of its own (it never reads the segments): a save whose
 * completed segment's chunk messages the service holds back, and a save
 * whose GetStagingInfo is never answered, each hold up no other save, and
 * freeing the client ends them at once; so does a save whose segment
 * could not be written, its piece going as bytes. Under build-asan a save that
 * outlived its client shows as a use after free.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "fake_server.h"
#include "stoker/v1/checkpoint.pb-c.h"
#include "stoker_ckpt.h"

/* ---- The stand-in service (its handlers run on the fake's loop thread) ---- */

static int64_t stall_rank = -1;   /* This rank's stream stops reading after its first chunk. */
static atomic_int streams_held;   /* Streams read to their end (park) or stalled. */
static atomic_int streams_failed; /* Streams ended by a cancel (the client's). */
static atomic_int shm_chunks;     /* Chunk messages naming a segment (rank 0 and 1 apart). */
static atomic_int shm_chunks_of[2];
static atomic_llong bytes_of[2]; /* Chunk bytes that came inline (rank 0 and 1). */

/* How GetStagingInfo is answered. */
enum staging {
  STAGING_NONE, /* UNIMPLEMENTED (the clients are told STOKER_CKPT_SHM=off anyway). */
  STAGING_SHM,  /* Shared memory in shm_dir (segments of SHM_MAX bytes). */
  STAGING_HOLD, /* The first call is never answered; later ones: no shared memory. */
};
static enum staging staging;
static char shm_dir[64];
static atomic_int staging_asked;
#define SHM_TOKEN "c105ed"
#define SHM_MAX   (1u << 20)
static uint64_t shm_max = SHM_MAX; /* What GetStagingInfo answers. */

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
  const Stoker__V1__WriteChunk *m = (const Stoker__V1__WriteChunk *)msg;
  bool stall = m && m->rank == stall_rank;
  if (m && m->shm_name && m->shm_name[0]) {
    atomic_fetch_add(&shm_chunks, 1);
    if (m->rank < 2) atomic_fetch_add(&shm_chunks_of[m->rank], 1);
  }
  if (m && m->rank < 2) atomic_fetch_add(&bytes_of[m->rank], (long long)m->data.len);
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

static void end_held_ask(struct rpc_call *call, void *arg) {
  (void)arg;
  rpc_fail(call, RPC_CANCELLED, "cancelled");
}

static void handle_staging_info(struct rpc_call *call, const ProtobufCMessage *req, void *svc) {
  (void)req, (void)svc;
  int n = atomic_fetch_add(&staging_asked, 1);
  if (staging == STAGING_HOLD && n == 0) { /* Held until the caller (or the stop) cancels. */
    rpc_on_cancel(call, end_held_ask, NULL);
    return;
  }
  if (staging == STAGING_NONE) {
    rpc_fail(call, RPC_UNIMPLEMENTED, "no staging info");
    return;
  }
  Stoker__V1__StagingInfo info = STOKER__V1__STAGING_INFO__INIT;
  if (staging == STAGING_SHM) {
    info.shm_dir = shm_dir;
    info.shm_token = SHM_TOKEN;
    info.shm_max_bytes = shm_max;
  }
  rpc_reply(call, &info.base);
}

#define SVC Stoker__V1__Checkpoint_Service
static const struct rpc_method_def methods[] = {
    RPC_UNSERVED_ROW(SVC, begin),  RPC_CLIENT_STREAM_ROW(SVC, write, handle_write),
    RPC_UNSERVED_ROW(SVC, commit), RPC_UNSERVED_ROW(SVC, abort),
    RPC_UNSERVED_ROW(SVC, list),   RPC_UNSERVED_ROW(SVC, get_manifest),
    RPC_UNSERVED_ROW(SVC, read),   RPC_UNSERVED_ROW(SVC, delete),
    RPC_UNSERVED_ROW(SVC, verify), RPC_UNARY_PARKED_ROW(SVC, get_staging_info, handle_staging_info),
};

/* The stand-in's shm directory (with the instance file that proves this
 * host), emptied and removed by shm_dir_remove. */
static void shm_dir_make(void) {
  snprintf(shm_dir, sizeof(shm_dir), "%s/stk-close-XXXXXX",
           access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
  assert_non_null(mkdtemp(shm_dir));
  char inst[128];
  snprintf(inst, sizeof(inst), "%s/instance-%s", shm_dir, SHM_TOKEN);
  int fd = open(inst, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  assert_true(fd >= 0);
  close(fd);
}

static void shm_dir_remove(void) {
  DIR *d = opendir(shm_dir);
  assert_non_null(d);
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char path[400];
    snprintf(path, sizeof(path), "%s/%s", shm_dir, e->d_name);
    unlink(path);
  }
  closedir(d);
  rmdir(shm_dir);
}

static void serve_staging(struct fake_server *f, int64_t stall_rank_of, enum staging how) {
  stall_rank = stall_rank_of;
  staging = how;
  atomic_store(&streams_held, 0);
  atomic_store(&streams_failed, 0);
  atomic_store(&shm_chunks, 0);
  atomic_store(&shm_chunks_of[0], 0);
  atomic_store(&shm_chunks_of[1], 0);
  atomic_store(&bytes_of[0], 0);
  atomic_store(&bytes_of[1], 0);
  atomic_store(&staging_asked, 0);
  fake_server_init(f, NULL);
  fake_server_start(f, NULL, &stoker__v1__checkpoint__descriptor, methods, RPC_N_ROWS(methods),
                    NULL);
}

static void serve(struct fake_server *f, int64_t stall_rank_of) {
  serve_staging(f, stall_rank_of, STAGING_NONE);
}

/* Waits up to ms for *v to reach n. */
static void wait_count(atomic_int *v, int n, int ms) {
  for (int i = 0; i < ms / 10 && atomic_load(v) < n; i++)
    nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
  assert_int_equal(atomic_load(v), n);
}

static void wait_held(int n) {
  wait_count(&streams_held, n, 30000);
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
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

/* shm: the STOKER_CKPT_SHM the saves see ("off": bytes over gRPC, no
 * GetStagingInfo). */
static struct stk_client *connect_shm(const struct fake_server *f, const char *shm,
                                      int64_t timeout_ms) {
  setenv(STK_CKPT_SHM_ENV, shm, 1);
  struct stk_client_opts o = {.address = f->addr, .default_timeout_ms = timeout_ms};
  struct stk_client *c = NULL;
  assert_int_equal(stk_ckpt_connect(&o, &c), 0);
  return c;
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

/* A shard of many small tensors whose names are long: one segment holds
 * them all, and its chunk messages (metadata only) add up to far more than
 * the stream's flow-control window, so a service that stops reading holds
 * the segment's messages back. */
#define SMALL_N     1024
#define SMALL_BYTES 1024 /* SMALL_N of them fill one SHM_MAX segment. */
#define NAME_BYTES  (64u << 10)

struct small_shard {
  uint8_t *buf;
  char *names;
  uint64_t shape[1], off[1], sz[1];
  struct stk_ckpt_tensor t[SMALL_N];
};

static void small_shard_init(struct small_shard *s) {
  s->buf = malloc((size_t)SMALL_N * SMALL_BYTES);
  s->names = malloc((size_t)SMALL_N * NAME_BYTES);
  assert_non_null(s->buf);
  assert_non_null(s->names);
  s->shape[0] = s->sz[0] = SMALL_BYTES, s->off[0] = 0;
  for (size_t i = 0; i < SMALL_N; i++) {
    char *name = s->names + i * NAME_BYTES;
    memset(name, 'n', NAME_BYTES - 1);
    name[NAME_BYTES - 1] = '\0';
    char head[16];
    int n = snprintf(head, sizeof(head), "t%05zu.", i); /* Unique; still NAME_BYTES - 1 long. */
    memcpy(name, head, (size_t)n);
    memset(s->buf + i * SMALL_BYTES, (int)(i % 251), SMALL_BYTES);
    s->t[i] = (struct stk_ckpt_tensor){
        name, STK_DTYPE_U8, s->shape, {1, s->off, s->sz}, s->buf + i * SMALL_BYTES, SMALL_BYTES};
  }
}

static void small_shard_free(struct small_shard *s) {
  free(s->buf), free(s->names);
}

/* Shared-memory staging: the service takes rank 0's first chunk message
 * and then holds its stream back, so rank 0's save sits in the flush of
 * its one segment (its other chunk messages not taken). That holds up no
 * other save: rank 1's save on the same client sends its segment's every
 * message and "last". Freeing the client then ends both at once, each
 * callback with STK_ECANCELED. The old flush sent a segment's messages in
 * one loop on the engine's thread, each waiting for the one before to be
 * taken: rank 1 never reached its end. */
static void test_held_flush_holds_no_other(void **state) {
  (void)state;
  shm_dir_make();
  struct fake_server f;
  serve_staging(&f, 0, STAGING_SHM);
  struct stk_client *c = connect_shm(&f, "on", 30000);
  struct small_shard *sh = malloc(sizeof(*sh));
  assert_non_null(sh);
  small_shard_init(sh);
  struct saved s[2] = {0};
  for (uint32_t r = 0; r < 2; r++)
    assert_int_equal(stk_ckpt_save_async(c, "att", r, sh->t, SMALL_N, on_saved, &s[r]), 0);
  wait_held(2); /* Rank 0 held after its first message, rank 1 at its end. */
  assert_int_equal(atomic_load(&shm_chunks_of[0]), 1);
  assert_int_equal(atomic_load(&shm_chunks_of[1]), SMALL_N); /* Every chunk through the segment. */
  nanosleep(&(struct timespec){0, 200 * 1000 * 1000}, NULL); /* Rank 0's flush fills the window. */
  assert_int_equal(atomic_load(&s[0].calls) + atomic_load(&s[1].calls), 0);
  int64_t t0 = now_ms();
  stk_client_free(c);
  assert_true(now_ms() - t0 < 5000);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(atomic_load(&s[r].calls), 1);
    assert_int_equal(s[r].err, STK_ECANCELED);
    assert_non_null(strstr(s[r].msg, "cancelled"));
  }
  fake_server_stop(&f);
  small_shard_free(sh);
  free(sh);
  shm_dir_remove();
}

/* A segment that cannot be written (the file may not grow: RLIMIT_FSIZE
 * here, a full tmpfs in life) sends its piece as bytes instead: 32 MiB cut
 * into 4 MiB messages. The service stops reading rank 0's stream after its
 * first message; that holds up no other save: rank 1's save on the same
 * client sends every byte (inline) and "last". Freeing the client ends
 * both at once. The old fall-back sent the piece's messages in one loop
 * on the engine's thread, each waiting for the one before to be taken. */
static void test_fallen_back_piece_holds_no_other(void **state) {
  (void)state;
  shm_dir_make();
  shm_max = 64u << 20; /* The 32 MiB shard is one piece. */
  struct fake_server f;
  serve_staging(&f, 0, STAGING_SHM);
  struct stk_client *c = connect_shm(&f, "on", 30000);
  struct shard sh;
  shard_init(&sh);
  struct rlimit old;
  assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
  struct sigaction ign = {.sa_handler = SIG_IGN}, old_act;
  assert_int_equal(sigaction(SIGXFSZ, &ign, &old_act), 0);
  struct rlimit small = {1u << 20, old.rlim_max};
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
  struct saved s[2] = {0};
  for (uint32_t r = 0; r < 2; r++)
    assert_int_equal(stk_ckpt_save_async(c, "att", r, &sh.t, 1, on_saved, &s[r]), 0);
  wait_held(2); /* Rank 0 held after its first message, rank 1 at its end. */
  assert_int_equal(atomic_load(&bytes_of[1]), (long long)ELEMS * sizeof(float));
  assert_int_equal(atomic_load(&shm_chunks_of[1]), 0);
  assert_int_equal(atomic_load(&s[0].calls) + atomic_load(&s[1].calls), 0);
  int64_t t0 = now_ms();
  stk_client_free(c);
  assert_true(now_ms() - t0 < 5000);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(atomic_load(&s[r].calls), 1);
    assert_int_equal(s[r].err, STK_ECANCELED);
  }
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
  assert_int_equal(sigaction(SIGXFSZ, &old_act, NULL), 0);
  fake_server_stop(&f);
  free(sh.buf);
  shm_max = SHM_MAX;
  shm_dir_remove();
}

/* An attempt owned by a replica that never answers ("ID@OWNER", OWNER a
 * socket that takes connections and never speaks): the writer's open
 * (making the owner's client) does not wait for it, and its
 * GetStagingInfo, sent to the owner, waits as a step; rank 1's save to
 * the stand-in on the same client goes to its end meanwhile, and freeing
 * the client ends both at once. The old GetStagingInfo waited on the
 * engine's thread for its timeout (a minute here). */
static void test_silent_owner_holds_no_other(void **state) {
  (void)state;
  int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(ls >= 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(bind(ls, (struct sockaddr *)&sa, sizeof(sa)), 0);
  assert_int_equal(listen(ls, 16), 0); /* Never accepted: the kernel completes the connects. */
  socklen_t len = sizeof(sa);
  assert_int_equal(getsockname(ls, (struct sockaddr *)&sa, &len), 0);
  char attempt[64];
  snprintf(attempt, sizeof(attempt), "att@127.0.0.1:%u", ntohs(sa.sin_port));
  struct fake_server f;
  serve_staging(&f, -1, STAGING_NONE);
  struct stk_client *c = connect_shm(&f, "auto", 60000);
  struct shard sh;
  shard_init(&sh);
  struct saved s[2] = {0};
  assert_int_equal(stk_ckpt_save_async(c, attempt, 0, &sh.t, 1, on_saved, &s[0]), 0);
  assert_int_equal(stk_ckpt_save_async(c, "att", 1, &sh.t, 1, on_saved, &s[1]), 0);
  wait_count(&streams_held, 1, 10000); /* Rank 1 at its end. */
  assert_int_equal(atomic_load(&s[0].calls) + atomic_load(&s[1].calls), 0);
  int64_t t0 = now_ms();
  stk_client_free(c);
  assert_true(now_ms() - t0 < 5000);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(atomic_load(&s[r].calls), 1);
    assert_int_equal(s[r].err, STK_ECANCELED);
  }
  fake_server_stop(&f);
  close(ls);
  free(sh.buf);
}

/* GetStagingInfo, asked at a save's first tensor, is never answered for
 * rank 0's save (the client's timeout is a minute): that holds up no other
 * save on the client, rank 1's save (asked after it, answered "no shared
 * memory") sends its bytes and "last"; freeing the client ends the unanswered
 * call at once, not at its timeout, and both callbacks get STK_ECANCELED.
 * The old call waited on the engine's thread for the answer. */
static void test_unanswered_staging_info_holds_no_other(void **state) {
  (void)state;
  struct fake_server f;
  serve_staging(&f, -1, STAGING_HOLD);
  struct stk_client *c = connect_shm(&f, "auto", 60000);
  struct shard sh;
  shard_init(&sh);
  struct saved s[2] = {0};
  assert_int_equal(stk_ckpt_save_async(c, "att", 0, &sh.t, 1, on_saved, &s[0]), 0);
  wait_count(&staging_asked, 1, 10000); /* Rank 0's question, held. */
  assert_int_equal(stk_ckpt_save_async(c, "att", 1, &sh.t, 1, on_saved, &s[1]), 0);
  wait_count(&streams_held, 1, 10000); /* Rank 1 at its end meanwhile. */
  assert_int_equal(atomic_load(&staging_asked), 2);
  assert_int_equal(atomic_load(&s[0].calls) + atomic_load(&s[1].calls), 0);
  int64_t t0 = now_ms();
  stk_client_free(c);
  assert_true(now_ms() - t0 < 5000);
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
      cmocka_unit_test(test_held_flush_holds_no_other),
      cmocka_unit_test(test_unanswered_staging_info_holds_no_other),
      cmocka_unit_test(test_fallen_back_piece_holds_no_other),
      cmocka_unit_test(test_silent_owner_holds_no_other),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
