/*
 * stokerctl's dataloader subcommands: loader create, show, mixture,
 * explain, commit. Each is: check operands and flags, connect to the
 * dataloader (--dataloader / STOKER_DATALOADER), one call through
 * libstoker-client, print a table or JSON, map the outcome to an exit code.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_format.h"
#include "cli_loader_format.h"
#include "cli_loader_spec.h"
#include "stoker_loader.h"

/* Connects to the dataloader, which must have been given. */
static int connect_loader(const struct cli_ctx *x, struct stk_client **ret_client) {
  if (!x->args->dataloader)
    return cli_usage_error(x, "no dataloader address (--dataloader ADDR or STOKER_DATALOADER)");
  return cli_connect(x, x->args->dataloader, ret_client);
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
static int finish_info(const struct cli_ctx *x, struct stk_client *c, int err,
                       Stoker__V1__LoaderInfo *info) {
  if (err == 0) {
    print_info(x, info);
    protobuf_c_message_free_unpacked(&info->base, NULL);
  }
  int rc = err ? cli_report(x, err) : 0;
  stk_client_free(c);
  return rc;
}

int cli_loader_create(const struct cli_ctx *x) {
  static struct cli_loader_spec spec; /* Large; one per process. */
  char why[256];
  if (cli_loader_spec_from_args(x->args, x->name, &spec, why, sizeof(why)) < 0)
    return cli_usage_error(x, "%s", why);
  struct stk_client *c;
  int rc = connect_loader(x, &c);
  if (rc) return rc;
  Stoker__V1__LoaderInfo *info = NULL;
  int err = stk_loader_create(c, &spec.spec, 0, &info);
  return finish_info(x, c, err, info);
}

int cli_loader_show(const struct cli_ctx *x) {
  struct stk_client *c;
  int rc = connect_loader(x, &c);
  if (rc) return rc;
  Stoker__V1__LoaderInfo *info = NULL;
  int err = stk_loader_get(c, x->name, 0, &info);
  return finish_info(x, c, err, info);
}

int cli_loader_mixture(const struct cli_ctx *x) {
  static struct cli_mixture mix;
  char why[256];
  if (cli_mixture_from_args(x->args, x->name, &mix, why, sizeof(why)) < 0)
    return cli_usage_error(x, "%s", why);
  struct stk_client *c;
  int rc = connect_loader(x, &c);
  if (rc) return rc;
  Stoker__V1__LoaderInfo *info = NULL;
  int err = stk_loader_update_mixture(c, &mix.req, 0, &info);
  return finish_info(x, c, err, info);
}

/* Parses operand STEP and --rank/--world (default 0 of 1). */
static int explain_args(const struct cli_ctx *x, int64_t *step, uint32_t *rank, uint32_t *world) {
  uint64_t s, r = 0, w = 1;
  const char *rv = cli_flag_value(x->args, "rank"), *wv = cli_flag_value(x->args, "world");
  if (cli_parse_uint(x->ops[1], INT64_MAX, &s) < 0)
    return cli_usage_error(x, "bad step \"%s\"", x->ops[1]);
  if ((rv && cli_parse_uint(rv, UINT32_MAX, &r) < 0) ||
      (wv && cli_parse_uint(wv, UINT32_MAX, &w) < 0) || w == 0 || r >= w)
    return cli_usage_error(x, "need 0 <= --rank < --world (got %s and %s)", rv ? rv : "0",
                           wv ? wv : "1");
  *step = (int64_t)s;
  *rank = (uint32_t)r;
  *world = (uint32_t)w;
  return 0;
}

int cli_loader_explain(const struct cli_ctx *x) {
  int64_t step = 0;
  uint32_t rank = 0, world = 1;
  int rc = explain_args(x, &step, &rank, &world);
  if (rc) return rc;
  struct stk_client *c;
  if ((rc = connect_loader(x, &c)) != 0) return rc;
  Stoker__V1__ExplainResponse *resp = NULL;
  int err = stk_loader_explain(c, x->name, step, rank, world, 0, &resp);
  if (err == 0) {
    if (x->args->json) {
      cJSON *o = fmt_explain_json(x->name, step, rank, world, resp);
      fmt_print_json(o, stdout);
      cJSON_Delete(o);
    } else {
      fmt_explain_table(resp, stdout);
    }
    protobuf_c_message_free_unpacked(&resp->base, NULL);
  }
  rc = err ? cli_report(x, err) : 0;
  stk_client_free(c);
  return rc;
}

int cli_loader_commit(const struct cli_ctx *x) {
  uint64_t step;
  if (cli_parse_uint(x->ops[1], INT64_MAX, &step) < 0)
    return cli_usage_error(x, "bad step \"%s\"", x->ops[1]);
  struct stk_client *c;
  int rc = connect_loader(x, &c);
  if (rc) return rc;
  int err = stk_loader_commit(c, x->name, (int64_t)step, 0);
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
  stk_client_free(c);
  return rc;
}
