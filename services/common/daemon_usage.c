/*
 * daemon_usage: a daemon's budgets per tenant and job, served as
 * stoker.v1.Usage and rendered as stoker_budget_* (daemon_usage.h). Both
 * ask the daemon's collect function afresh, so nothing here goes stale.
 */
#include "daemon_usage.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "metrics.h"
#include "metrics_jobs.h"
#include "rpc.h"
#include "stk_error.h"
#include "stoker/v1/common.pb-c.h"
#include "strbuf.h"

struct usage_src {
  struct rpc_server *srv;
  usage_collect_fn collect;
  void *arg;
};

static int gather(struct usage_src *s, struct usage *u);
static void usage_free(struct usage *u);
static void tenant_label(const struct usage_src *s, const char *job, char *out, size_t len);

int usage_add(struct usage *u, uint32_t budget, const char *job, uint64_t bytes) {
  if (bytes == 0) return 0;
  if (u->n_jobs == u->cap_jobs) {
    size_t cap = u->cap_jobs ? u->cap_jobs * 2 : 64;
    struct usage_job *v = realloc(u->jobs, cap * sizeof(*v));
    if (!v) return STK_ENOMEM;
    u->jobs = v;
    u->cap_jobs = cap;
  }
  u->jobs[u->n_jobs++] = (struct usage_job){.job = job, .budget = budget, .used_bytes = bytes};
  return 0;
}

/* ------------------------------------------------------------- GetUsage */

/* The reply's strings and arrays, freed after rpc_reply. */
struct report {
  Stoker__V1__UsageReport r;
  Stoker__V1__BudgetUsage b[USAGE_BUDGETS_MAX], *bp[USAGE_BUDGETS_MAX];
  Stoker__V1__JobUsage *jobs, **jp;
  char (*tenants)[256];
};

RPC_HANDLER(handle_get_usage, struct usage_src, Stoker__V1__GetUsageRequest) {
  (void)req;
  struct usage u;
  int rc = gather(svc, &u);
  struct report rep = {.r = STOKER__V1__USAGE_REPORT__INIT};
  size_t n = u.n_jobs;
  if (rc == 0) {
    rep.jobs = calloc(n + 1, sizeof(*rep.jobs));
    rep.jp = calloc(n + 1, sizeof(*rep.jp));
    rep.tenants = calloc(n + 1, sizeof(*rep.tenants));
    if (!rep.jobs || !rep.jp || !rep.tenants) rc = STK_ENOMEM;
  }
  if (rc) {
    rpc_fail_err(call, rc, "cannot gather the budgets' usage");
  } else {
    size_t at = 0;
    char why[256];
    for (uint32_t b = 0; b < u.n_budgets; b++) {
      Stoker__V1__BudgetUsage *bu = &rep.b[b];
      stoker__v1__budget_usage__init(bu);
      bu->budget = (char *)u.budgets[b].name;
      bu->limit_bytes = u.budgets[b].limit_bytes;
      bu->limit_per_job_bytes = u.budgets[b].limit_per_job_bytes;
      bu->used_bytes = u.budgets[b].used_bytes;
      bu->jobs = rep.jp + at;
      for (size_t i = 0; i < n; i++) {
        if (u.jobs[i].budget != b || rpc_call_denies_job(call, u.jobs[i].job, why, sizeof(why)))
          continue;
        Stoker__V1__JobUsage *ju = &rep.jobs[at];
        stoker__v1__job_usage__init(ju);
        ju->job = (char *)u.jobs[i].job;
        tenant_label(svc, ju->job, rep.tenants[at], sizeof(rep.tenants[at]));
        ju->tenant = rep.tenants[at];
        ju->used_bytes = u.jobs[i].used_bytes;
        rep.jp[at++] = ju;
        bu->n_jobs++;
      }
      rep.bp[b] = bu;
    }
    rep.r.budgets = rep.bp;
    rep.r.n_budgets = u.n_budgets;
    rpc_reply(call, &rep.r.base);
  }
  free(rep.jobs);
  free(rep.jp);
  free(rep.tenants);
  usage_free(&u);
}

#define USAGE_SVC Stoker__V1__Usage_Service

/* Any token may ask: the handler lists only the jobs its scope covers. */
static const struct rpc_method_def usage_rows[] = {
    RPC_UNARY_SCOPED_ROW(USAGE_SVC, get_usage, handle_get_usage),
};

/* -------------------------------------------------------------- metrics */

/* One tenant's sum of a budget. */
struct tenant_sum {
  char name[256];
  uint64_t bytes;
};

static void write_family(struct strbuf *out, const char *name, const char *help) {
  strbuf_printf(out, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
}

/* Adds bytes to name's sum among the first USAGE_TENANTS_MAX tenants, or
 * to "other" (sums[USAGE_TENANTS_MAX]) beyond them. */
static void tenant_add(struct tenant_sum *sums, size_t *n, const char *name, uint64_t bytes) {
  for (size_t i = 0; i < *n; i++)
    if (strcmp(sums[i].name, name) == 0) {
      sums[i].bytes += bytes;
      return;
    }
  if (*n == USAGE_TENANTS_MAX) {
    sums[USAGE_TENANTS_MAX].bytes += bytes;
    return;
  }
  snprintf(sums[*n].name, sizeof(sums[*n].name), "%s", name);
  sums[(*n)++].bytes = bytes;
}

static void write_budgets(struct strbuf *out, const struct usage_src *s, const struct usage *u) {
  write_family(
      out, "stoker_budget_limit_bytes",
      "What a budget lets jobs hold: per=\"all\" every job together, per=\"job\" one job.");
  for (uint32_t b = 0; b < u->n_budgets; b++) {
    strbuf_printf(out, "stoker_budget_limit_bytes{budget=\"%s\",per=\"all\"} %llu\n",
                  u->budgets[b].name, (unsigned long long)u->budgets[b].limit_bytes);
    if (u->budgets[b].limit_per_job_bytes)
      strbuf_printf(out, "stoker_budget_limit_bytes{budget=\"%s\",per=\"job\"} %llu\n",
                    u->budgets[b].name, (unsigned long long)u->budgets[b].limit_per_job_bytes);
  }
  write_family(out, "stoker_budget_used_bytes", "What every job holds of the budget now.");
  for (uint32_t b = 0; b < u->n_budgets; b++)
    strbuf_printf(out, "stoker_budget_used_bytes{budget=\"%s\"} %llu\n", u->budgets[b].name,
                  (unsigned long long)u->budgets[b].used_bytes);
  write_family(out, "stoker_budget_job_used_bytes",
               "What one job holds of the budget (the first 500 jobs by name, per budget).");
  static struct tenant_sum sums[USAGE_BUDGETS_MAX][USAGE_TENANTS_MAX + 1]; /* Loop only. */
  size_t n_sums[USAGE_BUDGETS_MAX] = {0}, shown[USAGE_BUDGETS_MAX] = {0};
  memset(sums, 0, sizeof(sums));
  for (size_t i = 0; i < u->n_jobs; i++) {
    const struct usage_job *j = &u->jobs[i];
    char tenant[256];
    tenant_label(s, j->job, tenant, sizeof(tenant));
    tenant_add(sums[j->budget], &n_sums[j->budget], tenant, j->used_bytes);
    if (shown[j->budget]++ >= METRICS_JOBS_MAX) continue;
    strbuf_printf(out, "stoker_budget_job_used_bytes{budget=\"%s\",tenant=\"",
                  u->budgets[j->budget].name);
    metrics_jobs_put_label(out, tenant);
    strbuf_puts(out, "\",job=\"");
    metrics_jobs_put_label(out, j->job);
    strbuf_printf(out, "\"} %llu\n", (unsigned long long)j->used_bytes);
  }
  write_family(out, "stoker_budget_tenant_used_bytes",
               "What the jobs of one tenant (a team's token scope; * for operators' jobs) hold "
               "of the budget.");
  for (uint32_t b = 0; b < u->n_budgets; b++) {
    for (size_t t = 0; t <= n_sums[b] && t <= USAGE_TENANTS_MAX; t++) {
      bool other = t == n_sums[b];
      if (other && (n_sums[b] < USAGE_TENANTS_MAX || !sums[b][USAGE_TENANTS_MAX].bytes)) break;
      strbuf_printf(out, "stoker_budget_tenant_used_bytes{budget=\"%s\",tenant=\"",
                    u->budgets[b].name);
      metrics_jobs_put_label(out, other ? "other" : sums[b][t].name);
      strbuf_printf(out, "\"} %llu\n",
                    (unsigned long long)sums[b][other ? USAGE_TENANTS_MAX : t].bytes);
    }
  }
}

static void collect_metrics(struct strbuf *out, void *arg) {
  struct usage_src *s = arg;
  struct usage u;
  if (gather(s, &u) == 0) write_budgets(out, s, &u); /* Out of memory: no budget series. */
  usage_free(&u);
}

int daemon_usage_serve(struct daemon *d, usage_collect_fn collect, void *arg) {
  /* Lives as long as the daemon: its server and registry keep it. */
  struct usage_src *s = calloc(1, sizeof(*s));
  if (!s) return STK_ENOMEM;
  daemon_own(d, s);
  *s = (struct usage_src){.srv = daemon_rpc(d), .collect = collect, .arg = arg};
  int rc = rpc_server_add_service(s->srv, &stoker__v1__usage__descriptor, usage_rows,
                                  RPC_N_ROWS(usage_rows), s);
  if (rc == 0 && daemon_metrics(d))
    rc = metrics_add_collector(daemon_metrics(d), collect_metrics, s);
  return rc;
}

/* -------------------------------------------------------------- helpers */

static int by_budget_job(const void *a, const void *b) {
  const struct usage_job *x = a, *y = b;
  if (x->budget != y->budget) return x->budget < y->budget ? -1 : 1;
  return strcmp(x->job, y->job);
}

/* The daemon's figures, its jobs sorted by (budget, name), one row each. */
static int gather(struct usage_src *s, struct usage *u) {
  memset(u, 0, sizeof(*u));
  int rc = s->collect(s->arg, u);
  if (rc) return rc;
  if (u->n_jobs) qsort(u->jobs, u->n_jobs, sizeof(*u->jobs), by_budget_job);
  size_t w = 0;
  for (size_t i = 0; i < u->n_jobs; i++) {
    if (w && u->jobs[w - 1].budget == u->jobs[i].budget &&
        strcmp(u->jobs[w - 1].job, u->jobs[i].job) == 0)
      u->jobs[w - 1].used_bytes += u->jobs[i].used_bytes;
    else
      u->jobs[w++] = u->jobs[i];
  }
  u->n_jobs = w;
  return 0;
}

static void usage_free(struct usage *u) {
  free(u->jobs);
  u->jobs = NULL;
  u->n_jobs = u->cap_jobs = 0;
}

/* "team-a-*" for a job of team-a-, "*" for a job no team covers. */
static void tenant_label(const struct usage_src *s, const char *job, char *out, size_t len) {
  const char *t = rpc_server_tenant(s->srv, job);
  snprintf(out, len, "%s*", t ? t : "");
}
