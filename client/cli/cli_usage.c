/*
 * `stokerctl usage`: what the caller's jobs hold of each daemon's budgets,
 * against the limits, from stoker.v1.Usage/GetUsage on every service
 * address stokerctl was given (the coordinator always; each dataloader part
 * and the checkpoint service when set). The daemon lists only the jobs the
 * token covers, so a team sees its own jobs and an operator every job.
 *
 * Table: per budget a row for all jobs (every tenant's, against the
 * daemon's limit), a row per tenant of the caller's jobs (their sum,
 * against the same limit) and a row per job (against the per-job limit).
 * --json: one object per budget and address.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_ckpt_format.h"
#include "cli_format.h"

struct cell_bytes {
  char used[32], limit[32];
};

static void row(struct table *t, const char *service, const char *budget, const char *tenant,
                const char *job, uint64_t used, uint64_t limit) {
  struct cell_bytes c;
  fmt_bytes(used, c.used, sizeof(c.used));
  if (limit)
    fmt_bytes(limit, c.limit, sizeof(c.limit));
  else
    snprintf(c.limit, sizeof(c.limit), "-");
  const char *cells[] = {service, budget, tenant, job, c.used, c.limit};
  table_add(t, cells);
}

/* The caller's tenants of budget b, each once, in the order first seen. */
static void tenant_rows(struct table *t, const char *service, const Stoker__V1__BudgetUsage *b) {
  for (size_t i = 0; i < b->n_jobs; i++) {
    bool seen = false;
    for (size_t k = 0; k < i && !seen; k++) seen = !strcmp(b->jobs[k]->tenant, b->jobs[i]->tenant);
    if (seen) continue;
    uint64_t sum = 0;
    for (size_t k = i; k < b->n_jobs; k++)
      if (!strcmp(b->jobs[k]->tenant, b->jobs[i]->tenant)) sum += b->jobs[k]->used_bytes;
    row(t, service, b->budget, b->jobs[i]->tenant, "(tenant)", sum, b->limit_bytes);
  }
}

static void print_json(const char *service, const char *address, const Stoker__V1__BudgetUsage *b) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "service", service);
  cJSON_AddStringToObject(o, "address", address);
  cJSON_AddStringToObject(o, "budget", b->budget);
  cJSON_AddNumberToObject(o, "used_bytes", (double)b->used_bytes);
  cJSON_AddNumberToObject(o, "limit_bytes", (double)b->limit_bytes);
  cJSON_AddNumberToObject(o, "limit_per_job_bytes", (double)b->limit_per_job_bytes);
  cJSON *jobs = cJSON_AddArrayToObject(o, "jobs");
  for (size_t i = 0; i < b->n_jobs; i++) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "job", b->jobs[i]->job);
    cJSON_AddStringToObject(j, "tenant", b->jobs[i]->tenant);
    cJSON_AddNumberToObject(j, "used_bytes", (double)b->jobs[i]->used_bytes);
    cJSON_AddItemToArray(jobs, j);
  }
  fmt_print_json(o, stdout);
  cJSON_Delete(o);
}

/* Asks one address; returns 0 or the exit code of its failure. */
static int report(const struct cli_ctx *x, const char *service, const char *address, void *arg) {
  struct table *t = arg;
  struct stk_client *c = NULL;
  int rc = cli_connect(x, address, &c);
  if (rc) return rc;
  Stoker__V1__UsageReport *r = NULL;
  int err = stk_usage_get(c, 0, &r);
  if (err < 0) {
    rc = cli_report(x, err);
    stk_client_free(c);
    return rc;
  }
  for (size_t i = 0; i < r->n_budgets; i++) {
    const Stoker__V1__BudgetUsage *b = r->budgets[i];
    if (x->args->json) {
      print_json(service, address, b);
      continue;
    }
    row(t, service, b->budget, "*", "(all jobs)", b->used_bytes, b->limit_bytes);
    tenant_rows(t, service, b);
    for (size_t k = 0; k < b->n_jobs; k++)
      row(t, service, b->budget, b->jobs[k]->tenant, b->jobs[k]->job, b->jobs[k]->used_bytes,
          b->limit_per_job_bytes);
  }
  protobuf_c_message_free_unpacked(&r->base, NULL);
  stk_client_free(c);
  return 0;
}

int cli_usage(const struct cli_ctx *x) {
  static const char *const headers[] = {"SERVICE", "BUDGET", "TENANT", "JOB", "USED", "LIMIT"};
  struct table *t = table_new(6, headers);
  int worst = cli_each_address(x, report, t);
  if (t && !x->args->json) table_print(t, stdout);
  table_free(t);
  return worst;
}
