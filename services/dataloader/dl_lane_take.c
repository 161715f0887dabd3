/*
 * dl_lane_take: a lane's delimited units — llm.c blocks of uint32 tokens
 * served without BOS/EOS markers, the common case — read in the same pass
 * that fills the lines (dl_take.h), so each token is read from the map once
 * instead of being scanned for delimiters when the unit is loaded and copied
 * later. Explain needs a unit's pieces and document numbers, so dl_lane.c
 * reads such a unit whole (the other forms) when provenance is asked for.
 *
 * Accounting: mixing counts tokens served per dataset. A unit read whole is
 * charged in full when loaded; a delimited unit's size is known only once
 * it is read, so it is charged when used up. The counter is the same
 * wherever it is read: the dataset pick runs only once the unit is used up,
 * and snapshots store the full charge (dl_gen_charge_due), so their format
 * does not depend on how a unit was read.
 */
#include "dl_internal.h"
#include "dl_take.h"
#include "stk_error.h"

bool dl_gen_delimited(const struct dl_gen *g) {
  return g->unit.raw != NULL;
}

bool dl_gen_take_done(struct dl_gen *g) {
  const struct dl_unit *u = &g->unit;
  while (g->raw_pos < u->raw_end && u->raw[g->raw_pos] == u->delim) g->raw_pos++;
  return g->raw_pos == u->raw_end;
}

size_t dl_gen_take(struct dl_gen *g, struct dl_line_out *out, uint32_t fill, size_t want) {
  const struct dl_unit *u = &g->unit;
  uint32_t *dst = out && out->tokens ? out->tokens + fill : NULL;
  uint32_t *starts = out && out->starts ? out->starts + out->n_starts : NULL;
  size_t n_starts = 0;
  size_t n = dl_take_u32(u->raw, &g->raw_pos, u->raw_end, u->delim, want, dst, starts, &n_starts);
  for (size_t i = 0; i < n_starts; i++) starts[i] += fill;
  if (starts) out->n_starts += n_starts;
  return n;
}

/* Whether the current unit's dataset is counted in this version's mix. */
static bool counted(const struct dl_job *j, const struct dl_gen *g) {
  return dl_version_weight(&j->ver[g->vi], (uint32_t)g->cur_ds) > 0;
}

uint64_t dl_gen_charge_due(const struct dl_job *j, const struct dl_gen *g) {
  if (g->cur_ds < 0 || !dl_gen_delimited(g) || !counted(j, g)) return 0;
  const struct dl_unit *u = &g->unit;
  uint64_t total = g->off + dl_take_count_u32(u->raw, g->raw_pos, u->raw_end, u->delim);
  return total - g->charge_from;
}

void dl_gen_charge_used_up(const struct dl_job *j, struct dl_gen *g) {
  if (g->cur_ds >= 0 && dl_gen_delimited(g) && counted(j, g))
    g->ds[g->cur_ds].taken += g->off - g->charge_from;
}

int dl_gen_resume_unit(const struct dl_job *j, struct dl_gen *g) {
  if (!dl_gen_delimited(g)) return g->off <= g->n_xtok ? 0 : STK_ECORRUPT;
  const struct dl_unit *u = &g->unit;
  g->raw_pos = u->raw_begin;
  if (dl_take_u32(u->raw, &g->raw_pos, u->raw_end, u->delim, g->off, NULL, NULL, NULL) < g->off)
    return STK_ECORRUPT;
  g->charge_from = g->off;
  uint64_t due = dl_gen_charge_due(j, g);
  if (g->ds[g->cur_ds].taken < due) return STK_ECORRUPT;
  g->ds[g->cur_ds].taken -= due;
  return 0;
}
