/*
 * coord_catalog: the life of a job, above its parts. coord_job_new and
 * coord_job_free (which ends the job's parked calls, frees its members,
 * events and surplus list), and the tooling calls on the set of jobs:
 * CreateJob, GetJob, ListJobs (label selector, by name) and DeleteJob
 * (every key of the job removed with range deletes in one synced batch;
 * parked calls end, watchers get a DELETED event). Only coord_load.c and
 * coord.c, above it, call into it.
 */
#include "coord_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "page.h"
#include "stk_error.h"

#define S(x) STOKER__V1__JOB_STATE__JOB_STATE_##x

struct job *coord_job_new(struct coord *c, Stoker__V1__JobSpec *spec) {
  struct job *j = coord_xcalloc(1, sizeof(*j));
  j->c = c;
  j->spec = spec;
  j->name = coord_xstrdup(spec->name);
  j->reason = coord_xstrdup("");
  j->ckpt_uri = coord_xstrdup("");
  j->first_event_seq = 1;
  j->events = coord_xcalloc(c->opts.max_events_per_job, sizeof(*j->events));
  coord_tab_init(&j->members);
  coord_tab_init(&j->prev);
  coord_tab_init(&j->joiners_by_id);
  coord_tab_init(&j->barriers);
  coord_tab_init(&j->kv);
  list_init(&j->leases);
  list_init(&j->joiners);
  list_init(&j->dirty_link);
  coord_tab_put(&c->jobs, &j->hn, j->name);
  return j;
}

static void free_member_tab(struct htab *t) {
  size_t pos;
  struct hnode *n = coord_tab_first(t, &pos);
  while (n) {
    struct hnode *next = coord_tab_next(t, n, &pos);
    coord_member_free(container_of(n, struct member, hn));
    n = next;
  }
  coord_tab_free(t);
}

void coord_job_free(struct job *j) {
  if (!j) return;
  coord_fail_parked(j, true, STK_ENOENT, "job deleted");
  free_member_tab(&j->members);
  free_member_tab(&j->prev);
  coord_tab_free(&j->joiners_by_id);
  coord_tab_free(&j->barriers);
  coord_tab_free(&j->kv);
  coord_events_free(j);
  coord_surplus_clear(j);
  coord_shrink_clear(j);
  list_del(&j->dirty_link);
  protobuf_c_message_free_unpacked(&j->spec->base, NULL);
  free(j->by_rank);
  free(j->name);
  free(j->reason);
  free(j->preempted);
  if (j->queue) protobuf_c_message_free_unpacked(&j->queue->base, NULL);
  free(j->ckpt_uri);
  free(j);
}

static Stoker__V1__JobSpec *spec_copy(const Stoker__V1__JobSpec *in) {
  size_t n = stoker__v1__job_spec__get_packed_size(in);
  uint8_t *buf = coord_xmalloc(n);
  stoker__v1__job_spec__pack(in, buf);
  Stoker__V1__JobSpec *out = stoker__v1__job_spec__unpack(NULL, n, buf);
  free(buf);
  return out;
}

void coord_create_job(struct coord *c, const Stoker__V1__CreateJobRequest *req, coord_done_fn done,
                      void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_PLAIN, done, arg);
  if (c->closing || c->broken) return coord_fail(w, STK_EUNAVAIL, "coordinator unavailable");
  if (!req->spec) return coord_fail(w, STK_EINVAL, "spec missing");
  Stoker__V1__JobSpec *spec = spec_copy(req->spec);
  char msg[160];
  int err = spec ? coord_spec_check(spec, msg, sizeof(msg)) : STK_ENOMEM;
  if (!err && coord_tab_get(&c->jobs, spec->name)) {
    err = STK_EEXIST;
    snprintf(msg, sizeof(msg), "job %s exists", spec->name);
  }
  if (err) {
    if (spec) protobuf_c_message_free_unpacked(&spec->base, NULL);
    return coord_fail(w, err, "%s", msg);
  }
  struct job *j = coord_job_new(c, spec);
  j->state = S(WAITING);
  j->generation = 1;
  j->by_rank = coord_xcalloc(1, sizeof(*j->by_rank));
  j->created_ms = coord_wall_ms();
  coord_job_touch(j, "created");
  coord_event(j, STOKER__V1__JOB_EVENT_TYPE__JOB_EVENT_CREATED, NULL, 0, "created");
  coord_answer_job(w, j);
}

void coord_get_job(struct coord *c, const Stoker__V1__GetJobRequest *req, coord_done_fn done,
                   void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_PLAIN, done, arg);
  struct job *j = coord_job_or_fail(c, req->job, w);
  if (j) coord_answer_job(w, j);
}

void coord_list_members(struct coord *c, const Stoker__V1__ListMembersRequest *req,
                        coord_done_fn done, void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_PLAIN, done, arg);
  struct job *j = coord_job_or_fail(c, req->job, w);
  if (!j) return;
  uint32_t from = 0;
  int err = coord_member_token_decode(j, req->page_token, &from);
  if (err == STK_ENOMEM) return coord_fail(w, err, "out of memory");
  if (err < 0) return coord_fail(w, err, "%s", stk_detail());
  struct member_page p;
  coord_member_page(j, from, req->page_size, &p);
  Stoker__V1__ListMembersResponse resp = STOKER__V1__LIST_MEMBERS_RESPONSE__INIT;
  resp.n_members = p.n;
  resp.members = p.ptrs;
  if (p.token) resp.next_page_token = p.token;
  resp.generation = j->generation;
  coord_answer(w, &resp.base);
  coord_member_page_free(&p);
}

static bool labels_match(const struct job *j, const Stoker__V1__ListJobsRequest *req) {
  for (size_t i = 0; i < req->n_label_selector; i++) {
    const Stoker__V1__ListJobsRequest__LabelSelectorEntry *want = req->label_selector[i];
    bool found = false;
    for (size_t k = 0; k < j->spec->n_labels && !found; k++)
      found = strcmp(j->spec->labels[k]->key, want->key) == 0 &&
              strcmp(j->spec->labels[k]->value, want->value) == 0;
    if (!found) return false;
  }
  return true;
}

static int by_name(const void *a, const void *b) {
  const struct job *x = *(struct job *const *)a, *y = *(struct job *const *)b;
  return strcmp(x->name, y->name);
}

/* Answers one page of jobs[0..n) (sorted by name, after the request's
 * token): at most `size` jobs within the page byte bound, with the token of
 * the next page when some are left. */
static void answer_list(struct coord_wait *w, struct job **jobs, size_t n, uint32_t size) {
  Stoker__V1__ListJobsResponse resp = STOKER__V1__LIST_JOBS_RESPONSE__INIT;
  size_t cap = n < size ? n : size, k = 0, used = 0;
  struct job_view *views = coord_xcalloc(cap + 1, sizeof(*views));
  Stoker__V1__Job **ptrs = coord_xcalloc(cap + 1, sizeof(*ptrs));
  char *token = NULL;
  for (size_t i = 0; i < n; i++) {
    coord_job_view_init(&views[k], jobs[i], true);
    size_t bytes = protobuf_c_message_get_packed_size(&views[k].job.base);
    if (!page_fits(size, k, used, bytes)) {
      coord_job_view_free(&views[k]);
      if (page_token_encode(jobs[i - 1]->name, &token) < 0) {
        coord_fail(w, STK_ENOMEM, "out of memory");
        goto out;
      }
      resp.next_page_token = token;
      break;
    }
    ptrs[k] = &views[k].job;
    used += bytes;
    k++;
  }
  resp.n_jobs = k;
  resp.jobs = ptrs;
  coord_answer(w, &resp.base);
out:
  for (size_t i = 0; i < k; i++) coord_job_view_free(&views[i]);
  free(views);
  free(ptrs);
  free(token);
}

void coord_list_jobs(struct coord *c, const Stoker__V1__ListJobsRequest *req, coord_done_fn done,
                     void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_PLAIN, done, arg);
  if (c->closing || c->broken) return coord_fail(w, STK_EUNAVAIL, "coordinator unavailable");
  char *after = NULL;
  int err = page_token_decode(req->page_token, &after);
  if (err == STK_ENOMEM) return coord_fail(w, err, "out of memory");
  if (err < 0) return coord_fail(w, err, "%s", stk_detail());
  struct job **jobs = coord_xcalloc(c->jobs.n + 1, sizeof(*jobs));
  size_t n = 0, pos;
  for (struct hnode *h = coord_tab_first(&c->jobs, &pos); h;
       h = coord_tab_next(&c->jobs, h, &pos)) {
    struct job *j = container_of(h, struct job, hn);
    if ((!after || strcmp(j->name, after) > 0) && labels_match(j, req)) jobs[n++] = j;
  }
  free(after);
  qsort(jobs, n, sizeof(*jobs), by_name);
  answer_list(w, jobs, n, page_size(req->page_size));
  free(jobs);
}

static void delete_keys(struct coord *c, const char *name) {
  char key[96];
  int kl = snprintf(key, sizeof(key), "j/%s", name);
  coord_store_del(c, key, (size_t)kl);
  const char *prefixes[] = {"m", "k", "e"};
  for (size_t i = 0; i < 3; i++) {
    kl = snprintf(key, sizeof(key), "%s/%s/", prefixes[i], name);
    coord_store_del_prefix(c, key, (size_t)kl);
  }
}

void coord_delete_job(struct coord *c, const Stoker__V1__JobActionRequest *req, coord_done_fn done,
                      void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_PLAIN, done, arg);
  struct job *j = coord_job_or_fail(c, req->job, w);
  if (!j) return;
  bool idle = coord_job_ended(j) || j->state == STOKER__V1__JOB_STATE__JOB_STATE_PAUSED;
  if (!idle && !req->force)
    return coord_fail(w, STK_ESTATE, "job %s is active; stop or pause it, or force", j->name);
  coord_fail_parked(j, true, STK_ENOENT, "job deleted");
  if (c->stats.members >= j->n_members) c->stats.members -= j->n_members;
  delete_keys(c, j->name);
  coord_watch_job_deleted(j);
  coord_tab_del(&c->jobs, &j->hn);
  coord_job_free(j);
  Stoker__V1__Empty e = STOKER__V1__EMPTY__INIT;
  coord_answer(w, &e.base);
}
