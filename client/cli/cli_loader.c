/*
 * stokerctl's dataloader subcommands: loader create, show, list, delete,
 * mixture, explain, commit. Each is: check operands and flags, connect to the
 * dataloader (--dataloader / STOKER_DATALOADER), one call through
 * libstoker-client, print a table or JSON, map the outcome to an exit code.
 *
 * The address may be a comma-separated list, the i-th address being part i
 * of a scaled-out job (stoker-dataloader --part I/P): create, mixture and
 * commit then go to every part, show gives the combined info (committed
 * step the oldest over the parts) and explain the whole slice, every part's
 * runs merged in slice order. One address is one process, as always.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_format.h"
#include "cli_loader_format.h"
#include "cli_loader_spec.h"
#include "stoker_loader.h"

/* Connects to every dataloader part, whose address list must have been
 * given, with the global TLS/token/timeout flags. Reports a failure itself
 * and returns its exit code. */
static int connect_loader(const struct cli_ctx *x, struct stk_loader **ret_loader) {
  const struct cli_args *a = x->args;
  if (!a->dataloader)
    return cli_usage_error(x, "no dataloader address (--dataloader ADDR or STOKER_DATALOADER)");
  struct stk_client_opts o = {
      .address = a->dataloader,
      .tls_ca_file = a->tls_ca,
      .tls_cert_file = a->tls_cert,
      .tls_key_file = a->tls_key,
      .token_file = a->token_file,
      .default_timeout_ms = a->timeout_ms,
  };
  int err = stk_loader_open(&o, ret_loader);
  return err ? cli_report(x, err) : 0;
}

static void print_info(const struct cli_ctx *x, const Stoker__V1__LoaderInfo *info) {
  if (x->args->json) {
    cJSON *o = fmt_loader_json(info);
    fmt_print_json(o, stdout);
    cJSON_Delete(o);
  } else {
    fmt_loader_show(info, stdout);
  }
}

/* Ends a command that got a LoaderInfo back (or failed). */
static int finish_info(const struct cli_ctx *x, struct stk_loader *l, int err,
                       Stoker__V1__LoaderInfo *info) {
  if (err == 0) {
    print_info(x, info);
    protobuf_c_message_free_unpacked(&info->base, NULL);
  }
  int rc = err ? cli_report(x, err) : 0;
  stk_loader_close(l);
  return rc;
}

int cli_loader_create(const struct cli_ctx *x) {
  static struct cli_loader_spec spec; /* Large; one per process. */
  char why[256];
  if (cli_loader_spec_from_args(x->args, x->name, &spec, why, sizeof(why)) < 0)
    return cli_usage_error(x, "%s", why);
  struct stk_loader *l;
  int rc = connect_loader(x, &l);
  if (rc) return rc;
  Stoker__V1__LoaderInfo *info = NULL;
  int err = stk_loader_create_all(l, &spec.spec, 0, &info);
  return finish_info(x, l, err, info);
}

int cli_loader_show(const struct cli_ctx *x) {
  struct stk_loader *l;
  int rc = connect_loader(x, &l);
  if (rc) return rc;
  Stoker__V1__LoaderInfo *info = NULL;
  int err = stk_loader_info_all(l, x->name, 0, &info);
  return finish_info(x, l, err, info);
}

int cli_loader_list(const struct cli_ctx *x) {
  struct stk_loader *l;
  int rc = connect_loader(x, &l);
  if (rc) return rc;
  uint32_t n = stk_loader_n_parts(l);
  cJSON *arr = x->args->json ? cJSON_CreateArray() : NULL;
  int err = 0;
  for (uint32_t i = 0; !err && i < n; i++) {
    Stoker__V1__ListLoadersResponse *resp = NULL;
    if ((err = stk_loader_list(stk_loader_part(l, i), 0, &resp)) != 0) break;
    if (arr)
      fmt_loader_list_json(resp, n > 1 ? (int)i : -1, arr);
    else
      fmt_loader_list(resp, n > 1 ? (int)i : -1, i == 0, stdout);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
  }
  if (arr && !err) fmt_print_json(arr, stdout);
  cJSON_Delete(arr);
  rc = err ? cli_report(x, err) : 0;
  stk_loader_close(l);
  return rc;
}

int cli_loader_delete(const struct cli_ctx *x) {
  struct stk_loader *l;
  int rc = connect_loader(x, &l);
  if (rc) return rc;
  int err = stk_loader_delete_all(l, x->name, 0);
  if (err == 0) {
    if (x->args->json) {
      cJSON *o = cJSON_CreateObject();
      cJSON_AddStringToObject(o, "job", x->name);
      cJSON_AddBoolToObject(o, "deleted", 1);
      fmt_print_json(o, stdout);
      cJSON_Delete(o);
    } else {
      printf("loader \"%s\" deleted\n", x->name);
    }
  }
  rc = err ? cli_report(x, err) : 0;
  stk_loader_close(l);
  return rc;
}

int cli_loader_mixture(const struct cli_ctx *x) {
  static struct cli_mixture mix;
  char why[256];
  if (cli_mixture_from_args(x->args, x->name, &mix, why, sizeof(why)) < 0)
    return cli_usage_error(x, "%s", why);
  struct stk_loader *l;
  int rc = connect_loader(x, &l);
  if (rc) return rc;
  Stoker__V1__LoaderInfo *info = NULL;
  int err = stk_loader_update_all(l, &mix.req, 0, &info);
  return finish_info(x, l, err, info);
}

/* Parses operand STEP and --rank/--world (default 0 of 1). */
static int explain_args(const struct cli_ctx *x, int64_t *step, uint32_t *rank, uint32_t *world) {
  uint64_t s, r = 0, w = 1;
  const char *rv = cli_flag_value(x->args, "rank"), *wv = cli_flag_value(x->args, "world");
  if (flag_parse_uint(x->ops[1], INT64_MAX, &s) < 0)
    return cli_usage_error(x, "bad step \"%s\"", x->ops[1]);
  if ((rv && flag_parse_uint(rv, UINT32_MAX, &r) < 0) ||
      (wv && flag_parse_uint(wv, UINT32_MAX, &w) < 0) || w == 0 || r >= w)
    return cli_usage_error(x, "need 0 <= --rank < --world (got %s and %s)", rv ? rv : "0",
                           wv ? wv : "1");
  *step = (int64_t)s;
  *rank = (uint32_t)r;
  *world = (uint32_t)w;
  return 0;
}

/* Every part's Explain of one slice; sources views them all, merged. */
struct explain_all {
  uint32_t n;
  Stoker__V1__ExplainResponse **parts; /* [n], owned */
  Stoker__V1__ExplainResponse merged;  /* sources point into parts */
};

static void explain_all_free(struct explain_all *e) {
  for (uint32_t i = 0; e->parts && i < e->n; i++)
    if (e->parts[i]) protobuf_c_message_free_unpacked(&e->parts[i]->base, NULL);
  free(e->parts);
  free(e->merged.sources);
}

/* Merges the parts' runs by slice line (the parts' lines are disjoint),
 * keeping each part's order within a line. */
static int explain_merge(struct explain_all *e) {
  size_t total = 0;
  for (uint32_t i = 0; i < e->n; i++) total += e->parts[i]->n_sources;
  size_t *at = calloc(e->n, sizeof(*at));
  e->merged.sources = calloc(total + 1, sizeof(*e->merged.sources));
  if (!at || !e->merged.sources) {
    free(at);
    return STK_ENOMEM;
  }
  for (size_t k = 0; k < total; k++) {
    uint32_t best = e->n;
    for (uint32_t i = 0; i < e->n; i++) {
      if (at[i] == e->parts[i]->n_sources) continue;
      if (best == e->n ||
          e->parts[i]->sources[at[i]]->line < e->parts[best]->sources[at[best]]->line)
        best = i;
    }
    e->merged.sources[k] = e->parts[best]->sources[at[best]++];
  }
  e->merged.n_sources = total;
  free(at);
  return 0;
}

static int explain_all(struct stk_loader *l, const char *job, int64_t step, uint32_t rank,
                       uint32_t world, struct explain_all *e) {
  *e = (struct explain_all){.n = stk_loader_n_parts(l)};
  stoker__v1__explain_response__init(&e->merged);
  e->parts = calloc(e->n, sizeof(*e->parts));
  int err = e->parts ? 0 : STK_ENOMEM;
  for (uint32_t i = 0; !err && i < e->n; i++)
    err = stk_loader_explain(stk_loader_part(l, i), job, step, rank, world, 0, &e->parts[i]);
  return err ? err : explain_merge(e);
}

int cli_loader_explain(const struct cli_ctx *x) {
  int64_t step = 0;
  uint32_t rank = 0, world = 1;
  int rc = explain_args(x, &step, &rank, &world);
  if (rc) return rc;
  struct stk_loader *l;
  if ((rc = connect_loader(x, &l)) != 0) return rc;
  struct explain_all e;
  int err = explain_all(l, x->name, step, rank, world, &e);
  if (err == 0) {
    if (x->args->json) {
      cJSON *o = fmt_explain_json(x->name, step, rank, world, &e.merged);
      fmt_print_json(o, stdout);
      cJSON_Delete(o);
    } else {
      fmt_explain_table(&e.merged, stdout);
    }
  }
  explain_all_free(&e);
  rc = err ? cli_report(x, err) : 0;
  stk_loader_close(l);
  return rc;
}

int cli_loader_commit(const struct cli_ctx *x) {
  uint64_t step;
  if (flag_parse_uint(x->ops[1], INT64_MAX, &step) < 0)
    return cli_usage_error(x, "bad step \"%s\"", x->ops[1]);
  struct stk_loader *l;
  int rc = connect_loader(x, &l);
  if (rc) return rc;
  int err = stk_loader_commit_all(l, x->name, (int64_t)step, 0);
  if (err == 0) {
    if (x->args->json) {
      cJSON *o = cJSON_CreateObject();
      cJSON_AddStringToObject(o, "job", x->name);
      cJSON_AddNumberToObject(o, "committed_step", (double)step);
      fmt_print_json(o, stdout);
      cJSON_Delete(o);
    } else {
      printf("loader \"%s\" committed at step %" PRIu64 "\n", x->name, step);
    }
  }
  rc = err ? cli_report(x, err) : 0;
  stk_loader_close(l);
  return rc;
}
