/*
 * `stokerctl health`: the standard gRPC health check against every service
 * address stokerctl was given (the coordinator always; the dataloader, each
 * part of a scaled-out one, and the checkpoint service when set), one line
 * each: SERVICE ADDRESS STATUS [DETAIL]. STATUS is the server's answer
 * (SERVING, NOT_SERVING, SERVICE_UNKNOWN), "unreachable" when no answer
 * came (refused, no route, deadline) or "error" for any other failure
 * (a token refused, TLS); DETAIL says why for the last two. Exits 0 only
 * when every service is SERVING, else the exit code of the first that is
 * not (4 for NOT_SERVING and unreachable).
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_format.h"
#include "grpc/health/v1/health.pb-c.h"

struct health_row {
  char status[32];
  char detail[512];
  int rc; /* Exit code: 0 when SERVING. */
};

/* The client's last message for err, or the error's text. */
static void describe(int err, char *out, size_t len) {
  snprintf(out, len, "%s", stk_client_last_error(NULL));
  if (!out[0]) snprintf(out, len, "%s", stk_strerror(err));
}

/* Checks one address. */
static void check(const struct cli_ctx *x, const char *address, struct health_row *row) {
  struct stk_client_opts o = cli_client_opts(x, address);
  struct stk_client *c = NULL;
  int serving = 0;
  int err = stk_client_new(&o, &c);
  if (!err) err = stk_health_check(c, "", 0, &serving);
  if (err < 0) describe(err, row->detail, sizeof(row->detail));
  stk_client_free(c);
  if (err < 0) {
    bool gone = err == STK_EUNAVAIL || err == STK_ETIMEDOUT;
    snprintf(row->status, sizeof(row->status), "%s", gone ? "unreachable" : "error");
    row->rc = cli_exit_code(err);
    return;
  }
  const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(
      &grpc__health__v1__health_check_response__serving_status__descriptor, serving);
  snprintf(row->status, sizeof(row->status), "%s", v ? v->name : "UNKNOWN");
  row->rc = serving == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                ? 0
                : CLI_EXIT_UNAVAILABLE;
}

/* Checks one address and adds its row (table) or prints its JSON line:
 * {"service","address","status"} and "error" with the detail if any.
 * Returns 0 or the exit code of its failure. */
static int report(const struct cli_ctx *x, const char *name, const char *address, void *arg) {
  struct table *t = arg;
  struct health_row row = {0};
  check(x, address, &row);
  if (x->args->json) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "service", name);
    cJSON_AddStringToObject(o, "address", address);
    cJSON_AddStringToObject(o, "status", row.status);
    if (row.detail[0]) cJSON_AddStringToObject(o, "error", row.detail);
    fmt_print_json(o, stdout);
    cJSON_Delete(o);
  } else if (t) {
    const char *cells[] = {name, address, row.status, row.detail[0] ? row.detail : NULL};
    table_add(t, cells);
  }
  return row.rc;
}

int cli_health(const struct cli_ctx *x) {
  static const char *const headers[] = {"SERVICE", "ADDRESS", "STATUS", "DETAIL"};
  struct table *t = table_new(4, headers);
  int worst = cli_each_address(x, report, t);
  if (t && !x->args->json) table_print(t, stdout);
  table_free(t);
  return worst;
}
