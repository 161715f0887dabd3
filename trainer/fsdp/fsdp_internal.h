/*
 * fsdp_internal.h: what the fsdp files share: the per-unit shard state, the
 * step plan (compute steps, gather events, the ordered collective list the
 * communication thread runs), the rate limiter, and the fsdp object with
 * its per-step rendezvous between the compute and communication threads.
 *
 * A step's compute steps are s = 0 .. 2U-1: forward of unit s for s < U,
 * then backward of unit 2U-1-s. A gather event is one all-gather of a unit
 * kept alive over consecutive compute steps [first_step, last_step] (the
 * head's forward and backward share the gathers of the head and of unit 0).
 * With a root unit (opts.root_unit; K = 1), unit 0 is gathered once for the
 * whole step and is not counted against K.
 */
#ifndef STK_FSDP_INTERNAL_H
#define STK_FSDP_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "fsdp.h"

/* One unit's shard on this rank (count = padded / W elements each). */
struct fsdp_unit {
  size_t numel;  /* Real elements of the unit. */
  size_t padded; /* Padded to a multiple of W. */
  size_t count;  /* Shard elements: padded / W. */
  float *param;  /* fp32 master shard. */
  float *m, *v;  /* AdamW state of the shard. */
  float *gshard; /* Mean gradient shard after the reduce-scatter. */
  uint8_t *mask; /* Decay mask slice (padding: 0). */
};

struct fsdp_gather {
  int unit;
  int first_step, last_step;
  int root; /* The root unit's gather: held all step, outside the unit limit. */
};

enum fsdp_op_kind {
  FSDP_OP_GATHER = 0,         /* All-gather of gather event `index`. */
  FSDP_OP_REDUCE_SCATTER = 1, /* Reduce-scatter of unit `index`'s gradient. */
  FSDP_OP_ALL_REDUCE = 2,     /* The squared norm, loss and votes. */
};

struct fsdp_op {
  enum fsdp_op_kind kind;
  int index;
  int after_steps; /* Runs once this many compute steps are done. */
};

#define FSDP_STEP_MAX_GATHERS 2

struct fsdp_plan {
  int nsteps; /* 2U compute steps; step nsteps is the norm pseudo-step. */
  int (*step_gathers)[FSDP_STEP_MAX_GATHERS];
  int *step_ngathers;
  struct fsdp_gather *gathers;
  int ngathers;
  struct fsdp_op *ops;
  int nops;
};

/* root_unit0: unit 0 (the embeddings the tied head reads) is the root unit,
 * gathered once per step and kept until its backward (what K = 1 uses). */
int fsdp_plan_build(const struct model_config *cfg, int root_unit0, struct fsdp_plan *ret_plan);
void fsdp_plan_close(struct fsdp_plan *p);
/* The unit compute step s runs, and whether it is a backward step. */
int fsdp_plan_step_unit(const struct fsdp_plan *p, int s);
int fsdp_plan_step_backward(const struct fsdp_plan *p, int s);

/*
 * The rate limiter: at most max_units buffers (0: no limit) and max_bytes
 * bytes (0: no limit) acquired at once. acquire blocks until enough is
 * released, or fails with STK_ECANCELED once aborted. The root unit's
 * buffer (acquire_root) counts against the bytes only; peak_units counts
 * every buffer, root included. Thread safe.
 */
struct fsdp_limiter {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int max_units;
  size_t max_bytes;
  int units; /* Counted against max_units. */
  int roots; /* Root buffers: bytes only. */
  size_t bytes;
  int aborted;
  int peak_units;
  size_t peak_bytes;
  int64_t wait_ns;
};

int fsdp_limiter_init(struct fsdp_limiter *l, int max_units, size_t max_bytes);
void fsdp_limiter_close(struct fsdp_limiter *l);
int fsdp_limiter_acquire(struct fsdp_limiter *l, size_t bytes);
void fsdp_limiter_release(struct fsdp_limiter *l, size_t bytes);
int fsdp_limiter_acquire_root(struct fsdp_limiter *l, size_t bytes);
void fsdp_limiter_release_root(struct fsdp_limiter *l, size_t bytes);
void fsdp_limiter_abort(struct fsdp_limiter *l);
/* Clears the abort and the counts in use (between steps); keeps peaks. */
void fsdp_limiter_rearm(struct fsdp_limiter *l);

struct fsdp {
  struct model_config cfg;
  struct coll_group *group; /* NULL: one rank. */
  int rank, world;
  struct fsdp_opts opts;
  int U;
  struct fsdp_unit *units;
  struct fsdp_plan plan;
  struct fsdp_limiter lim;
  struct model *model; /* Built for (B, T) on the first step. */
  int B, T;
  int64_t steps_done;
  int64_t coll_wait_ns;
  int64_t coll_busy_ns; /* The communication thread inside collectives. */
  uint64_t bytes_moved, gather_bytes;
  int64_t nsteps_stat;
  float vote;                      /* This rank's, for the next step. */
  int votes;                       /* Summed over ranks by the last step. */
  int (*before_update)(void *arg); /* fsdp_set_before_update; NULL: none. */
  void *before_update_arg;

  /* One step's rendezvous, under mu. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done_steps; /* Compute steps finished (nsteps + 1 once the norm is ready). */
  int error;      /* First error of the step, or 0. */
  int rs_done;    /* Reduce-scatters finished. */
  int ar_done;
  float **bufs;   /* Per gather event: the unsharded unit once gathered. */
  char *ready;    /* Per gather event. */
  float **grads;  /* Per unit: the unsharded gradient during backward. */
  float **params; /* Per unit: what the model reads (compute side only). */
  float red[3];   /* Squared gradient norm, loss and votes, all-reduced. */
};

/* fsdp_shard.c: the shards. */
int fsdp_units_init(struct fsdp *f);
void fsdp_units_free(struct fsdp *f);

/* fsdp_comm.c: collectives (trivial without a group) and the comm thread. */
int fsdp_coll_gather(struct fsdp *f, int unit, float *ret_full);
int64_t fsdp_now_ns(void);
void *fsdp_comm_main(void *arg);
/* Records the step's first error and wakes everybody. Takes f->mu. */
void fsdp_fail(struct fsdp *f, int err);

#endif
