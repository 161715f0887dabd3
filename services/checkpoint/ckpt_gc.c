/*
 * ckpt_gc: removing checkpoints and leftovers (blocking, worker threads).
 *
 * Deleting a committed checkpoint journals the intent (D/ record, and the
 * C/ record goes in the same synced batch), deletes the manifest first (the
 * checkpoint stops existing), then its objects, then the intent; recovery
 * finishes an interrupted deletion. Orphan upload GC aborts the multipart uploads under
 * the service's prefix that no open attempt owns once they are older than
 * a grace period: an upload begun just before a crash, before its upload
 * id reached the journal, is otherwise never aborted and its parts are
 * kept (and billed) forever.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_journal.h"
#include "ckpt_manifest.h"
#include "ckpt_service_int.h"
#include "stk_error.h"

static int collect(void *arg, const char *key, uint64_t size) {
  (void)size;
  struct ckpt_keylist *l = arg;
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 32;
    char **k = realloc(l->keys, cap * sizeof(*k));
    if (!k) return STK_ENOMEM;
    l->keys = k;
    l->cap = cap;
  }
  if (!(l->keys[l->n] = strdup(key))) return STK_ENOMEM;
  l->n++;
  return 0;
}

int ckpt_keylist_list(struct ckpt_service *s, const char *prefix, struct ckpt_keylist *l) {
  return storage_list(s->st, prefix, collect, l);
}

void ckpt_keylist_free(struct ckpt_keylist *l) {
  for (size_t i = 0; i < l->n; i++) free(l->keys[i]);
  free(l->keys);
}

int ckpt_delete_dir(struct ckpt_service *s, const char *dir_key) {
  struct ckpt_keylist l = {0};
  int err = storage_list(s->st, dir_key, collect, &l);
  for (size_t i = 0; i < l.n; i++) {
    int e = storage_delete(s->st, l.keys[i]);
    if (e && !err) err = e;
  }
  ckpt_keylist_free(&l);
  return err;
}

int ckpt_delete_finish(struct ckpt_service *s, const char *job, int64_t step) {
  Stoker__V1__JournalAttempt *rec;
  struct ckpt_jkey dk;
  ckpt_jkey_step(&dk, 'D', job, step);
  int err = ckpt_journal_get(s->kv, &dk, &stoker__v1__journal_attempt__descriptor,
                             (ProtobufCMessage **)&rec);
  if (err) return err == STK_ENOENT ? 0 : err;
  /* The manifest names the objects (no reliance on LIST); read it first. */
  struct ckpt_manifest *m = NULL;
  uint64_t size;
  if (storage_head(s->st, rec->manifest_key, &size) == 0 && size <= CKPT_MANIFEST_MAX_BYTES) {
    uint8_t *buf = malloc(size ? size : 1);
    size_t got;
    if (buf && storage_get(s->st, rec->manifest_key, 0, buf, size, &got) == 0)
      ckpt_manifest_parse(buf, got, &m);
    free(buf);
  }
  err = storage_delete(s->st, rec->manifest_key);
  for (size_t i = 0; !err && m && i < m->n_objects; i++) {
    char *key;
    if (ckpt_key_object(s->prefix, rec->job, rec->step, rec->attempt, m->objects[i].key, &key))
      continue;
    err = storage_delete(s->st, key);
    free(key);
  }
  ckpt_manifest_free(m);
  char *dir;
  if (!err && ckpt_key_attempt_dir(s->prefix, rec->job, rec->step, rec->attempt, &dir) == 0) {
    ckpt_delete_dir(s, dir);
    free(dir);
  }
  if (!err) err = kv_delete(s->kv, dk.b, dk.len, true);
  stoker__v1__journal_attempt__free_unpacked(rec, NULL);
  return err;
}

int ckpt_delete_run(struct ckpt_service *s, const char *job, int64_t step) {
  struct ckpt_jkey ck, dk;
  ckpt_jkey_step(&ck, 'C', job, step);
  ckpt_jkey_step(&dk, 'D', job, step);
  void *v;
  size_t len;
  int err = kv_get(s->kv, NULL, ck.b, ck.len, &v, &len);
  if (err) {
    if (err == STK_ENOENT)
      stk_set_detail("no checkpoint of job %s at step %lld", job, (long long)step);
    return err;
  }
  struct kv_batch *b = kv_batch_new();
  if (!b) {
    free(v);
    return STK_ENOMEM;
  }
  kv_batch_put(b, dk.b, dk.len, v, len);
  kv_batch_delete(b, ck.b, ck.len);
  err = kv_write(s->kv, b, true);
  kv_batch_free(b);
  free(v);
  return err ? err : ckpt_delete_finish(s, job, step);
}

/* ---- Orphaned multipart uploads ---- */

bool ckpt_gc_attempt_journaled(struct ckpt_service *s, const char *attempt, size_t len) {
  char id[CKPT_ATTEMPT_MAX_BYTES + 1];
  if (len == 0 || len > CKPT_ATTEMPT_MAX_BYTES) return false;
  memcpy(id, attempt, len);
  id[len] = '\0';
  struct ckpt_jkey k;
  ckpt_jkey_attempt(&k, id);
  void *v;
  size_t n;
  if (kv_get(s->kv, NULL, k.b, k.len, &v, &n) != 0) return false;
  free(v);
  return true;
}

/* Whether the journal's record kind ('C' or 'D') of (job, step) names attempt. */
static bool step_record_names(struct ckpt_service *s, char kind, const char *job, int64_t step,
                              const char *attempt) {
  Stoker__V1__JournalAttempt *rec;
  struct ckpt_jkey k;
  ckpt_jkey_step(&k, kind, job, step);
  if (ckpt_journal_get(s->kv, &k, &stoker__v1__journal_attempt__descriptor,
                       (ProtobufCMessage **)&rec) != 0)
    return false;
  bool names = rec->attempt && strcmp(rec->attempt, attempt) == 0;
  stoker__v1__journal_attempt__free_unpacked(rec, NULL);
  return names;
}

bool ckpt_gc_attempt_claimed(struct ckpt_service *s, const char *job, int64_t step,
                             const char *attempt) {
  /* In this order: a record only ever moves A/ -> C/ -> D/ -> gone, each
   * move one synced batch, so an attempt claimed when its keys were listed
   * is found by one of the three reads, whenever they run. */
  return ckpt_gc_attempt_journaled(s, attempt, strlen(attempt)) ||
         step_record_names(s, 'C', job, step, attempt) ||
         step_record_names(s, 'D', job, step, attempt);
}

struct upload_ref {
  char *key, *id;
};

struct uploadlist {
  struct upload_ref *v;
  size_t n, cap;
  size_t skip;       /* Bytes of the listing prefix ("PREFIX/" or ""). */
  int64_t cutoff_ms; /* Uploads begun at or before this are old enough. */
};

static int abort_listed(void *arg, const struct storage_upload *u) {
  int e = storage_mpu_abort(arg, u->key, u->upload_id);
  return e == STK_ENOENT ? 0 : e; /* Completed or aborted meanwhile. */
}

int ckpt_abort_uploads_under(struct ckpt_service *s, const char *dir_key) {
  int err = storage_mpu_list(s->st, dir_key, abort_listed, s->st);
  return err == STK_ENOTSUP ? 0 : err;
}

/* What a key "JOB/step-N/attempt-ID/OBJECT" (relative to the service's
 * prefix) names: the job, the step, the attempt, and the length of its
 * attempt directory "JOB/step-N/attempt-ID/". */
struct attempt_key {
  char job[CKPT_JOB_MAX_BYTES + 1];
  int64_t step;
  char id[CKPT_ATTEMPT_MAX_BYTES + 1];
  size_t dir_len;
};

/* False for any key the service does not write. */
static bool parse_attempt_key(const char *rel, struct attempt_key *ret) {
  const char *s1 = strchr(rel, '/'), *s2 = s1 ? strchr(s1 + 1, '/') : NULL;
  const char *s3 = s2 ? strchr(s2 + 1, '/') : NULL;
  if (!s3 || !s3[1] || (size_t)(s1 - rel) > CKPT_JOB_MAX_BYTES || (size_t)(s2 - s1 - 1) != 17)
    return false;
  char seg[18];
  memcpy(seg, s1 + 1, 17);
  seg[17] = '\0';
  if (ckpt_key_parse_step(seg, &ret->step) != 0) return false;
  memcpy(ret->job, rel, (size_t)(s1 - rel));
  ret->job[s1 - rel] = '\0';
  size_t alen = (size_t)(s3 - s2 - 1);
  if (ckpt_name_check_job(ret->job) != 0 || alen <= 8 || alen - 8 > CKPT_ATTEMPT_MAX_BYTES ||
      strncmp(s2 + 1, "attempt-", 8) != 0)
    return false;
  memcpy(ret->id, s2 + 9, alen - 8);
  ret->id[alen - 8] = '\0';
  ret->dir_len = (size_t)(s3 + 1 - rel);
  return ckpt_name_check_attempt(ret->id) == 0;
}

/* The attempt id of a key; false for any key the service does not write. */
static bool attempt_of_key(const char *rel, char ret_id[CKPT_ATTEMPT_MAX_BYTES + 1]) {
  struct attempt_key k;
  if (!parse_attempt_key(rel, &k)) return false;
  memcpy(ret_id, k.id, sizeof(k.id));
  return true;
}

/* Keeps the uploads old enough whose keys are the service's. */
static int collect_upload(void *arg, const struct storage_upload *u) {
  struct uploadlist *l = arg;
  char id[CKPT_ATTEMPT_MAX_BYTES + 1];
  if (u->initiated_ms == 0 || u->initiated_ms > l->cutoff_ms ||
      !attempt_of_key(u->key + l->skip, id))
    return 0;
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 16;
    struct upload_ref *v = realloc(l->v, cap * sizeof(*v));
    if (!v) return STK_ENOMEM;
    l->v = v;
    l->cap = cap;
  }
  struct upload_ref *r = &l->v[l->n];
  r->key = strdup(u->key);
  r->id = strdup(u->upload_id);
  if (!r->key || !r->id) {
    free(r->key);
    free(r->id);
    return STK_ENOMEM;
  }
  l->n++;
  return 0;
}

static void uploadlist_free(struct uploadlist *l) {
  for (size_t i = 0; i < l->n; i++) {
    free(l->v[i].key);
    free(l->v[i].id);
  }
  free(l->v);
}

int ckpt_gc_orphan_uploads(struct ckpt_service *s, int64_t now_ms, uint64_t grace_ms,
                           uint64_t *ret_aborted) {
  char prefix[CKPT_PREFIX_MAX_BYTES + 2];
  snprintf(prefix, sizeof(prefix), "%s%s", s->prefix, s->prefix[0] ? "/" : "");
  struct uploadlist l = {.skip = strlen(prefix), .cutoff_ms = now_ms - (int64_t)grace_ms};
  int err = storage_mpu_list(s->st, prefix, collect_upload, &l);
  uint64_t aborted = 0;
  /* The journal is read after the listing: an attempt's A/ record is
   * written before any of its uploads begins and dropped only once they are
   * completed or aborted, so an upload listed without one is nobody's. */
  for (size_t i = 0; i < l.n; i++) {
    char id[CKPT_ATTEMPT_MAX_BYTES + 1];
    attempt_of_key(l.v[i].key + l.skip, id);
    if (ckpt_gc_attempt_journaled(s, id, strlen(id))) continue;
    int e = storage_mpu_abort(s->st, l.v[i].key, l.v[i].id);
    if (e == 0) aborted++;
    if (e && e != STK_ENOENT && !err) err = e; /* ENOENT: completed or aborted meanwhile. */
  }
  uploadlist_free(&l);
  *ret_aborted = aborted;
  return err;
}

/* ---- Orphaned attempt directories ---- */

static int cmp_keys(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The index in the remembered list of dir, or n when not there. */
static size_t remembered(const struct ckpt_service *s, const char *dir) {
  size_t i = 0;
  while (i < s->n_orphan_dirs && strcmp(s->orphan_dirs[i].dir, dir) != 0) i++;
  return i;
}

void ckpt_gc_orphan_dirs_free(struct ckpt_service *s) {
  for (size_t i = 0; i < s->n_orphan_dirs; i++) free(s->orphan_dirs[i].dir);
  free(s->orphan_dirs);
  s->orphan_dirs = NULL;
  s->n_orphan_dirs = 0;
}

/* Deletes the keys [from, to) of l (one attempt directory, dir) and aborts
 * the uploads under it; counts the objects deleted. */
static int remove_dir(struct ckpt_service *s, const struct ckpt_keylist *l, size_t from, size_t to,
                      const char *dir, uint64_t *ret_objects) {
  int err = ckpt_abort_uploads_under(s, dir);
  for (size_t i = from; i < to; i++) {
    int e = storage_delete(s->st, l->keys[i]);
    if (e == 0) (*ret_objects)++;
    if (e && !err) err = e;
  }
  return err;
}

/* One attempt directory found orphaned now: removed once it has been
 * orphaned for grace_ms, else remembered (into next, next_n). */
static int orphan_found(struct ckpt_service *s, const struct ckpt_keylist *l, size_t from,
                        size_t to, const char *dir, int64_t now_ms, uint64_t grace_ms,
                        struct ckpt_orphan_dir *next, size_t *next_n,
                        struct ckpt_orphan_sweep *ret) {
  size_t i = remembered(s, dir);
  int64_t first_ms = i < s->n_orphan_dirs ? s->orphan_dirs[i].first_ms : now_ms;
  if (now_ms - first_ms >= (int64_t)grace_ms) {
    int err = remove_dir(s, l, from, to, dir, &ret->objects);
    if (!err) {
      ret->attempts++;
      return 0;
    }
    /* Kept, with its first sighting: the next run tries again. */
  }
  char *copy = strdup(dir);
  if (!copy) return STK_ENOMEM;
  next[(*next_n)++] = (struct ckpt_orphan_dir){copy, first_ms};
  return 0;
}

int ckpt_gc_orphan_attempts(struct ckpt_service *s, int64_t now_ms, uint64_t grace_ms,
                            struct ckpt_orphan_sweep *ret) {
  *ret = (struct ckpt_orphan_sweep){0};
  char prefix[CKPT_PREFIX_MAX_BYTES + 2];
  snprintf(prefix, sizeof(prefix), "%s%s", s->prefix, s->prefix[0] ? "/" : "");
  size_t skip = strlen(prefix);
  struct ckpt_keylist l = {0};
  int err = ckpt_keylist_list(s, prefix, &l);
  /* Every orphan dir now is at most one per listed key. */
  struct ckpt_orphan_dir *next = err ? NULL : calloc(l.n ? l.n : 1, sizeof(*next));
  size_t next_n = 0;
  if (!err && !next) err = STK_ENOMEM;
  if (!err && l.n)
    qsort(l.keys, l.n, sizeof(*l.keys), cmp_keys); /* A directory's keys side by side. */
  for (size_t i = 0, end; !err && i < l.n; i = end) {
    struct attempt_key k;
    end = i + 1;
    if (strncmp(l.keys[i], prefix, skip) != 0 || !parse_attempt_key(l.keys[i] + skip, &k)) continue;
    const char *dir = l.keys[i];
    size_t dir_len = skip + k.dir_len;
    bool manifest = false;
    for (; end <= l.n; end++) {
      const char *key = l.keys[end - 1];
      manifest = manifest || strcmp(key + dir_len, "manifest.pb") == 0;
      if (end == l.n || strncmp(l.keys[end], dir, dir_len) != 0) break;
    }
    /* A manifest: a checkpoint exists (this service's or an imported one).
     * The journal is read after the listing (ckpt_gc_attempt_claimed). */
    if (manifest || ckpt_gc_attempt_claimed(s, k.job, k.step, k.id)) continue;
    char dirkey[STORAGE_KEY_MAX + 1];
    snprintf(dirkey, sizeof(dirkey), "%.*s", (int)dir_len, dir);
    err = orphan_found(s, &l, i, end, dirkey, now_ms, grace_ms, next, &next_n, ret);
  }
  if (!err) { /* Directories gone (or claimed) since are forgotten. */
    ckpt_gc_orphan_dirs_free(s);
    s->orphan_dirs = next;
    s->n_orphan_dirs = next_n;
    next = NULL;
  }
  for (size_t i = 0; next && i < next_n; i++) free(next[i].dir);
  free(next);
  ckpt_keylist_free(&l);
  ret->waiting = s->n_orphan_dirs;
  return err;
}
