/*
 * libstoker-client, operator calls: what stokerctl, the tests and the
 * in-tree trainer call besides the public API, each taking or answering
 * protobuf-c messages of stoker/v1 (jobs, scale, watch; loader create,
 * get, mixture, explain; checkpoint list, manifest, delete, verify; the
 * budget usage any daemon reports). This header is NOT installed: it
 * names generated protobuf-c types, whose layout is not a stable ABI. Its functions live in the
 * static library (admin.c, loader_admin.c, ckpt_admin.c) and are not part of the shared
 * libstoker-client.so, so only programs built in this tree call them.
 *
 * Every message returned (*ret_job, *ret_info, *ret_resp, ...) is freed by
 * the caller with protobuf_c_message_free_unpacked(&x->base, NULL).
 * timeout_ms 0: the client's default. Errors and threads as in
 * stoker_client.h.
 */
#ifndef STOKER_ADMIN_H
#define STOKER_ADMIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "stoker/v1/checkpoint.pb-c.h"
#include "stoker/v1/common.pb-c.h"
#include "stoker/v1/coordinator.pb-c.h"
#include "stoker/v1/dataloader.pb-c.h"
#include "stoker_ckpt.h"
#include "stoker_client.h"
#include "stoker_loader.h"

/* ------------------------------------------------------------------ jobs */

int stk_job_create(struct stk_client *c, const Stoker__V1__JobSpec *spec, int64_t timeout_ms,
                   Stoker__V1__Job **ret_job);
/* The job with every member of its generation: the member pages after
 * GetJob's first (ListMembers) are followed and moved into *ret_job, which
 * holds no next_members_page_token; read again (up to 5 times) when the
 * generation changes meanwhile, then STK_EABORTED. timeout_ms bounds each
 * call. */
int stk_job_get(struct stk_client *c, const char *job, int64_t timeout_ms,
                Stoker__V1__Job **ret_job);
/* Jobs whose labels include every (keys[i], values[i]). The listings here
 * (jobs, loaders, checkpoints) follow the service's pages to the last and
 * answer every entry in one response; timeout_ms bounds each page. Each
 * job holds every member, as stk_job_get's does. The Jobs the other calls
 * answer (create, actions, scale) hold their first page of members. */
int stk_job_list(struct stk_client *c, const char *const *keys, const char *const *values,
                 size_t n_labels, int64_t timeout_ms, Stoker__V1__ListJobsResponse **ret_resp);

enum stk_job_verb {
  STK_JOB_PAUSE,
  STK_JOB_RESUME,
  STK_JOB_STOP,
};
int stk_job_action(struct stk_client *c, enum stk_job_verb verb, const char *job, bool force,
                   int64_t timeout_ms, Stoker__V1__Job **ret_job);
int stk_job_delete(struct stk_client *c, const char *job, bool force, int64_t timeout_ms);
int stk_job_scale(struct stk_client *c, const char *job, uint32_t ranks, bool skip_checkpoint,
                  int64_t timeout_ms, Stoker__V1__Job **ret_job);
/* ScaleJob with in_place: a running submitted job shrunk while the pods of
 * the ranks removed are being deleted; the kept ranks checkpoint with them
 * and rejoin in their processes, and the removed ranks' SIGTERM is no
 * preemption notice (ScaleJobRequest.in_place). */
int stk_job_scale_in_place(struct stk_client *c, const char *job, uint32_t ranks,
                           int64_t timeout_ms, Stoker__V1__Job **ret_job);
/* PreemptJob: a preemption notice for the whole job (reason NULL: ""). */
int stk_job_preempt(struct stk_client *c, const char *job, const char *reason, int64_t timeout_ms,
                    Stoker__V1__Job **ret_job);

/* Streams job's events with seq > after_seq, then live ones. on_event runs
 * on the client's thread with a borrowed event. The stream ends when the job
 * is deleted (status 0), on an error, or on stk_watch_cancel(). */
struct stk_watch;
typedef void (*stk_event_fn)(void *arg, const Stoker__V1__JobEvent *ev);
int stk_job_watch(struct stk_client *c, const char *job, uint64_t after_seq, stk_event_fn on_event,
                  void *arg, struct stk_watch **ret_watch);
/* Waits up to timeout_ms (< 0: forever) for the stream to end. Returns
 * STK_ETIMEDOUT while it is still open, else its final status (0, or the
 * mapped error; the message is in stk_client_last_error()). Cancelled
 * streams end with STK_ECANCELED. */
int stk_watch_wait(struct stk_watch *w, int64_t timeout_ms);
void stk_watch_cancel(struct stk_watch *w);
/* Cancels, waits for the end, frees. Accepts NULL. */
void stk_watch_free(struct stk_watch *w);

/* --------------------------------------------------------------- loaders */

/* Creates the loader spec->job. Errors: STK_EEXIST, STK_EINVAL (bad spec,
 * dataset that cannot be opened: see stk_client_last_error()). */
int stk_loader_create(struct stk_client *c, const Stoker__V1__LoaderSpec *spec, int64_t timeout_ms,
                      Stoker__V1__LoaderInfo **ret_info);
int stk_loader_get(struct stk_client *c, const char *job, int64_t timeout_ms,
                   Stoker__V1__LoaderInfo **ret_info);

/* A new configuration version from req->from_step on (new weights, new or
 * removed datasets, seq_len, global_batch, blocked units and documents). */
int stk_loader_update_mixture(struct stk_client *c, const Stoker__V1__UpdateMixtureRequest *req,
                              int64_t timeout_ms, Stoker__V1__LoaderInfo **ret_info);

/* Every job of one dataloader process, by name; failed ones (a dataset gone
 * at its start, data lost under it) have failed and failure set. */
int stk_loader_list(struct stk_client *c, int64_t timeout_ms,
                    Stoker__V1__ListLoadersResponse **ret_resp);
/* Removes the job and what it stored from one process. STK_ENOENT. */
int stk_loader_delete(struct stk_client *c, const char *job, int64_t timeout_ms);

/* Provenance of a slice: one LineSource per piece of a document in a line
 * (dataset, file, document index in the file, offsets in it and in its unit). */
int stk_loader_explain(struct stk_client *c, const char *job, int64_t step, uint32_t rank,
                       uint32_t world, int64_t timeout_ms, Stoker__V1__ExplainResponse **ret_resp);

/* Creates the job on every part, in part order, stopping at the first
 * failure (the message names the part). ret_info (may be NULL) is part 0's. */
int stk_loader_create_all(struct stk_loader *l, const Stoker__V1__LoaderSpec *spec,
                          int64_t timeout_ms, Stoker__V1__LoaderInfo **ret_info);
/* Part 0's info, with committed_step the oldest over the parts (the step
 * every part can resume from), failed (with that part's failure) when any
 * part's job failed. */
int stk_loader_info_all(struct stk_loader *l, const char *job, int64_t timeout_ms,
                        Stoker__V1__LoaderInfo **ret_info);
/* Deletes the job on every part, in part order, stopping at the first
 * failure (the message names the part). */
int stk_loader_delete_all(struct stk_loader *l, const char *job, int64_t timeout_ms);
/* A new configuration version on every part (as create). */
int stk_loader_update_all(struct stk_loader *l, const Stoker__V1__UpdateMixtureRequest *req,
                          int64_t timeout_ms, Stoker__V1__LoaderInfo **ret_info);

/* --------------------------------------------------------- checkpoints */

int stk_ckpt_list(struct stk_client *c, const char *job, int64_t timeout_ms,
                  Stoker__V1__ListCheckpointsResponse **ret_resp);
int stk_ckpt_get_manifest(struct stk_client *c, const char *job, int64_t step, int64_t timeout_ms,
                          Stoker__V1__Manifest **ret_manifest);
int stk_ckpt_delete(struct stk_client *c, const char *job, int64_t step, int64_t timeout_ms);
/* Re-reads every byte on the service. Returns 0 with *ret_resp even when
 * problems were found (resp->n_problems > 0); STK_ENOTSUP when the service
 * has no Verify method. */
int stk_ckpt_verify(struct stk_client *c, const char *job, int64_t step, int64_t timeout_ms,
                    Stoker__V1__VerifyCheckpointResponse **ret_resp);

/* ----------------------------------------------------------------- usage */

/* stoker.v1.Usage/GetUsage of the daemon c talks to (any of the three):
 * each of its budgets with its limits and the jobs the client's token
 * covers that hold some of it. */
int stk_usage_get(struct stk_client *c, int64_t timeout_ms, Stoker__V1__UsageReport **ret_report);

#endif
