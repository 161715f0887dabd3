/*
 * fsdp_plan: compiles a model's step into the fixed schedule both threads
 * follow. The compute side walks steps 0 .. 2U-1; the communication thread
 * runs the op list in order. The op list is a pure function of the model
 * configuration, so every rank issues the same collectives in the same
 * order whatever the timing: all-gathers for step s+1 are issued as step s
 * starts (the prefetch), and a unit's reduce-scatter right after its
 * backward step. With a root unit (opts.root_unit, always at K = 1) unit 0
 * is one gather event over the whole step: its forward, the tied head's
 * forward and backward, and its own backward read the same buffer.
 */
#include <stdlib.h>

#include "fsdp_internal.h"
#include "stk_error.h"

int fsdp_plan_step_unit(const struct fsdp_plan *p, int s) {
  int U = p->nsteps / 2;
  return s < U ? s : p->nsteps - 1 - s;
}

int fsdp_plan_step_backward(const struct fsdp_plan *p, int s) {
  return s >= p->nsteps / 2;
}

/* Gather events: a unit needed by consecutive steps is gathered once; the
 * root unit (gather 0 when root_unit0) once for every step. */
static void plan_gathers(const struct model_config *cfg, int root_unit0, struct fsdp_plan *p) {
  if (root_unit0) p->gathers[p->ngathers++] = (struct fsdp_gather){0, 0, p->nsteps - 1, 1};
  for (int s = 0; s < p->nsteps; s++) {
    int needs[2];
    int n = model_unit_needs(cfg, fsdp_plan_step_unit(p, s), needs);
    p->step_ngathers[s] = n;
    for (int i = 0; i < n; i++) {
      if (root_unit0 && needs[i] == 0) {
        p->step_gathers[s][i] = 0;
        continue;
      }
      int g = 0;
      while (g < p->ngathers &&
             !(p->gathers[g].unit == needs[i] && p->gathers[g].last_step == s - 1))
        g++;
      if (g == p->ngathers) p->gathers[p->ngathers++] = (struct fsdp_gather){needs[i], s, s, 0};
      p->gathers[g].last_step = s;
      p->step_gathers[s][i] = g;
    }
  }
}

static void emit_gathers_for(struct fsdp_plan *p, int s) {
  for (int g = 0; g < p->ngathers; g++)
    if (p->gathers[g].first_step == s) p->ops[p->nops++] = (struct fsdp_op){FSDP_OP_GATHER, g, 0};
}

static void plan_ops(struct fsdp_plan *p) {
  emit_gathers_for(p, 0);
  for (int s = 0; s < p->nsteps; s++) {
    emit_gathers_for(p, s + 1);
    if (fsdp_plan_step_backward(p, s))
      p->ops[p->nops++] =
          (struct fsdp_op){FSDP_OP_REDUCE_SCATTER, fsdp_plan_step_unit(p, s), s + 1};
  }
  p->ops[p->nops++] = (struct fsdp_op){FSDP_OP_ALL_REDUCE, 0, p->nsteps + 1};
}

int fsdp_plan_build(const struct model_config *cfg, int root_unit0, struct fsdp_plan *ret_plan) {
  int U = model_unit_count(cfg);
  struct fsdp_plan p = {.nsteps = 2 * U};
  size_t max_gathers = (size_t)p.nsteps * FSDP_STEP_MAX_GATHERS;
  p.step_gathers = calloc((size_t)p.nsteps, sizeof(*p.step_gathers));
  p.step_ngathers = calloc((size_t)p.nsteps, sizeof(int));
  p.gathers = calloc(max_gathers, sizeof(struct fsdp_gather));
  p.ops = calloc(max_gathers + (size_t)U + 1, sizeof(struct fsdp_op));
  if (!p.step_gathers || !p.step_ngathers || !p.gathers || !p.ops) {
    fsdp_plan_close(&p);
    return STK_ENOMEM;
  }
  plan_gathers(cfg, root_unit0, &p);
  plan_ops(&p);
  *ret_plan = p;
  return 0;
}

void fsdp_plan_close(struct fsdp_plan *p) {
  free(p->step_gathers);
  free(p->step_ngathers);
  free(p->gathers);
  free(p->ops);
  *p = (struct fsdp_plan){0};
}
