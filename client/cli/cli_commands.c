/*
 * stokerctl's command table: for each command its words, the operands it
 * needs, the flags it accepts (rows of cli_args.c's flag table, which
 * parses them and holds their help), the function that runs it, and what
 * only the command can say: its usage line, one-line summary and notes.
 * cli_help.c prints every usage text from here and that flag table.
 */
#include "cli_commands.h"

#include <string.h>

#include "cli.h"

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
    {{"usage", NULL},
     0,
     "",
     cli_usage,
     "",
     "what your jobs hold of each service's budgets, against the limits",
     "Asks every service address given (stoker.v1.Usage/GetUsage): the coordinator's key-value\n"
     "store (kv), the dataloader's streams (stream), the checkpoint service's staging and\n"
     "restores (staging, read). Per budget: all jobs (every tenant's, against the service's\n"
     "limit), then each tenant of your jobs and each of your jobs (against the per-job limit).\n"
     "A team's token sees its own jobs only; an operator's every job.\n"
     "--json: one object per budget {\"service\",\"address\",\"budget\",\"used_bytes\",\n"
     "\"limit_bytes\",\"limit_per_job_bytes\",\"jobs\":[{\"job\",\"tenant\",\"used_bytes\"}]}.\n"},
    {{"jobs", "list"},
     0,
     "label",
     cli_jobs_list,
     "[--label K=V]...",
     "list jobs (with all of these labels)",
     NULL},
    {{"job", "show"},
     1,
     "",
     cli_job_show,
     "NAME",
     "spec, state, queue, checkpoint and members",
     "A submitted job (job submit) also shows where it was sent and the queue controller's last\n"
     "report: QUEUED at position N, ADMITTED with its ranks, EVICTED, FINISHED or REJECTED.\n"},
    {{"job", "watch"},
     1,
     "after",
     cli_job_watch,
     "NAME [--after SEQ]",
     "stream events until Ctrl-C or deletion",
     "QUEUED, ADMITTED, PREEMPTED, SHRUNK, GROWN, RESUMED and REJECTED print as sentences\n"
     "(\"queued in Q at position 2\", \"admitted 4 ranks\", \"shrunk to 2 ranks at step S\",\n"
     "\"rejected by the queue controller: WHY\"); the others as their fields and message.\n"
     "--json: one object per event.\n"},
    {{"job", "create"},
     1,
     "min max heartbeat misses last-call join-timeout label dataset checkpoint-storage "
     "checkpoint-every",
     cli_job_create,
     "NAME --min N --max N [--heartbeat 5s] [--misses 3]\n[--last-call 30s] [--join-timeout "
     "10m] [--label K=V]...\n[--dataset URI] [--checkpoint-storage URI] [--checkpoint-every N]",
     "create a job",
     "Defaults of --heartbeat, --misses, --last-call and --join-timeout are the coordinator's.\n"},
    {{"job", "submit"},
     1,
     "template queue priority min max heartbeat misses last-call join-timeout label dataset "
     "checkpoint-storage checkpoint-every",
     cli_job_submit,
     "NAME --template T --min N --max N\n[--queue Q] [--priority P] [job create's flags]\n"
     "[-- TRAINER ARGS...]",
     "submit a job to a cluster queue (its controller starts the ranks)",
     "The coordinator keeps the job; the queue controller (deploy/k8s) creates its workload from\n"
     "the template, with the words after -- appended to the trainer's command (at most 64, each\n"
     "at most 1024 bytes), and reports it: job show prints the queue state, position and admitted\n"
     "ranks, job watch the QUEUED, ADMITTED, PREEMPTED, SHRUNK, GROWN, RESUMED and REJECTED\n"
     "events. No Kubernetes credentials are needed: the coordinator's token scope applies as to\n"
     "job create.\n"},
    {{"job", "scale"},
     2,
     "skip-checkpoint in-place",
     cli_job_scale,
     "NAME N [--skip-checkpoint | --in-place]",
     "checkpoint, then restart at N ranks",
     "--in-place (a submitted job's queue controller shrinking it while it deletes the pods of\n"
     "the ranks removed): every rank checkpoints at one step, the removed ranks leave without\n"
     "their SIGTERM pausing the job, and the kept ranks rejoin at N in their processes.\n"},
    {{"job", "resize"},
     2,
     "skip-checkpoint in-place",
     cli_job_scale,
     "NAME N [--skip-checkpoint | --in-place]",
     "job scale: checkpoint, then restart at N ranks",
     "A submitted job is resized by its queue controller: down with a checkpoint, then a restart\n"
     "at N ranks; up with a new workload slice (admitted when the quota allows), the job growing\n"
     "at a step boundary once the new ranks joined. N above the job's max ranks or below its min\n"
     "ranks is refused.\n"
     "job watch shows SCALED, then PREEMPTED and SHRUNK, or ADMITTED and GROWN.\n"},
    {{"job", "pause"},
     1,
     "force",
     cli_job_pause,
     "NAME [--force]",
     "checkpoint, then pause (--force: without the checkpoint)",
     NULL},
    {{"job", "resume"}, 1, "", cli_job_resume, "NAME", "resume a paused job", NULL},
    {{"job", "preempt"},
     1,
     "reason",
     cli_job_preempt,
     "NAME [--reason TEXT]",
     "preemption notice: checkpoint, stop, resume when the ranks rejoin",
     "Every rank checkpoints at one step, stages its shards and exits 75 (stoker-train); the job\n"
     "is PAUSED and resumes by itself from that checkpoint when its ranks join again. A second\n"
     "notice changes nothing."},
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
     "dataset seq-len global-batch seed shards lanes block-tokens bos eos max-doc-tokens tokenizer",
     cli_loader_create,
     "JOB --dataset NAME=URI[:FORMAT][@WEIGHT]...\n--seq-len N --global-batch N [--seed N] "
     "[--shards L] [--lanes C]\n[--block-tokens N] [--bos ID] [--eos ID] [--max-doc-tokens N]\n"
     "[--tokenizer NAME=SPEC]...",
     "create a job's data loader (FORMAT: megatron, llmc, text)",
     "URI: file:///PATH or /PATH (a file or directory the dataloader reads; PATH must lie\n"
     "under one of its data-root directories, links included, else PERMISSION_DENIED), or\n"
     "synthetic:N_DOCS:MIN_LEN:MAX_LEN:SEED. Lanes are the job's, over all ranks: any world\n"
     "size reads the same global batches.\n"},
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
     "every loader job of each dataloader part (failed ones: why)",
     "--json: one object per job (with \"part\" when there are several parts).\n"},
    {{"loader", "delete"},
     1,
     "",
     cli_loader_delete,
     "JOB",
     "remove a loader job and its state on every part (failed ones too)",
     NULL},
    {{"loader", "mixture"},
     1,
     "from-step dataset block-tokens seq-len global-batch block-document tokenizer",
     cli_loader_mixture,
     "JOB --from-step S [--dataset ...]... [--seq-len N]\n[--global-batch N] [--block-tokens N] "
     "[--block-document DATASET/FILE/DOC]...\n[--tokenizer NAME=SPEC]...",
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
     "--json: the whole manifest.\n"},
    {{"checkpoint", "verify"},
     2,
     "progress",
     cli_ckpt_verify,
     "JOB STEP [--progress]",
     "re-read every byte, check every CRC",
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
     "Its writers fail, its staging memory is freed and what it uploaded is deleted;\n"
     "exits 0 also when the attempt was already aborted, 3 once it committed.\n"
     "With checkpoint replicas, give the handle Begin answered (ID@OWNER) or\n"
     "--checkpoint OWNER: only the replica owning an attempt knows it.\n"},
};

const struct cli_command *cli_commands(size_t *ret_n) {
  *ret_n = sizeof(commands) / sizeof(commands[0]);
  return commands;
}

bool cli_command_takes(const struct cli_command *cmd, const char *flag) {
  size_t n = strlen(flag);
  for (const char *p = cmd->flags; (p = strstr(p, flag)) != NULL; p += n) {
    if ((p == cmd->flags || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0')) return true;
  }
  return false;
}
