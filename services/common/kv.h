/*
 * kv: the one place that talks to RocksDB. Every daemon keeps its state
 * through this wrapper: open a database directory, write batches (synced
 * when the change is about to be acknowledged), point reads, prefix
 * iteration, and snapshots for consistent multi-key reads. RocksDB's
 * errptr strings become STK_E* codes here, with the text kept as the
 * thread's stk_detail().
 *
 * Thread safety: a struct kv may be used from any thread at once (RocksDB
 * is thread-safe); a batch, iterator or snapshot belongs to one thread.
 */
#ifndef STK_KV_H
#define STK_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kv;
struct kv_batch;
struct kv_iter;
struct kv_snapshot;

struct kv_opts {
  bool create_if_missing;   /* Create the directory's database if absent. */
  size_t block_cache_bytes; /* 0: RocksDB's default. */
  bool paranoid_checks;     /* Fail on any corruption found at open. */
  /* Reads only at open (a state loaded into memory, then written to):
   * the memtable is an unsorted vector, sorted once when flushed or read,
   * instead of a skiplist that sorts every insert. */
  bool write_mostly;
  /* Bytes a memtable holds before it is flushed (RocksDB keeps up to two:
   * one filling, one flushing); 0: RocksDB's default, 64 MiB. */
  size_t write_buffer_bytes;
};

/* Opens (creating the directory if needed) the database in dir. Errors:
 * STK_EIO (with detail), STK_ECORRUPT, STK_EBUSY (locked by another process). */
int kv_open(const char *dir, const struct kv_opts *opts, struct kv **ret_kv);

/* Flushes memtables and closes. Accepts NULL. */
void kv_close(struct kv *kv);

/* Reads a key. On success *ret_value is malloc'd (free() it) and
 * *ret_len set; STK_ENOENT when absent. snap may be NULL (latest). */
int kv_get(struct kv *kv, const struct kv_snapshot *snap, const void *key, size_t key_len,
           void **ret_value, size_t *ret_len);

/* Batches: changes applied atomically by kv_write. */
struct kv_batch *kv_batch_new(void);
void kv_batch_free(struct kv_batch *b);
void kv_batch_put(struct kv_batch *b, const void *key, size_t key_len, const void *value,
                  size_t value_len);
void kv_batch_delete(struct kv_batch *b, const void *key, size_t key_len);
/* Deletes every key in [begin, end). */
void kv_batch_delete_range(struct kv_batch *b, const void *begin, size_t begin_len, const void *end,
                           size_t end_len);
size_t kv_batch_count(const struct kv_batch *b);
void kv_batch_clear(struct kv_batch *b);

/* Applies a batch. sync=true returns only after the write-ahead log is
 * fsync'ed: the change survives kill -9 and power loss. */
int kv_write(struct kv *kv, struct kv_batch *b, bool sync);

/* Convenience single-key synced put and delete. */
int kv_put(struct kv *kv, const void *key, size_t key_len, const void *value, size_t value_len,
           bool sync);
int kv_delete(struct kv *kv, const void *key, size_t key_len, bool sync);

/* Iterates keys starting with prefix, in key order. snap may be NULL.
 * Usage: for (it = ...; kv_iter_valid(it); kv_iter_next(it)) ...; then
 * kv_iter_error(it) tells whether the scan ended early. */
int kv_iter_prefix(struct kv *kv, const struct kv_snapshot *snap, const void *prefix,
                   size_t prefix_len, struct kv_iter **ret_iter);
bool kv_iter_valid(const struct kv_iter *it);
void kv_iter_next(struct kv_iter *it);
/* Moves to the first key >= key (still within the prefix). */
void kv_iter_seek(struct kv_iter *it, const void *key, size_t key_len);
const void *kv_iter_key(const struct kv_iter *it, size_t *ret_len);
const void *kv_iter_value(const struct kv_iter *it, size_t *ret_len);
int kv_iter_error(const struct kv_iter *it);
void kv_iter_free(struct kv_iter *it);

/* A consistent view of the database at this instant. */
struct kv_snapshot *kv_snapshot_new(struct kv *kv);
void kv_snapshot_free(struct kv *kv, struct kv_snapshot *snap);

/* Big-endian u64 for ordered numeric key parts. */
static inline void kv_put_u64be(uint8_t *out, uint64_t v) {
  for (int i = 7; i >= 0; i--) {
    out[i] = (uint8_t)(v & 0xff);
    v >>= 8;
  }
}
static inline uint64_t kv_get_u64be(const uint8_t *in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = (v << 8) | in[i];
  return v;
}

#endif
