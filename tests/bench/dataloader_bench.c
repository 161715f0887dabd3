/*
 * Dataloader benchmark. Writes a synthetic llm.c corpus (uint32 tokens) of
 * at least 2 GiB plus a 100 MiB one into WORK, then measures in one run:
 *   raw       memcpy of batch-sized chunks from an mmap of the page-cached
 *             files (the ceiling: what serving tokens costs at the least);
 *   raw_random  memcpy of the same files in loader-sized units (llm.c
 *             blocks: BENCH_BLOCK_TOKENS or the default 32768 tokens) in a
 *             random order, as a shuffling loader must read them (a seeded
 *             shuffle, not the loader's own permutation);
 *   tcp       one loopback TCP stream carrying batch-sized messages from a
 *             sender thread to this one (what the kernel alone costs a
 *             trainer on another host; the wire path's ceiling);
 *   embedded  the core in-process (dl_core.h) serving consecutive steps to
 *             one rank on one thread;
 *   grpc      one client streaming the same rank's batches (StreamBatches,
 *             prefetch) from the daemon at ADDR on loopback, as a trainer on
 *             the daemon's host does: tokens through the shared-memory ring;
 *   wire      the same with STOKER_DL_SHM=off: tokens in the gRPC messages
 *             (a trainer on another host);
 *   first     create loader + first batch on a fresh state directory, for
 *             the small and the large corpus (must not grow with size);
 *   bpe       GPT-2 BPE tokenization on one core, when vocab files are given.
 * The machine's speed drifts (a shared VM), so raw, embedded, grpc and wire
 * are measured in ROUNDS interleaved rounds (BENCH_ROUNDS, default 8), each
 * phase SECONDS / ROUNDS per round with a raw pass between any two phases;
 * a ratio is the median over rounds of the phase's rate over the mean of
 * the raw passes just before and after it, a rate the median of the
 * rounds' rates. Per-round figures go to stderr.
 * ADDR "-" skips the daemon (grpc and wire print 0), to profile the rest.
 * Prints one JSON line. Usage:
 *   dataloader_bench ADDR WORK [SECONDS] [ENCODER_JSON VOCAB_BPE TEXT_FILE]
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench_stats.h"
#include "dl_core.h"
#include "dl_synthetic.h"
#include "dl_tokenizer.h"
#include "stk_error.h"
#include "stoker_admin.h"

#define SEQ_LEN      2048
#define GLOBAL_BATCH 64
#define LINE_TOKENS  (SEQ_LEN + 1)
#define BATCH_TOKENS ((size_t)GLOBAL_BATCH * LINE_TOKENS)
#define MIN_DOC      1024
#define MAX_DOC      3072
#define LARGE_FILES  8
#define LARGE_DOCS   33000 /* Per file: ~2048 tokens each, 8 files > 2 GiB. */
#define SMALL_DOCS   12900 /* One file, ~100 MiB. */
#define SEED         11

static void die(const char *what, int err) {
  fprintf(stderr, "dataloader_bench: %s: %s (%s)\n", what, stk_strerror(err), stk_detail());
  exit(1);
}

/* Writes the corpora (once; kept between runs in WORK). */
static void write_corpora(const char *work, uint64_t *ret_large_tokens) {
  char path[512];
  uint64_t tokens = 0;
  snprintf(path, sizeof(path), "%s/large", work);
  mkdir(path, 0755);
  for (int f = 0; f < LARGE_FILES; f++) {
    snprintf(path, sizeof(path), "%s/large/part_%02d.bin", work, f);
    struct stat st;
    if (stat(path, &st) != 0) {
      fprintf(stderr, "writing %s\n", path);
      int err = dl_synthetic_write_llmc(path, (uint64_t)f * LARGE_DOCS, LARGE_DOCS, MIN_DOC,
                                        MAX_DOC, SEED);
      if (err < 0) die("write corpus", err);
      stat(path, &st);
    }
    tokens += ((uint64_t)st.st_size - 1024) / 4;
  }
  snprintf(path, sizeof(path), "%s/small", work);
  mkdir(path, 0755);
  snprintf(path, sizeof(path), "%s/small/part_00.bin", work);
  struct stat st;
  if (stat(path, &st) != 0) {
    int err = dl_synthetic_write_llmc(path, 0, SMALL_DOCS, MIN_DOC, MAX_DOC, SEED + 1);
    if (err < 0) die("write small corpus", err);
  }
  *ret_large_tokens = tokens;
}

/* Maps every large file (reading it once to warm the page cache). */
struct mapped {
  const uint8_t *p[LARGE_FILES];
  size_t len[LARGE_FILES];
};

static void map_large(const char *work, struct mapped *m) {
  static uint8_t buf[1 << 20];
  for (int f = 0; f < LARGE_FILES; f++) {
    char path[512];
    snprintf(path, sizeof(path), "%s/large/part_%02d.bin", work, f);
    int fd = open(path, O_RDONLY);
    if (fd < 0) die("open corpus", STK_EIO);
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
    struct stat st;
    fstat(fd, &st);
    m->len[f] = (size_t)st.st_size;
    m->p[f] = mmap(NULL, m->len[f], PROT_READ, MAP_SHARED, fd, 0);
    if (m->p[f] == MAP_FAILED) die("mmap", STK_EIO);
    close(fd);
  }
}

/* Tokens per second of memcpy in batch-sized chunks over the whole corpus,
 * one pass (main makes an untimed one first, which faults the mapping in). */
static double raw_tokens_per_s(const struct mapped *m) {
  static uint32_t *dst;
  if (!dst && !(dst = malloc(BATCH_TOKENS * 4))) die("malloc", STK_ENOMEM);
  uint64_t bytes = 0;
  double t0 = bench_now_s();
  for (int f = 0; f < LARGE_FILES; f++) {
    for (size_t off = 1024; off + BATCH_TOKENS * 4 <= m->len[f]; off += BATCH_TOKENS * 4) {
      memcpy(dst, m->p[f] + off, BATCH_TOKENS * 4);
      __asm__ volatile("" : : "r"(dst) : "memory"); /* Keep the copy. */
      bytes += BATCH_TOKENS * 4;
    }
  }
  return (double)bytes / 4 / (bench_now_s() - t0);
}

/* Tokens per second of memcpy of whole units in a random order over the
 * corpus, one pass: what a loader that shuffles units must at least read.
 * The destination is one batch-sized buffer filled unit after unit and
 * reused, as the sequential pass reuses its one and the loader fills a
 * batch. */
static double raw_random_tokens_per_s(const struct mapped *m) {
  static uint32_t *dst;
  static size_t *order, n_units, unit_bytes;
  if (!order) {
    const char *block = getenv("BENCH_BLOCK_TOKENS");
    unit_bytes = (size_t)(block ? strtoul(block, NULL, 10) : 32768) * 4;
    if (unit_bytes == 0 || unit_bytes > BATCH_TOKENS * 4) unit_bytes = 32768 * 4;
    for (int f = 0; f < LARGE_FILES; f++) n_units += (m->len[f] - 1024) / unit_bytes;
    order = malloc(n_units * sizeof *order);
    dst = malloc(BATCH_TOKENS * 4);
    if (!order || !dst) die("malloc", STK_ENOMEM);
    size_t k = 0;
    for (int f = 0; f < LARGE_FILES; f++)
      for (size_t u = 0; u < (m->len[f] - 1024) / unit_bytes; u++) order[k++] = (size_t)f << 40 | u;
    uint64_t x = SEED * 0x9E3779B97F4A7C15ull;
    for (size_t i = n_units - 1; i > 0; i--) { /* Fisher-Yates, xorshift. */
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      size_t j = (size_t)(x % (i + 1)), t = order[i];
      order[i] = order[j], order[j] = t;
    }
  }
  size_t at = 0;
  double t0 = bench_now_s();
  for (size_t i = 0; i < n_units; i++) {
    size_t f = order[i] >> 40, u = order[i] & ((1ull << 40) - 1);
    if (at + unit_bytes > BATCH_TOKENS * 4) at = 0;
    memcpy((uint8_t *)dst + at, m->p[f] + 1024 + u * unit_bytes, unit_bytes);
    __asm__ volatile("" : : "r"(dst) : "memory");
    at += unit_bytes;
  }
  return (double)(n_units * unit_bytes) / 4 / (bench_now_s() - t0);
}

/* One loopback TCP stream: a sender thread writes batch-sized messages for
 * as long as the socket takes them (it blocks, using no CPU, while no phase
 * reads); tcp_tokens_per_s reads whole messages for `seconds`. */
struct tcp_stream {
  int rx, tx;
  pthread_t sender;
  uint8_t *msg;
};

static void *tcp_send_main(void *arg) {
  struct tcp_stream *s = arg;
  for (;;) {
    for (size_t off = 0; off < BATCH_TOKENS * 4;) {
      ssize_t n = send(s->tx, s->msg + off, BATCH_TOKENS * 4 - off, MSG_NOSIGNAL);
      if (n <= 0) return NULL; /* The reader closed: the bench is over. */
      off += (size_t)n;
    }
  }
}

static void tcp_open(struct tcp_stream *s) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  int one = 1, lis = socket(AF_INET, SOCK_STREAM, 0);
  if (lis < 0 || bind(lis, (struct sockaddr *)&a, sizeof a) || listen(lis, 1) ||
      getsockname(lis, (struct sockaddr *)&a, &len))
    die("tcp listen", STK_EIO);
  s->tx = socket(AF_INET, SOCK_STREAM, 0);
  if (s->tx < 0 || connect(s->tx, (struct sockaddr *)&a, sizeof a)) die("tcp connect", STK_EIO);
  s->rx = accept(lis, NULL, NULL);
  close(lis);
  if (s->rx < 0) die("tcp accept", STK_EIO);
  setsockopt(s->tx, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  s->msg = malloc(BATCH_TOKENS * 4);
  if (!s->msg) die("malloc", STK_ENOMEM);
  memset(s->msg, 7, BATCH_TOKENS * 4);
  if (pthread_create(&s->sender, NULL, tcp_send_main, s)) die("tcp sender", STK_ENOMEM);
}

static double tcp_tokens_per_s(struct tcp_stream *s, double seconds) {
  static uint8_t *buf;
  if (!buf && !(buf = malloc(BATCH_TOKENS * 4))) die("malloc", STK_ENOMEM);
  uint64_t bytes = 0;
  double t0 = bench_now_s(), t;
  do {
    for (size_t off = 0; off < BATCH_TOKENS * 4;) { /* One whole message, as a batch. */
      ssize_t n = recv(s->rx, buf + off, BATCH_TOKENS * 4 - off, 0);
      if (n <= 0) die("tcp recv", STK_EIO);
      off += (size_t)n;
    }
    bytes += BATCH_TOKENS * 4;
    t = bench_now_s() - t0;
  } while (t < seconds);
  return (double)bytes / 4 / t;
}

static void tcp_close(struct tcp_stream *s) {
  shutdown(s->rx, SHUT_RDWR);
  close(s->rx);
  pthread_join(s->sender, NULL);
  close(s->tx);
  free(s->msg);
}

/* A loader spec over one llm.c directory. */
struct spec_buf {
  Stoker__V1__LoaderSpec spec;
  Stoker__V1__DatasetSpec ds, *dsp;
  Stoker__V1__StorageRef src;
  char uri[1024];
};

static void make_spec(struct spec_buf *b, const char *job, const char *dir) {
  stoker__v1__loader_spec__init(&b->spec);
  stoker__v1__dataset_spec__init(&b->ds);
  stoker__v1__storage_ref__init(&b->src);
  snprintf(b->uri, sizeof(b->uri), "file://%s", dir);
  b->src.uri = b->uri;
  b->ds.name = "corpus";
  b->ds.source = &b->src;
  b->ds.format = STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_LLMC;
  b->ds.weight = 1;
  const char *block = getenv("BENCH_BLOCK_TOKENS"); /* llm.c unit size; unset: the default. */
  if (block) b->ds.block_tokens = (uint32_t)strtoul(block, NULL, 10);
  b->dsp = &b->ds;
  b->spec.job = (char *)job;
  b->spec.datasets = &b->dsp;
  b->spec.n_datasets = 1;
  b->spec.seq_len = SEQ_LEN;
  b->spec.global_batch = GLOBAL_BATCH;
  b->spec.seed = SEED;
}

/* Fresh state dir: open + create + first batch, in seconds. Leaves the
 * core open in *ret_dl for further use. */
static double first_batch_s(const char *work, const char *corpus, const char *state,
                            struct dl **ret_dl) {
  char dir[512], data[512];
  snprintf(dir, sizeof(dir), "%s/%s", work, state);
  snprintf(data, sizeof(data), "%s/%s", work, corpus);
  char cmd[1100];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  if (system(cmd) != 0) die("clean state dir", STK_EIO);
  struct spec_buf b;
  make_spec(&b, "bench", data);
  double t0 = bench_now_s();
  struct dl_opts o = {.dir = dir};
  struct dl *dl;
  int err = dl_open(&o, &dl);
  if (err == 0) err = dl_create_job(dl, &b.spec);
  struct dl_batch batch;
  if (err == 0) err = dl_get_batch(dl, "bench", 0, 0, 1, &batch);
  if (err < 0) die("first batch", err);
  double t = bench_now_s() - t0;
  dl_batch_free(&batch);
  *ret_dl = dl;
  return t;
}

/* Consecutive steps for rank 0 of 1 in this thread for `seconds`, from
 * *step on (advanced, so the next round continues the stream). */
static double embedded_tokens_per_s(struct dl *dl, int64_t *step_io, double seconds) {
  uint64_t tokens = 0;
  double t0 = bench_now_s(), t;
  int64_t step = *step_io;
  do {
    struct dl_batch b;
    int err = dl_get_batch(dl, "bench", step++, 0, 1, &b);
    if (err < 0) die("embedded batch", err);
    tokens += (uint64_t)b.lines * b.line_tokens;
    dl_batch_free(&b);
    t = bench_now_s() - t0;
  } while (t < seconds);
  *step_io = step;
  return (double)tokens / t;
}

/* One client streaming rank 0 of 1 from the daemon, kept open across
 * rounds; wire: without the shared-memory ring. */
struct grpc_stream {
  struct stk_client *client;
  struct stk_batch_stream *stream;
};

static void grpc_open(const char *addr, const char *work, bool wire, struct grpc_stream *g) {
  if (wire) setenv("STOKER_DL_SHM", "off", 1);
  struct stk_client_opts o = {.address = addr, .default_timeout_ms = 120000};
  char data[512];
  snprintf(data, sizeof(data), "%s/large", work);
  int err = stk_loader_connect(&o, &g->client);
  struct spec_buf b;
  char job[64];
  snprintf(job, sizeof(job), "bench-%d-%lld-%d", (int)getpid(), (long long)time(NULL), wire);
  make_spec(&b, job, data);
  Stoker__V1__LoaderInfo *info = NULL;
  if (err == 0) err = stk_loader_create(g->client, &b.spec, 0, &info);
  if (err < 0) die(stk_client_last_error(NULL), err);
  protobuf_c_message_free_unpacked(&info->base, NULL);
  if ((err = stk_batch_stream_open(g->client, job, 0, 0, 1, 8, &g->stream)) < 0) die("stream", err);
  struct stk_batch bt;
  if ((err = stk_batch_stream_next(g->stream, 60000, &bt)) < 0)
    die(stk_client_last_error(NULL), err);
  stk_batch_free(&bt); /* The first batch warms the server; rounds time the rest. */
  unsetenv("STOKER_DL_SHM");
}

static double grpc_tokens_per_s(struct grpc_stream *g, double seconds) {
  if (!g->stream) return 0;
  uint64_t tokens = 0;
  double t0 = bench_now_s(), t;
  do {
    struct stk_batch bt;
    int err = stk_batch_stream_next(g->stream, 60000, &bt);
    if (err < 0) die(stk_client_last_error(NULL), err);
    tokens += (uint64_t)bt.lines * bt.line_tokens;
    stk_batch_free(&bt);
    t = bench_now_s() - t0;
  } while (t < seconds);
  return (double)tokens / t;
}

static void grpc_close(struct grpc_stream *g) {
  if (!g->stream) return;
  stk_batch_stream_free(g->stream);
  stk_client_free(g->client);
}

/* GPT-2 BPE MB/s on one core over text (encoded in 4 KiB pieces, as a
 * text reader would); negative when it cannot run. */
static double bpe_mb_per_s(const char *encoder, const char *vocab, const char *text_path) {
  char spec[1100];
  snprintf(spec, sizeof(spec), "gpt2:%s,%s", encoder, vocab);
  struct dl_tokenizer *tok;
  if (dl_tokenizer_new(spec, &tok) < 0) return -1;
  FILE *f = fopen(text_path, "rb");
  if (!f) return -1;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = malloc((size_t)len + 1);
  size_t n = fread(text, 1, (size_t)len, f);
  fclose(f);
  struct dl_tokens out = {0};
  double t0 = bench_now_s();
  for (size_t off = 0; off < n; off += 4096) {
    out.n = 0;
    dl_tokenizer_encode(tok, text + off, n - off < 4096 ? n - off : 4096, &out);
  }
  double t = bench_now_s() - t0;
  dl_tokens_release(&out);
  free(text);
  dl_tokenizer_free(tok);
  return (double)n / 1e6 / t;
}

#define MAX_ROUNDS 16
enum { RAW, EMBEDDED, GRPC, WIRE, RAW_RANDOM, TCP, PHASES };
static const char *const phase_name[PHASES] = {"raw",  "embedded",   "grpc",
                                               "wire", "raw_random", "tcp"};

/* BENCH_PHASES (a comma-separated list of phase names) limits the timed
 * phases to those named, for profiling one of them; the raw passes stay. */
static bool phase_wanted(int p) {
  const char *only = getenv("BENCH_PHASES");
  if (!only || !*only) return true;
  size_t n = strlen(phase_name[p]);
  for (const char *q = only; (q = strstr(q, phase_name[p])) != NULL; q += n)
    if ((q == only || q[-1] == ',') && (q[n] == ',' || q[n] == 0)) return true;
  return false;
}

/* The interleaved rounds: rate[phase][round], and base[phase][round] the
 * raw rate around that phase (the mean of the raw passes just before and
 * just after it), which its ratio is taken against. */
static void rounds(const struct mapped *m, struct dl *large, struct grpc_stream *shm,
                   struct grpc_stream *wire, struct tcp_stream *tcp, int n, double seconds,
                   double rate[PHASES][MAX_ROUNDS], double base[PHASES][MAX_ROUNDS]) {
  int64_t step = 1;
  double before = raw_tokens_per_s(m);
  for (int r = 0; r < n; r++) {
    rate[RAW][r] = base[RAW][r] = before;
    for (int p = EMBEDDED; p < PHASES; p++) {
      if (!phase_wanted(p)) {
        rate[p][r] = 0;
        base[p][r] = 1;
        continue;
      }
      if (p == EMBEDDED)
        rate[p][r] = embedded_tokens_per_s(large, &step, seconds / n);
      else if (p == RAW_RANDOM)
        rate[p][r] = raw_random_tokens_per_s(m);
      else if (p == TCP)
        rate[p][r] = tcp_tokens_per_s(tcp, seconds / n);
      else
        rate[p][r] = grpc_tokens_per_s(p == GRPC ? shm : wire, seconds / n);
      double after = raw_tokens_per_s(m);
      base[p][r] = (before + after) / 2;
      before = after;
    }
    fprintf(stderr, "round %d:", r + 1);
    for (int p = 0; p < PHASES; p++)
      fprintf(stderr, " %s %.0f M/s (%.3f)", phase_name[p], rate[p][r] / 1e6,
              rate[p][r] / base[p][r]);
    fprintf(stderr, "\n");
  }
}

/* Median over rounds of phase p's rate over phase q's in the same round. */
static double pair_ratio_median(double rate[PHASES][MAX_ROUNDS], int p, int q, int n) {
  double ratio[MAX_ROUNDS];
  for (int r = 0; r < n; r++) ratio[r] = rate[q][r] > 0 ? rate[p][r] / rate[q][r] : 0;
  return bench_median(ratio, n);
}

/* Median over rounds of phase p's ratio to the raw rate around it. */
static double ratio_median(double rate[PHASES][MAX_ROUNDS], double base[PHASES][MAX_ROUNDS], int p,
                           int n) {
  double ratio[MAX_ROUNDS];
  for (int r = 0; r < n; r++) ratio[r] = rate[p][r] / base[p][r];
  return bench_median(ratio, n);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: dataloader_bench ADDR WORK [SECONDS] [ENCODER VOCAB TEXT]\n");
    return 2;
  }
  const char *addr = argv[1], *work = argv[2];
  double seconds = argc > 3 ? atof(argv[3]) : 10;
  int n_rounds = getenv("BENCH_ROUNDS") ? atoi(getenv("BENCH_ROUNDS")) : 8;
  if (n_rounds < 1 || n_rounds > MAX_ROUNDS) n_rounds = 8;
  uint64_t corpus_tokens;
  write_corpora(work, &corpus_tokens);
  struct mapped m;
  map_large(work, &m);
  struct dl *small, *large;
  fprintf(stderr, "first batch...\n");
  double first_small = first_batch_s(work, "small", "state-small", &small);
  double first_large = first_batch_s(work, "large", "state-large", &large);
  dl_close(small);
  struct grpc_stream shm = {0}, wire = {0};
  if (strcmp(addr, "-") != 0) {
    grpc_open(addr, work, false, &shm);
    grpc_open(addr, work, true, &wire);
  }
  double rate[PHASES][MAX_ROUNDS], base[PHASES][MAX_ROUNDS];
  struct tcp_stream tcp;
  tcp_open(&tcp);
  raw_tokens_per_s(&m); /* Faults the baseline's mapping in. */
  rounds(&m, large, &shm, &wire, &tcp, n_rounds, seconds, rate, base);
  tcp_close(&tcp);
  grpc_close(&shm);
  grpc_close(&wire);
  dl_close(large);
  double bpe = argc > 6 ? bpe_mb_per_s(argv[4], argv[5], argv[6]) : -1;
  char bpe_text[32] = "null";
  if (bpe >= 0) snprintf(bpe_text, sizeof(bpe_text), "%.2f", bpe);
  printf("{\"bench\":\"dataloader\",\"seq_len\":%d,\"global_batch\":%d,\"rounds\":%d,"
         "\"corpus_tokens\":%" PRIu64 ",\"corpus_bytes\":%" PRIu64
         ",\"raw_tokens_per_s\":%.0f,\"embedded_tokens_per_s\":%.0f,"
         "\"grpc_tokens_per_s\":%.0f,\"grpc_wire_tokens_per_s\":%.0f,\"embedded_ratio\":%.3f,"
         "\"grpc_ratio\":%.3f,\"grpc_wire_ratio\":%.3f,"
         "\"raw_random_tokens_per_s\":%.0f,\"tcp_tokens_per_s\":%.0f,"
         "\"embedded_random_ratio\":%.3f,"
         "\"grpc_wire_tcp_ratio\":%.3f,"
         "\"first_batch_s_small\":%.4f,\"first_batch_s_large\":%.4f,\"bpe_mb_per_s\":%s}\n",
         SEQ_LEN, GLOBAL_BATCH, n_rounds, corpus_tokens, corpus_tokens * 4,
         bench_median(rate[RAW], n_rounds), bench_median(rate[EMBEDDED], n_rounds),
         bench_median(rate[GRPC], n_rounds), bench_median(rate[WIRE], n_rounds),
         ratio_median(rate, base, EMBEDDED, n_rounds), ratio_median(rate, base, GRPC, n_rounds),
         ratio_median(rate, base, WIRE, n_rounds), bench_median(rate[RAW_RANDOM], n_rounds),
         bench_median(rate[TCP], n_rounds), pair_ratio_median(rate, EMBEDDED, RAW_RANDOM, n_rounds),
         pair_ratio_median(rate, WIRE, TCP, n_rounds), first_small, first_large, bpe_text);
  for (int f = 0; f < LARGE_FILES; f++) munmap((void *)m.p[f], m.len[f]);
  return 0;
}
