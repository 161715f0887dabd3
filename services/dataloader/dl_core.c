/*
 * dl_core: the dataloader's entry points that are not about serving —
 * open/close, create, delete, info and list. Serving lives in dl_serve.c,
 * configuration changes in dl_update.c, Commit and ExportState in
 * dl_commit.c, ImportState in dl_import.c. Below them: dl_load.c (the
 * stored jobs at open), the job table (dl_jobs.c), a job's life (dl_job.c);
 * README.md draws the whole ladder.
 */
#include <stdlib.h>
#include <string.h>

#include "dl_internal.h"
#include "page.h"
#include "stk_error.h"

int dl_open(const struct dl_opts *opts, struct dl **ret_dl) {
  if (!opts || !opts->dir || !ret_dl) {
    stk_set_detail("dl_open: opts.dir is required");
    return STK_EINVAL;
  }
  struct dl *dl = calloc(1, sizeof *dl);
  if (!dl) return STK_ENOMEM;
  dl->opts = *opts;
  struct dl_opts *o = &dl->opts;
  if (!o->max_batch_bytes) o->max_batch_bytes = 256u << 20;
  if (!o->max_step) o->max_step = INT64_C(1) << 40;
  if (!o->max_replay_lines) o->max_replay_lines = 1u << 20;
  if (!o->max_replay_tokens) o->max_replay_tokens = UINT64_C(1) << 30;
  if (!o->snapshot_every_lines) o->snapshot_every_lines = 32;
  if (!o->max_snapshots_per_lane) o->max_snapshots_per_lane = 256;
  if (!o->keep_commits) o->keep_commits = 2;
  if (!o->max_job_state_bytes) o->max_job_state_bytes = UINT64_C(256) << 20;
  if (!o->open_source) o->open_source = dl_default_open_source;
  if (!o->parts) o->parts = 1;
  if (o->part >= o->parts) {
    stk_set_detail("dl_open: part %u of %u: need part < parts", o->part, o->parts);
    free(dl);
    return STK_EINVAL;
  }
  o->dir = NULL;
  pthread_mutex_init(&dl->mu, NULL);
  struct kv_opts ko = {.create_if_missing = true};
  int rc = kv_open(opts->dir, &ko, &dl->kv);
  if (rc == 0) rc = dl_load(dl);
  if (rc == 0 && o->gen_threads > 1) rc = dl_helper_new(&dl->helper);
  if (rc < 0) {
    dl_close(dl);
    return rc;
  }
  *ret_dl = dl;
  return 0;
}

void dl_close(struct dl *dl) {
  if (!dl) return;
  dl_helper_free(dl->helper);
  dl_jobs_close(dl);
  kv_close(dl->kv);
  pthread_mutex_destroy(&dl->mu);
  free(dl);
}

int dl_create_job(struct dl *dl, const Stoker__V1__LoaderSpec *spec) {
  if (!spec) return STK_EINVAL;
  if (spec->job && dl_job_name_taken(dl, spec->job)) {
    stk_set_detail("dataloader job '%s' exists", spec->job);
    return STK_EEXIST;
  }
  struct dl_job *j = NULL;
  int rc = dl_job_new(dl, spec, &j);
  if (rc < 0) return rc;
  if (j->C < dl->opts.parts) {
    stk_set_detail("%u lanes cannot be split over %u processes (lanes >= parts)", j->C,
                   dl->opts.parts);
    dl_job_free(j);
    return STK_EINVAL;
  }
  /* Registered first so a racing create of the same name fails; removed
   * again if the write fails (nothing stored then). */
  if ((rc = dl_add_job(dl, j)) < 0) {
    dl_job_free(j);
    return rc;
  }
  if ((rc = dl_store_put_config(dl, j, true)) < 0) dl_remove_job(dl, j); /* frees it */
  return rc;
}

/* Deletes a loaded job: its keys first (synced), then the table entry.
 * Holding the write lock and the commit mutex waits for calls in flight and
 * makes any later change see `deleted` (so nothing writes its keys again). */
static int delete_loaded(struct dl *dl, struct dl_job *j) {
  pthread_rwlock_wrlock(&j->lock);
  pthread_mutex_lock(&j->commit_mu);
  int rc = j->deleted ? STK_ENOENT : dl_store_delete(dl, j->name);
  if (rc == 0) j->deleted = true;
  pthread_mutex_unlock(&j->commit_mu);
  pthread_rwlock_unlock(&j->lock);
  if (rc == 0) dl_remove_job(dl, j);
  if (rc == STK_ENOENT) stk_set_detail("no dataloader job '%s'", j->name);
  return rc;
}

int dl_delete_job(struct dl *dl, const char *job) {
  struct dl_job *j = NULL;
  int rc = dl_job_get(dl, job, &j);
  if (rc == STK_ESTATE) return dl_delete_failed(dl, job);
  if (rc < 0) return rc;
  rc = delete_loaded(dl, j);
  dl_job_put(dl, j);
  return rc;
}

/* The latest version's shape, mixture and tokenizers over the creation spec. */
static int fill_info(const struct dl_job *j, Stoker__V1__LoaderInfo *info) {
  const struct dl_version *v = &j->ver[j->n_ver - 1];
  Stoker__V1__LoaderSpec *s = malloc(sizeof *s);
  Stoker__V1__DatasetSpec **ds = calloc(j->n_ds + 1, sizeof *ds);
  if (!s || !ds) {
    free(s);
    free(ds);
    return STK_ENOMEM;
  }
  *s = *j->spec;
  s->seq_len = v->seq_len;
  s->global_batch = v->global_batch;
  s->logical_shards = j->L;
  s->lanes = j->C;
  for (uint32_t d = 0; d < j->n_ds; d++) {
    if (!(ds[d] = malloc(sizeof *ds[d]))) break;
    *ds[d] = *j->ds[d].spec; /* shallow: strings stay the job's, see dl_info_free */
    ds[d]->weight = dl_version_weight(v, d);
    uint32_t t = dl_version_tok(v, d);
    if (t) ds[d]->tokenizer = j->ds[d].tok_name[t]; /* the one a version chose */
    s->n_datasets = d + 1;
  }
  s->datasets = ds;
  info->spec = s;
  info->committed_step = j->n_commits ? j->commits[j->n_commits - 1].step : -1;
  if (dl_job_check_data(j) < 0) { /* its data was lost under it */
    info->failed = true;
    info->failure = (char *)stk_detail();
  }
  if (j->dl->opts.parts > 1) {
    info->part = j->dl->opts.part;
    info->parts = j->dl->opts.parts;
  }
  if ((info->lane_lines_generated = calloc(j->C, sizeof(uint64_t)))) {
    info->n_lane_lines_generated = j->C;
    for (uint32_t c = 0; c < j->C; c++)
      info->lane_lines_generated[c] = __atomic_load_n(&j->lanes[c].generated, __ATOMIC_RELAXED);
  }
  return s->n_datasets == j->n_ds && info->lane_lines_generated ? 0 : STK_ENOMEM;
}

int dl_get_info(struct dl *dl, const char *job, Stoker__V1__LoaderInfo **ret_info) {
  struct dl_job *j = NULL;
  int got = dl_job_get(dl, job, &j);
  if (got == STK_ESTATE && dl_failed_info(dl, job, ret_info) == 0) return 0;
  if (got < 0) return got;
  Stoker__V1__LoaderInfo *info = malloc(sizeof *info);
  if (!info) {
    dl_job_put(dl, j);
    return STK_ENOMEM;
  }
  stoker__v1__loader_info__init(info);
  pthread_rwlock_rdlock(&j->lock);
  pthread_mutex_lock(&j->commit_mu);
  int rc = fill_info(j, info);
  /* The strings are copied through a pack/unpack so the reply owns them. */
  Stoker__V1__LoaderInfo *own = NULL;
  if (rc == 0) {
    size_t n = stoker__v1__loader_info__get_packed_size(info);
    uint8_t *buf = malloc(n + 1);
    if (buf) {
      stoker__v1__loader_info__pack(info, buf);
      own = stoker__v1__loader_info__unpack(NULL, n, buf);
      free(buf);
    }
    if (!own) rc = STK_ENOMEM;
  }
  pthread_mutex_unlock(&j->commit_mu);
  pthread_rwlock_unlock(&j->lock);
  dl_job_put(dl, j);
  if (info->spec) {
    for (size_t d = 0; d < info->spec->n_datasets; d++) free(info->spec->datasets[d]);
    free(info->spec->datasets);
    free(info->spec);
  }
  free(info->lane_lines_generated);
  free(info);
  if (rc == 0) *ret_info = own;
  return rc;
}

int dl_lane_lines_generated(struct dl *dl, const char *job, uint32_t lane, uint64_t *ret_lines) {
  struct dl_job *j = NULL;
  int rc = dl_job_get(dl, job, &j);
  if (rc < 0) return rc;
  if (lane >= j->C) {
    stk_set_detail("job %s has %u lanes", j->name, j->C);
    rc = STK_EINVAL;
  } else {
    *ret_lines = __atomic_load_n(&j->lanes[lane].generated, __ATOMIC_RELAXED);
  }
  dl_job_put(dl, j);
  return rc;
}

void dl_info_free(Stoker__V1__LoaderInfo *info) {
  if (info) stoker__v1__loader_info__free_unpacked(info, NULL);
}

/* Fills r with the jobs of names[from..n) that fit one page. */
static int list_page(struct dl *dl, char **names, size_t from, size_t n, uint32_t size,
                     Stoker__V1__ListLoadersResponse *r) {
  if (!(r->loaders = calloc(size + 1, sizeof *r->loaders))) return STK_ENOMEM;
  size_t used = 0;
  for (size_t i = from; i < n; i++) {
    Stoker__V1__LoaderInfo *info;
    int rc = dl_get_info(dl, names[i], &info);
    if (rc == STK_ENOENT) continue; /* deleted meanwhile: left out */
    if (rc < 0) return rc;
    size_t bytes = protobuf_c_message_get_packed_size(&info->base);
    if (!page_fits(size, r->n_loaders, used, bytes)) {
      dl_info_free(info);
      return page_token_encode(names[i - 1], &r->next_page_token);
    }
    r->loaders[r->n_loaders++] = info;
    used += bytes;
  }
  return 0;
}

int dl_list_jobs(struct dl *dl, const Stoker__V1__ListLoadersRequest *req,
                 Stoker__V1__ListLoadersResponse **ret_resp) {
  char *after = NULL, **v = NULL;
  size_t n = 0, from = 0;
  int rc = page_token_decode(req ? req->page_token : NULL, &after);
  if (rc == 0) rc = dl_job_names(dl, &v, &n);
  if (rc < 0) {
    free(after);
    return rc;
  }
  while (after && from < n && strcmp(v[from], after) <= 0) from++;
  free(after);
  Stoker__V1__ListLoadersResponse *r = malloc(sizeof *r);
  if (r) stoker__v1__list_loaders_response__init(r);
  rc = r ? list_page(dl, v, from, n, page_size(req ? req->page_size : 0), r) : STK_ENOMEM;
  for (size_t i = 0; i < n; i++) free(v[i]);
  free(v);
  if (rc < 0) {
    dl_list_free(r);
    return rc;
  }
  *ret_resp = r;
  return 0;
}

void dl_list_free(Stoker__V1__ListLoadersResponse *resp) {
  if (!resp) return;
  for (size_t i = 0; i < resp->n_loaders; i++) dl_info_free(resp->loaders[i]);
  free(resp->loaders);
  if (resp->next_page_token != protobuf_c_empty_string) free(resp->next_page_token);
  free(resp);
}
