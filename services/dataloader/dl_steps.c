/*
 * dl_steps: the arithmetic that maps steps to lane lines and lanes to units.
 * Everything here is a pure function of the job's configuration, which is
 * what makes a batch a pure function of (versions, step).
 */
#include "dl_internal.h"

#include "stk_error.h"

uint32_t dl_version_of_step(const struct dl_job *j, int64_t step) {
  uint32_t vi = 0;
  while (vi + 1 < j->n_ver && j->ver[vi + 1].from_step <= step) vi++;
  return vi;
}

uint64_t dl_lane_lines(const struct dl_job *j, uint32_t vi, uint32_t c, int64_t step) {
  const struct dl_version *v = &j->ver[vi];
  if (step <= v->from_step) return 0;
  uint64_t n = (uint64_t)(step - v->from_step) * v->global_batch;
  return n > c ? (n - c - 1) / j->C + 1 : 0;
}

uint64_t dl_lane_version_end(const struct dl_job *j, uint32_t vi, uint32_t c) {
  if (vi + 1 >= j->n_ver) return UINT64_MAX;
  return dl_lane_lines(j, vi, c, j->ver[vi + 1].from_step);
}

uint32_t dl_lane_shards(const struct dl_job *j, uint32_t ds, uint32_t c) {
  uint32_t ld = j->ds[ds].shards;
  return c < ld ? (ld - c + j->C - 1) / j->C : 0;
}

void dl_shard_range(const struct dl_job *j, uint32_t ds, uint32_t shard, uint64_t *ret_begin,
                    uint64_t *ret_end) {
  unsigned __int128 u = j->ds[ds].units, ld = j->ds[ds].shards;
  *ret_begin = (uint64_t)(u * shard / ld);
  *ret_end = (uint64_t)(u * (shard + 1) / ld);
}

int dl_version_index(const struct dl_job *j, uint64_t ver_id, uint32_t *ret_vi) {
  for (uint32_t i = 0; i < j->n_ver; i++)
    if (j->ver[i].id == ver_id) {
      *ret_vi = i;
      return 0;
    }
  return STK_ENOENT;
}
