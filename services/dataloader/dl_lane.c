/*
 * dl_lane: a lane's generator, the heart of the dataloader. A lane turns its
 * shards of every dataset into one stream of packed lines:
 *   - mixing: when the current unit is used up, the lane picks the dataset
 *     furthest below its weight (fewest tokens taken per unit of weight in
 *     this version; ties to the lowest index): deterministic, RNG-free and
 *     token-accurate;
 *   - order: within a dataset the lane visits its shards round robin, and
 *     shard s serves unit perm_{key(seed, dataset, s, epoch)}(i) as its i-th,
 *     a new order every epoch;
 *   - packing: lines of T tokens are cut from the concatenated units with
 *     memcpy; a unit left half-used continues in the next line.
 * The state is a pointer (version, line, unit, offset, per-shard counts) and
 * serializes to a small blob; the unit being read is a cache re-read after a
 * restore.
 */
#include <stdlib.h>
#include <string.h>

#include "dl_codec.h"
#include "dl_internal.h"
#include "dl_perm.h"
#include "stk_error.h"

static void unit_drop(struct dl_gen *g) {
  if (g->xtok != g->unit.tokens) free(g->xtok);
  dl_unit_free(&g->unit);
  memset(&g->unit, 0, sizeof g->unit);
  free(g->seg_x);
  free(g->seg_doc);
  free(g->seg_new);
  g->xtok = NULL;
  g->seg_x = NULL;
  g->seg_doc = NULL;
  g->seg_new = NULL;
  g->n_xtok = g->n_seg = 0;
}

void dl_gen_free(struct dl_gen *g) {
  unit_drop(g);
  for (uint32_t d = 0; d < g->n_ds; d++) free(g->ds[d].pos);
  free(g->ds);
  memset(g, 0, sizeof *g);
  g->cur_ds = -1;
}

void dl_gen_reset(struct dl_gen *g) {
  dl_gen_free(g);
}

int dl_gen_fit(struct dl_job *j, uint32_t c, struct dl_gen *g) {
  if (g->n_ds >= j->n_ds) return 0;
  struct dl_lds *ds = realloc(g->ds, j->n_ds * sizeof *ds);
  if (!ds) return STK_ENOMEM;
  g->ds = ds;
  for (uint32_t d = g->n_ds; d < j->n_ds; d++) {
    memset(&ds[d], 0, sizeof ds[d]);
    ds[d].n_pos = dl_lane_shards(j, d, c);
    ds[d].pos = calloc(ds[d].n_pos ? ds[d].n_pos : 1, sizeof *ds[d].pos);
    if (!ds[d].pos) return STK_ENOMEM;
    g->n_ds = d + 1;
  }
  return 0;
}

/* Splits the unit into pieces (document or leading fragment) and builds the
 * served tokens with BOS/EOS inserted. */
static int build_pieces(struct dl_gen *g) {
  const struct dl_unit *u = &g->unit;
  size_t lead = (u->n_docs == 0 || u->doc_starts[0] > 0) ? 1 : 0;
  size_t n = u->n_docs + lead;
  g->seg_x = malloc(n * sizeof *g->seg_x);
  g->seg_doc = malloc(n * sizeof *g->seg_doc);
  g->seg_new = malloc(n);
  if (!g->seg_x || !g->seg_doc || !g->seg_new) return STK_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    size_t di = i - lead; /* wraps for the lead piece, unused then */
    g->seg_x[i] = lead && i == 0 ? 0 : u->doc_starts[di];
    g->seg_new[i] = !(lead && i == 0);
    g->seg_doc[i] = g->seg_new[i] ? u->first_doc + di : (u->first_doc ? u->first_doc - 1 : 0);
    if (lead && i == 0 && u->n_docs == 0) g->seg_doc[i] = u->first_doc;
  }
  g->n_seg = n;
  return 0;
}

/* Rewrites pieces into served coordinates, inserting BOS/EOS. */
static int insert_markers(struct dl_job *j, struct dl_gen *g) {
  const struct dl_unit *u = &g->unit;
  size_t extra = g->n_seg * ((size_t)j->add_eos + (size_t)j->add_bos);
  uint32_t *x = malloc((u->n_tokens + extra + 1) * sizeof *x);
  if (!x) return STK_ENOMEM;
  size_t w = 0;
  for (size_t i = 0; i < g->n_seg; i++) {
    size_t b = g->seg_x[i], e = i + 1 < g->n_seg ? g->seg_x[i + 1] : u->n_tokens;
    g->seg_x[i] = (uint32_t)w;
    if (j->add_bos && g->seg_new[i]) x[w++] = j->bos_id;
    if (e > b) memcpy(x + w, u->tokens + b, (e - b) * sizeof *x); /* empty: tokens may be NULL */
    w += e - b;
    if (j->add_eos) x[w++] = j->eos_id;
  }
  g->xtok = x;
  g->n_xtok = w;
  return 0;
}

/* Reads a unit. Without markers the served tokens are the unit's: where the
 * reader can, the unit is delimited (read while lines fill, dl_lane_take.c)
 * or, when `whole` (Explain needs pieces), borrowed from the reader's map,
 * so a line is filled with one copy. */
static int load_unit(struct dl_job *j, struct dl_gen *g, uint32_t d, uint64_t unit, bool whole) {
  unit_drop(g);
  bool plain = !j->add_bos && !j->add_eos;
  struct dl_source *src = j->ds[d].src;
  int rc = !plain  ? dl_source_read_unit(src, unit, &g->unit)
           : whole ? dl_source_read_unit_runs(src, unit, &g->unit)
                   : dl_source_read_unit_delimited(src, unit, &g->unit);
  if (rc < 0) {
    memset(&g->unit, 0, sizeof g->unit);
    return rc;
  }
  if (dl_gen_delimited(g)) {
    g->raw_pos = g->unit.raw_begin;
    g->charge_from = 0;
    return 0;
  }
  if ((rc = build_pieces(g)) < 0) return rc;
  if (plain) {
    g->xtok = g->unit.tokens; /* NULL in the borrowed form */
    g->n_xtok = g->unit.n_tokens;
    return 0;
  }
  return insert_markers(j, g);
}

int dl_gen_load_unit(struct dl_job *j, struct dl_gen *g, uint32_t d, uint64_t unit) {
  return load_unit(j, g, d, unit, false);
}

/* Re-reads the current delimited unit whole, at the same served offset,
 * charging what was still due (whole units are charged when loaded). */
static int read_whole(struct dl_job *j, struct dl_gen *g) {
  uint64_t due = dl_gen_charge_due(j, g), off = g->off;
  int rc = load_unit(j, g, (uint32_t)g->cur_ds, g->cur_unit, true);
  if (rc < 0) return rc;
  g->off = off;
  g->ds[g->cur_ds].taken += due;
  return 0;
}

/* Whether the current unit has nothing left to serve. */
static bool unit_done(struct dl_gen *g) {
  return dl_gen_delimited(g) ? dl_gen_take_done(g) : g->off >= g->n_xtok;
}

static int pick_dataset(const struct dl_job *j, const struct dl_gen *g) {
  const struct dl_version *v = &j->ver[g->vi];
  int best = -1;
  double best_ratio = 0;
  for (uint32_t d = 0; d < g->n_ds; d++) {
    double w = dl_version_weight(v, d);
    if (w <= 0 || (g->ds[d].flags & DL_LDS_DEAD)) continue;
    double ratio = (double)g->ds[d].taken / w;
    if (best < 0 || ratio < best_ratio) {
      best = (int)d;
      best_ratio = ratio;
    }
  }
  return best;
}

/* Starts a new epoch of dataset d in lane c; false when the lane has no
 * unit of it left to give (it is then marked dead). */
static bool epoch_start(struct dl_job *j, uint32_t c, struct dl_lds *s, uint32_t d) {
  if (s->flags & DL_LDS_STARTED) {
    if (!(s->flags & DL_LDS_TOOK)) {
      s->flags |= DL_LDS_DEAD;
      return false;
    }
    s->epoch++;
  }
  s->left = 0;
  for (uint32_t i = 0; i < s->n_pos; i++) {
    uint64_t b, e;
    dl_shard_range(j, d, c + i * j->C, &b, &e);
    s->pos[i] = 0;
    s->left += e - b;
  }
  s->rr = 0;
  s->flags = DL_LDS_STARTED;
  if (s->left == 0) s->flags |= DL_LDS_DEAD;
  return s->left > 0;
}

/* The next unit of dataset d in lane c's order (consumes it). */
static uint64_t take_unit(struct dl_job *j, uint32_t c, struct dl_lds *s, uint32_t d) {
  uint32_t i = s->rr;
  uint64_t b, e;
  for (;;) {
    dl_shard_range(j, d, c + i * j->C, &b, &e);
    if (s->pos[i] < e - b) break;
    i = (i + 1) % s->n_pos;
  }
  uint64_t shard = c + (uint64_t)i * j->C;
  uint64_t key = dl_key(dl_key(dl_key(j->seed, j->ds[d].key), shard), s->epoch);
  uint64_t unit = b + dl_perm(key, e - b, s->pos[i]);
  s->pos[i]++;
  s->left--;
  s->rr = (i + 1) % s->n_pos;
  return unit;
}

static int next_unit(struct dl_job *j, uint32_t c, struct dl_gen *g) {
  const struct dl_version *v = &j->ver[g->vi];
  for (;;) {
    int d = pick_dataset(j, g);
    if (d < 0) {
      stk_set_detail("job %s lane %u: no dataset of the mixture has data left", j->name, c);
      return STK_ERANGE;
    }
    struct dl_lds *s = &g->ds[d];
    if ((!(s->flags & DL_LDS_STARTED) || s->left == 0) && !epoch_start(j, c, s, (uint32_t)d))
      continue;
    uint64_t unit = take_unit(j, c, s, (uint32_t)d);
    if (dl_version_blocked(v, (uint32_t)d, unit)) continue;
    int rc = dl_gen_load_unit(j, g, (uint32_t)d, unit);
    if (rc < 0) return rc;
    g->off = 0;
    if (unit_done(g)) continue;
    s->flags |= DL_LDS_TOOK;
    if (!dl_gen_delimited(g)) s->taken += g->n_xtok;
    g->cur_ds = d;
    g->cur_unit = unit;
    g->cur_epoch = s->epoch;
    return 0;
  }
}

/* Index of the piece holding served offset off. */
static size_t piece_at(const struct dl_gen *g, uint64_t off) {
  size_t lo = 0, hi = g->n_seg;
  while (hi - lo > 1) {
    size_t mid = (lo + hi) / 2;
    if (g->seg_x[mid] <= off)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

static int add_run(struct dl_job *j, const struct dl_gen *g, struct dl_line_out *o, size_t n) {
  if (o->n_runs == o->cap_runs) {
    size_t cap = o->cap_runs ? o->cap_runs * 2 : 16;
    Stoker__V1__LineSource **r = realloc(o->runs, cap * sizeof *r);
    if (!r) return STK_ENOMEM;
    o->runs = r;
    o->cap_runs = cap;
  }
  Stoker__V1__LineSource *s = malloc(sizeof *s);
  if (!s) return STK_ENOMEM;
  stoker__v1__line_source__init(s);
  s->line = o->line;
  s->dataset = strdup(j->ds[g->cur_ds].spec->name);
  if (!s->dataset) {
    free(s);
    return STK_ENOMEM;
  }
  s->document = g->seg_doc[piece_at(g, g->off)];
  s->token_begin = g->off;
  s->token_end = g->off + n;
  s->epoch = g->cur_epoch;
  s->unit = g->cur_unit;
  s->lane = o->lane;
  o->runs[o->n_runs++] = s;
  return 0;
}

/* Copies n tokens of the current unit at line position fill. */
static int emit(struct dl_job *j, struct dl_gen *g, struct dl_line_out *o, uint32_t fill,
                size_t n) {
  if (o->tokens && g->xtok)
    memcpy(o->tokens + fill, g->xtok + g->off, n * sizeof(uint32_t));
  else if (o->tokens)
    dl_unit_copy(&g->unit, g->off, n, o->tokens + fill);
  if (o->starts) {
    size_t i = piece_at(g, g->off);
    if (g->seg_x[i] < g->off) i++;
    for (; i < g->n_seg && g->seg_x[i] < g->off + n; i++)
      if (g->seg_new[i]) o->starts[o->n_starts++] = fill + (uint32_t)(g->seg_x[i] - g->off);
  }
  if (o->explain) return add_run(j, g, o, n);
  return 0;
}

int dl_gen_line(struct dl_job *j, uint32_t c, struct dl_gen *g, struct dl_line_out *out) {
  uint32_t t = j->ver[g->vi].seq_len + 1;
  int rc = dl_gen_fit(j, c, g);
  for (uint32_t fill = 0; rc == 0 && fill < t;) {
    if (g->cur_ds < 0 || unit_done(g)) {
      dl_gen_charge_used_up(j, g);
      unit_drop(g);
      g->cur_ds = -1;
      if ((rc = next_unit(j, c, g)) < 0) break;
    }
    if (dl_gen_delimited(g) && out && out->explain && (rc = read_whole(j, g)) < 0) break;
    size_t n;
    if (dl_gen_delimited(g)) {
      n = dl_gen_take(g, out, fill, t - fill);
    } else {
      n = g->n_xtok - g->off;
      if (n > t - fill) n = t - fill;
      if (out) rc = emit(j, g, out, fill, n);
    }
    g->off += n;
    fill += (uint32_t)n;
  }
  if (rc == 0) {
    g->k++;
    __atomic_fetch_add(&j->lanes[c].generated, 1, __ATOMIC_RELAXED);
  }
  return rc;
}

int dl_gen_next_version(struct dl_job *j, struct dl_gen *g) {
  g->vi++;
  g->k = 0;
  for (uint32_t d = 0; d < g->n_ds; d++) g->ds[d].taken = 0;
  g->charge_from = g->off; /* a delimited unit counts in the new version from here */
  if (g->cur_ds < 0 || unit_done(g)) return 0;
  const struct dl_version *v = &j->ver[g->vi];
  if (dl_version_blocked(v, (uint32_t)g->cur_ds, g->cur_unit)) {
    unit_drop(g);
    g->cur_ds = -1;
    g->off = 0;
  } else if (!dl_gen_delimited(g) && dl_version_weight(v, (uint32_t)g->cur_ds) > 0) {
    g->ds[g->cur_ds].taken += g->n_xtok - g->off;
  }
  return 0;
}
