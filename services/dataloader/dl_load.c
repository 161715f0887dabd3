/*
 * dl_load: the job table rebuilt from RocksDB at dl_open. For every job of
 * the catalog: its configuration decoded (datasets reopened), its kept
 * commits read and their lane snapshots pinned in memory, then the job
 * added to the table. One job that cannot load (a dataset gone, a corrupt
 * record) must not stop the others: it is kept as failed, with the reason,
 * until it is deleted or a restart finds it whole again.
 */
#include <stdio.h>
#include <stdlib.h>

#include "dl_internal.h"
#include "stk_error.h"

/* Reads the kept commits and pins their snapshots in memory. */
static int load_commits(struct dl *dl, struct dl_job *j) {
  int rc = dl_store_get_commits(dl, j);
  for (uint32_t i = 0; rc == 0 && i < j->n_commits; i++)
    for (uint32_t c = 0; rc == 0 && c < j->C; c++) {
      const struct dl_commit *cm = &j->commits[i];
      uint32_t vi;
      void *val = NULL;
      size_t len;
      if (dl_version_index(j, cm->ver_id[c], &vi) < 0) continue;
      rc = dl_store_get_snap(dl, j->name, c, cm->ver_id[c], cm->k[c], &val, &len);
      if (rc == STK_ENOENT) {
        rc = 0;
        continue;
      }
      if (rc == 0) rc = dl_snap_add(j, c, vi, cm->k[c], true, val, len);
      free(val);
    }
  if (rc == STK_ECORRUPT) stk_set_detail("job %s: corrupt commit record", j->name);
  return rc;
}

static int load_job(struct dl *dl, const char *name) {
  void *val;
  size_t len;
  int rc = dl_store_get_config(dl, name, &val, &len);
  if (rc < 0) return rc;
  struct dl_job *j = NULL;
  rc = dl_config_decode(dl, val, len, &j);
  free(val);
  if (rc == 0) rc = load_commits(dl, j);
  if (rc == 0) rc = dl_add_job(dl, j);
  if (rc < 0) dl_job_free(j);
  return rc;
}

/* Loads one job of the catalog, or records why it failed. */
static int load_or_fail(struct dl *dl, const char *name) {
  stk_clear_detail();
  int rc = load_job(dl, name);
  if (rc < 0 && rc != STK_ENOMEM) {
    char reason[600];
    snprintf(reason, sizeof reason, "%s: %s", stk_strerror(rc), stk_detail());
    rc = dl_add_failed(dl, name, reason);
  }
  return rc;
}

int dl_load(struct dl *dl) {
  return dl_store_each_job(dl, load_or_fail);
}
