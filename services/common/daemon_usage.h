/*
 * daemon_usage: what a daemon's budgets hold, per tenant and job, against
 * their limits, shown two ways from one figure source: the
 * stoker.v1.Usage service (GetUsage: the caller's jobs only, for
 * `stokerctl usage` and any gRPC client) and the stoker_budget_* families
 * on /metrics (every tenant, for Prometheus and the dashboard).
 *
 * A tenant is a team of the token file: a job belongs to the longest team
 * prefix covering its name (rpc_server_tenant), "*" when none does. The
 * label set is bounded: per-job series for the first METRICS_JOBS_MAX jobs
 * by name (per budget), per-tenant series for
 * USAGE_TENANTS_MAX tenants (met in job-name order), the rest summed under
 * tenant="other".
 *
 * Loop thread only: the daemon's collect function runs on the loop (for a
 * GetUsage call and for each /metrics render) and its job names need only
 * stay valid until it returns to its caller's caller.
 */
#ifndef STK_DAEMON_USAGE_H
#define STK_DAEMON_USAGE_H

#include <stddef.h>
#include <stdint.h>

struct daemon;

#define USAGE_BUDGETS_MAX 4   /* Budgets one daemon reports. */
#define USAGE_TENANTS_MAX 100 /* Tenants given series of their own. */

struct usage_budget {
  const char *name;             /* "kv", "stream", "staging", "read" */
  uint64_t limit_bytes;         /* All jobs together. */
  uint64_t limit_per_job_bytes; /* One job; 0: no per-job limit. */
  uint64_t used_bytes;          /* Held now, every job. */
};

struct usage_job {
  const char *job; /* Borrowed. */
  uint32_t budget; /* Index into the budgets. */
  uint64_t used_bytes;
};

/* What a daemon's collect function fills: its budgets, and through
 * usage_add the jobs holding some of them (a job may be added more than
 * once for one budget: its rows are summed). */
struct usage {
  struct usage_budget budgets[USAGE_BUDGETS_MAX];
  uint32_t n_budgets;
  struct usage_job *jobs;
  size_t n_jobs, cap_jobs;
};

/* Returns 0 or STK_ENOMEM. */
typedef int (*usage_collect_fn)(void *arg, struct usage *u);

/* Adds a job's holding of budget (0 bytes are skipped). 0 or STK_ENOMEM. */
int usage_add(struct usage *u, uint32_t budget, const char *job, uint64_t bytes);

/* Serves stoker.v1.Usage on the daemon's server and adds the metrics
 * collector; before daemon_start. 0, or an error from the server or
 * STK_ENOMEM. */
int daemon_usage_serve(struct daemon *d, usage_collect_fn collect, void *arg);

#endif
