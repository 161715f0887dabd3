/*
 * dl_store: the dataloader's keys in RocksDB. Per job:
 *   "dlc/<job>"                       catalog entry (empty value)
 *   "dlj/<job>/cfg"                   configuration (dl_config_encode)
 *   "dlj/<job>/commits"               kept commits: step and each lane's position
 *   "dlj/<job>/snap/<lane><ver><k>"   lane snapshot at a committed position
 * (numbers big-endian). Every change is one synced batch, so a kill -9 leaves
 * either the old or the new state. Snapshots are caches of a pure function:
 * losing one costs replay time, never correctness. The reads are those
 * dl_load.c makes at open. Keys only: this file knows no job table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dl_codec.h"
#include "dl_internal.h"
#include "stk_error.h"

#define KEY_MAX 200

static size_t key_job(char *out, const char *job, const char *suffix) {
  return (size_t)snprintf(out, KEY_MAX, "dlj/%s/%s", job, suffix);
}

static size_t key_snap(uint8_t *out, const char *job, uint32_t lane, uint64_t ver_id, uint64_t k) {
  size_t n = key_job((char *)out, job, "snap/");
  uint8_t be[8];
  kv_put_u64be(be, lane);
  memcpy(out + n, be + 4, 4);
  kv_put_u64be(out + n + 4, ver_id);
  kv_put_u64be(out + n + 12, k);
  return n + 20;
}

static void encode_commits(const struct dl_job *j, const struct dl_commit *list, uint32_t n,
                           struct dl_wbuf *w) {
  dl_w_u32(w, n);
  dl_w_u32(w, j->C);
  for (uint32_t i = 0; i < n; i++) {
    dl_w_u64(w, (uint64_t)list[i].step);
    for (uint32_t c = 0; c < j->C; c++) {
      dl_w_u64(w, list[i].ver_id[c]);
      dl_w_u64(w, list[i].k[c]);
    }
  }
}

static void put_commits(struct kv_batch *b, const struct dl_job *j, const struct dl_commit *list,
                        uint32_t n, const struct dl_commit *cur, uint8_t *const *blobs,
                        const size_t *lens) {
  struct dl_wbuf w = {0};
  char key[KEY_MAX];
  encode_commits(j, list, n, &w);
  kv_batch_put(b, key, key_job(key, j->name, "commits"), w.data, w.len);
  free(w.data);
  for (uint32_t c = 0; cur && c < j->C; c++) {
    uint8_t sk[KEY_MAX + 24];
    if (!blobs[c]) continue; /* a lane another part serves */
    kv_batch_put(b, sk, key_snap(sk, j->name, c, cur->ver_id[c], cur->k[c]), blobs[c], lens[c]);
  }
}

static bool kept(const struct dl_commit *list, uint32_t n, uint32_t c, uint64_t ver, uint64_t k) {
  for (uint32_t i = 0; i < n; i++)
    if (list[i].ver_id[c] == ver && list[i].k[c] == k) return true;
  return false;
}

int dl_store_commit(struct dl *dl, struct dl_job *j, const struct dl_commit *list, uint32_t n,
                    uint8_t *const *blobs, const size_t *lens, const struct dl_commit *drop,
                    uint32_t n_drop) {
  struct kv_batch *b = kv_batch_new();
  if (!b) return STK_ENOMEM;
  put_commits(b, j, list, n, &list[n - 1], blobs, lens);
  for (uint32_t i = 0; i < n_drop; i++)
    for (uint32_t c = 0; c < j->C; c++) {
      if (kept(list, n, c, drop[i].ver_id[c], drop[i].k[c])) continue;
      uint8_t sk[KEY_MAX + 24];
      kv_batch_delete(b, sk, key_snap(sk, j->name, c, drop[i].ver_id[c], drop[i].k[c]));
    }
  int rc = kv_write(dl->kv, b, true);
  kv_batch_free(b);
  return rc;
}

int dl_store_put_config(struct dl *dl, struct dl_job *j, bool is_new) {
  uint8_t *cfg;
  size_t len;
  int rc = dl_config_encode(j, &cfg, &len);
  if (rc < 0) return rc;
  struct kv_batch *b = kv_batch_new();
  char key[KEY_MAX];
  if (!b) {
    free(cfg);
    return STK_ENOMEM;
  }
  kv_batch_put(b, key, key_job(key, j->name, "cfg"), cfg, len);
  if (is_new) kv_batch_put(b, key, (size_t)snprintf(key, KEY_MAX, "dlc/%s", j->name), "", 0);
  rc = kv_write(dl->kv, b, true);
  kv_batch_free(b);
  free(cfg);
  return rc;
}

int dl_store_replace(struct dl *dl, struct dl_job *j, const struct dl_commit *c,
                     uint8_t *const *blobs, const size_t *lens) {
  uint8_t *cfg;
  size_t len;
  int rc = dl_config_encode(j, &cfg, &len);
  if (rc < 0) return rc;
  struct kv_batch *b = kv_batch_new();
  if (!b) {
    free(cfg);
    return STK_ENOMEM;
  }
  char begin[KEY_MAX], end[KEY_MAX], key[KEY_MAX];
  size_t nb = key_job(begin, j->name, ""), ne = key_job(end, j->name, "");
  end[ne - 1] = '/' + 1;
  kv_batch_delete_range(b, begin, nb, end, ne);
  kv_batch_put(b, key, key_job(key, j->name, "cfg"), cfg, len);
  kv_batch_put(b, key, (size_t)snprintf(key, KEY_MAX, "dlc/%s", j->name), "", 0);
  put_commits(b, j, c, 1, c, blobs, lens);
  rc = kv_write(dl->kv, b, true);
  kv_batch_free(b);
  free(cfg);
  return rc;
}

static int decode_commits(struct dl_job *j, const uint8_t *p, size_t len) {
  struct dl_rbuf r = {.p = p, .left = len};
  uint32_t n = dl_r_u32(&r), C = dl_r_u32(&r);
  if (r.failed || C != j->C || n > r.left / 8) return STK_ECORRUPT;
  if (!(j->commits = calloc(n + 1, sizeof *j->commits))) return STK_ENOMEM;
  for (uint32_t i = 0; i < n; i++) {
    struct dl_commit *c = &j->commits[i];
    c->step = (int64_t)dl_r_u64(&r);
    c->ver_id = calloc(C, sizeof *c->ver_id);
    c->k = calloc(C, sizeof *c->k);
    j->n_commits = i + 1;
    if (!c->ver_id || !c->k) return STK_ENOMEM;
    for (uint32_t l = 0; l < C; l++) {
      c->ver_id[l] = dl_r_u64(&r);
      c->k[l] = dl_r_u64(&r);
    }
  }
  return r.failed ? STK_ECORRUPT : 0;
}

int dl_store_get_commits(struct dl *dl, struct dl_job *j) {
  char key[KEY_MAX];
  void *val;
  size_t len;
  int rc = kv_get(dl->kv, NULL, key, key_job(key, j->name, "commits"), &val, &len);
  if (rc == STK_ENOENT) return 0;
  if (rc < 0) return rc;
  rc = decode_commits(j, val, len);
  free(val);
  return rc;
}

int dl_store_get_snap(struct dl *dl, const char *job, uint32_t lane, uint64_t ver_id, uint64_t k,
                      void **ret_val, size_t *ret_len) {
  uint8_t sk[KEY_MAX + 24];
  return kv_get(dl->kv, NULL, sk, key_snap(sk, job, lane, ver_id, k), ret_val, ret_len);
}

int dl_store_get_config(struct dl *dl, const char *job, void **ret_val, size_t *ret_len) {
  char key[KEY_MAX];
  return kv_get(dl->kv, NULL, key, key_job(key, job, "cfg"), ret_val, ret_len);
}

int dl_store_delete(struct dl *dl, const char *job) {
  struct kv_batch *b = kv_batch_new();
  if (!b) return STK_ENOMEM;
  char begin[KEY_MAX], end[KEY_MAX], key[KEY_MAX];
  size_t nb = key_job(begin, job, ""), ne = key_job(end, job, "");
  end[ne - 1] = '/' + 1;
  kv_batch_delete_range(b, begin, nb, end, ne);
  kv_batch_delete(b, key, (size_t)snprintf(key, KEY_MAX, "dlc/%s", job));
  int rc = kv_write(dl->kv, b, true);
  kv_batch_free(b);
  return rc;
}

int dl_store_each_job(struct dl *dl, int (*fn)(struct dl *dl, const char *name)) {
  struct kv_iter *it;
  int rc = kv_iter_prefix(dl->kv, NULL, "dlc/", 4, &it);
  if (rc < 0) return rc;
  for (; rc == 0 && kv_iter_valid(it); kv_iter_next(it)) {
    size_t klen;
    const char *k = kv_iter_key(it, &klen);
    char name[KEY_MAX];
    if (klen - 4 >= sizeof name) continue;
    memcpy(name, k + 4, klen - 4);
    name[klen - 4] = 0;
    rc = fn(dl, name);
  }
  if (rc == 0) rc = kv_iter_error(it);
  kv_iter_free(it);
  return rc;
}
