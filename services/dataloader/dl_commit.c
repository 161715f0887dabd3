/*
 * dl_commit: the state "after step S" — every lane's generator positioned
 * where step S+1 begins — made durable (Commit) and exported into a model
 * checkpoint (ExportState; dl_import.c imports it on another instance).
 * The blob is the job configuration plus C lane snapshots: O(C x shards),
 * independent of the corpus and of S. A scaled-out instance (part I of P)
 * snapshots, stores and exports only its own lanes; its export names them
 * (format DLX4), so blobs of every part can be imported together anywhere.
 * Every blob ends in its CRC32C (formats in dl_internal.h).
 */
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "dl_codec.h"
#include "dl_internal.h"
#include "stk_error.h"

struct state {
  struct dl_commit pos;
  uint8_t **blobs; /* [C]; NULL for lanes another part serves */
  size_t *lens;    /* [C] */
  uint32_t n;
};

static void state_free(struct state *s) {
  for (uint32_t c = 0; c < s->n && s->blobs; c++) free(s->blobs[c]);
  free(s->blobs);
  free(s->lens);
  dl_commit_clear(&s->pos);
}

/* Snapshots every lane this instance serves at the start of step+1 (the
 * position of every lane is recorded). Job read lock held. */
static int capture(struct dl_job *j, int64_t step, struct state *s) {
  if (step < 0 || step >= j->dl->opts.max_step) {
    stk_set_detail("step must be in [0, %lld)", (long long)j->dl->opts.max_step);
    return STK_EINVAL;
  }
  s->n = j->C;
  s->pos.step = step;
  s->pos.ver_id = calloc(j->C, sizeof(uint64_t));
  s->pos.k = calloc(j->C, sizeof(uint64_t));
  s->blobs = calloc(j->C, sizeof *s->blobs);
  s->lens = calloc(j->C, sizeof *s->lens);
  if (!s->pos.ver_id || !s->pos.k || !s->blobs || !s->lens) return STK_ENOMEM;
  uint32_t vi = dl_version_of_step(j, step + 1);
  int rc = 0;
  for (uint32_t c = 0; rc == 0 && c < j->C; c++) {
    struct dl_gen g = {.cur_ds = -1};
    s->pos.ver_id[c] = j->ver[vi].id;
    s->pos.k[c] = dl_lane_lines(j, vi, c, step + 1);
    if (!dl_owns_lane(j->dl, c)) continue;
    pthread_mutex_lock(&j->lanes[c].mu);
    rc = dl_seek(j, c, &g, false, vi, s->pos.k[c], NULL);
    pthread_mutex_unlock(&j->lanes[c].mu);
    if (rc == 0) rc = dl_gen_encode(j, &g, &s->blobs[c], &s->lens[c]);
    dl_gen_free(&g);
  }
  return rc;
}

/* Pins the new commit's snapshots; unpins those of dropped commits. */
static void pin(struct dl_job *j, const struct state *s, bool pinned) {
  for (uint32_t c = 0; c < j->C; c++) {
    uint32_t vi;
    if (!s->blobs[c] || dl_version_index(j, s->pos.ver_id[c], &vi) < 0) continue;
    pthread_mutex_lock(&j->lanes[c].mu);
    dl_snap_add(j, c, vi, s->pos.k[c], pinned, s->blobs[c], s->lens[c]);
    pthread_mutex_unlock(&j->lanes[c].mu);
  }
}

static void unpin(struct dl_job *j, const struct dl_commit *drop) {
  for (uint32_t c = 0; c < j->C; c++) {
    struct dl_lane *l = &j->lanes[c];
    pthread_mutex_lock(&l->mu);
    for (size_t i = 0; i < l->n_snaps; i++)
      if (l->snaps[i].ver_id == drop->ver_id[c] && l->snaps[i].k == drop->k[c])
        l->snaps[i].pinned = false;
    pthread_mutex_unlock(&l->mu);
  }
}

/* The new kept list: older commits (other steps), then s, at most keep. */
static int record(struct dl *dl, struct dl_job *j, struct state *s) {
  uint32_t keep = dl->opts.keep_commits, n = 0, n_drop = 0;
  struct dl_commit *list = calloc(j->n_commits + 1, sizeof *list);
  struct dl_commit *drop = calloc(j->n_commits + 1, sizeof *drop);
  if (!list || !drop) {
    free(list);
    free(drop);
    return STK_ENOMEM;
  }
  for (uint32_t i = 0; i < j->n_commits; i++) {
    if (j->commits[i].step == s->pos.step)
      drop[n_drop++] = j->commits[i];
    else
      list[n++] = j->commits[i];
  }
  while (n + 1 > keep) {
    drop[n_drop++] = list[0];
    memmove(list, list + 1, --n * sizeof *list);
  }
  list[n++] = s->pos;
  int rc = dl_store_commit(dl, j, list, n, s->blobs, s->lens, drop, n_drop);
  if (rc == 0) {
    for (uint32_t i = 0; i < n_drop; i++) {
      unpin(j, &drop[i]);
      dl_commit_clear(&drop[i]);
    }
    free(j->commits);
    j->commits = list;
    j->n_commits = n;
    pin(j, s, true);
    memset(&s->pos, 0, sizeof s->pos); /* now owned by j->commits */
  } else {
    free(list);
  }
  free(drop);
  return rc;
}

int dl_commit(struct dl *dl, const char *job, int64_t step) {
  struct dl_job *j = NULL;
  int rc = dl_job_get(dl, job, &j);
  if (rc < 0) return rc;
  struct state s = {0};
  pthread_rwlock_rdlock(&j->lock);
  pthread_mutex_lock(&j->commit_mu);
  if (j->deleted) { /* DeleteLoader won: writing now would bring keys back */
    stk_set_detail("no dataloader job '%s'", j->name);
    rc = STK_ENOENT;
  }
  if (rc == 0) rc = capture(j, step, &s);
  if (rc == 0) rc = dl_job_check_data(j); /* snapshots of lanes that read zeros */
  if (rc == 0) rc = record(dl, j, &s);
  pthread_mutex_unlock(&j->commit_mu);
  pthread_rwlock_unlock(&j->lock);
  dl_job_put(dl, j);
  state_free(&s);
  return rc;
}

/* DLX3 (a whole job: every lane, in order) or DLX4 (a part: the lanes held,
 * each named), then the CRC32C of all of it. */
static void write_blob(struct dl_wbuf *w, bool partial, int64_t step, const uint8_t *cfg,
                       size_t cfg_len, const struct state *s) {
  uint32_t held = 0;
  for (uint32_t c = 0; c < s->n; c++) held += s->blobs[c] != NULL;
  dl_w_u32(w, partial ? DL_BLOB_PART : DL_BLOB_FULL);
  dl_w_u64(w, (uint64_t)step);
  dl_w_blob(w, cfg, cfg_len);
  dl_w_u32(w, s->n);
  if (partial) dl_w_u32(w, held);
  for (uint32_t c = 0; c < s->n; c++) {
    if (!s->blobs[c]) continue;
    if (partial) dl_w_u32(w, c);
    dl_w_blob(w, s->blobs[c], s->lens[c]);
  }
  if (!w->failed) dl_w_u32(w, crc32c(w->data, w->len));
}

int dl_export_state(struct dl *dl, const char *job, int64_t step, uint8_t **ret_blob,
                    size_t *ret_len) {
  struct dl_job *j = NULL;
  int rc = dl_job_get(dl, job, &j);
  if (rc < 0) return rc;
  struct state s = {0};
  struct dl_wbuf w = {0};
  uint8_t *cfg = NULL;
  size_t cfg_len = 0;
  pthread_rwlock_rdlock(&j->lock);
  rc = capture(j, step, &s);
  if (rc == 0) rc = dl_job_check_data(j);
  if (rc == 0) rc = dl_config_encode(j, &cfg, &cfg_len);
  pthread_rwlock_unlock(&j->lock);
  dl_job_put(dl, j);
  if (rc == 0) {
    write_blob(&w, dl->opts.parts > 1, step, cfg, cfg_len, &s);
    if (w.failed) rc = STK_ENOMEM;
  }
  free(cfg);
  state_free(&s);
  if (rc < 0) {
    free(w.data);
    return rc;
  }
  *ret_blob = w.data;
  *ret_len = w.len;
  return 0;
}
