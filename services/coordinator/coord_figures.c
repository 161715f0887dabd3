/*
 * coord_figures: each job's headline figures (generation, world, step,
 * tokens/s, checkpoint, waiting joiners) for the daemon's per-job metrics,
 * read on the loop at scrape time so that a deleted job leaves no series.
 */
#include <stdlib.h>
#include <string.h>

#include "coord_internal.h"

static int by_name(const void *a, const void *b) {
  return strcmp((*(const struct job *const *)a)->name, (*(const struct job *const *)b)->name);
}

static void figures_of(const struct job *j, struct coord_job_figures *f) {
  *f = (struct coord_job_figures){.name = j->name,
                                  .generation = j->generation,
                                  .world_size = j->n_members,
                                  .checkpoint_step = j->ckpt_step,
                                  .joiners = j->n_joiners,
                                  .kv_bytes = j->kv_bytes};
  size_t pos;
  for (struct hnode *n = coord_tab_first(&j->members, &pos); n;
       n = coord_tab_next(&j->members, n, &pos)) {
    const struct member *m = (const struct member *)n;
    if (m->step > f->step) f->step = m->step;
    f->tokens_per_s += m->tps;
  }
}

size_t coord_job_figures(const struct coord *c, struct coord_job_figures *out, size_t max) {
  size_t n = c->jobs.n, k = 0, pos;
  if (n == 0 || max == 0) return n;
  const struct job **all = malloc(n * sizeof *all);
  if (!all) return n; /* Out of memory: no series this scrape. */
  for (struct hnode *h = coord_tab_first(&c->jobs, &pos); h && k < n;
       h = coord_tab_next(&c->jobs, h, &pos))
    all[k++] = (const struct job *)h;
  qsort(all, k, sizeof *all, by_name);
  for (size_t i = 0; i < k && i < max; i++) figures_of(all[i], &out[i]);
  free(all);
  return n;
}
