/*
 * ckpt_rpc_report: tells the coordinator about each committed checkpoint
 * (ReportCheckpoint, so GetJob's latest_checkpoint follows the commits).
 * Reports are queued from the loop and sent by one thread with the rpc.h
 * client, retried with backoff while the coordinator is unreachable; a
 * report the coordinator refuses (unknown job, say) is logged and dropped.
 */
#ifndef STK_CKPT_RPC_REPORT_H
#define STK_CKPT_RPC_REPORT_H

#include <stdint.h>

struct ckpt_report;

/* target: "HOST:PORT" of the coordinator; token may be NULL. */
int ckpt_report_new(const char *target, const char *token, struct ckpt_report **ret_report);

/* Queues a report (copies the strings). Any thread. */
void ckpt_report_commit(struct ckpt_report *r, const char *job, int64_t step, const char *uri);

/* Sends what is queued (up to timeout_ms more), stops the thread, frees.
 * Accepts NULL. */
void ckpt_report_free(struct ckpt_report *r, int64_t timeout_ms);

#endif
