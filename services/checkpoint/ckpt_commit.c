/*
 * ckpt_commit: the commit protocol and its undo, as blocking steps run on a
 * worker thread (or by recovery at open), both driven by the journal alone
 * so that a live commit and one finished after a crash are the same code.
 *
 * Commit: every rank finished, every object done -> build the manifest from
 * the journaled objects (per-block CRCs from the journaled parts) -> full
 * manifest check (coverage, bounds, overlaps) -> write it LAST under the
 * attempt's write-once key -> journal "committed" and drop the attempt's
 * records in one synced batch. Abort: delete the manifest key first (so a
 * half-done commit can never survive), abort open uploads, delete objects,
 * drop the records. Retention: keep the newest K steps and every M-th.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_crc.h"
#include "ckpt_journal.h"
#include "ckpt_manifest.h"
#include "ckpt_service_int.h"
#include "stk_error.h"

char *ckpt_manifest_uri(const struct ckpt_service *s, const char *key) {
  size_t n = strlen(s->url);
  while (n > 0 && s->url[n - 1] == '/') n--;
  char *u = malloc(n + strlen(key) + 2);
  if (u) sprintf(u, "%.*s/%s", (int)n, s->url, key);
  return u;
}

void ckpt_journal_parts_free(Stoker__V1__JournalPart **parts, uint32_t n_parts) {
  if (!parts) return;
  for (uint32_t i = 0; i < n_parts; i++)
    if (parts[i]) stoker__v1__journal_part__free_unpacked(parts[i], NULL);
  free(parts);
}

int ckpt_journal_parts(struct kv *kv, const char *attempt, uint32_t rank, uint32_t index,
                       uint32_t n_parts, Stoker__V1__JournalPart ***ret_parts) {
  Stoker__V1__JournalPart **parts = calloc(n_parts ? n_parts : 1, sizeof(*parts));
  if (!parts) return STK_ENOMEM;
  int err = 0;
  for (uint32_t i = 0; !err && i < n_parts; i++) {
    struct ckpt_jkey k;
    ckpt_jkey_part(&k, attempt, rank, index, i + 1);
    err = ckpt_journal_get(kv, &k, &stoker__v1__journal_part__descriptor,
                           (ProtobufCMessage **)&parts[i]);
    if (err == STK_ENOENT)
      stk_set_detail("part %u of object %u/%u is not journaled", i + 1, rank, index);
  }
  if (err) {
    ckpt_journal_parts_free(parts, n_parts);
    return err;
  }
  *ret_parts = parts;
  return 0;
}

/* The CRCs of a journaled object: its own (single PUT) or its parts'. */
static int object_crcs(struct kv *kv, const char *attempt, const Stoker__V1__JournalObject *o,
                       uint32_t **ret, size_t *ret_n) {
  size_t n = 0;
  uint32_t *crcs = NULL;
  if (!o->upload_id || !o->upload_id[0]) {
    crcs = malloc((o->n_block_crc32c ? o->n_block_crc32c : 1) * sizeof(*crcs));
    if (!crcs) return STK_ENOMEM;
    if (o->n_block_crc32c) memcpy(crcs, o->block_crc32c, o->n_block_crc32c * sizeof(*crcs));
    *ret = crcs;
    *ret_n = o->n_block_crc32c;
    return 0;
  }
  Stoker__V1__JournalPart **parts;
  int err = ckpt_journal_parts(kv, attempt, o->rank, o->index, o->parts, &parts);
  if (err) return err;
  uint64_t size = 0;
  for (uint32_t i = 0; i < o->parts; i++) n += parts[i]->n_block_crc32c, size += parts[i]->size;
  crcs = malloc((n ? n : 1) * sizeof(*crcs));
  if (!crcs) err = STK_ENOMEM;
  for (uint32_t i = 0, at = 0; !err && i < o->parts; i++) {
    if (parts[i]->n_block_crc32c)
      memcpy(crcs + at, parts[i]->block_crc32c, parts[i]->n_block_crc32c * sizeof(*crcs));
    at += (uint32_t)parts[i]->n_block_crc32c;
  }
  ckpt_journal_parts_free(parts, o->parts);
  if (!err && size != o->size) {
    stk_set_detail("object %u/%u: parts hold %llu bytes, not %llu", o->rank, o->index,
                   (unsigned long long)size, (unsigned long long)o->size);
    err = STK_ECORRUPT;
  }
  if (err) {
    free(crcs);
    return err;
  }
  *ret = crcs;
  *ret_n = n;
  return 0;
}

static int add_object(struct kv *kv, struct ckpt_manifest *m, const Stoker__V1__JournalObject *o) {
  if (!o->sealed || !o->done) {
    stk_set_detail("object %u/%u is not uploaded", o->rank, o->index);
    return STK_ESTATE;
  }
  uint32_t *crcs = NULL, idx;
  size_t n = 0;
  char name[CKPT_OBJECT_MAX_BYTES + 1];
  ckpt_object_name(o->rank, o->index, name);
  int err = object_crcs(kv, m->attempt, o, &crcs, &n);
  if (!err) err = ckpt_manifest_add_object(m, name, o->size, crcs, n, &idx);
  free(crcs);
  for (size_t i = 0; !err && i < o->n_chunks; i++) {
    const Stoker__V1__ChunkEntry *c = o->chunks[i];
    struct ckpt_shape shape = {.ndim = (uint32_t)c->n_global_shape};
    struct ckpt_box box = {.ndim = shape.ndim};
    if (shape.ndim > CKPT_MAX_DIMS || !c->box || c->box->n_offsets != shape.ndim ||
        c->box->n_sizes != shape.ndim) {
      stk_set_detail("journaled chunk %zu of object %s is malformed", i, name);
      return STK_ECORRUPT;
    }
    u64copy(shape.dims, c->global_shape, shape.ndim);
    u64copy(box.offsets, c->box->offsets, shape.ndim);
    u64copy(box.sizes, c->box->sizes, shape.ndim);
    err = ckpt_manifest_add_chunk(m, c->tensor, c->dtype, &shape, &box, idx, c->object_offset);
  }
  return err;
}

/* Counts the attempt's finished ranks. */
static int count_ranks(struct kv *kv, const char *attempt, uint32_t *ret) {
  struct ckpt_jkey k;
  ckpt_jkey_attempt_prefix(&k, 'R', attempt);
  struct kv_iter *it;
  int err = kv_iter_prefix(kv, NULL, k.b, k.len, &it);
  if (err) return err;
  uint32_t n = 0;
  for (; kv_iter_valid(it); kv_iter_next(it)) n++;
  err = kv_iter_error(it);
  kv_iter_free(it);
  *ret = n;
  return err;
}

/* Builds the manifest of an attempt from its journal records. */
static int build_manifest(struct kv *kv, const Stoker__V1__JournalAttempt *rec,
                          struct ckpt_manifest **ret) {
  uint32_t ranks;
  int err = count_ranks(kv, rec->attempt, &ranks);
  if (!err && ranks != rec->world) {
    stk_set_detail("%u of %u ranks finished", ranks, rec->world);
    err = STK_ESTATE;
  }
  struct ckpt_manifest *m = NULL;
  if (!err) err = ckpt_manifest_new(rec->job, rec->step, rec->world, rec->attempt, &m);
  if (err) return err;
  m->created_at_ms = rec->created_at_ms;
  struct ckpt_jkey k;
  ckpt_jkey_attempt_prefix(&k, 'O', rec->attempt);
  struct kv_iter *it;
  err = kv_iter_prefix(kv, NULL, k.b, k.len, &it);
  for (; !err && kv_iter_valid(it); kv_iter_next(it)) {
    size_t len;
    const void *v = kv_iter_value(it, &len);
    Stoker__V1__JournalObject *o = (Stoker__V1__JournalObject *)ckpt_journal_unpack(
        &stoker__v1__journal_object__descriptor, v, len);
    if (!o) {
      stk_set_detail("undecodable object record");
      err = STK_ECORRUPT;
      break;
    }
    err = add_object(kv, m, o);
    stoker__v1__journal_object__free_unpacked(o, NULL);
  }
  if (!err && it) err = kv_iter_error(it);
  kv_iter_free(it);
  if (!err) err = ckpt_manifest_check(m);
  if (err) {
    ckpt_manifest_free(m);
    return err;
  }
  *ret = m;
  return 0;
}

/* Writes the manifest under its write-once key. A manifest already there
 * with the same bytes is ours, written before a crash. */
static int write_manifest(struct ckpt_service *s, const char *key, const uint8_t *buf, size_t len) {
  int err;
  if (storage_caps(s->st)->conditional_put) {
    err = storage_put(s->st, key, buf, len, STORAGE_IF_ABSENT);
  } else {
    /* Best available: the key is unique to the attempt and only this
     * service writes it, so HEAD then PUT cannot race with another writer. */
    uint64_t size;
    err = storage_head(s->st, key, &size);
    if (err == STK_ENOENT)
      err = storage_put(s->st, key, buf, len, 0);
    else if (err == 0)
      err = STK_EEXIST;
  }
  if (err != STK_EEXIST) return err;
  uint8_t *old = malloc(len + 1);
  size_t got = 0;
  if (!old) return STK_ENOMEM;
  err = storage_get(s->st, key, 0, old, len + 1, &got);
  if (!err && (got != len || memcmp(old, buf, len) != 0)) {
    stk_set_detail("a different manifest exists at %s", key);
    err = STK_EEXIST;
  }
  free(old);
  return err;
}

static int record_committed(struct ckpt_service *s, Stoker__V1__JournalAttempt *rec,
                            struct commit_result *ret) {
  ret->committed_at_ms = ckpt__svc_now_ms();
  rec->committed_at_ms = ret->committed_at_ms;
  rec->manifest_key = ret->manifest_key;
  struct kv_batch *b = kv_batch_new();
  if (!b) return STK_ENOMEM;
  struct ckpt_jkey k;
  ckpt_jkey_step(&k, 'C', rec->job, rec->step);
  ckpt_journal_batch_put(b, &k, &rec->base);
  ckpt_journal_drop_attempt(b, rec->attempt);
  int err = kv_write(s->kv, b, true);
  kv_batch_free(b);
  return err;
}

int ckpt_commit_run(struct ckpt_service *s, const char *attempt, struct commit_result *ret) {
  Stoker__V1__JournalAttempt *rec;
  struct ckpt_jkey k;
  ckpt_jkey_attempt(&k, attempt);
  int err = ckpt_journal_get(s->kv, &k, &stoker__v1__journal_attempt__descriptor,
                             (ProtobufCMessage **)&rec);
  if (err) return err;
  void *v;
  size_t len;
  ckpt_jkey_step(&k, 'C', rec->job, rec->step);
  if (kv_get(s->kv, NULL, k.b, k.len, &v, &len) == 0) {
    free(v);
    stk_set_detail("step %lld of job %s is already committed", (long long)rec->step, rec->job);
    stoker__v1__journal_attempt__free_unpacked(rec, NULL);
    return STK_EEXIST;
  }
  struct ckpt_manifest *m = NULL;
  uint8_t *buf = NULL;
  char *key = NULL;
  err = build_manifest(s->kv, rec, &m);
  if (!err) err = ckpt_manifest_pack(m, &buf, &len);
  if (!err) err = ckpt_key_manifest(s->prefix, rec->job, rec->step, rec->attempt, &key);
  if (!err) {
    snprintf(ret->manifest_key, sizeof(ret->manifest_key), "%s", key);
    ckpt__svc_probe(s, "before_manifest");
    err = write_manifest(s, key, buf, len);
  }
  if (!err) {
    ckpt__svc_probe(s, "manifest_written");
    err = record_committed(s, rec, ret);
    rec->manifest_key = NULL; /* Borrowed from ret. */
  }
  if (!err) ckpt__svc_probe(s, "committed");
  ckpt_manifest_free(m);
  free(buf);
  free(key);
  stoker__v1__journal_attempt__free_unpacked(rec, NULL);
  return err;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

/* The committed steps of a job, ascending (free() them). */
int ckpt_committed_steps(struct ckpt_service *s, const char *job, int64_t **ret, size_t *ret_n) {
  struct ckpt_jkey k;
  ckpt_jkey_step(&k, 'C', job, -1);
  struct kv_iter *it;
  int err = kv_iter_prefix(s->kv, NULL, k.b, k.len, &it);
  if (err) return err;
  int64_t *steps = NULL;
  size_t n = 0, cap = 0;
  for (; kv_iter_valid(it); kv_iter_next(it)) {
    size_t len;
    const void *key = kv_iter_key(it, &len);
    if (len != k.len + 8) continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 16;
      int64_t *ns = realloc(steps, cap * sizeof(*ns));
      if (!ns) {
        err = STK_ENOMEM;
        break;
      }
      steps = ns;
    }
    steps[n++] = ckpt_jkey_step_of(key, len);
  }
  if (!err) err = kv_iter_error(it);
  kv_iter_free(it);
  if (err) {
    free(steps);
    return err;
  }
  if (n > 1) qsort(steps, n, sizeof(*steps), cmp_i64);
  *ret = steps;
  *ret_n = n;
  return 0;
}

int ckpt_retention_run(struct ckpt_service *s, const char *job) {
  if (s->o.keep_last == 0) return 0;
  int64_t *steps;
  size_t n;
  int err = ckpt_committed_steps(s, job, &steps, &n);
  if (err) return err;
  for (size_t i = 0; i < n; i++) {
    bool keep = i + s->o.keep_last >= n ||
                (s->o.keep_every > 0 && steps[i] % (int64_t)s->o.keep_every == 0);
    if (!keep) {
      int e = ckpt_delete_run(s, job, steps[i]);
      if (e && e != STK_ENOENT && !err) err = e;
    }
  }
  free(steps);
  return err;
}
