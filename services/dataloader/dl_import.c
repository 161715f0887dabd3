/*
 * dl_import: ImportState — a job recreated (or replaced in place) from an
 * exported blob, committed at the blob's step. Each lane snapshot is checked
 * against the position the configuration says step+1 starts at before
 * anything is stored, so a blob from another job or a corrupted one changes
 * nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "dl_codec.h"
#include "dl_internal.h"
#include "stk_error.h"

#define EXPORT_MAGIC 0x31584C44u /* "DLX1" */

struct blob {
  int64_t step;
  const uint8_t *cfg;
  size_t cfg_len;
  uint32_t n;
  const uint8_t **lanes;
  size_t *lens;
};

static int parse(const uint8_t *p, size_t len, struct blob *b) {
  struct dl_rbuf r = {.p = p, .left = len};
  if (dl_r_u32(&r) != EXPORT_MAGIC) return STK_ECORRUPT;
  b->step = (int64_t)dl_r_u64(&r);
  b->cfg = dl_r_blob(&r, &b->cfg_len);
  b->n = dl_r_u32(&r);
  if (r.failed || b->step < 0 || b->n == 0 || b->n > r.left / 4) return STK_ECORRUPT;
  b->lanes = calloc(b->n, sizeof *b->lanes);
  b->lens = calloc(b->n, sizeof *b->lens);
  if (!b->lanes || !b->lens) return STK_ENOMEM;
  for (uint32_t c = 0; c < b->n; c++) b->lanes[c] = dl_r_blob(&r, &b->lens[c]);
  return r.failed || r.left ? STK_ECORRUPT : 0;
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
    rc = dl_gen_decode(j, c, b->lanes[c], b->lens[c], &g);
    if (rc == 0 && (g.vi != vi || g.k != dl_lane_lines(j, vi, c, b->step + 1))) rc = STK_ECORRUPT;
    pos->ver_id[c] = j->ver[vi].id;
    pos->k[c] = dl_lane_lines(j, vi, c, b->step + 1);
    dl_gen_free(&g);
  }
  return rc;
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
    if (dl_version_index(j, j->commits ? j->commits[0].ver_id[c] : UINT64_MAX, &vi) == 0)
      dl_snap_add(j, c, vi, j->commits[0].k[c], true, b->lanes[c], b->lens[c]);
  }
}

static int replace(struct dl *dl, struct dl_job *old, struct dl_job *nj, const struct blob *b,
                   struct dl_commit *pos) {
  pthread_rwlock_wrlock(&old->lock);
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

static int import_job(struct dl *dl, const struct blob *b, int64_t *ret_step) {
  struct dl_job *nj = NULL;
  struct dl_commit pos = {0};
  int rc = dl_config_decode(dl, b->cfg, b->cfg_len, &nj);
  if (rc < 0) return rc;
  if ((rc = check_lanes(nj, b, &pos)) < 0) {
    if (rc == STK_ECORRUPT) stk_set_detail("state blob: lane snapshots do not match the step");
    dl_commit_clear(&pos);
    dl_job_free(nj);
    return rc;
  }
  struct dl_job *old = dl_find_job(dl, nj->name);
  if (old) {
    rc = replace(dl, old, nj, b, &pos);
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
  struct blob b = {0};
  int rc = blob && dl ? parse(blob, len, &b) : STK_EINVAL;
  if (rc == 0)
    rc = import_job(dl, &b, ret_step);
  else if (rc == STK_ECORRUPT)
    stk_set_detail("state blob is corrupt or truncated");
  free(b.lanes);
  free(b.lens);
  return rc;
}
