/*
 * The gRPC adapter of the dataloader: one thin handler per method and the
 * method table.
 * The core's calls block (batch generation reads datasets; changes are
 * synced RocksDB writes), so each call becomes a task on the libuv
 * threadpool: `run` calls the core on a worker thread, `reply` answers on
 * the loop, exactly once. The request stays valid until the call finishes,
 * so workers read it in place. StreamBatches lives in dl_rpc_stream.c,
 * what both use in dl_rpc_base.c.
 */
#include "dl_rpc.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dl_rpc_internal.h"
#include "log.h"
#include "shm_ring.h"
#include "stk_error.h"

struct task;
typedef int (*task_run_fn)(struct task *t);
typedef void (*task_reply_fn)(struct task *t);

struct task {
  uv_work_t work;
  struct dl_rpc *a;
  struct rpc_call *call;
  const ProtobufCMessage *req;
  task_run_fn run;     /* Worker thread: the core call. */
  task_reply_fn reply; /* Loop, on success: rpc_reply and free the output. */
  int err;
  char msg[DL_RPC_MSG_LEN];
  double gen_seconds;
  struct dl_batch batch;
  Stoker__V1__LoaderInfo *info;
  Stoker__V1__ExplainResponse *explain;
  Stoker__V1__ListLoadersResponse *list;
  uint8_t *blob;
  size_t blob_len;
  int64_t step;
};

/* ------------------------------------------------------- task plumbing */

static void task_work(uv_work_t *w) {
  struct task *t = w->data;
  stk_clear_detail();
  t->err = t->run(t);
  if (t->err < 0) dl_rpc_capture_error(t->err, t->msg, sizeof(t->msg));
}

static void queue(struct task *t);

static void task_done(uv_work_t *w, int status) {
  struct task *t = w->data;
  if (status == 0 &&
      t->err == DL_YIELDED) { /* A slice of a long replay: the rest waits its turn. */
    if (t->a->replay_yields) metric_counter_add(t->a->replay_yields, 1);
    t->err = 0;
    queue(t);
    return;
  }
  if (status < 0 && !t->err) { /* Never ran (uv_cancel is not used; defensive). */
    t->err = STK_ECANCELED;
    snprintf(t->msg, sizeof(t->msg), "cancelled");
  }
  if (t->err)
    rpc_fail_err(t->call, t->err, "%s", t->msg);
  else
    t->reply(t);
  free(t);
}

/* The job a request names (its string field "job"), "" when it names none:
 * the scheduler's queue for it. */
static const char *request_job(const ProtobufCMessage *req) {
  const ProtobufCFieldDescriptor *f =
      protobuf_c_message_descriptor_get_field_by_name(req->descriptor, "job");
  if (!f || f->type != PROTOBUF_C_TYPE_STRING || f->label == PROTOBUF_C_LABEL_REPEATED) return "";
  const char *job = *(char *const *)((const char *)req + f->offset);
  return job ? job : "";
}

/* Queues run on a worker (fair shares per tenant and job, dl_sched.h);
 * reply (or the error) follows on the loop. A run that yields (a slice of
 * a long replay, DL_YIELDED) is queued again, behind the work waiting. */
static void submit(struct rpc_call *call, const ProtobufCMessage *req, struct dl_rpc *a,
                   task_run_fn run, task_reply_fn reply) {
  struct task *t = calloc(1, sizeof(*t));
  if (!t) {
    rpc_fail_err(call, STK_ENOMEM, "out of memory");
    return;
  }
  t->a = a;
  t->call = call;
  t->req = req;
  t->run = run;
  t->reply = reply;
  t->work.data = t;
  queue(t);
}

static void queue(struct task *t) {
  int rc = dl_sched_submit(t->a->sched, rpc_call_scope(t->call), request_job(t->req), &t->work,
                           task_work, task_done);
  if (rc) {
    rpc_fail_err(t->call, rc, "cannot queue work");
    free(t);
  }
}

/* -------------------------------------------------- LoaderInfo replies */

static void reply_info(struct task *t) {
  rpc_reply(t->call, &t->info->base);
  dl_info_free(t->info);
}

static int run_create(struct task *t) {
  const Stoker__V1__CreateLoaderRequest *r = (const void *)t->req;
  if (!r->spec) {
    stk_set_detail("spec is required");
    return STK_EINVAL;
  }
  int rc = dl_create_job(t->a->dl, r->spec);
  return rc ? rc : dl_get_info(t->a->dl, r->spec->job, &t->info);
}

static int run_get(struct task *t) {
  const Stoker__V1__GetLoaderRequest *r = (const void *)t->req;
  return dl_get_info(t->a->dl, r->job, &t->info);
}

static int run_update(struct task *t) {
  const Stoker__V1__UpdateMixtureRequest *r = (const void *)t->req;
  int rc = dl_update_mixture(t->a->dl, r);
  return rc ? rc : dl_get_info(t->a->dl, r->job, &t->info);
}

/* The blob names its job; LoaderState.job says which job the reply
 * describes, so it is required (and checked before anything changes). */
static int run_import(struct task *t) {
  const Stoker__V1__LoaderState *r = (const void *)t->req;
  if (!r->job || !r->job[0]) {
    stk_set_detail("job is required (the job the state belongs to)");
    return STK_EINVAL;
  }
  size_t n = 1 + r->n_more_states;
  const uint8_t **blobs = malloc(n * sizeof *blobs);
  size_t *lens = malloc(n * sizeof *lens);
  int rc = blobs && lens ? 0 : STK_ENOMEM;
  for (size_t i = 0; rc == 0 && i < n; i++) {
    const ProtobufCBinaryData *d = i == 0 ? &r->state : &r->more_states[i - 1];
    blobs[i] = d->data;
    lens[i] = d->len;
  }
  if (rc == 0) rc = dl_import_states(t->a->dl, r->job, blobs, lens, n, NULL);
  free(blobs);
  free(lens);
  return rc ? rc : dl_get_info(t->a->dl, r->job, &t->info);
}

/* ------------------------------------------------------ other replies */

static int run_get_batch(struct task *t) {
  const Stoker__V1__GetBatchRequest *r = (const void *)t->req;
  double t0 = dl_rpc_now();
  int rc = dl_get_batch(t->a->dl, r->job, r->step, r->rank, r->world, &t->batch);
  t->gen_seconds += dl_rpc_now() - t0; /* Over every slice of its replay. */
  return rc;
}

static void reply_batch(struct task *t) {
  Stoker__V1__Batch msg;
  dl_rpc_batch_encode(&t->batch, &msg);
  if (t->a->gen_seconds) metric_histogram_observe(t->a->gen_seconds, t->gen_seconds);
  dl_rpc_count_served(t->a, &t->batch);
  rpc_reply(t->call, &msg.base);
  dl_batch_free(&t->batch);
}

static int run_explain(struct task *t) {
  const Stoker__V1__ExplainRequest *r = (const void *)t->req;
  return dl_explain(t->a->dl, r->job, r->step, r->rank, r->world, &t->explain);
}

static void reply_explain(struct task *t) {
  rpc_reply(t->call, &t->explain->base);
  dl_explain_free(t->explain);
}

static int run_commit(struct task *t) {
  const Stoker__V1__CommitRequest *r = (const void *)t->req;
  return dl_commit(t->a->dl, r->job, r->step);
}

static void reply_empty(struct task *t) {
  Stoker__V1__Empty e = STOKER__V1__EMPTY__INIT;
  rpc_reply(t->call, &e.base);
}

static int run_list(struct task *t) {
  return dl_list_jobs(t->a->dl, (const void *)t->req, &t->list);
}

static void reply_list(struct task *t) {
  rpc_reply_listing(t->call, &t->list->base); /* The loaders the caller's token covers. */
  dl_list_free(t->list);
}

static int run_delete(struct task *t) {
  const Stoker__V1__DeleteLoaderRequest *r = (const void *)t->req;
  return dl_delete_job(t->a->dl, r->job);
}

static int run_export(struct task *t) {
  const Stoker__V1__ExportStateRequest *r = (const void *)t->req;
  t->step = r->step;
  return dl_export_state(t->a->dl, r->job, r->step, &t->blob, &t->blob_len);
}

static void reply_state(struct task *t) {
  const Stoker__V1__ExportStateRequest *r = (const void *)t->req;
  Stoker__V1__LoaderState s = STOKER__V1__LOADER_STATE__INIT;
  s.job = r->job;
  s.step = t->step;
  s.state.data = t->blob;
  s.state.len = t->blob_len;
  rpc_reply(t->call, &s.base);
  free(t->blob);
}

/* ------------------------------------------------------------- table */

RPC_HANDLER(handle_create_loader, struct dl_rpc, Stoker__V1__CreateLoaderRequest) {
  submit(call, &req->base, svc, run_create, reply_info);
}

RPC_HANDLER(handle_get_loader, struct dl_rpc, Stoker__V1__GetLoaderRequest) {
  submit(call, &req->base, svc, run_get, reply_info);
}

RPC_HANDLER(handle_get_batch, struct dl_rpc, Stoker__V1__GetBatchRequest) {
  submit(call, &req->base, svc, run_get_batch, reply_batch);
}

RPC_HANDLER(handle_stream_batches, struct dl_rpc, Stoker__V1__StreamBatchesRequest) {
  dl_rpc_stream(call, svc, req);
}

RPC_HANDLER(handle_update_mixture, struct dl_rpc, Stoker__V1__UpdateMixtureRequest) {
  submit(call, &req->base, svc, run_update, reply_info);
}

RPC_HANDLER(handle_commit, struct dl_rpc, Stoker__V1__CommitRequest) {
  submit(call, &req->base, svc, run_commit, reply_empty);
}

RPC_HANDLER(handle_export_state, struct dl_rpc, Stoker__V1__ExportStateRequest) {
  submit(call, &req->base, svc, run_export, reply_state);
}

RPC_HANDLER(handle_import_state, struct dl_rpc, Stoker__V1__LoaderState) {
  submit(call, &req->base, svc, run_import, reply_info);
}

RPC_HANDLER(handle_explain, struct dl_rpc, Stoker__V1__ExplainRequest) {
  submit(call, &req->base, svc, run_explain, reply_explain);
}

RPC_HANDLER(handle_list_loaders, struct dl_rpc, Stoker__V1__ListLoadersRequest) {
  submit(call, &req->base, svc, run_list, reply_list);
}

RPC_HANDLER(handle_delete_loader, struct dl_rpc, Stoker__V1__DeleteLoaderRequest) {
  submit(call, &req->base, svc, run_delete, reply_empty);
}

#define SVC Stoker__V1__Dataloader_Service

static const struct rpc_method_def dataloader_methods[] = {
    RPC_UNARY_ROW(SVC, create_loader, handle_create_loader),
    RPC_UNARY_ROW(SVC, get_loader, handle_get_loader),
    RPC_UNARY_ROW(SVC, get_batch, handle_get_batch),
    RPC_SERVER_STREAM_ROW(SVC, stream_batches, handle_stream_batches),
    RPC_UNARY_ROW(SVC, update_mixture, handle_update_mixture),
    RPC_UNARY_ROW(SVC, commit, handle_commit),
    RPC_UNARY_ROW(SVC, export_state, handle_export_state),
    RPC_UNARY_ROW(SVC, import_state, handle_import_state),
    RPC_UNARY_ROW(SVC, explain, handle_explain),
    RPC_UNARY_SCOPED_ROW(SVC, list_loaders, handle_list_loaders),
    RPC_UNARY_ROW(SVC, delete_loader, handle_delete_loader),
};

static void register_metrics(struct dl_rpc *a, struct metrics *m) {
  if (!m) return;
  a->batches = metrics_counter(m, "stoker_dataloader_batches_total",
                               "Batches served (GetBatch replies and stream messages).", NULL);
  a->tokens =
      metrics_counter(m, "stoker_dataloader_tokens_total", "Tokens in the batches served.", NULL);
  a->gen_seconds = metrics_histogram(m, "stoker_dataloader_batch_generation_seconds",
                                     "Time to generate one batch on a worker thread.", NULL);
  a->prefetched = metrics_gauge(m, "stoker_dataloader_prefetched_batches",
                                "Batches generated for streams and not yet sent.", NULL);
  a->shm_batches =
      metrics_counter(m, "stoker_dataloader_shm_batches_total",
                      "Stream batches delivered through a shared-memory ring (tokens not "
                      "in the message).",
                      NULL);
  a->replay_yields =
      metrics_counter(m, "stoker_dataloader_replay_slices_yielded_total",
                      "Calls that gave their worker back after a slice of a long replay "
                      "(--replay-slice-tokens) and were queued again behind other work.",
                      NULL);
  /* Fails only out of memory: the per-job gauges are then missing. */
  metrics_add_collector(m, dl_rpc_job_metrics_collect, a);
}

/* Every second: health follows whether the workers are stuck. */
static void check_stuck(uv_timer_t *timer) {
  struct dl_rpc *a = timer->data;
  bool stuck = dl_sched_stuck(a->sched, a->stuck_ms);
  if (stuck == a->stuck) return;
  a->stuck = stuck;
  if (stuck)
    log_error("workers_stuck",
              "every worker has been on one call for over %llu ms and %llu calls wait: "
              "NOT_SERVING until one comes free",
              (unsigned long long)a->stuck_ms, (unsigned long long)dl_sched_waiting(a->sched));
  else
    log_info("workers_free", "a worker came free: serving again");
  rpc_server_set_unhealthy(a->rpc, RPC_UNHEALTHY_WORKERS_STUCK, stuck);
}

static int start_stuck_timer(struct dl_rpc *a) {
  if (!(a->stuck_timer = calloc(1, sizeof(*a->stuck_timer)))) return STK_ENOMEM;
  uv_timer_init(a->loop, a->stuck_timer);
  a->stuck_timer->data = a;
  uv_timer_start(a->stuck_timer, check_stuck, 1000, 1000);
  uv_unref((uv_handle_t *)a->stuck_timer); /* Keeps no loop alive by itself. */
  return 0;
}

static void stuck_timer_closed(uv_handle_t *h) {
  free(h);
}

static void stop_stuck_timer(struct dl_rpc *a) {
  if (!a->stuck_timer) return;
  uv_close((uv_handle_t *)a->stuck_timer, stuck_timer_closed);
  a->stuck_timer = NULL;
}

/* The directory of shared-memory rings, when the options name one. */
static int open_shm_dir(struct dl_rpc *a, const struct dl_rpc_opts *opts) {
  if (!opts || !opts->shm_dir || !opts->shm_dir[0]) return 0;
  a->shm_ring_bytes = opts->shm_ring_bytes ? opts->shm_ring_bytes : (uint64_t)256 << 20;
  if (!(a->shm_dir = strdup(opts->shm_dir))) return STK_ENOMEM;
  int rc = shm_ring_dir_open(a->shm_dir, opts->shm_owner, &a->shm_dirfd);
  if (rc) {
    free(a->shm_dir);
    a->shm_dir = NULL;
  }
  return rc;
}

int dl_rpc_register(struct rpc_server *s, uv_loop_t *loop, struct dl *dl,
                    const struct dl_rpc_opts *opts, struct dl_rpc **ret_adapter) {
  struct dl_rpc *a = calloc(1, sizeof(*a));
  if (!a) return STK_ENOMEM;
  a->dl = dl;
  a->loop = loop;
  a->rpc = s;
  a->shm_dirfd = -1;
  a->stuck_ms = opts && opts->stuck_ms ? opts->stuck_ms : 60000;
  a->tokens_field =
      protobuf_c_message_descriptor_get_field_by_name(&stoker__v1__batch__descriptor, "tokens")->id;
  int rc = dl_sched_new(loop, opts && opts->workers ? opts->workers : 4, &a->sched);
  if (rc) {
    free(a);
    return rc;
  }
  rc = open_shm_dir(a, opts);
  if (rc) {
    dl_sched_free(a->sched);
    free(a);
    return rc;
  }
  a->max_prefetch = opts && opts->max_prefetch ? opts->max_prefetch : 16;
  a->default_prefetch = opts && opts->default_prefetch ? opts->default_prefetch : 2;
  if (a->default_prefetch > a->max_prefetch) a->default_prefetch = a->max_prefetch;
  a->stream_bytes = opts && opts->stream_bytes ? opts->stream_bytes : (uint64_t)1 << 30;
  a->stream_bytes_per_job =
      opts && opts->stream_bytes_per_job ? opts->stream_bytes_per_job : (uint64_t)256 << 20;
  register_metrics(a, opts ? opts->metrics : NULL);
  rc = start_stuck_timer(a);
  if (!rc)
    rc = rpc_server_add_service(s, &stoker__v1__dataloader__descriptor, dataloader_methods,
                                RPC_N_ROWS(dataloader_methods), a);
  if (rc) {
    dl_rpc_free(a);
    return rc;
  }
  *ret_adapter = a;
  return 0;
}

void dl_rpc_drain(struct dl_rpc *a) {
  a->draining = true;
  stop_stuck_timer(a);
  dl_rpc_stream_drain(a);
}

void dl_rpc_free(struct dl_rpc *a) {
  if (!a) return;
  stop_stuck_timer(a); /* Closed by the loop's last run, if the daemon never drained. */
  dl_sched_free(a->sched);
  if (a->shm_dirfd >= 0) shm_ring_dir_close(a->shm_dir, a->shm_dirfd);
  free(a->shm_dir);
  free(a);
}
