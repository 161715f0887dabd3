/*
 * coord: opening and closing the coordinator, the top of its ladder. Two
 * handles drive everything: an idle handle that runs one "pass" (start a
 * group commit, release durable answers, feed watchers) at the end of the
 * loop iteration in which something changed (coord_kick, in coord_base.c,
 * starts it), and one tick timer that sweeps leases, last-call windows and
 * timeouts of every job.
 */
#include "coord_internal.h"

#include <stdlib.h>

#include "stk_error.h"

static void finalize(struct coord *c);

static void on_idle(uv_idle_t *h) {
  struct coord *c = h->data;
  uv_idle_stop(h);
  coord_store_maybe_commit(c);
  coord_release(c);
  coord_watch_pump_all(c);
  if (c->closing && !c->finalizing && coord_store_idle(c) && list_empty(&c->ready) &&
      list_empty(&c->watchers) && list_empty(&c->watch_todo))
    finalize(c);
}

static void on_tick(uv_timer_t *h) {
  struct coord *c = h->data;
  coord_lease_sweep(c);
  if (!list_empty(&c->dirty_members) && coord_now(c) >= c->next_stats_flush) coord_kick(c);
}

static void apply_defaults(struct coord_opts *o) {
  if (!o->tick_ms) o->tick_ms = 20;
  if (!o->max_events_per_job) o->max_events_per_job = 10000;
  if (!o->watch_queue_max) o->watch_queue_max = 1024;
  if (!o->stats_flush_ms) o->stats_flush_ms = 2000;
  if (!o->scale_timeout_beats) o->scale_timeout_beats = 10;
  if (!o->kv_bytes_per_job) o->kv_bytes_per_job = (uint64_t)64 << 20;
  if (!o->kv_bytes) o->kv_bytes = (uint64_t)1 << 30;
}

static struct coord *coord_alloc(uv_loop_t *loop, const struct coord_opts *opts) {
  struct coord *c = coord_xcalloc(1, sizeof(*c));
  c->loop = loop;
  c->opts = *opts;
  c->pass = on_idle;
  apply_defaults(&c->opts);
  coord_tab_init(&c->jobs);
  c->batch = kv_batch_new();
  c->writing = kv_batch_new();
  list_init(&c->dirty_jobs);
  list_init(&c->dirty_members);
  list_init(&c->ready);
  list_init(&c->watchers);
  list_init(&c->watch_todo);
  return c;
}

static void free_jobs(struct coord *c) {
  size_t pos;
  struct hnode *n = coord_tab_first(&c->jobs, &pos);
  while (n) {
    struct hnode *next = coord_tab_next(&c->jobs, n, &pos);
    coord_tab_del(&c->jobs, n);
    coord_job_free(container_of(n, struct job, hn));
    n = next;
  }
}

static void coord_dealloc(struct coord *c) {
  free_jobs(c);
  coord_tab_free(&c->jobs);
  kv_batch_free(c->batch);
  kv_batch_free(c->writing);
  kv_close(c->kv);
  free(c);
}

int coord_open(uv_loop_t *loop, const struct coord_opts *opts, struct coord **ret_coord) {
  if (!loop || !opts || !opts->dir || !ret_coord) return STK_EINVAL;
  struct coord *c = coord_alloc(loop, opts);
  struct kv_opts ko = {.create_if_missing = true,
                       .write_mostly = true,
                       .write_buffer_bytes = (size_t)opts->write_buffer_bytes};
  int err = kv_open(opts->dir, &ko, &c->kv);
  if (!err) err = coord_store_load(c);
  if (err) {
    coord_dealloc(c);
    return err;
  }
  uv_idle_init(loop, &c->idle);
  uv_timer_init(loop, &c->tick);
  c->idle.data = c->tick.data = c;
  c->handles_open = 2;
  c->next_stats_flush = coord_now(c) + c->opts.stats_flush_ms;
  uv_timer_start(&c->tick, on_tick, c->opts.tick_ms, c->opts.tick_ms);
  coord_kick(c);
  *ret_coord = c;
  return 0;
}

static void on_handle_closed(uv_handle_t *h) {
  struct coord *c = h->data;
  if (--c->handles_open > 0) return;
  coord_close_fn done = c->close_done;
  void *arg = c->close_arg;
  coord_dealloc(c);
  if (done) done(arg);
}

static void finalize(struct coord *c) {
  c->finalizing = true;
  uv_close((uv_handle_t *)&c->idle, on_handle_closed);
  uv_close((uv_handle_t *)&c->tick, on_handle_closed);
}

void coord_close(struct coord *c, coord_close_fn done, void *arg) {
  if (c->closing) return;
  c->closing = true;
  c->close_done = done;
  c->close_arg = arg;
  uv_timer_stop(&c->tick);
  size_t pos;
  for (struct hnode *n = coord_tab_first(&c->jobs, &pos); n; n = coord_tab_next(&c->jobs, n, &pos))
    coord_fail_parked(container_of(n, struct job, hn), true, STK_EUNAVAIL, "coordinator closing");
  /* coord_close may run inside a watch callback: the watchers of the
   * current pump pass wait in watch_todo. */
  struct list *lists[] = {&c->watchers, &c->watch_todo};
  for (size_t i = 0; i < 2; i++)
    while (!list_empty(lists[i]))
      coord_watch_end(container_of(lists[i]->next, struct coord_wait, link), STK_EUNAVAIL,
                      "coordinator closing");
  c->next_stats_flush = 0;
  coord_kick(c);
}

void coord_get_stats(const struct coord *c, struct coord_stats *ret_stats) {
  *ret_stats = c->stats;
  ret_stats->jobs = c->jobs.n;
}
