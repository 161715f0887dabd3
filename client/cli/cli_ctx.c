/*
 * What every stokerctl command shares (see cli.h): the clock, the client
 * options from the global flags, connecting, every service address, and
 * the one-line error reports with their exit codes.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "rpc.h"
#include "stk_error.h"

int64_t cli_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int cli_usage_error(const struct cli_ctx *x, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "stokerctl: %s%s", x->cmd ? x->cmd : "", x->cmd ? ": " : "");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  if (x->cmd)
    fprintf(stderr, " (see stokerctl %s --help)\n", x->cmd);
  else
    fprintf(stderr, " (see stokerctl --help)\n");
  return CLI_EXIT_USAGE;
}

int cli_report(const struct cli_ctx *x, int err) {
  int code = 0;
  const char *msg = stk_client_last_error(&code);
  if (!code) code = stk_error_to_grpc(err);
  if (!msg[0]) msg = stk_strerror(err);
  fprintf(stderr, "stokerctl: %s: %s (%s)\n", x->cmd, msg, rpc_code_name(code));
  return cli_exit_code(err);
}

struct stk_client_opts cli_client_opts(const struct cli_ctx *x, const char *address) {
  const struct cli_args *a = x->args;
  return (struct stk_client_opts){
      .address = address,
      .tls_ca_file = a->tls_ca,
      .tls_cert_file = a->tls_cert,
      .tls_key_file = a->tls_key,
      .token_file = a->token_file,
      .default_timeout_ms = a->timeout_ms,
  };
}

int cli_connect(const struct cli_ctx *x, const char *address, struct stk_client **ret_client) {
  struct stk_client_opts o = cli_client_opts(x, address);
  int err = stk_client_new(&o, ret_client);
  return err ? cli_report(x, err) : 0;
}

int cli_each_address(const struct cli_ctx *x, cli_address_fn fn, void *arg) {
  const char *names[] = {"coordinator", "dataloader", "checkpoint"};
  const char *addrs[] = {x->args->coordinator, x->args->dataloader, x->args->checkpoint};
  int worst = 0;
  for (int i = 0; i < 3; i++) {
    if (!addrs[i]) continue;
    /* A scaled-out dataloader is a comma-separated list: each part's own. */
    for (const char *p = addrs[i]; *p;) {
      size_t n = strcspn(p, ",");
      char address[512];
      snprintf(address, sizeof(address), "%.*s", (int)(n < sizeof(address) ? n : 0), p);
      int rc = address[0] ? fn(x, names[i], address, arg) : 0;
      if (rc && !worst) worst = rc;
      p += n;
      if (*p == ',') p++;
    }
  }
  return worst;
}
