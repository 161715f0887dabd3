/*
 * dl_stream_helper: the C client's side of the Python benchmark
 * (python_bench.py). Streams one rank's batches of an existing loader job
 * (rank 0 of 1, from step 0) with stk_batch_stream_* from the daemon at
 * ADDR, tokens through the shared-memory ring as for any trainer on the
 * daemon's host, and runs timed phases on command, so that the Python
 * benchmark can interleave them with its own phases in rounds:
 *
 *   dl_stream_helper ADDR JOB PREFETCH [TOKEN_BYTES]
 *
 * TOKEN_BYTES 8 streams int64 tokens (stk_batch_stream_open_opts: the
 * daemon writes them into the ring as a PyTorch loop needs them); 4, the
 * default, uint32 as a C trainer takes them.
 *
 * Prints "ready" once the stream delivered its first batch; then reads one
 * number per line on stdin, SECONDS, streams for that long (touching a few
 * tokens of each batch, as the Python loop does) and prints
 * "TOKENS SECONDS BATCHES". Between phases it waits on stdin: the server
 * fills the stream's prefetch and idles. EOF on stdin ends it.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_stats.h"
#include "stoker_loader.h"

static int fail(const char *what, int err) {
  fprintf(stderr, "dl_stream_helper: %s: %s (%s)\n", what, stk_strerror(err),
          stk_client_last_error(NULL));
  return 1;
}

/* One batch from the stream, a few of its tokens read (the sum goes to
 * *touch so the reads stay). */
static int take(struct stk_batch_stream *s, uint64_t *tokens, uint64_t *touch) {
  struct stk_batch b;
  int err = stk_batch_stream_next(s, 60000, &b);
  if (err < 0) return err;
  const int64_t *wide = stk_batch_tokens_i64(&b);
  for (uint32_t l = 0; l < b.lines; l++) {
    size_t at = (size_t)l * b.line_tokens;
    *touch += wide ? (uint64_t)wide[at] : b.tokens[at];
  }
  *tokens += (uint64_t)b.lines * b.line_tokens;
  stk_batch_free(&b);
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 4 && argc != 5) {
    fprintf(stderr, "usage: dl_stream_helper ADDR JOB PREFETCH [TOKEN_BYTES]\n");
    return 2;
  }
  struct stk_batch_stream_opts so = {.prefetch = (uint32_t)atoi(argv[3]),
                                     .token_bytes = argc == 5 ? (uint32_t)atoi(argv[4]) : 4};
  struct stk_client_opts o = {.address = argv[1], .default_timeout_ms = 120000};
  struct stk_client *client;
  struct stk_batch_stream *stream;
  int err = stk_loader_connect(&o, &client);
  if (err < 0) return fail("connect", err);
  err = stk_batch_stream_open_opts(client, argv[2], 0, 0, 1, &so, &stream);
  if (err < 0) return fail("stream", err);
  uint64_t tokens = 0, touch = 0;
  if ((err = take(stream, &tokens, &touch)) < 0) return fail("first batch", err);
  printf("ready\n");
  fflush(stdout);
  double seconds;
  while (scanf("%lf", &seconds) == 1) {
    uint64_t batches = 0;
    tokens = 0;
    double t0 = bench_now_s(), t;
    do {
      if ((err = take(stream, &tokens, &touch)) < 0) return fail("batch", err);
      batches++;
      t = bench_now_s() - t0;
    } while (t < seconds);
    printf("%" PRIu64 " %.6f %" PRIu64 "\n", tokens, t, batches);
    fflush(stdout);
  }
  fprintf(stderr, "dl_stream_helper: done (touch %" PRIu64 ")\n", touch);
  stk_batch_stream_free(stream);
  stk_client_free(client);
  return 0;
}
