/*
 * ckpt_fetch: ranged GETs of checkpoint objects shared by the reads that
 * want the same bytes at once, so that the ranks of one restore (each a
 * Read, all arriving together, their boxes crossing the same saved rank's
 * object) fetch each range once instead of once per rank. See ckpt_fetch.c.
 */
#ifndef STK_CKPT_FETCH_H
#define STK_CKPT_FETCH_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt_pool.h"

struct ckpt_fetches;
struct ckpt_fetch;

/* Bytes of one object a read wants fetched: [offset, offset + len) of the
 * object stored at key (its full storage key: job, step, attempt and
 * object), whole CRC blocks, with the manifest's CRCs of those blocks. */
struct ckpt_fetch_want {
  const char *key;
  uint64_t offset, len;
  uint64_t object_bytes; /* The object's size, as its manifest says. */
  const uint32_t *crcs;  /* CRCs of the blocks from offset / block_bytes on. */
  size_t n_crcs;         /* Blocks the range touches. */
};

/* How ckpt_fetch_claim answered. */
enum ckpt_fetch_how {
  CKPT_FETCH_GET,   /* A new fetch: the caller GETs into its bytes and ends it. */
  CKPT_FETCH_READY, /* Another read's fetch, its bytes checked: use them. */
  CKPT_FETCH_WAIT,  /* Another read's fetch, its GET out: the caller's task
                     * parks and is resumed on pool when that fetch ends. */
};

struct ckpt_fetch_counts {
  uint64_t gets;       /* Fetches made (a GET each). */
  uint64_t shared;     /* Claims answered by a fetch another claim made. */
  uint64_t held_bytes; /* Bytes of the fetches held now. */
};

/* A table of fetches of objects cut into CRC blocks of block_bytes; a
 * fetch is freed when its last holder lets go. */
int ckpt_fetches_new(uint64_t block_bytes, struct ckpt_fetches **ret);
/* Accepts NULL. Nothing may be held. */
void ckpt_fetches_free(struct ckpt_fetches *c);

/*
 * The fetch for w, held by the caller until ckpt_fetch_release (*ret, set
 * before any other thread can resume waiter). A fetch of the same key that
 * covers w's range, of an object of the same size whose CRCs over w's
 * blocks are w's, answers READY (its bytes passed their CRC check) or WAIT
 * (its GET is out: waiter, the calling task, is queued, and the caller must
 * park it and touch neither it nor *ret until it runs again). Otherwise a
 * new fetch of exactly w's range answers GET, its bytes allocated: the
 * caller fetches and checks them and ends it (ckpt_fetch_end). Any thread.
 * 0 or STK_ENOMEM.
 */
int ckpt_fetch_claim(struct ckpt_fetches *c, const struct ckpt_fetch_want *w,
                     struct ckpt_task *waiter, struct ckpt_fetch **ret,
                     enum ckpt_fetch_how *ret_how);

/* The bytes of w's range in a fetch claimed for it (at w->offset). */
uint8_t *ckpt_fetch_bytes(struct ckpt_fetch *f, uint64_t offset);

/* Ends a fetch claimed with GET: err 0 when its bytes passed their CRC
 * check (from then on shared), else the error and its text (the fetch is
 * dropped from the table: the next claim fetches again). Resumes the
 * waiting tasks on pool. Any thread. */
void ckpt_fetch_end(struct ckpt_fetches *c, struct ckpt_fetch *f, int err, const char *msg,
                    struct ckpt_pool *pool);

/* An ended fetch's error (0: its bytes are good) and its text. */
int ckpt_fetch_error(const struct ckpt_fetch *f, char *msg, size_t len);

/* Lets go of a claimed fetch (NULL: nothing). Any thread. */
void ckpt_fetch_release(struct ckpt_fetches *c, struct ckpt_fetch *f);

void ckpt_fetches_get_counts(struct ckpt_fetches *c, struct ckpt_fetch_counts *ret);

#endif
