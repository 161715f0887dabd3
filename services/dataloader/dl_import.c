/*
 * dl_import: ImportState — a job recreated (or replaced in place) from
 * exported blobs, committed at their step. A blob holds every lane (DLX3,
 * from an instance serving the whole job) or the lanes of one part (DLX4);
 * its CRC32C is checked first (a corrupt blob is STK_ECORRUPT: DATA_LOSS);
 * the blobs of every part of a scaled-out job, taken at one step, are
 * imported together, so an operator can move a job to any number of
 * processes. Each lane snapshot this instance serves is checked against the
 * position the configuration says step+1 starts at before anything is
 * stored, so a blob from another job, a corrupted one or a missing part
 * changes nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "dl_codec.h"
#include "dl_internal.h"
#include "stk_error.h"

struct blob {
  int64_t step;
  const uint8_t *cfg;
  size_t cfg_len;
  uint32_t n;            /* C */
  const uint8_t **lanes; /* [n] NULL: not in the blob */
  size_t *lens;
};

static void blob_clear(struct blob *b) {
  free(b->lanes);
  free(b->lens);
  memset(b, 0, sizeof *b);
}

/* DLX4's (lane, snapshot) pairs: lanes in range, none twice. */
static int parse_pairs(struct dl_rbuf *r, struct blob *b) {
  uint32_t held = dl_r_u32(r);
  if (r->failed || held > b->n) return STK_ECORRUPT;
  for (uint32_t i = 0; i < held; i++) {
    uint32_t c = dl_r_u32(r);
    if (r->failed || c >= b->n || b->lanes[c]) return STK_ECORRUPT;
    b->lanes[c] = dl_r_blob(r, &b->lens[c]);
  }
  return 0;
}

/* The body's length once the format is known: a checksummed blob (DLX3,
 * DLX4) must end in the CRC32C of what precedes it. */
static int check_sum(const uint8_t *p, size_t len, uint32_t magic, size_t *ret_body) {
  *ret_body = len;
  if (magic == DL_BLOB_FULL_V1 || magic == DL_BLOB_PART_V1) return 0;
  if ((magic != DL_BLOB_FULL && magic != DL_BLOB_PART) || len < 8) return STK_ECORRUPT;
  struct dl_rbuf tail = {.p = p + len - 4, .left = 4};
  if (dl_r_u32(&tail) != crc32c(p, len - 4)) return STK_ECORRUPT;
  *ret_body = len - 4;
  return 0;
}

static int parse(const uint8_t *p, size_t len, struct blob *b) {
  struct dl_rbuf r = {.p = p, .left = len};
  uint32_t magic = dl_r_u32(&r);
  size_t body;
  if (r.failed || check_sum(p, len, magic, &body) != 0) return STK_ECORRUPT;
  r.left = body - 4;
  b->step = (int64_t)dl_r_u64(&r);
  b->cfg = dl_r_blob(&r, &b->cfg_len);
  b->n = dl_r_u32(&r);
  if (r.failed || b->step < 0 || b->n == 0 || b->n > r.left / 4) return STK_ECORRUPT;
  b->lanes = calloc(b->n, sizeof *b->lanes);
  b->lens = calloc(b->n, sizeof *b->lens);
  if (!b->lanes || !b->lens) return STK_ENOMEM;
  if (magic == DL_BLOB_PART || magic == DL_BLOB_PART_V1) {
    if (parse_pairs(&r, b) < 0) return STK_ECORRUPT;
  } else {
    for (uint32_t c = 0; c < b->n; c++) b->lanes[c] = dl_r_blob(&r, &b->lens[c]);
  }
  return r.failed || r.left ? STK_ECORRUPT : 0;
}

/* Adds b's lanes that all lacks; all and b must agree on step and config. */
static int merge(struct blob *all, const struct blob *b) {
  if (b->step != all->step || b->n != all->n || b->cfg_len != all->cfg_len ||
      memcmp(b->cfg, all->cfg, b->cfg_len) != 0) {
    stk_set_detail("state blobs disagree on the step or the job configuration (export every "
                   "process of one job at the same committed step)");
    return STK_EINVAL;
  }
  for (uint32_t c = 0; c < all->n; c++)
    if (!all->lanes[c] && b->lanes[c]) {
      all->lanes[c] = b->lanes[c];
      all->lens[c] = b->lens[c];
    }
  return 0;
}

/* Decodes every lane snapshot and checks its position. */
static int check_lanes(struct dl_job *j, const struct blob *b, struct dl_commit *pos) {
  if (b->n != j->C) return STK_ECORRUPT;
  pos->step = b->step;
  pos->ver_id = calloc(j->C, sizeof(uint64_t));
  pos->k = calloc(j->C, sizeof(uint64_t));
  if (!pos->ver_id || !pos->k) return STK_ENOMEM;
  uint32_t vi = dl_version_of_step(j, b->step + 1);
  int rc = 0;
  for (uint32_t c = 0; rc == 0 && c < j->C; c++) {
    struct dl_gen g = {.cur_ds = -1};
    pos->ver_id[c] = j->ver[vi].id;
    pos->k[c] = dl_lane_lines(j, vi, c, b->step + 1);
    if (!b->lanes[c]) continue; /* not served here (see only_served) */
    rc = dl_gen_decode(j, c, b->lanes[c], b->lens[c], &g);
    if (rc == 0 && (g.vi != vi || g.k != pos->k[c])) rc = STK_ECORRUPT;
    dl_gen_free(&g);
  }
  return rc;
}

/* Drops the lanes another part serves; every lane served here must be there. */
static int only_served(const struct dl *dl, struct blob *b) {
  for (uint32_t c = 0; c < b->n; c++) {
    if (!dl_owns_lane(dl, c)) {
      b->lanes[c] = NULL;
      b->lens[c] = 0;
    } else if (!b->lanes[c]) {
      stk_set_detail("lane %u is in none of the state blobs: import the blobs of every process "
                     "that served the job, exported at one step",
                     c);
      return STK_EINVAL;
    }
  }
  return 0;
}

#define SWAP(f)                                                                                    \
  do {                                                                                             \
    __typeof__(a->f) t_ = a->f;                                                                    \
    a->f = b->f;                                                                                   \
    b->f = t_;                                                                                     \
  } while (0)

/* Exchanges everything but identity and locks. */
static void swap_contents(struct dl_job *a, struct dl_job *b) {
  SWAP(spec);
  SWAP(seed);
  SWAP(L);
  SWAP(C);
  SWAP(add_bos);
  SWAP(add_eos);
  SWAP(bos_id);
  SWAP(eos_id);
  SWAP(ds);
  SWAP(n_ds);
  SWAP(ver);
  SWAP(n_ver);
  SWAP(next_ver_id);
  SWAP(commits);
  SWAP(n_commits);
  SWAP(lanes);
}

static void install(struct dl_job *j, const struct blob *b, struct dl_commit *pos) {
  j->commits = calloc(1, sizeof *j->commits);
  if (j->commits) {
    j->commits[0] = *pos;
    j->n_commits = 1;
    memset(pos, 0, sizeof *pos);
  }
  for (uint32_t c = 0; c < j->C; c++) {
    uint32_t vi;
    if (!b->lanes[c]) continue;
    if (dl_version_index(j, j->commits ? j->commits[0].ver_id[c] : UINT64_MAX, &vi) == 0)
      dl_snap_add(j, c, vi, j->commits[0].k[c], true, b->lanes[c], b->lens[c]);
  }
}

static int replace(struct dl *dl, struct dl_job *old, struct dl_job *nj, const struct blob *b,
                   struct dl_commit *pos) {
  pthread_rwlock_wrlock(&old->lock);
  if (old->deleted) { /* DeleteLoader won: writing now would bring keys back */
    pthread_rwlock_unlock(&old->lock);
    dl_job_free(nj);
    stk_set_detail("dataloader job '%s' was deleted meanwhile", old->name);
    return STK_ENOENT;
  }
  swap_contents(old, nj);
  int rc = dl_store_replace(dl, old, pos, (uint8_t *const *)b->lanes, b->lens);
  if (rc < 0)
    swap_contents(old, nj);
  else
    install(old, b, pos);
  pthread_rwlock_unlock(&old->lock);
  dl_job_free(nj);
  return rc;
}

static int import_job(struct dl *dl, const char *job, const struct blob *b, int64_t *ret_step) {
  struct dl_job *nj = NULL;
  struct dl_commit pos = {0};
  int rc = dl_config_decode(dl, b->cfg, b->cfg_len, &nj);
  if (rc < 0) return rc;
  if (job && strcmp(nj->name, job) != 0) { /* The request names the target. */
    stk_set_detail("the state blob belongs to job %s, not %s", nj->name, job);
    dl_job_free(nj);
    return STK_EINVAL;
  }
  if (nj->C < dl->opts.parts) {
    stk_set_detail("%u lanes cannot be split over %u processes (lanes >= parts)", nj->C,
                   dl->opts.parts);
    dl_job_free(nj);
    return STK_EINVAL;
  }
  if ((rc = check_lanes(nj, b, &pos)) < 0) {
    if (rc == STK_ECORRUPT) stk_set_detail("state blob: lane snapshots do not match the step");
    dl_commit_clear(&pos);
    dl_job_free(nj);
    return rc;
  }
  struct dl_job *old = NULL;
  rc = dl_job_get(dl, nj->name, &old);
  if (rc == 0) {
    rc = replace(dl, old, nj, b, &pos);
    dl_job_put(dl, old);
  } else if (rc != STK_ENOENT) { /* a job that failed to load: delete it first */
    dl_job_free(nj);
  } else if ((rc = dl_store_replace(dl, nj, &pos, (uint8_t *const *)b->lanes, b->lens)) == 0) {
    install(nj, b, &pos);
    if ((rc = dl_add_job(dl, nj)) < 0) dl_job_free(nj);
  } else {
    dl_job_free(nj);
  }
  dl_commit_clear(&pos);
  if (rc == 0 && ret_step) *ret_step = b->step;
  return rc;
}

int dl_import_state(struct dl *dl, const uint8_t *blob, size_t len, int64_t *ret_step) {
  return dl_import_states(dl, NULL, &blob, &len, 1, ret_step);
}

int dl_import_states(struct dl *dl, const char *job, const uint8_t *const *blobs,
                     const size_t *lens, size_t n, int64_t *ret_step) {
  struct blob all = {0};
  int rc = dl && blobs && lens && n ? 0 : STK_EINVAL;
  for (size_t i = 0; rc == 0 && i < n; i++) {
    struct blob b = {0};
    rc = blobs[i] ? parse(blobs[i], lens[i], &b) : STK_EINVAL;
    if (rc == STK_ECORRUPT && n == 1) stk_set_detail("state blob is corrupt or truncated");
    if (rc == STK_ECORRUPT && n > 1) stk_set_detail("state blob %zu is corrupt or truncated", i);
    if (rc == 0 && i == 0) {
      all = b;
      continue;
    }
    if (rc == 0) rc = merge(&all, &b);
    blob_clear(&b);
  }
  if (rc == 0) rc = only_served(dl, &all);
  if (rc == 0) rc = import_job(dl, job, &all, ret_step);
  blob_clear(&all);
  return rc;
}
