/*
 * ckpt_recover: what a restarted service does before it serves (blocking,
 * at open). Each attempt still journaled as open is either completed and
 * committed (every rank finished, every object's parts journaled: the
 * multipart uploads are completed from the journaled ETags) or aborted
 * (uploads aborted, objects deleted). Nothing half-written is committed:
 * the commit step rebuilds and rechecks the whole manifest from the journal.
 * Interrupted deletions are finished.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_journal.h"
#include "ckpt_service_int.h"
#include "stk_error.h"

struct idlist {
  char **ids;
  size_t n, cap;
};

static int idlist_add(struct idlist *l, const void *key, size_t len) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 16;
    char **n = realloc(l->ids, cap * sizeof(*n));
    if (!n) return STK_ENOMEM;
    l->ids = n;
    l->cap = cap;
  }
  char *id = malloc(len + 1);
  if (!id) return STK_ENOMEM;
  memcpy(id, key, len);
  id[len] = '\0';
  l->ids[l->n++] = id;
  return 0;
}

static void idlist_free(struct idlist *l) {
  for (size_t i = 0; i < l->n; i++) free(l->ids[i]);
  free(l->ids);
}

/* Keys under prefix (without it), copied. */
static int scan(struct kv *kv, const char *prefix, struct idlist *l) {
  struct kv_iter *it;
  size_t plen = strlen(prefix);
  int err = kv_iter_prefix(kv, NULL, prefix, plen, &it);
  if (err) return err;
  for (; !err && kv_iter_valid(it); kv_iter_next(it)) {
    size_t len;
    const char *k = kv_iter_key(it, &len);
    err = idlist_add(l, k + plen, len - plen);
  }
  if (!err) err = kv_iter_error(it);
  kv_iter_free(it);
  return err;
}

/* Finishes one object if its parts are all journaled: true when done. */
static bool finish_object(struct ckpt_service *s, const Stoker__V1__JournalAttempt *rec,
                          Stoker__V1__JournalObject *o) {
  if (o->done) return true;
  if (!o->sealed || !o->upload_id || !o->upload_id[0]) return false;
  Stoker__V1__JournalPart **jp;
  if (ckpt_journal_parts(s->kv, rec->attempt, o->rank, o->index, o->parts, &jp) != 0) return false;
  struct storage_part *sp = calloc(o->parts ? o->parts : 1, sizeof(*sp));
  char name[CKPT_OBJECT_MAX_BYTES + 1], *key = NULL;
  ckpt_object_name(o->rank, o->index, name);
  int err =
      sp ? ckpt_key_object(s->prefix, rec->job, rec->step, rec->attempt, name, &key) : STK_ENOMEM;
  for (uint32_t i = 0; !err && i < o->parts; i++)
    sp[i] = (struct storage_part){(int)jp[i]->number, jp[i]->etag};
  if (!err) err = storage_mpu_complete(s->st, key, o->upload_id, sp, o->parts, 0);
  if (err == STK_ENOENT) { /* Completed before the crash, not yet journaled? */
    uint64_t size;
    err = storage_head(s->st, key, &size);
    if (!err && size != o->size) err = STK_ECORRUPT;
  }
  free(sp);
  free(key);
  ckpt_journal_parts_free(jp, o->parts);
  if (err) return false;
  o->done = true;
  struct ckpt_jkey k;
  ckpt_jkey_object(&k, rec->attempt, o->rank, o->index);
  return ckpt_journal_put(s->kv, &k, &o->base, true) == 0;
}

/* True if every object of the attempt is (now) done. */
static bool finish_objects(struct ckpt_service *s, const Stoker__V1__JournalAttempt *rec) {
  struct ckpt_jkey k;
  ckpt_jkey_attempt_prefix(&k, 'O', rec->attempt);
  struct idlist keys = {0};
  bool ok = scan(s->kv, k.b, &keys) == 0;
  for (size_t i = 0; ok && i < keys.n; i++) {
    struct ckpt_jkey ok_key;
    ok_key.len = (size_t)snprintf(ok_key.b, sizeof(ok_key.b), "%s%s", k.b, keys.ids[i]);
    Stoker__V1__JournalObject *o;
    if (ckpt_journal_get(s->kv, &ok_key, &stoker__v1__journal_object__descriptor,
                         (ProtobufCMessage **)&o) != 0) {
      ok = false;
      break;
    }
    ok = finish_object(s, rec, o);
    stoker__v1__journal_object__free_unpacked(o, NULL);
  }
  idlist_free(&keys);
  return ok;
}

static int recover_attempt(struct ckpt_service *s, const char *id) {
  Stoker__V1__JournalAttempt *rec;
  struct ckpt_jkey k;
  ckpt_jkey_attempt(&k, id);
  int err = ckpt_journal_get(s->kv, &k, &stoker__v1__journal_attempt__descriptor,
                             (ProtobufCMessage **)&rec);
  if (err) return err;
  struct commit_result cr = {0};
  int result = STK_EABORTED;
  if (finish_objects(s, rec) && ckpt_commit_run(s, id, &cr) == 0) {
    result = 0;
    s->stats.recovered_commits++;
    ckpt_retention_run(s, rec->job);
  } else {
    err = ckpt__attempt_cleanup_run(s, id);
    s->stats.recovered_aborts++;
  }
  if (!err) {
    char *uri = result == 0 ? ckpt_manifest_uri(s, cr.manifest_key) : NULL;
    ckpt__attempt_recovered(s, rec, result, cr.committed_at_ms, uri);
    free(uri);
  }
  stoker__v1__journal_attempt__free_unpacked(rec, NULL);
  return err;
}

/* D/<job>/<step>: finish deleting. */
static int recover_deletes(struct ckpt_service *s) {
  struct kv_iter *it;
  int err = kv_iter_prefix(s->kv, NULL, "D/", 2, &it);
  if (err) return err;
  struct idlist jobs = {0};
  int64_t *steps = NULL;
  size_t n = 0;
  for (; !err && kv_iter_valid(it); kv_iter_next(it)) {
    size_t len;
    const char *key = kv_iter_key(it, &len);
    if (len < 2 + 1 + 8) continue;
    int64_t *ns = realloc(steps, (n + 1) * sizeof(*ns));
    if (!ns || idlist_add(&jobs, key + 2, len - 2 - 1 - 8) != 0) {
      if (ns) steps = ns;
      err = STK_ENOMEM;
      break;
    }
    steps = ns;
    steps[n++] = ckpt_jkey_step_of(key, len);
  }
  kv_iter_free(it);
  for (size_t i = 0; !err && i < n; i++) err = ckpt_delete_finish(s, jobs.ids[i], steps[i]);
  free(steps);
  idlist_free(&jobs);
  return err;
}

int ckpt_recover(struct ckpt_service *s) {
  struct idlist ids = {0};
  int err = scan(s->kv, "A/", &ids);
  for (size_t i = 0; !err && i < ids.n; i++) err = recover_attempt(s, ids.ids[i]);
  idlist_free(&ids);
  return err ? err : recover_deletes(s);
}
