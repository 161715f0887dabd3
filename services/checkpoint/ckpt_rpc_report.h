/*
 * ckpt_rpc_report: tells the coordinator about each committed checkpoint
 * (ReportCheckpoint, so GetJob's latest_checkpoint follows the commits).
 * Reports are queued from the loop and sent by one thread with the rpc.h
 * client, retried with backoff while the coordinator is unreachable (the
 * first failure of a report and every tenth retry are logged); a report the
 * coordinator refuses (unknown job, say) is logged and dropped. Outcomes are
 * counted in stoker_checkpoint_coordinator_reports_total{result="reported",
 * "refused", "dropped"} and failed tries in
 * stoker_checkpoint_coordinator_report_failures_total. The client can be
 * replaced while reports flow (ckpt_report_reload, the daemon's SIGHUP).
 */
#ifndef STK_CKPT_RPC_REPORT_H
#define STK_CKPT_RPC_REPORT_H

#include <stdint.h>

struct ckpt_report;
struct metrics;

struct ckpt_report_opts {
  const char *target;        /* "HOST:PORT" of the coordinator. */
  const char *token;         /* Bearer token; NULL: none. */
  const char *tls_ca_file;   /* PEM; set: TLS, verifying the coordinator. */
  const char *tls_cert_file; /* PEM client certificate (mutual TLS); NULL: none. */
  const char *tls_key_file;
  struct metrics *metrics; /* Where the counters go; NULL: not counted. */
};

int ckpt_report_new(const struct ckpt_report_opts *opts, struct ckpt_report **ret_report);

/* Builds a client from opts (metrics ignored), for a coordinator whose
 * CA, client certificate or token changed: the reporter thread uses it
 * from its next try on (a retry waiting is woken). On failure (a file that
 * does not load; stk_detail() says which and why) the client in use stays.
 * Any thread. */
int ckpt_report_reload(struct ckpt_report *r, const struct ckpt_report_opts *opts);

/* Queues a report (copies the strings). Any thread. */
void ckpt_report_commit(struct ckpt_report *r, const char *job, int64_t step, const char *uri);

/* Sends what is queued (up to timeout_ms more), stops the thread, frees.
 * Accepts NULL. */
void ckpt_report_free(struct ckpt_report *r, int64_t timeout_ms);

#endif
