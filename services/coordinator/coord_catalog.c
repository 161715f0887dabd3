/*
 * coord_catalog: ListJobs (label selector, by name) and DeleteJob (every
 * key of the job removed with range deletes in one synced batch; parked
 * calls end, watchers get a DELETED event).
 */
#include "coord_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stk_error.h"

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

static void answer_list(struct coord_wait *w, struct job **jobs, size_t n) {
  Stoker__V1__ListJobsResponse resp = STOKER__V1__LIST_JOBS_RESPONSE__INIT;
  struct job_view *views = coord_xcalloc(n, sizeof(*views));
  Stoker__V1__Job **ptrs = coord_xcalloc(n, sizeof(*ptrs));
  for (size_t i = 0; i < n; i++) {
    coord_job_view_init(&views[i], jobs[i], true);
    ptrs[i] = &views[i].job;
  }
  resp.n_jobs = n;
  resp.jobs = ptrs;
  coord_answer(w, &resp.base);
  for (size_t i = 0; i < n; i++) coord_job_view_free(&views[i]);
  free(views);
  free(ptrs);
}

void coord_list_jobs(struct coord *c, const Stoker__V1__ListJobsRequest *req, coord_done_fn done,
                     void *arg) {
  struct coord_wait *w = coord_wait_new(c, WAIT_PLAIN, done, arg);
  if (c->closing || c->broken) return coord_fail(w, STK_EUNAVAIL, "coordinator unavailable");
  struct job **jobs = coord_xcalloc(c->jobs.n, sizeof(*jobs));
  size_t n = 0, pos;
  for (struct hnode *h = coord_tab_first(&c->jobs, &pos); h;
       h = coord_tab_next(&c->jobs, h, &pos)) {
    struct job *j = container_of(h, struct job, hn);
    if (labels_match(j, req)) jobs[n++] = j;
  }
  qsort(jobs, n, sizeof(*jobs), by_name);
  answer_list(w, jobs, n);
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
  bool idle = j->state == STOKER__V1__JOB_STATE__JOB_STATE_STOPPED ||
              j->state == STOKER__V1__JOB_STATE__JOB_STATE_PAUSED;
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
