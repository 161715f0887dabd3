/*
 * dl_seek: random access into a lane's stream. A lane line is produced by
 * running the generator forward from the nearest earlier state: the live
 * generator (sequential reads cost nothing extra), an in-memory snapshot
 * (taken every snapshot_every_lines lines; committed ones pinned and
 * reloaded from RocksDB at open), or the initial state. The replay a call
 * may need is bounded by max_replay_lines and by max_replay_tokens (lines
 * of a long seq_len cost that much more each), so a hostile far-away step
 * is refused instead of holding a worker.
 *
 * The replay loop is resumable: given a budget of tokens, it stops when the
 * budget is spent, leaves the live generator where it stopped (and a
 * snapshot there, in case another call of the job moves the live one
 * first) and returns DL_YIELDED. Calling again restores from that place,
 * so a long replay runs as slices of at most the budget each, and the
 * worker between them goes to other calls (dl_sched.h decides whose).
 */
#include <stdlib.h>
#include <string.h>

#include "dl_internal.h"
#include "stk_error.h"

static int pos_cmp(uint32_t vi1, uint64_t k1, uint32_t vi2, uint64_t k2) {
  if (vi1 != vi2) return vi1 < vi2 ? -1 : 1;
  return k1 < k2 ? -1 : (k1 > k2);
}

static uint64_t sat_add(uint64_t a, uint64_t b) {
  return a + b < a ? UINT64_MAX : a + b;
}

/* Lines the generator runs from (vi0, k0) to (vi, k). */
static uint64_t distance(const struct dl_job *j, uint32_t c, uint32_t vi0, uint64_t k0, uint32_t vi,
                         uint64_t k) {
  if (vi0 == vi) return k - k0;
  uint64_t d = dl_lane_version_end(j, vi0, c) - k0;
  for (uint32_t m = vi0 + 1; m < vi; m++) d = sat_add(d, dl_lane_version_end(j, m, c));
  return sat_add(d, k);
}

static uint64_t sat_mul(uint64_t a, uint64_t b) {
  return b && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

/* Tokens the generator produces from (vi0, k0) to (vi, k): each version's
 * lines at its own T = seq_len + 1. */
static uint64_t distance_tokens(const struct dl_job *j, uint32_t c, uint32_t vi0, uint64_t k0,
                                uint32_t vi, uint64_t k) {
  uint64_t t0 = (uint64_t)j->ver[vi0].seq_len + 1;
  if (vi0 == vi) return sat_mul(k - k0, t0);
  uint64_t d = sat_mul(dl_lane_version_end(j, vi0, c) - k0, t0);
  for (uint32_t m = vi0 + 1; m < vi; m++)
    d = sat_add(d, sat_mul(dl_lane_version_end(j, m, c), (uint64_t)j->ver[m].seq_len + 1));
  return sat_add(d, sat_mul(k, (uint64_t)j->ver[vi].seq_len + 1));
}

static int yield(struct dl_job *j, uint32_t c, const struct dl_gen *g);

static void maybe_snap(struct dl_job *j, uint32_t c, const struct dl_gen *g) {
  if (g->k % j->dl->opts.snapshot_every_lines) return;
  uint8_t *blob;
  size_t len;
  if (dl_gen_encode(j, g, &blob, &len) < 0) return; /* a cache: losing one is harmless */
  dl_snap_add(j, c, g->vi, g->k, false, blob, len);
  free(blob);
}

/* Runs g forward to (vi, k); with a budget, stops early when the budget
 * is spent (yield). */
static int advance(struct dl_job *j, uint32_t c, struct dl_gen *g, uint32_t vi, uint64_t k,
                   uint64_t *budget_tokens) {
  while (pos_cmp(g->vi, g->k, vi, k) < 0) {
    int rc;
    if (g->vi < vi && g->k >= dl_lane_version_end(j, g->vi, c)) {
      rc = dl_gen_next_version(j, g);
    } else {
      if (budget_tokens && *budget_tokens == 0) return yield(j, c, g);
      uint64_t t = (uint64_t)j->ver[g->vi].seq_len + 1;
      rc = dl_gen_line(j, c, g, NULL);
      if (budget_tokens) *budget_tokens -= t < *budget_tokens ? t : *budget_tokens;
    }
    if (rc < 0) return rc;
    maybe_snap(j, c, g);
  }
  return 0;
}

/* Ends a slice of replay at g's place: a snapshot there keeps the progress
 * even if the live generator moves before the next slice. */
static int yield(struct dl_job *j, uint32_t c, const struct dl_gen *g) {
  uint8_t *blob;
  size_t len;
  if (g->k % j->dl->opts.snapshot_every_lines && dl_gen_encode(j, g, &blob, &len) == 0) {
    dl_snap_add(j, c, g->vi, g->k, false, blob, len); /* A cache: losing it costs a replay. */
    free(blob);
  }
  return DL_YIELDED;
}

/* Restores g from the best start found; *ret_from tells which. */
static int restore(struct dl_job *j, uint32_t c, struct dl_gen *g, const struct dl_snap *s,
                   bool from_live) {
  struct dl_lane *l = &j->lanes[c];
  if (from_live) {
    uint8_t *blob;
    size_t len;
    int rc = dl_gen_encode(j, &l->live, &blob, &len);
    if (rc == 0) rc = dl_gen_decode(j, c, blob, len, g);
    free(blob);
    return rc;
  }
  if (s) return dl_gen_decode(j, c, s->blob, s->len, g);
  dl_gen_reset(g);
  return dl_gen_fit(j, c, g);
}

int dl_seek(struct dl_job *j, uint32_t c, struct dl_gen *g, bool is_live, uint32_t vi, uint64_t k,
            uint64_t *budget_tokens) {
  struct dl_lane *l = &j->lanes[c];
  uint32_t bvi = 0;
  uint64_t bk = 0;
  bool keep = false, from_live = false;
  const struct dl_snap *snap = NULL;
  if (is_live && l->live_ok && pos_cmp(g->vi, g->k, vi, k) <= 0) {
    keep = true;
    bvi = g->vi;
    bk = g->k;
  }
  if (!is_live && l->live_ok && pos_cmp(l->live.vi, l->live.k, vi, k) <= 0) {
    from_live = true;
    bvi = l->live.vi;
    bk = l->live.k;
  }
  for (size_t i = 0; i < l->n_snaps; i++) {
    const struct dl_snap *s = &l->snaps[i];
    if (pos_cmp(s->vi, s->k, vi, k) > 0) break;
    if (pos_cmp(s->vi, s->k, bvi, bk) > 0) {
      snap = s;
      keep = from_live = false;
      bvi = s->vi;
      bk = s->k;
    }
  }
  const struct dl_opts *o = &j->dl->opts;
  if (distance(j, c, bvi, bk, vi, k) > o->max_replay_lines ||
      distance_tokens(j, c, bvi, bk, vi, k) > o->max_replay_tokens) {
    stk_set_detail("job %s lane %u: the step is too far from any restorable state (more than "
                   "%llu lines or %llu tokens to replay)",
                   j->name, c, (unsigned long long)o->max_replay_lines,
                   (unsigned long long)o->max_replay_tokens);
    return STK_ERANGE;
  }
  int rc = keep ? 0 : restore(j, c, g, snap, from_live);
  if (is_live) l->live_ok = rc == 0;
  if (rc == 0) rc = advance(j, c, g, vi, k, is_live ? budget_tokens : NULL);
  if (rc < 0 && is_live) l->live_ok = false;
  return rc;
}

int dl_snap_add(struct dl_job *j, uint32_t c, uint32_t vi, uint64_t k, bool pinned,
                const uint8_t *blob, size_t len) {
  struct dl_lane *l = &j->lanes[c];
  size_t at = 0;
  while (at < l->n_snaps && pos_cmp(l->snaps[at].vi, l->snaps[at].k, vi, k) < 0) at++;
  if (at < l->n_snaps && l->snaps[at].vi == vi && l->snaps[at].k == k) {
    l->snaps[at].pinned |= pinned;
    return 0;
  }
  if (!pinned && l->n_snaps >= j->dl->opts.max_snapshots_per_lane) {
    size_t victim = 0;
    while (victim < l->n_snaps && l->snaps[victim].pinned) victim++;
    if (victim == l->n_snaps || victim >= at) return 0; /* the new one would be oldest */
    free(l->snaps[victim].blob);
    memmove(&l->snaps[victim], &l->snaps[victim + 1], (l->n_snaps - victim - 1) * sizeof *l->snaps);
    l->n_snaps--;
    at--;
  }
  if (l->n_snaps == l->cap_snaps) {
    size_t cap = l->cap_snaps ? l->cap_snaps * 2 : 16;
    struct dl_snap *s = realloc(l->snaps, cap * sizeof *s);
    if (!s) return STK_ENOMEM;
    l->snaps = s;
    l->cap_snaps = cap;
  }
  uint8_t *copy = malloc(len ? len : 1);
  if (!copy) return STK_ENOMEM;
  memcpy(copy, blob, len);
  memmove(&l->snaps[at + 1], &l->snaps[at], (l->n_snaps - at) * sizeof *l->snaps);
  l->snaps[at] = (struct dl_snap){
      .vi = vi, .ver_id = j->ver[vi].id, .k = k, .pinned = pinned, .blob = copy, .len = len};
  l->n_snaps++;
  return 0;
}

/* Drops snapshots of versions that no longer exist or lie past their
 * version's new end, and the live generator (its version index may be
 * stale). Caller holds the job's write lock. */
void dl_snaps_reindex(struct dl_job *j) {
  for (uint32_t c = 0; c < j->C; c++) {
    struct dl_lane *l = &j->lanes[c];
    size_t w = 0;
    for (size_t i = 0; i < l->n_snaps; i++) {
      struct dl_snap s = l->snaps[i];
      if (dl_version_index(j, s.ver_id, &s.vi) < 0 || s.k > dl_lane_version_end(j, s.vi, c)) {
        free(s.blob);
        continue;
      }
      l->snaps[w++] = s;
    }
    l->n_snaps = w;
    dl_gen_reset(&l->live);
    l->live_ok = false;
  }
}

void dl_lane_clear(struct dl_lane *l) {
  for (size_t i = 0; i < l->n_snaps; i++) free(l->snaps[i].blob);
  free(l->snaps);
  l->snaps = NULL;
  l->n_snaps = l->cap_snaps = 0;
  dl_gen_free(&l->live);
  l->live_ok = false;
}
