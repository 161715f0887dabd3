/*
 * stokerctl: the operator's command line for Stoker. main() parses the
 * command line, finds the subcommand in one table (words, operands, flags
 * it accepts), and runs it; every failure ends as one line on stderr and an
 * exit code from the table in --help.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "rpc.h"
#include "stk_config.h"

static const char usage_text[] =
    "usage: stokerctl [GLOBAL FLAGS] COMMAND [ARGS] [FLAGS]\n"
    "\n"
    "Commands:\n"
    "  health                          check every service address given\n"
    "  jobs list [--label K=V]...      list jobs (with all of these labels)\n"
    "  job show NAME                   spec, state, checkpoint and members\n"
    "  job watch NAME [--after SEQ]    stream events until Ctrl-C or deletion\n"
    "  job create NAME --min N --max N [--heartbeat 5s] [--misses 3]\n"
    "             [--last-call 30s] [--join-timeout 10m] [--label K=V]...\n"
    "             [--dataset URI] [--checkpoint-storage URI] [--checkpoint-every N]\n"
    "  job scale NAME N [--skip-checkpoint]\n"
    "  job pause|resume|stop NAME [--force]\n"
    "  job delete NAME [--force]\n"
    "  loader create JOB --dataset NAME=URI[:FORMAT][@WEIGHT]... --seq-len N\n"
    "             --global-batch N [--seed N] [--shards L] [--lanes C] [--bos ID]\n"
    "             [--eos ID] [--max-doc-tokens N]     (FORMAT: megatron, llmc, text)\n"
    "  loader show JOB                 spec, datasets and committed step\n"
    "  loader mixture JOB --from-step S [--dataset ...]... [--seq-len N]\n"
    "             [--global-batch N]   new configuration from step S on\n"
    "  loader explain JOB STEP [--rank R --world W]   where each line came from\n"
    "  loader commit JOB STEP          make the loader state after STEP durable\n"
    "  checkpoint list JOB             committed checkpoints of a job\n"
    "  checkpoint show JOB STEP        manifest: tensors, dtype, shape, chunks, objects\n"
    "                                  (--json: the whole manifest)\n"
    "  checkpoint verify JOB STEP [--progress]   re-read every byte, check every CRC\n"
    "                                  (progress bar on a terminal or with --progress)\n"
    "  checkpoint delete JOB STEP      delete a committed checkpoint\n"
    "\n"
    "Global flags:\n"
    "  --coordinator ADDR   coordinator HOST:PORT (env STOKER_COORDINATOR,\n"
    "                       default " CLI_DEFAULT_COORDINATOR ")\n"
    "  --dataloader ADDRS   dataloader HOST:PORT, or a comma-separated list of the parts\n"
    "                       of a scaled-out one (env STOKER_DATALOADER)\n"
    "  --checkpoint ADDR    checkpoint service HOST:PORT (env STOKER_CHECKPOINT,\n"
    "                       default 127.0.0.1:7072)\n"
    "  --json               JSON output, one object per line\n"
    "  --timeout DURATION   per-call deadline (default 10s; e.g. 500ms, 30s, 2m)\n"
    "  --tls-ca FILE        use TLS, verifying servers with this CA (PEM)\n"
    "  --tls-cert FILE      client certificate for mutual TLS (PEM)\n"
    "  --tls-key FILE       client key for mutual TLS (PEM)\n"
    "  --token-file FILE    bearer token (env STOKER_TOKEN_FILE)\n"
    "  -h, --help           this text (after a command: that command's usage)\n"
    "  --version            print \"stokerctl VERSION\" and exit\n"
    "\n"
    "Exit codes:\n"
    "  0  ok\n"
    "  1  usage error or invalid argument\n"
    "  2  not found\n"
    "  3  failed precondition or conflict (wrong state, already exists, aborted)\n"
    "  4  unavailable or timed out (includes a service not SERVING)\n"
    "  5  unauthenticated or permission denied\n"
    "  6  other error\n";

struct command {
  const char *words[2]; /* words[1] NULL for one-word commands. */
  int n_ops;            /* Operands required after the words. */
  const char *flags;    /* Subcommand flags accepted, space-separated. */
  int (*run)(const struct cli_ctx *x);
};

static const struct command commands[] = {
    {{"health", NULL}, 0, "", cli_health},
    {{"jobs", "list"}, 0, "label", cli_jobs_list},
    {{"job", "show"}, 1, "", cli_job_show},
    {{"job", "watch"}, 1, "after", cli_job_watch},
    {{"job", "create"},
     1,
     "min max heartbeat misses last-call join-timeout label dataset checkpoint-storage "
     "checkpoint-every",
     cli_job_create},
    {{"job", "scale"}, 2, "skip-checkpoint", cli_job_scale},
    {{"job", "pause"}, 1, "force", cli_job_pause},
    {{"job", "resume"}, 1, "", cli_job_resume},
    {{"job", "stop"}, 1, "force", cli_job_stop},
    {{"job", "delete"}, 1, "force", cli_job_delete},
    {{"loader", "create"},
     1,
     "dataset seq-len global-batch seed shards lanes bos eos max-doc-tokens",
     cli_loader_create},
    {{"loader", "show"}, 1, "", cli_loader_show},
    {{"loader", "mixture"}, 1, "from-step dataset seq-len global-batch", cli_loader_mixture},
    {{"loader", "explain"}, 2, "rank world", cli_loader_explain},
    {{"loader", "commit"}, 2, "", cli_loader_commit},
    {{"checkpoint", "list"}, 1, "", cli_ckpt_list},
    {{"checkpoint", "show"}, 2, "", cli_ckpt_show},
    {{"checkpoint", "verify"}, 2, "progress", cli_ckpt_verify},
    {{"checkpoint", "delete"}, 2, "", cli_ckpt_delete},
};

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

int cli_connect(const struct cli_ctx *x, const char *address, struct stk_client **ret_client) {
  const struct cli_args *a = x->args;
  struct stk_client_opts o = {
      .address = address,
      .tls_ca_file = a->tls_ca,
      .tls_cert_file = a->tls_cert,
      .tls_key_file = a->tls_key,
      .token_file = a->token_file,
      .default_timeout_ms = a->timeout_ms,
  };
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

static int words_of(const struct command *cmd) {
  return cmd->words[1] ? 2 : 1;
}

static const struct command *find_command(const struct cli_args *a) {
  for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
    const struct command *cmd = &commands[i];
    int w = words_of(cmd);
    if (a->n_pos >= w && strcmp(a->pos[0], cmd->words[0]) == 0 &&
        (w == 1 || strcmp(a->pos[1], cmd->words[1]) == 0))
      return cmd;
  }
  return NULL;
}

/* Checks operands and flags of cmd, then runs it. */
static int run_command(const struct command *cmd, const struct cli_args *a) {
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
  if (a.help || a.n_pos == 0) {
    fputs(usage_text, a.help ? stdout : stderr);
    return a.help ? CLI_EXIT_OK : CLI_EXIT_USAGE;
  }
  cli_apply_env(&a, env);
  const struct command *cmd = find_command(&a);
  if (!cmd)
    return cli_usage_error(&top, "unknown command \"%s%s%s\"", a.pos[0], a.n_pos > 1 ? " " : "",
                           a.n_pos > 1 ? a.pos[1] : "");
  return run_command(cmd, &a);
}
