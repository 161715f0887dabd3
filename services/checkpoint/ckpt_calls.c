/*
 * ckpt_calls: the one-shot calls that run a blocking step on the work pool
 * and answer once (List, GetManifest, Delete, GC), plus loading a committed
 * checkpoint's manifest, shared with restore and verify.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_journal.h"
#include "ckpt_manifest.h"
#include "ckpt_mcache.h"
#include "ckpt_service_int.h"
#include "page.h"
#include "stk_error.h"

/* List's page: at most `size` checkpoints, of steps after after_step when
 * `after` (services/common/page.h). */
struct list_page {
  uint32_t size;
  bool after;
  int64_t after_step;
};

struct call_job {
  struct ckpt_task t;
  struct ckpt_service *s;
  int (*run)(struct call_job *j);
  char job[CKPT_JOB_MAX_BYTES + 1];
  int64_t step;
  struct list_page page; /* List: which page */
  ckpt_done_fn done;
  void *arg;
  ProtobufCMessage *resp; /* Built by run; freed with free_resp. */
  void (*free_resp)(ProtobufCMessage *m);
  int err;
  char msg[320];
};

static void call_work(struct ckpt_task *t) {
  struct call_job *j = (struct call_job *)t;
  stk_clear_detail();
  j->err = j->run(j);
  if (j->err)
    snprintf(j->msg, sizeof(j->msg), "%s", stk_detail()[0] ? stk_detail() : stk_strerror(j->err));
}

static void call_after(struct ckpt_task *t) {
  struct call_job *j = (struct call_job *)t;
  if (j->err)
    j->done(j->arg, j->err, j->msg, NULL);
  else
    j->done(j->arg, 0, "", j->resp);
  if (j->resp && j->free_resp) j->free_resp(j->resp);
  free(j);
}

static void call_start(struct ckpt_service *s, const char *job, int64_t step, bool check_step,
                       const struct list_page *page, int (*run)(struct call_job *),
                       ckpt_done_fn done, void *arg) {
  if (s->closing) FAIL_LATER(s, done, arg, STK_EUNAVAIL, "closing");
  int err = ckpt_name_check_job(job);
  if (!err && check_step) err = ckpt_name_check_step(step);
  if (err) FAIL_LATER(s, done, arg, err, stk_detail());
  struct call_job *j = calloc(1, sizeof(*j));
  if (!j) FAIL_LATER(s, done, arg, STK_ENOMEM, "");
  j->t.work = call_work;
  j->t.after = call_after;
  j->s = s;
  j->run = run;
  snprintf(j->job, sizeof(j->job), "%s", job);
  j->step = step;
  if (page) j->page = *page;
  j->done = done;
  j->arg = arg;
  ckpt_pool_submit(s->work, &j->t);
}

/* ---- Loading a manifest ---- */

/* The manifest's bytes from storage (ckpt_mcache_load_fn). */
static int load_raw(void *arg, const char *key, uint8_t **ret_buf, size_t *ret_len) {
  struct ckpt_service *s = arg;
  uint64_t size = 0;
  uint8_t *buf = NULL;
  size_t got = 0;
  int err = storage_head(s->st, key, &size);
  if (!err && size > CKPT_MANIFEST_MAX_BYTES) err = STK_ETOOBIG;
  if (!err && !(buf = malloc(size ? size : 1))) err = STK_ENOMEM;
  if (!err) err = storage_get(s->st, key, 0, buf, size, &got);
  if (err) {
    free(buf);
    return err;
  }
  *ret_buf = buf;
  *ret_len = got;
  return 0;
}

int ckpt_load_manifest(struct ckpt_service *s, const char *job, int64_t step,
                       const struct ckpt_manifest **ret_m, struct ckpt_mcache_hold *ret_hold) {
  *ret_hold = (struct ckpt_mcache_hold){0};
  struct ckpt_jkey k;
  ckpt_jkey_step(&k, 'C', job, step);
  Stoker__V1__JournalAttempt *rec;
  int err = ckpt_journal_get(s->kv, &k, &stoker__v1__journal_attempt__descriptor,
                             (ProtobufCMessage **)&rec);
  if (err == STK_ENOENT && s->o.shared_storage && ckpt_import_step(s, job, step) == 0)
    err = ckpt_journal_get(s->kv, &k, &stoker__v1__journal_attempt__descriptor,
                           (ProtobufCMessage **)&rec);
  if (err == STK_ENOENT)
    stk_set_detail("no checkpoint of job %s at step %lld", job, (long long)step);
  if (err) return err;
  err = ckpt_mcache_get(s->mcache, rec->manifest_key, load_raw, s, ret_hold);
  const struct ckpt_manifest *m = ret_hold->value;
  if (!err && (strcmp(m->job, job) != 0 || m->step != step)) {
    /* Bytes that do not parse are never held (the cache's make fails);
     * these parse but are not the manifest wanted: read them again next
     * time. */
    ckpt_mcache_release(s->mcache, ret_hold);
    ckpt_mcache_forget(s->mcache, rec->manifest_key);
    stk_set_detail("manifest %s names another checkpoint", rec->manifest_key);
    err = STK_ECORRUPT;
  }
  stoker__v1__journal_attempt__free_unpacked(rec, NULL);
  if (!err) *ret_m = m;
  return err;
}

void ckpt_release_manifest(struct ckpt_service *s, struct ckpt_mcache_hold *hold) {
  ckpt_mcache_release(s->mcache, hold);
}

static void free_manifest_msg(ProtobufCMessage *m) {
  protobuf_c_message_free_unpacked(m, NULL);
}

static int run_get_manifest(struct call_job *j) {
  const struct ckpt_manifest *m;
  struct ckpt_mcache_hold hold;
  int err = ckpt_load_manifest(j->s, j->job, j->step, &m, &hold);
  if (err) return err;
  j->resp = (ProtobufCMessage *)stoker__v1__manifest__unpack(NULL, hold.len, hold.buf);
  j->free_resp = free_manifest_msg;
  ckpt_release_manifest(j->s, &hold);
  return j->resp ? 0 : STK_ENOMEM;
}

void ckpt_get_manifest(struct ckpt_service *s, const Stoker__V1__GetManifestRequest *req,
                       ckpt_done_fn done, void *arg) {
  call_start(s, req->job, req->step, true, NULL, run_get_manifest, done, arg);
}

/* ---- Delete and GC ---- */

static Stoker__V1__Empty empty_msg = STOKER__V1__EMPTY__INIT;

static int run_delete(struct call_job *j) {
  j->resp = &empty_msg.base;
  return ckpt_delete_run(j->s, j->job, j->step);
}

void ckpt_delete(struct ckpt_service *s, const Stoker__V1__DeleteCheckpointRequest *req,
                 ckpt_done_fn done, void *arg) {
  call_start(s, req->job, req->step, true, NULL, run_delete, done, arg);
}

static int run_gc(struct call_job *j) {
  j->resp = &empty_msg.base;
  return ckpt__attempt_collect_run(j->s, j->job);
}

void ckpt_gc(struct ckpt_service *s, const char *job, ckpt_done_fn done, void *arg) {
  call_start(s, job, 0, false, NULL, run_gc, done, arg);
}

/* ---- List ---- */

static void free_list(ProtobufCMessage *msg) {
  Stoker__V1__ListCheckpointsResponse *r = (Stoker__V1__ListCheckpointsResponse *)msg;
  for (size_t i = 0; i < r->n_checkpoints; i++) {
    free(r->checkpoints[i]->uri);
    free(r->checkpoints[i]);
  }
  free(r->checkpoints);
  if (r->next_page_token != protobuf_c_empty_string) free(r->next_page_token);
  free(r);
}

static int list_add(Stoker__V1__ListCheckpointsResponse *r, int64_t step, char *uri, int64_t at_ms,
                    uint64_t generation) {
  Stoker__V1__CheckpointRef **n =
      realloc(r->checkpoints, (r->n_checkpoints + 1) * sizeof(*r->checkpoints));
  if (!n) return STK_ENOMEM;
  r->checkpoints = n;
  Stoker__V1__CheckpointRef *ref = malloc(sizeof(*ref));
  if (!ref || !uri) {
    free(ref);
    free(uri);
    return STK_ENOMEM;
  }
  stoker__v1__checkpoint_ref__init(ref);
  ref->step = step;
  ref->uri = uri;
  ref->committed_at_ms = at_ms;
  ref->generation = generation;
  r->checkpoints[r->n_checkpoints++] = ref;
  return 0;
}

/* A manifest found in storage: checked, then journaled as committed. */
static int import_one(struct ckpt_service *s, const char *job, const char *key) {
  uint64_t size;
  int err = storage_head(s->st, key, &size);
  if (err) return err;
  if (size > CKPT_MANIFEST_MAX_BYTES) return STK_ETOOBIG;
  uint8_t *buf = malloc(size ? size : 1);
  size_t got;
  struct ckpt_manifest *m = NULL;
  char *expect = NULL;
  err = buf ? storage_get(s->st, key, 0, buf, size, &got) : STK_ENOMEM;
  if (!err) err = ckpt_manifest_parse(buf, got, &m);
  free(buf);
  if (!err) err = ckpt_key_manifest(s->prefix, m->job, m->step, m->attempt, &expect);
  if (!err && (strcmp(m->job, job) != 0 || strcmp(expect, key) != 0)) err = STK_ECORRUPT;
  if (!err) {
    Stoker__V1__JournalAttempt rec = STOKER__V1__JOURNAL_ATTEMPT__INIT;
    rec.job = m->job;
    rec.step = m->step;
    rec.world = m->world;
    rec.attempt = m->attempt;
    rec.created_at_ms = rec.committed_at_ms = m->created_at_ms;
    rec.manifest_key = (char *)key;
    struct ckpt_jkey k;
    ckpt_jkey_step(&k, 'C', job, m->step);
    void *v;
    size_t len;
    if (kv_get(s->kv, NULL, k.b, k.len, &v, &len) == 0)
      free(v); /* Two manifests for one step: the first found stays. */
    else
      err = ckpt_journal_put(s->kv, &k, &rec.base, true);
  }
  free(expect);
  ckpt_manifest_free(m);
  return err;
}

/* What one listing of a job's keys found: the manifests' keys (imported
 * into the journal as they come). */
struct listing {
  struct ckpt_service *s;
  const char *job;
  char **keys;
  size_t n, cap;
};

/* Whether the journal's C/ record of the step the manifest key names
 * (".../step-N/attempt-ID" + "/manifest.pb" from end on) is that key: then
 * nothing is fetched (List with shared storage lists on every call). */
static bool journaled(struct ckpt_service *s, const char *job, const char *key, size_t end) {
  size_t a = end, st;
  while (a > 0 && key[a - 1] != '/') a--; /* key[a..end): "attempt-ID" */
  if (a < 2) return false;
  for (st = a - 1; st > 0 && key[st - 1] != '/';) st--; /* key[st..a-1): "step-N" */
  char seg[24];
  int64_t step;
  if (a - 1 - st >= sizeof(seg)) return false;
  memcpy(seg, key + st, a - 1 - st);
  seg[a - 1 - st] = 0;
  if (ckpt_key_parse_step(seg, &step) != 0) return false;
  struct ckpt_jkey k;
  ckpt_jkey_step(&k, 'C', job, step);
  Stoker__V1__JournalAttempt *rec;
  if (ckpt_journal_get(s->kv, &k, &stoker__v1__journal_attempt__descriptor,
                       (ProtobufCMessage **)&rec) != 0)
    return false;
  bool same = rec->manifest_key && strcmp(rec->manifest_key, key) == 0;
  stoker__v1__journal_attempt__free_unpacked(rec, NULL);
  return same;
}

static int keys_cb(void *arg, const char *key, uint64_t size) {
  (void)size;
  struct listing *l = arg;
  size_t n = strlen(key);
  if (n <= 12 || strcmp(key + n - 12, "/manifest.pb") != 0) return 0;
  if (!journaled(l->s, l->job, key, n - 12)) import_one(l->s, l->job, key);
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 16;
    char **k = realloc(l->keys, cap * sizeof(*k));
    if (!k) return STK_ENOMEM;
    l->keys = k, l->cap = cap;
  }
  if (!(l->keys[l->n] = strdup(key))) return STK_ENOMEM;
  l->n++;
  return 0;
}

static void listing_free(struct listing *l) {
  for (size_t i = 0; i < l->n; i++) free(l->keys[i]);
  free(l->keys);
}

/* Whether key is among the manifests the listing found. */
static bool listed(const struct listing *l, const char *key) {
  for (size_t i = 0; i < l->n; i++)
    if (strcmp(l->keys[i], key) == 0) return true;
  return false;
}

/* Lists dir (a job's or a step's directory) and imports its manifests;
 * ret (may be NULL) keeps their keys. */
static int import_dir(struct ckpt_service *s, const char *job, const char *dir,
                      struct listing *ret) {
  struct listing l = {.s = s, .job = job};
  int err = storage_list(s->st, dir, keys_cb, &l);
  if (!err && ret)
    *ret = l;
  else
    listing_free(&l);
  return err;
}

static int import_from_storage(struct ckpt_service *s, const char *job, struct listing *ret) {
  char *dir;
  int err = ckpt_key_job_dir(s->prefix, job, &dir);
  if (err) return err;
  err = import_dir(s, job, dir, ret);
  free(dir);
  return err;
}

int ckpt_import_step(struct ckpt_service *s, const char *job, int64_t step) {
  char *dir;
  int err = ckpt_key_step_dir(s->prefix, job, step, &dir);
  if (err) return err;
  struct listing l;
  err = import_dir(s, job, dir, &l);
  free(dir);
  if (err) return err;
  err = l.n ? 0 : STK_ENOENT;
  listing_free(&l);
  return err;
}

/* Whether storage was listed for the job's manifests before (I/<job>/). */
static bool imported_before(struct ckpt_service *s, const char *job) {
  struct ckpt_jkey k;
  ckpt_jkey_step(&k, 'I', job, -1);
  void *v;
  size_t len;
  if (kv_get(s->kv, NULL, k.b, k.len, &v, &len) != 0) return false;
  free(v);
  return true;
}

/* The journal is authoritative for a job once its storage was listed: the
 * import ran (and journaled what it found) and this service is the only
 * writer under its prefix, so a job with no C/ record after that has no
 * checkpoint, and List answers it without listing the bucket again. */
static int import_once(struct ckpt_service *s, const char *job) {
  if (imported_before(s, job)) return 0;
  int err = import_from_storage(s, job, NULL);
  if (err) return err;
  struct ckpt_jkey k;
  ckpt_jkey_step(&k, 'I', job, -1);
  return kv_put(s->kv, k.b, k.len, "", 0, true);
}

/* After list_add: keeps the new last entry when it fits the page, or
 * takes it back out and ends the page with the token after the one
 * before it. */
static int page_close(Stoker__V1__ListCheckpointsResponse *r, size_t *used, uint32_t size) {
  size_t n = r->n_checkpoints - 1;
  Stoker__V1__CheckpointRef *last = r->checkpoints[n];
  size_t bytes = protobuf_c_message_get_packed_size(&last->base);
  if (page_fits(size, n, *used, bytes)) {
    *used += bytes;
    return 0;
  }
  char key[24];
  snprintf(key, sizeof(key), "%lld", (long long)r->checkpoints[n - 1]->step);
  free(last->uri);
  free(last);
  r->n_checkpoints = n;
  return page_token_encode(key, &r->next_page_token);
}

/* With shared storage, storage is the catalogue: List answers the
 * manifests one listing finds (those another replica committed imported on
 * the way), so a checkpoint a replica deleted is gone from every replica's
 * answer, and a commit answered before the List began is in it (its
 * manifest was written before its answer). */
static int run_list(struct call_job *j) {
  int64_t *steps;
  size_t n;
  struct listing seen = {0};
  bool shared = j->s->o.shared_storage;
  int err = shared ? import_from_storage(j->s, j->job, &seen) : 0;
  if (!err) err = ckpt_committed_steps(j->s, j->job, &steps, &n);
  if (!err && n == 0 && !shared) {
    free(steps);
    steps = NULL;
    err = import_once(j->s, j->job);
    if (!err) err = ckpt_committed_steps(j->s, j->job, &steps, &n);
  }
  if (err) {
    listing_free(&seen);
    return err;
  }
  Stoker__V1__ListCheckpointsResponse *r = malloc(sizeof(*r));
  if (!r) err = STK_ENOMEM;
  if (r) stoker__v1__list_checkpoints_response__init(r);
  size_t used = 0;
  for (size_t i = 0; !err && i < n; i++) {
    if (j->page.after && steps[i] <= j->page.after_step) continue;
    struct ckpt_jkey k;
    ckpt_jkey_step(&k, 'C', j->job, steps[i]);
    Stoker__V1__JournalAttempt *rec;
    if (ckpt_journal_get(j->s->kv, &k, &stoker__v1__journal_attempt__descriptor,
                         (ProtobufCMessage **)&rec) != 0)
      continue; /* Deleted meanwhile. */
    if (shared && !listed(&seen, rec->manifest_key)) {
      stoker__v1__journal_attempt__free_unpacked(rec, NULL);
      continue; /* Deleted by another replica. */
    }
    err = list_add(r, rec->step, ckpt_manifest_uri(j->s, rec->manifest_key), rec->committed_at_ms,
                   rec->generation);
    stoker__v1__journal_attempt__free_unpacked(rec, NULL);
    if (!err) err = page_close(r, &used, j->page.size);
    if (*r->next_page_token) break;
  }
  free(steps);
  listing_free(&seen);
  if (err && r) free_list(&r->base);
  if (err) return err;
  j->resp = &r->base;
  j->free_resp = free_list;
  return 0;
}

void ckpt_list(struct ckpt_service *s, const Stoker__V1__ListCheckpointsRequest *req,
               ckpt_done_fn done, void *arg) {
  struct list_page page = {.size = page_size(req->page_size)};
  char *after = NULL, *end = NULL;
  int err = page_token_decode(req->page_token, &after);
  if (!err && after) {
    page.after = true;
    page.after_step = strtoll(after, &end, 10);
    if (end == after || *end) {
      stk_set_detail("page_token is not a token this service gave");
      err = STK_EINVAL;
    }
  }
  free(after);
  if (err) FAIL_LATER(s, done, arg, err, stk_detail());
  call_start(s, req->job, 0, false, &page, run_list, done, arg);
}
