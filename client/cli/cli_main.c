/*
 * stokerctl: the operator's command line for Stoker. main() parses the
 * command line, finds the subcommand in one table (words, operands, flags
 * it accepts, usage; cli_help.c prints the usage texts from it), and runs it; every failure ends as
 * one line on stderr and an exit code from the table in --help.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "cli_help.h"
#include "rpc.h"
#include "stk_config.h"
#include "stk_error.h"

static const struct cli_command commands[] = {
    {{"health", NULL},
     0,
     "",
     cli_health,
     "",
     "check every service address given",
     "One line per service: SERVICE ADDRESS STATUS, STATUS being SERVING, NOT_SERVING or\n"
     "unreachable (with the reason). The coordinator is always checked; the dataloader (each\n"
     "part of a scaled-out one) and the checkpoint service when their address is given\n"
     "(--dataloader, --checkpoint or STOKER_DATALOADER, STOKER_CHECKPOINT).\n"
     "--json: one object per service {\"service\",\"address\",\"status\"} (and \"error\" when\n"
     "unreachable). Exits 0 when all are SERVING, 4 otherwise.\n"},
    {{"jobs", "list"},
     0,
     "label",
     cli_jobs_list,
     "[--label K=V]...",
     "list jobs (with all of these labels)",
     NULL},
    {{"job", "show"}, 1, "", cli_job_show, "NAME", "spec, state, checkpoint and members", NULL},
    {{"job", "watch"},
     1,
     "after",
     cli_job_watch,
     "NAME [--after SEQ]",
     "stream events until Ctrl-C or deletion",
     "  --after SEQ   only the events after sequence number SEQ\n"},
    {{"job", "create"},
     1,
     "min max heartbeat misses last-call join-timeout label dataset checkpoint-storage "
     "checkpoint-every",
     cli_job_create,
     "NAME --min N --max N [--heartbeat 5s] [--misses 3]\n[--last-call 30s] [--join-timeout "
     "10m] [--label K=V]...\n[--dataset URI] [--checkpoint-storage URI] [--checkpoint-every N]",
     "create a job",
     "  --min N, --max N        ranks a generation may start with, and at most\n"
     "  --heartbeat DURATION    heartbeat interval of the ranks (default 5s)\n"
     "  --misses N              heartbeats missed before a rank is lost (default 3)\n"
     "  --last-call DURATION    wait for more ranks once --min joined (default 30s)\n"
     "  --join-timeout DURATION how long a join may wait (default 10m)\n"
     "  --label K=V             a label (repeatable)\n"
     "  --dataset URI, --checkpoint-storage URI, --checkpoint-every N   kept in the spec\n"},
    {{"job", "scale"},
     2,
     "skip-checkpoint",
     cli_job_scale,
     "NAME N [--skip-checkpoint]",
     "checkpoint, then restart at N ranks",
     NULL},
    {{"job", "pause"},
     1,
     "force",
     cli_job_pause,
     "NAME [--force]",
     "checkpoint, then pause (--force: without the checkpoint)",
     NULL},
    {{"job", "resume"}, 1, "", cli_job_resume, "NAME", "resume a paused job", NULL},
    {{"job", "stop"},
     1,
     "force",
     cli_job_stop,
     "NAME [--force]",
     "checkpoint, then stop (--force: without the checkpoint)",
     NULL},
    {{"job", "delete"},
     1,
     "force",
     cli_job_delete,
     "NAME [--force]",
     "delete a job (--force: even while ranks are members)",
     NULL},
    {{"loader", "create"},
     1,
     "dataset seq-len global-batch seed shards lanes bos eos max-doc-tokens",
     cli_loader_create,
     "JOB --dataset NAME=URI[:FORMAT][@WEIGHT]... --seq-len N\n--global-batch N [--seed N] "
     "[--shards L] [--lanes C] [--bos ID]\n[--eos ID] [--max-doc-tokens N]",
     "create a job's data loader (FORMAT: megatron, llmc, text)",
     NULL},
    {{"loader", "show"},
     1,
     "",
     cli_loader_show,
     "JOB",
     "spec, datasets and committed step (or why the job failed)",
     NULL},
    {{"loader", "list"},
     0,
     "",
     cli_loader_list,
     "",
     "every loader job of each dataloader part, failed ones with the reason",
     "  --json   one object per job (with \"part\" when there are several parts)\n"},
    {{"loader", "delete"},
     1,
     "",
     cli_loader_delete,
     "JOB",
     "remove a loader job and its stored state on every part (failed ones too)",
     NULL},
    {{"loader", "mixture"},
     1,
     "from-step dataset seq-len global-batch block-document",
     cli_loader_mixture,
     "JOB --from-step S [--dataset ...]... [--seq-len N]\n[--global-batch N] "
     "[--block-document DATASET/FILE/DOC]...",
     "new configuration from step S on",
     NULL},
    {{"loader", "explain"},
     2,
     "rank world",
     cli_loader_explain,
     "JOB STEP [--rank R --world W]",
     "where each line came from",
     NULL},
    {{"loader", "commit"},
     2,
     "",
     cli_loader_commit,
     "JOB STEP",
     "make the loader state after STEP durable",
     NULL},
    {{"checkpoint", "list"}, 1, "", cli_ckpt_list, "JOB", "committed checkpoints of a job", NULL},
    {{"checkpoint", "show"},
     2,
     "",
     cli_ckpt_show,
     "JOB STEP",
     "manifest: tensors, dtype, shape, chunks, objects",
     "  --json   the whole manifest\n"},
    {{"checkpoint", "verify"},
     2,
     "progress",
     cli_ckpt_verify,
     "JOB STEP [--progress]",
     "re-read every byte, check every CRC",
     "  --progress   a progress bar on stderr (the default on a terminal)\n"
     "Exits 6 when any block is bad.\n"},
    {{"checkpoint", "delete"},
     2,
     "",
     cli_ckpt_delete,
     "JOB STEP",
     "delete a committed checkpoint",
     NULL},
    {{"checkpoint", "abort"},
     1,
     "reason",
     cli_ckpt_abort,
     "ATTEMPT [--reason TEXT]",
     "abort an open checkpoint attempt",
     "  --reason TEXT   named in the error its writers get\n"
     "Its writers fail, its staging memory is freed and what it uploaded is deleted;\n"
     "exits 0 also when the attempt was already aborted, 3 once it committed.\n"},
};

#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

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

/* True when name is in the space-separated list. */
static bool listed(const char *list, const char *name) {
  size_t n = strlen(name);
  for (const char *p = list; (p = strstr(p, name)) != NULL; p += n) {
    if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0')) return true;
  }
  return false;
}

static int words_of(const struct cli_command *cmd) {
  return cmd->words[1] ? 2 : 1;
}

static const struct cli_command *find_command(const struct cli_args *a) {
  for (size_t i = 0; i < N_COMMANDS; i++) {
    const struct cli_command *cmd = &commands[i];
    int w = words_of(cmd);
    if (a->n_pos >= w && strcmp(a->pos[0], cmd->words[0]) == 0 &&
        (w == 1 || strcmp(a->pos[1], cmd->words[1]) == 0))
      return cmd;
  }
  return NULL;
}

/* Checks operands and flags of cmd, then runs it. */
static int run_command(const struct cli_command *cmd, const struct cli_args *a) {
  char name[64];
  int w = words_of(cmd);
  snprintf(name, sizeof(name), "%s%s%s", cmd->words[0], w == 2 ? " " : "",
           w == 2 ? cmd->words[1] : "");
  struct cli_ctx x = {.args = a, .cmd = name, .n_ops = a->n_pos - w, .ops = a->pos + w};
  if (x.n_ops != cmd->n_ops)
    return cli_usage_error(&x, "expected %d argument%s, got %d", cmd->n_ops,
                           cmd->n_ops == 1 ? "" : "s", x.n_ops);
  for (int i = 0; i < a->n_flags; i++) {
    if (!listed(cmd->flags, a->flags[i].name))
      return cli_usage_error(&x, "--%s does not apply here", a->flags[i].name);
  }
  x.name = x.n_ops > 0 ? x.ops[0] : NULL;
  return cmd->run(&x);
}

/* No command matches the words: a group alone ("stokerctl job") or with
 * --help prints the group's subcommands (to stderr with exit 1 when bare,
 * like stokerctl alone); anything else is an unknown command. */
static int no_command(const struct cli_args *a) {
  struct cli_ctx top = {.args = a};
  if (cli_help_is_group(commands, N_COMMANDS, a->pos[0])) {
    if (a->help) {
      cli_help_group(commands, N_COMMANDS, a->pos[0], stdout);
      return CLI_EXIT_OK;
    }
    if (a->n_pos == 1) {
      cli_help_group(commands, N_COMMANDS, a->pos[0], stderr);
      return CLI_EXIT_USAGE;
    }
    fprintf(stderr, "stokerctl: unknown command \"%s %s\" (see stokerctl %s --help)\n", a->pos[0],
            a->pos[1], a->pos[0]);
    return CLI_EXIT_USAGE;
  }
  return cli_usage_error(&top, "unknown command \"%s\"", a->pos[0]);
}

static const char *env(const char *name) {
  return getenv(name);
}

int main(int argc, char **argv) {
  struct cli_args a;
  char why[256];
  struct cli_ctx top = {.args = &a};
  if (cli_parse(argc, argv, &a, why, sizeof(why)) < 0) return cli_usage_error(&top, "%s", why);
  if (a.version) {
    printf("stokerctl %s\n", STK_VERSION);
    return CLI_EXIT_OK;
  }
  if (a.n_pos == 0) {
    cli_help_global(commands, N_COMMANDS, a.help ? stdout : stderr);
    return a.help ? CLI_EXIT_OK : CLI_EXIT_USAGE;
  }
  cli_apply_env(&a, env);
  const struct cli_command *cmd = find_command(&a);
  if (!cmd) return no_command(&a);
  if (a.help) {
    cli_help_command(cmd, stdout);
    return CLI_EXIT_OK;
  }
  return run_command(cmd, &a);
}
