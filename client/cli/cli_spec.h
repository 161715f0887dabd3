/*
 * `stokerctl job create` flags to a JobSpec: parsed and checked here, away
 * from the network, so that tests can check every flag lands in its field.
 */
#ifndef STK_CLI_SPEC_H
#define STK_CLI_SPEC_H

#include "cli_args.h"
#include "stoker/v1/coordinator.pb-c.h"

/* A JobSpec and the storage its pointers use; strings point into argv. */
struct cli_spec {
  Stoker__V1__JobSpec spec;
  Stoker__V1__StorageRef dataset;
  Stoker__V1__StorageRef checkpoint_storage;
  Stoker__V1__JobSpec__LabelsEntry labels[CLI_MAX_FLAGS];
  Stoker__V1__JobSpec__LabelsEntry *label_ptrs[CLI_MAX_FLAGS];
  char label_text[CLI_MAX_FLAGS][2][256];
  Stoker__V1__Submission submission; /* job submit only. */
};

/* Fills out from name and --min, --max (required), --heartbeat, --misses,
 * --last-call, --join-timeout, --label k=v (repeatable), --dataset,
 * --checkpoint-storage, --checkpoint-every. Returns 0 or STK_EINVAL with
 * a one-line reason in err. */
int cli_spec_from_args(const struct cli_args *a, const char *name, struct cli_spec *out, char *err,
                       size_t err_len);

/* For job submit: fills out->spec.submission from --template (required),
 * --queue, --priority and the trainer's arguments (n_args words after
 * "--"). Their form is the coordinator's to check. Returns 0 or STK_EINVAL
 * with a one-line reason in err. */
int cli_submission_from_args(const struct cli_args *a, const char *const *args, int n_args,
                             struct cli_spec *out, char *err, size_t err_len);

#endif
