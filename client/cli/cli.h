/*
 * What stokerctl's subcommands share: the parsed command line, the name
 * of the command for error lines, and the one way errors are reported (one
 * line on stderr, an exit code from the table in --help).
 */
#ifndef STK_CLI_H
#define STK_CLI_H

#include "cli_args.h"
#include "stoker_admin.h"

struct cli_ctx {
  const struct cli_args *args;
  const char *cmd;  /* "job show", for error lines. */
  const char *name; /* First operand after the command words, if any. */
  int n_ops;        /* Operands after the command words. */
  const char *const *ops;
  int n_trailing; /* job submit: the words after "--" (the trainer's arguments). */
  const char *const *trailing;
};

/* Opens a client to address with the global TLS/token/timeout flags.
 * Reports a failure itself and returns its exit code. */
/* The client options of the global flags (TLS, token, timeout) for address. */
struct stk_client_opts cli_client_opts(const struct cli_ctx *x, const char *address);
int cli_connect(const struct cli_ctx *x, const char *address, struct stk_client **ret_client);

/* Prints "stokerctl: CMD: MESSAGE (CODE)" for err (the server's message
 * when there is one) and returns the exit code. */
int cli_report(const struct cli_ctx *x, int err);

/* Prints "stokerctl: CMD: MESSAGE" for a usage error; returns 1. */
int cli_usage_error(const struct cli_ctx *x, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Unix time now in milliseconds. */
int64_t cli_now_ms(void);

/* Calls fn once per service address the global flags give, in the order
 * coordinator, dataloader (each part of its comma list), checkpoint, with the
 * service's name. Returns the first nonzero result fn gave (all are called). */
typedef int (*cli_address_fn)(const struct cli_ctx *x, const char *service, const char *address,
                              void *arg);
int cli_each_address(const struct cli_ctx *x, cli_address_fn fn, void *arg);

/* Subcommands; each returns the process exit code. */
int cli_health(const struct cli_ctx *x);
int cli_usage(const struct cli_ctx *x);
int cli_jobs_list(const struct cli_ctx *x);
int cli_job_show(const struct cli_ctx *x);
int cli_job_watch(const struct cli_ctx *x);
int cli_job_create(const struct cli_ctx *x);
int cli_job_submit(const struct cli_ctx *x);
int cli_job_scale(const struct cli_ctx *x);
int cli_job_pause(const struct cli_ctx *x);
int cli_job_resume(const struct cli_ctx *x);
int cli_job_preempt(const struct cli_ctx *x);
int cli_job_stop(const struct cli_ctx *x);
int cli_job_delete(const struct cli_ctx *x);
int cli_loader_create(const struct cli_ctx *x);
int cli_loader_show(const struct cli_ctx *x);
int cli_loader_list(const struct cli_ctx *x);
int cli_loader_delete(const struct cli_ctx *x);
int cli_loader_mixture(const struct cli_ctx *x);
int cli_loader_explain(const struct cli_ctx *x);
int cli_loader_commit(const struct cli_ctx *x);
int cli_ckpt_list(const struct cli_ctx *x);
int cli_ckpt_show(const struct cli_ctx *x);
int cli_ckpt_verify(const struct cli_ctx *x);
int cli_ckpt_delete(const struct cli_ctx *x);
int cli_ckpt_abort(const struct cli_ctx *x);

#endif
