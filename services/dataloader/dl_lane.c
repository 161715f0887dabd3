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
 *
 * Blocked documents: a unit's pieces keep their place in the unit's served
 * coordinates, and the pieces of documents the version blocks are skipped
 * over when reached (the offset jumps past them). So snapshots, replays and
 * a version that starts in the middle of a unit need nothing new: the
 * offset means the same thing whatever is blocked, and from a version's
 * first line on its blocklist decides what is left. Mixing charges only
 * the tokens served.
 *
 * Tokenizer switch: a version that reads a text dataset with another
 * tokenizer re-reads the unit a lane is in the middle of from a place (the
 * document being served, from the byte the old tokens reached), so the
 * document goes on where it stopped; the place is part of the pointer
 * (dl_gen.res_*), and offsets are in the unit as so read.
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
  free(g->seg_doc_off);
  free(g->seg_new);
  free(g->seg_blk);
  g->xtok = NULL;
  g->seg_x = NULL;
  g->seg_doc = NULL;
  g->seg_doc_off = NULL;
  g->seg_new = NULL;
  g->seg_blk = NULL;
  g->n_xtok = g->n_seg = g->n_blk = 0;
  g->ids = false;
  g->bc_piece = SIZE_MAX;
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
 * served tokens with BOS/EOS inserted. Which documents the pieces belong to
 * is asked only when needed (name_pieces; its arrays are allocated then). */
static int build_pieces(struct dl_gen *g) {
  const struct dl_unit *u = &g->unit;
  /* A unit read from the middle of a document leads with that document's
   * rest, even an empty one (an EOS may still be due). */
  size_t lead = (u->n_docs == 0 || u->doc_starts[0] > 0 || g->res_lead) ? 1 : 0;
  size_t n = u->n_docs + lead;
  g->seg_x = malloc((n + 1) * sizeof *g->seg_x);
  g->seg_new = malloc(n + 1);
  if (!g->seg_x || !g->seg_new) return STK_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    size_t di = i - lead; /* wraps for the lead piece, unused then */
    g->seg_x[i] = lead && i == 0 ? 0 : u->doc_starts[di];
    g->seg_new[i] = !(lead && i == 0);
  }
  g->n_seg = n;
  return 0;
}

/* Names each piece's document (its index in unit.file and the piece's
 * offset in it), asking the reader once per unit load. */
static int name_pieces(struct dl_job *j, struct dl_gen *g, uint32_t d, uint64_t unit) {
  if (g->ids) return 0;
  struct dl_unit_docs docs;
  int rc = dl_source_unit_docs(j->ds[d].src, unit, &docs);
  if (rc < 0) return rc;
  if (!g->seg_doc) g->seg_doc = malloc((g->n_seg + 1) * sizeof *g->seg_doc);
  if (!g->seg_doc_off) g->seg_doc_off = malloc((g->n_seg + 1) * sizeof *g->seg_doc_off);
  if (!g->seg_doc || !g->seg_doc_off) return STK_ENOMEM;
  const struct dl_unit *u = &g->unit;
  size_t lead = g->n_seg > u->n_docs;
  for (size_t i = 0; i < g->n_seg; i++) {
    size_t di = i - lead;
    bool piece_lead = lead && i == 0;
    uint64_t rel = piece_lead   ? (g->res_lead ? g->res_rel : 0)
                   : u->doc_rel ? u->doc_rel[di]
                                : di + 1;
    g->seg_doc[i] = docs.base + rel - 1;
    /* A document resumed with another tokenizer counts its tokens from
     * the byte where it resumed (doc_byte_begin says which). */
    g->seg_doc_off[i] = piece_lead && !g->res_lead ? docs.lead_offset : 0;
  }
  g->ids = true;
  return 0;
}

/* Marks the pieces whose documents version vi blocks (none: n_blk 0). */
static int mark_blocked(struct dl_job *j, struct dl_gen *g, uint32_t d, uint64_t unit) {
  const struct dl_version *v = &j->ver[g->vi];
  g->n_blk = 0;
  if (!dl_version_blocks_docs(v, d)) return 0;
  int rc = name_pieces(j, g, d, unit);
  if (rc < 0) return rc;
  if (!g->seg_blk && !(g->seg_blk = malloc(g->n_seg + 1))) return STK_ENOMEM;
  for (size_t i = 0; i < g->n_seg; i++) {
    g->seg_blk[i] = dl_version_doc_blocked(v, d, g->unit.file, g->seg_doc[i]);
    g->n_blk += g->seg_blk[i];
  }
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
 * or, when `whole` (Explain needs pieces) or version vi blocks documents of
 * the dataset, borrowed from the reader's map, so a line is filled with one
 * copy. */
static int load_unit(struct dl_job *j, struct dl_gen *g, uint32_t d, uint64_t unit, bool whole) {
  unit_drop(g);
  bool plain = !j->add_bos && !j->add_eos;
  whole = whole || dl_version_blocks_docs(&j->ver[g->vi], d);
  struct dl_source *src = dl_ds_src(j, g->vi, d);
  int rc = g->res_rel
               ? dl_source_read_unit_from(src, unit, g->res_rel, g->res_byte, g->res_lead, &g->unit)
           : !plain ? dl_source_read_unit(src, unit, &g->unit)
           : whole  ? dl_source_read_unit_runs(src, unit, &g->unit)
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
  } else if ((rc = insert_markers(j, g)) < 0) {
    return rc;
  }
  return mark_blocked(j, g, d, unit);
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

/* Served offset where piece i ends. */
static uint64_t piece_end(const struct dl_gen *g, size_t i) {
  return i + 1 < g->n_seg ? g->seg_x[i + 1] : g->n_xtok;
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

/* Moves the offset past pieces of blocked documents (a whole unit). */
static void skip_blocked(struct dl_gen *g) {
  if (g->n_blk == 0) return;
  while (g->off < g->n_xtok) {
    size_t i = piece_at(g, g->off);
    if (!g->seg_blk[i]) return;
    g->off = piece_end(g, i);
  }
}

/* Tokens of a whole unit still to be served from the offset on. */
static uint64_t tokens_left(const struct dl_gen *g) {
  uint64_t n = g->n_xtok - g->off;
  if (g->n_blk == 0 || g->off >= g->n_xtok) return n;
  for (size_t i = piece_at(g, g->off); i < g->n_seg; i++) {
    if (!g->seg_blk[i]) continue;
    uint64_t b = g->seg_x[i] > g->off ? g->seg_x[i] : g->off;
    n -= piece_end(g, i) - b;
  }
  return n;
}

/* Whether the current unit has nothing left to serve. */
static bool unit_done(struct dl_gen *g) {
  if (dl_gen_delimited(g)) return dl_gen_take_done(g);
  skip_blocked(g);
  return g->off >= g->n_xtok;
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
    g->res_rel = 0; /* a new unit is read whole */
    g->res_lead = false;
    int rc = dl_gen_load_unit(j, g, (uint32_t)d, unit);
    if (rc < 0) return rc;
    g->off = 0;
    if (unit_done(g)) continue;
    s->flags |= DL_LDS_TOOK;
    if (!dl_gen_delimited(g)) s->taken += tokens_left(g);
    g->cur_ds = d;
    g->cur_unit = unit;
    g->cur_epoch = s->epoch;
    return 0;
  }
}

/* The document tokens of served range [b, e) of piece i, as offsets in
 * the document (inserted BOS/EOS are not the document's). */
static void doc_range(const struct dl_job *j, const struct dl_gen *g, size_t i, uint64_t b,
                      uint64_t e, uint64_t *ret_begin, uint64_t *ret_end) {
  uint64_t first = g->seg_x[i] + (j->add_bos && g->seg_new[i]);
  uint64_t last = piece_end(g, i) - j->add_eos; /* past the document's last token */
  if (last < first) last = first;
  b = b < first ? first : b > last ? last : b;
  e = e < first ? first : e > last ? last : e;
  *ret_begin = g->seg_doc_off[i] + (b - first);
  *ret_end = g->seg_doc_off[i] + (e - first);
}

static bool is_lead(const struct dl_gen *g, size_t i) {
  return i == 0 && g->n_seg > g->unit.n_docs;
}

/* Byte of its document's text where piece i's first token starts: 0, or
 * where a document resumed with another tokenizer went on. */
static uint64_t piece_byte0(const struct dl_gen *g, size_t i) {
  return is_lead(g, i) && g->res_lead ? g->res_byte : 0;
}

/* The byte of its document's text where served offset `at` of piece i
 * lies (a text dataset's unit: copied, so xtok is set), read with src.
 * A cursor makes a document's consecutive lines cost their own tokens. */
static uint64_t piece_byte_at(const struct dl_job *j, struct dl_gen *g, const struct dl_source *src,
                              size_t i, uint64_t at) {
  uint64_t first = g->seg_x[i] + (j->add_bos && g->seg_new[i]);
  uint64_t last = piece_end(g, i) - j->add_eos;
  if (last < first) last = first;
  at = at < first ? first : at > last ? last : at;
  if (g->bc_piece != i || g->bc_off > at) {
    g->bc_piece = i;
    g->bc_off = first;
    g->bc_bytes = piece_byte0(g, i);
  }
  for (; g->bc_off < at && g->xtok; g->bc_off++)
    g->bc_bytes += dl_source_token_bytes(src, g->xtok[g->bc_off]);
  return g->bc_bytes;
}

/* One source entry: n tokens of one piece at the offset. */
static int add_run(struct dl_job *j, struct dl_gen *g, struct dl_line_out *o, size_t n) {
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
  s->file = strdup(dl_source_file_name(j->ds[g->cur_ds].src, g->unit.file));
  if (!s->dataset || !s->file) {
    free(s->dataset);
    free(s->file);
    free(s);
    return STK_ENOMEM;
  }
  o->runs[o->n_runs++] = s; /* freed with the others from here on */
  size_t i = piece_at(g, g->off);
  s->document = g->seg_doc[i];
  doc_range(j, g, i, g->off, g->off + n, &s->doc_token_begin, &s->doc_token_end);
  const struct dl_source *src = dl_ds_src(j, g->vi, (uint32_t)g->cur_ds);
  s->tokenizer = "";
  if (dl_source_tokenizes(src)) { /* text: the tokenizer, and the piece's bytes of the text */
    const struct dl_ds *ds = &j->ds[g->cur_ds];
    s->tokenizer = ds->tok_name[dl_version_tok(&j->ver[g->vi], (uint32_t)g->cur_ds)];
    s->doc_byte_begin = piece_byte_at(j, g, src, i, g->off);
    s->doc_byte_end = piece_byte_at(j, g, src, i, g->off + n);
  }
  s->token_begin = g->off;
  s->token_end = g->off + n;
  s->epoch = g->cur_epoch;
  s->unit = g->cur_unit;
  s->lane = o->lane;
  return (s->tokenizer = strdup(s->tokenizer)) ? 0 : STK_ENOMEM;
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
      g->res_rel = 0;
      g->res_lead = false;
      if ((rc = next_unit(j, c, g)) < 0) break;
    }
    bool explain = out && out->explain;
    if (dl_gen_delimited(g) && explain && (rc = read_whole(j, g)) < 0) break;
    if (explain && (rc = name_pieces(j, g, (uint32_t)g->cur_ds, g->cur_unit)) < 0) break;
    size_t n;
    if (dl_gen_delimited(g)) {
      n = dl_gen_take(g, out, fill, t - fill);
    } else {
      /* One piece at a time where pieces matter: a source entry per
       * document piece, and blocked pieces skipped at the loop's top. */
      uint64_t end = explain || g->n_blk ? piece_end(g, piece_at(g, g->off)) : g->n_xtok;
      n = end - g->off;
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

/* The current unit read again with version g->vi's tokenizer from where
 * the old one (src) stopped: the document being served goes on from its
 * next byte (the rest of a token-split character too: the tokenizers are
 * byte-level), the unit's later documents follow. A document not begun
 * starts afresh (its BOS then still due). */
static int switch_tokenizer(struct dl_job *j, struct dl_gen *g, uint32_t d,
                            const struct dl_source *src) {
  size_t i = piece_at(g, g->off);
  bool lead = is_lead(g, i);
  uint32_t rel = 1; /* a unit of empty documents only: nothing follows */
  if (lead && g->res_lead)
    rel = g->res_rel;
  else if (!lead) {
    size_t di = i - (g->n_seg > g->unit.n_docs);
    rel = g->unit.doc_rel ? g->unit.doc_rel[di] : (uint32_t)(di + 1);
  }
  uint64_t byte = piece_byte_at(j, g, src, i, g->off);
  bool from_byte = lead || g->off > g->seg_x[i];
  g->res_rel = rel;
  g->res_byte = from_byte ? byte : 0;
  g->res_lead = from_byte;
  int rc = load_unit(j, g, d, g->cur_unit, false);
  g->off = 0;
  return rc;
}

int dl_gen_next_version(struct dl_job *j, struct dl_gen *g) {
  g->vi++;
  g->k = 0;
  for (uint32_t d = 0; d < g->n_ds; d++) g->ds[d].taken = 0;
  g->charge_from = g->off; /* a delimited unit counts in the new version from here */
  if (g->cur_ds < 0 || unit_done(g)) return 0;
  const struct dl_version *v = &j->ver[g->vi];
  uint32_t d = (uint32_t)g->cur_ds;
  if (dl_version_blocked(v, d, g->cur_unit)) {
    unit_drop(g);
    g->cur_ds = -1;
    g->off = 0;
    g->res_rel = 0;
    g->res_lead = false;
    return 0;
  }
  /* The new version's blocked documents apply to the rest of the unit: a
   * delimited unit is read whole from here (nothing is charged twice: the
   * counters of the new version start at 0), a whole one re-marked. */
  int rc = 0;
  uint32_t was = dl_version_tok(&j->ver[g->vi - 1], d), now = dl_version_tok(v, d);
  if (was != now && !dl_gen_delimited(g)) {
    rc = switch_tokenizer(j, g, d, j->ds[d].tok_src[was]);
  } else if (dl_gen_delimited(g) && dl_version_blocks_docs(v, d)) {
    uint64_t off = g->off;
    rc = load_unit(j, g, d, g->cur_unit, true);
    g->off = off;
  } else if (!dl_gen_delimited(g)) {
    rc = mark_blocked(j, g, d, g->cur_unit);
  }
  if (rc < 0) return rc;
  if (!dl_gen_delimited(g) && dl_version_weight(v, d) > 0) {
    skip_blocked(g);
    g->ds[d].taken += tokens_left(g);
  }
  return 0;
}
