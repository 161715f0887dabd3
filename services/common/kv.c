/*
 * kv over RocksDB's C API. Every daemon's durable state goes through here,
 * so this file is the single place where RocksDB's errptr strings become
 * STK_E* codes (with the text kept as the thread's stk_detail()), where the
 * open options are chosen (create if missing, WAL on, LZ4), and where a
 * prefix scan is bounded so that callers never see a key outside it.
 */
#include "kv.h"

#include <errno.h>
#include <fcntl.h>
#include <rocksdb/c.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "stk_error.h"

struct kv {
  rocksdb_t *db;
  rocksdb_options_t *opts;
  rocksdb_block_based_table_options_t *table_opts;
  rocksdb_cache_t *cache; /* NULL: RocksDB's default cache. */
  rocksdb_readoptions_t *read_latest;
  rocksdb_writeoptions_t *write_sync;
  rocksdb_writeoptions_t *write_async;
};

struct kv_batch {
  rocksdb_writebatch_t *wb;
};

struct kv_snapshot {
  const rocksdb_snapshot_t *snap;
  rocksdb_readoptions_t *read; /* Reads through this snapshot. */
};

struct kv_iter {
  rocksdb_iterator_t *it;
  rocksdb_readoptions_t *read; /* Owns the upper bound's lifetime. */
  uint8_t *prefix;
  size_t prefix_len;
  uint8_t *upper; /* Prefix successor; NULL when the prefix has none. */
  size_t upper_len;
};

/* Maps a RocksDB status text to an error code, keeps the text as the
 * detail and frees it. */
static int translate(char *errptr) {
  int err = STK_EIO;
  if (strstr(errptr, "lock") || strstr(errptr, "LOCK")) {
    if (strstr(errptr, "Resource temporarily unavailable") ||
        strstr(errptr, "lock hold by current process") || strstr(errptr, "No locks available"))
      err = STK_EBUSY;
  }
  if (strncmp(errptr, "Corruption", 10) == 0) err = STK_ECORRUPT;
  if (strncmp(errptr, "Invalid argument", 16) == 0 && strstr(errptr, "does not exist"))
    err = STK_ENOENT;
  stk_set_detail("%s", errptr);
  rocksdb_free(errptr);
  return err;
}

/* RocksDB holds DIR/LOCK with a POSIX record lock (fcntl F_SETLK) while
 * the database is open: F_GETLK names the process holding it, so a second
 * daemon started on the same directory can say whom it collided with.
 * When RocksDB says this process holds it (ours), the file is left alone:
 * closing any descriptor of it would drop this process's lock. */
static void describe_lock(const char *dir, bool ours) {
  if (ours) {
    stk_set_detail("the data directory %s is already open in this process", dir);
    return;
  }
  char path[4096];
  snprintf(path, sizeof(path), "%s/LOCK", dir);
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  bool known = fd >= 0 && fcntl(fd, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK && fl.l_pid > 0;
  if (fd >= 0) close(fd);
  if (known)
    stk_set_detail("the data directory %s is locked by process %d", dir, (int)fl.l_pid);
  else
    stk_set_detail("the data directory %s is locked by another process", dir);
}

/* mkdir -p: RocksDB creates only the last path component. */
static int make_dirs(const char *dir) {
  char *path = strdup(dir);
  if (!path) return STK_ENOMEM;
  for (char *p = path + 1;; p++) {
    if (*p != '/' && *p != '\0') continue;
    char saved = *p;
    *p = '\0';
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
      stk_set_detail("mkdir %s: %s", path, strerror(errno));
      free(path);
      return STK_EIO;
    }
    *p = saved;
    if (saved == '\0') break;
  }
  free(path);
  return 0;
}

static void kv_release(struct kv *kv) {
  if (kv->read_latest) rocksdb_readoptions_destroy(kv->read_latest);
  if (kv->write_sync) rocksdb_writeoptions_destroy(kv->write_sync);
  if (kv->write_async) rocksdb_writeoptions_destroy(kv->write_async);
  if (kv->opts) rocksdb_options_destroy(kv->opts);
  if (kv->table_opts) rocksdb_block_based_options_destroy(kv->table_opts);
  if (kv->cache) rocksdb_cache_destroy(kv->cache);
  free(kv);
}

static void configure(struct kv *kv, const struct kv_opts *o) {
  kv->opts = rocksdb_options_create();
  rocksdb_options_set_create_if_missing(kv->opts, o && o->create_if_missing);
  rocksdb_options_set_paranoid_checks(kv->opts, o && o->paranoid_checks);
  rocksdb_options_set_compression(kv->opts, rocksdb_lz4_compression);
  rocksdb_options_set_keep_log_file_num(kv->opts, 4);
  if (o && o->write_mostly) {
    rocksdb_options_set_memtable_vector_rep(kv->opts);
    rocksdb_options_set_allow_concurrent_memtable_write(kv->opts, 0); /* The vector's rule. */
  }
  if (o && o->write_buffer_bytes)
    rocksdb_options_set_write_buffer_size(kv->opts, o->write_buffer_bytes);
  kv->table_opts = rocksdb_block_based_options_create();
  if (o && o->block_cache_bytes) {
    kv->cache = rocksdb_cache_create_lru(o->block_cache_bytes);
    rocksdb_block_based_options_set_block_cache(kv->table_opts, kv->cache);
  }
  rocksdb_options_set_block_based_table_factory(kv->opts, kv->table_opts);
  kv->read_latest = rocksdb_readoptions_create();
  kv->write_sync = rocksdb_writeoptions_create();
  rocksdb_writeoptions_set_sync(kv->write_sync, 1);
  kv->write_async = rocksdb_writeoptions_create();
}

int kv_open(const char *dir, const struct kv_opts *opts, struct kv **ret_kv) {
  if (!dir || !*dir || !ret_kv) return STK_EINVAL;
  if (opts && opts->create_if_missing) {
    int rc = make_dirs(dir);
    if (rc) return rc;
  }
  struct kv *kv = calloc(1, sizeof(*kv));
  if (!kv) return STK_ENOMEM;
  configure(kv, opts);
  char *err = NULL;
  kv->db = rocksdb_open(kv->opts, dir, &err);
  if (err) {
    kv_release(kv);
    bool ours = strstr(err, "lock hold by current process") != NULL;
    int rc = translate(err);
    if (rc == STK_EBUSY) describe_lock(dir, ours);
    return rc;
  }
  *ret_kv = kv;
  return 0;
}

void kv_close(struct kv *kv) {
  if (!kv) return;
  rocksdb_flushoptions_t *fo = rocksdb_flushoptions_create();
  rocksdb_flushoptions_set_wait(fo, 1);
  char *err = NULL;
  rocksdb_flush(kv->db, fo, &err);
  if (err) rocksdb_free(err); /* The WAL still holds everything. */
  rocksdb_flushoptions_destroy(fo);
  rocksdb_close(kv->db);
  kv_release(kv);
}

int kv_get(struct kv *kv, const struct kv_snapshot *snap, const void *key, size_t key_len,
           void **ret_value, size_t *ret_len) {
  const rocksdb_readoptions_t *ro = snap ? snap->read : kv->read_latest;
  char *err = NULL;
  rocksdb_pinnableslice_t *v = rocksdb_get_pinned(kv->db, ro, key, key_len, &err);
  if (err) return translate(err);
  if (!v) return STK_ENOENT;
  size_t len = 0;
  const char *data = rocksdb_pinnableslice_value(v, &len);
  void *copy = malloc(len ? len : 1);
  if (!copy) {
    rocksdb_pinnableslice_destroy(v);
    return STK_ENOMEM;
  }
  if (len) memcpy(copy, data, len);
  rocksdb_pinnableslice_destroy(v);
  *ret_value = copy;
  *ret_len = len;
  return 0;
}

struct kv_batch *kv_batch_new(void) {
  struct kv_batch *b = malloc(sizeof(*b));
  if (!b) return NULL;
  b->wb = rocksdb_writebatch_create();
  return b;
}

void kv_batch_free(struct kv_batch *b) {
  if (!b) return;
  rocksdb_writebatch_destroy(b->wb);
  free(b);
}

void kv_batch_put(struct kv_batch *b, const void *key, size_t key_len, const void *value,
                  size_t value_len) {
  rocksdb_writebatch_put(b->wb, key, key_len, value, value_len);
}

void kv_batch_delete(struct kv_batch *b, const void *key, size_t key_len) {
  rocksdb_writebatch_delete(b->wb, key, key_len);
}

void kv_batch_delete_range(struct kv_batch *b, const void *begin, size_t begin_len, const void *end,
                           size_t end_len) {
  rocksdb_writebatch_delete_range(b->wb, begin, begin_len, end, end_len);
}

size_t kv_batch_count(const struct kv_batch *b) {
  return (size_t)rocksdb_writebatch_count(b->wb);
}

void kv_batch_clear(struct kv_batch *b) {
  rocksdb_writebatch_clear(b->wb);
}

int kv_write(struct kv *kv, struct kv_batch *b, bool sync) {
  char *err = NULL;
  rocksdb_write(kv->db, sync ? kv->write_sync : kv->write_async, b->wb, &err);
  return err ? translate(err) : 0;
}

int kv_put(struct kv *kv, const void *key, size_t key_len, const void *value, size_t value_len,
           bool sync) {
  char *err = NULL;
  rocksdb_put(kv->db, sync ? kv->write_sync : kv->write_async, key, key_len, value, value_len,
              &err);
  return err ? translate(err) : 0;
}

int kv_delete(struct kv *kv, const void *key, size_t key_len, bool sync) {
  char *err = NULL;
  rocksdb_delete(kv->db, sync ? kv->write_sync : kv->write_async, key, key_len, &err);
  return err ? translate(err) : 0;
}

struct kv_snapshot *kv_snapshot_new(struct kv *kv) {
  struct kv_snapshot *s = malloc(sizeof(*s));
  if (!s) return NULL;
  s->snap = rocksdb_create_snapshot(kv->db);
  s->read = rocksdb_readoptions_create();
  rocksdb_readoptions_set_snapshot(s->read, s->snap);
  return s;
}

void kv_snapshot_free(struct kv *kv, struct kv_snapshot *snap) {
  if (!snap) return;
  rocksdb_readoptions_destroy(snap->read);
  rocksdb_release_snapshot(kv->db, snap->snap);
  free(snap);
}

/* The smallest key greater than every key starting with prefix: the prefix
 * with trailing 0xff bytes dropped and its last byte incremented. Returns
 * false when there is none (empty or all-0xff prefix). */
static bool prefix_successor(const uint8_t *prefix, size_t len, uint8_t **ret, size_t *ret_len) {
  while (len > 0 && prefix[len - 1] == 0xff) len--;
  if (len == 0) return false;
  uint8_t *s = malloc(len);
  if (!s) return false;
  memcpy(s, prefix, len);
  s[len - 1]++;
  *ret = s;
  *ret_len = len;
  return true;
}

int kv_iter_prefix(struct kv *kv, const struct kv_snapshot *snap, const void *prefix,
                   size_t prefix_len, struct kv_iter **ret_iter) {
  struct kv_iter *it = calloc(1, sizeof(*it));
  if (!it) return STK_ENOMEM;
  it->prefix = malloc(prefix_len ? prefix_len : 1);
  if (!it->prefix) {
    free(it);
    return STK_ENOMEM;
  }
  if (prefix_len) memcpy(it->prefix, prefix, prefix_len);
  it->prefix_len = prefix_len;
  it->read = rocksdb_readoptions_create();
  if (snap) rocksdb_readoptions_set_snapshot(it->read, snap->snap);
  if (prefix_successor(it->prefix, prefix_len, &it->upper, &it->upper_len))
    rocksdb_readoptions_set_iterate_upper_bound(it->read, (const char *)it->upper, it->upper_len);
  it->it = rocksdb_create_iterator(kv->db, it->read);
  rocksdb_iter_seek(it->it, (const char *)it->prefix, prefix_len);
  *ret_iter = it;
  return 0;
}

bool kv_iter_valid(const struct kv_iter *it) {
  if (!rocksdb_iter_valid(it->it)) return false;
  size_t len = 0;
  const char *key = rocksdb_iter_key(it->it, &len);
  /* The upper bound already stops the scan; this also covers prefixes
   * without a successor. */
  return len >= it->prefix_len && memcmp(key, it->prefix, it->prefix_len) == 0;
}

void kv_iter_next(struct kv_iter *it) {
  rocksdb_iter_next(it->it);
}

void kv_iter_seek(struct kv_iter *it, const void *key, size_t key_len) {
  size_t n = key_len < it->prefix_len ? key_len : it->prefix_len;
  int cmp = memcmp(key, it->prefix, n);
  if (cmp < 0 || (cmp == 0 && key_len < it->prefix_len))
    rocksdb_iter_seek(it->it, (const char *)it->prefix, it->prefix_len);
  else
    rocksdb_iter_seek(it->it, key, key_len);
}

const void *kv_iter_key(const struct kv_iter *it, size_t *ret_len) {
  if (!kv_iter_valid(it)) return NULL;
  return rocksdb_iter_key(it->it, ret_len);
}

const void *kv_iter_value(const struct kv_iter *it, size_t *ret_len) {
  if (!kv_iter_valid(it)) return NULL;
  return rocksdb_iter_value(it->it, ret_len);
}

int kv_iter_error(const struct kv_iter *it) {
  char *err = NULL;
  rocksdb_iter_get_error(it->it, &err);
  return err ? translate(err) : 0;
}

void kv_iter_free(struct kv_iter *it) {
  if (!it) return;
  rocksdb_iter_destroy(it->it);
  rocksdb_readoptions_destroy(it->read);
  free(it->upper);
  free(it->prefix);
  free(it);
}
