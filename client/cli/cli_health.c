/*
 * `stokerctl health`: the standard gRPC health check against every service
 * address stokerctl was given (the coordinator always; the dataloader, each
 * part of a scaled-out one, and the checkpoint service when set). Exits
 * non-zero unless all are SERVING.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_format.h"
#include "grpc/health/v1/health.pb-c.h"

/* Checks one address; fills status text, returns 0 or the exit code. */
static int check(const struct cli_ctx *x, const char *address, char *status, size_t len) {
  struct stk_client *c;
  int rc = cli_connect(x, address, &c);
  if (rc) {
    snprintf(status, len, "ERROR");
    return rc;
  }
  int serving = 0;
  int err = stk_health_check(c, "", 0, &serving);
  stk_client_free(c);
  if (err < 0) {
    snprintf(status, len, "%s", stk_client_last_error(NULL));
    if (!status[0]) snprintf(status, len, "%s", stk_strerror(err));
    return cli_exit_code(err);
  }
  const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(
      &grpc__health__v1__health_check_response__serving_status__descriptor, serving);
  snprintf(status, len, "%s", v ? v->name : "UNKNOWN");
  return serving == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
             ? 0
             : CLI_EXIT_UNAVAILABLE;
}

/* Checks one address and adds its row (table) or prints its JSON line. */
static void report(const struct cli_ctx *x, struct table *t, const char *name, const char *address,
                   int *worst) {
  char status[600];
  int rc = check(x, address, status, sizeof(status));
  if (rc && !*worst) *worst = rc;
  if (x->args->json) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "service", name);
    cJSON_AddStringToObject(o, "address", address);
    cJSON_AddStringToObject(o, rc && strcmp(status, "NOT_SERVING") ? "error" : "status", status);
    fmt_print_json(o, stdout);
    cJSON_Delete(o);
  } else if (t) {
    const char *row[] = {name, address, status};
    table_add(t, row);
  }
}

int cli_health(const struct cli_ctx *x) {
  const char *names[] = {"coordinator", "dataloader", "checkpoint"};
  const char *addrs[] = {x->args->coordinator, x->args->dataloader, x->args->checkpoint};
  static const char *const headers[] = {"SERVICE", "ADDRESS", "STATUS"};
  struct table *t = table_new(3, headers);
  int worst = 0;
  for (int i = 0; i < 3; i++) {
    if (!addrs[i]) continue;
    /* A scaled-out dataloader is a comma-separated list: one row per part. */
    for (const char *p = addrs[i]; *p;) {
      size_t n = strcspn(p, ",");
      char address[512];
      snprintf(address, sizeof(address), "%.*s", (int)(n < sizeof(address) ? n : 0), p);
      if (address[0]) report(x, t, names[i], address, &worst);
      p += n;
      if (*p == ',') p++;
    }
  }
  if (t && !x->args->json) table_print(t, stdout);
  table_free(t);
  return worst;
}
