/*
 * ckpt_svc_fixture: what the checkpoint service tests share: a service on
 * its own loop over temp directories, blocking wrappers around the
 * asynchronous calls, a synthetic model (2-D dim0-sharded tensors, 1-D FSDP
 * flat shards, a scalar, per-rank blobs) whose every byte is a function of
 * (tensor, byte index), writers that honour back-pressure, and a reader
 * that assembles a wanted box from the streamed pieces.
 */
#ifndef STK_TEST_CKPT_SVC_FIXTURE_H
#define STK_TEST_CKPT_SVC_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "ckpt_box.h"
#include "ckpt_service.h"

struct fx {
  uv_loop_t loop;
  char dir[96];   /* Temp root. */
  char db[128];   /* dir/db */
  char data[128]; /* dir/data (the file:// root) */
  char url[160];
  struct ckpt_service_opts opts;
  struct ckpt_service *svc;
  int hooks; /* Commit hook calls. */
  int64_t hook_step;
  int abort_hooks; /* Abort hook calls. */
  int64_t abort_step;
  char abort_reason[320];
};

enum tkind { T_DIM0, T_FLAT, T_SCALAR, T_BLOB };

struct tspec {
  char name[64];
  int dtype;
  enum tkind kind;
  uint32_t owner; /* T_BLOB: the rank that writes it. */
  struct ckpt_shape shape;
  uint64_t bytes;
  uint8_t *full; /* Every byte, row-major. */
};

struct model {
  struct tspec *t;
  size_t n;
};

void fx_init(struct fx *f);  /* Temp dirs, loop, default options. */
int fx_open(struct fx *f);   /* Opens f->svc with f->opts. */
void fx_close(struct fx *f); /* Closes f->svc and runs the loop until done. */
void fx_fini(struct fx *f);  /* fx_close if open, loop close, rm -rf. */

int fx_begin(struct fx *f, const char *job, int64_t step, uint32_t world, char ret_attempt[65]);
/* ckpt_commit; ret_msg (may be NULL) gets the error text. */
int fx_commit(struct fx *f, const char *attempt, char *ret_msg, size_t msg_len);
/* Steps listed (at most max). */
int fx_list(struct fx *f, const char *job, int64_t *ret_steps, size_t max, size_t *ret_n);
/* One page of List (token NULL: the first); ret_next gets its
 * next_page_token, or the error text on failure. */
int fx_list_page(struct fx *f, const char *job, uint32_t page_size, const char *token,
                 int64_t *ret_steps, size_t max, size_t *ret_n, char ret_next[128]);
int fx_verify(struct fx *f, const char *job, int64_t step, uint64_t *ret_problems);
int fx_delete(struct fx *f, const char *job, int64_t step);

struct model *model_new(uint32_t world, uint64_t flat_numel, uint64_t seed);
/* n f32 tensors of rows x cols, each sharded by dim 0 as FSDP shards its
 * parameters and optimizer state: many small chunks per rank. */
struct model *model_new_fsdp(uint32_t n, uint64_t rows, uint64_t cols, uint64_t seed);
void model_free(struct model *m);

struct write_opts {
  uint32_t world;
  int64_t skip_last_rank; /* This rank never sends "last" (-1: none). */
  bool close_after_staged;
  uint64_t max_chunk_bytes; /* Boxes are split to at most this; 1 MiB default. */
};
/* Writes every rank's share of m, ranks interleaved chunk by chunk,
 * re-feeding on CKPT_WRITE_WAIT. Returns the first error. ret_waits counts
 * WAIT answers (may be NULL). */
int fx_write_model(struct fx *f, const char *attempt, const struct model *m,
                   const struct write_opts *wo, uint64_t *ret_waits);

/* One chunk of a 1-D tensor of dim elements: rank's box [off, off + size)
 * with data_len zero bytes (a count that need not match the box: hostile
 * tests send wrong ones). */
struct chunk_1d {
  const char *attempt;
  uint32_t rank;
  const char *tensor;
  int dtype;
  uint64_t dim, off, size;
  size_t data_len;
  bool last;
};
/* Feeds c to w: ckpt_write_feed's answer. */
int fx_feed_1d(struct ckpt_writer *w, const struct chunk_1d *c);

/* Reads the wanted box of a tensor and compares it with the model's bytes:
 * 0 if equal, the read's error otherwise (msg gets its text), or -1000 when
 * the bytes differ. */
int fx_read_check(struct fx *f, const char *job, int64_t step, const struct tspec *t,
                  const struct ckpt_box *want, char *msg, size_t msg_len);
/* Reads rank's share of every tensor at world size `world` in ONE Read
 * call (as a restoring trainer does) and compares each box with the
 * model's bytes: 0, the read's error, or -1000 when bytes differ. */
int fx_read_rank(struct fx *f, const char *job, int64_t step, const struct model *m, uint32_t rank,
                 uint32_t world);
/* What a Read's stream held: messages, pieces, and the largest message
 * that listed several pieces (packed bytes). */
struct fx_read_counts {
  uint64_t messages, pieces, max_packed_bytes;
};
/* fx_read_rank, the request asking for pack_pieces or not; every message
 * is checked to have the form asked for (pack: pieces listed, fields 1-5
 * empty; else one piece, no list). ret_counts may be NULL. */
int fx_read_rank_counted(struct fx *f, const char *job, int64_t step, const struct model *m,
                         uint32_t rank, uint32_t world, bool pack,
                         struct fx_read_counts *ret_counts);
/* One rank's Read of its share of every tensor of m at world size world. */
struct fx_read {
  const char *job;
  int64_t step;
  const struct model *m;
  uint32_t rank, world;
};
/* Starts the n Reads (pack_pieces) at once, then runs the loop until all
 * ended; ret_rcs[i] is read i's answer as fx_read_rank's. Returns the
 * first nonzero one. */
int fx_read_together(struct fx *f, const struct fx_read *reads, size_t n, int *ret_rcs);
/* Reads back every tensor at world size `world` (dim0 and flat sharding). */
int fx_read_all(struct fx *f, const char *job, int64_t step, const struct model *m, uint32_t world);

/* Runs the loop until *flag, failing the test after timeout_ms. */
void fx_run_until(struct fx *f, const bool *flag, uint32_t timeout_ms);
/* The wall clock (CLOCK_REALTIME) in ms. */
int64_t fx_now_ms(void);
/* Runs the loop for ms of wall clock. */
void fx_run_for(struct fx *f, uint32_t ms);

#endif
