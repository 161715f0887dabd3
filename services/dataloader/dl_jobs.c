/*
 * dl_jobs: the job table. Jobs are looked up with a reference
 * (dl_job_get/dl_job_put), so DeleteLoader can take a job out of the table
 * while calls still use it: the last reference frees it. A job whose stored
 * configuration could not be loaded at start (a dataset missing, unreadable
 * or corrupt) is kept as a *failed* entry — its name and the reason — so one
 * job's problem never stops the others: its calls fail with the reason,
 * GetLoader and ListLoaders show it, DeleteLoader removes it with what it
 * stored. Its keys stay in RocksDB until then, so restoring the dataset
 * and restarting brings the job back as it was. The entry points (dl_core.c
 * and the rest) call this table; it calls only a job's destructor
 * (dl_job.c) and the store's delete, never back up.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dl_internal.h"
#include "stk_error.h"

struct dl_failed {
  char *name;
  char *reason;
};

/* dl->mu held. */
static struct dl_failed *find_failed(struct dl *dl, const char *name) {
  for (size_t i = 0; i < dl->n_failed; i++)
    if (strcmp(dl->failed[i].name, name) == 0) return &dl->failed[i];
  return NULL;
}

/* dl->mu held. */
static size_t find_loaded(struct dl *dl, const char *name) {
  size_t i = 0;
  while (i < dl->n_jobs && strcmp(dl->jobs[i]->name, name) != 0) i++;
  return i;
}

int dl_job_get(struct dl *dl, const char *name, struct dl_job **ret_job) {
  int rc = STK_ENOENT;
  pthread_mutex_lock(&dl->mu);
  size_t i = name ? find_loaded(dl, name) : dl->n_jobs;
  struct dl_failed *f = name && i == dl->n_jobs ? find_failed(dl, name) : NULL;
  if (i < dl->n_jobs) {
    dl->jobs[i]->refs++;
    *ret_job = dl->jobs[i];
    rc = 0;
  } else if (f) {
    stk_set_detail("dataloader job '%s' failed to load: %s (fix it and restart, or DeleteLoader)",
                   name, f->reason);
    rc = STK_ESTATE;
  }
  pthread_mutex_unlock(&dl->mu);
  if (rc == STK_ENOENT) stk_set_detail("no dataloader job '%s'", name ? name : "");
  return rc;
}

void dl_job_put(struct dl *dl, struct dl_job *j) {
  if (!j) return;
  pthread_mutex_lock(&dl->mu);
  bool last = --j->refs == 0;
  pthread_mutex_unlock(&dl->mu);
  if (last) dl_job_free(j);
}

bool dl_job_name_taken(struct dl *dl, const char *name) {
  pthread_mutex_lock(&dl->mu);
  bool taken = find_loaded(dl, name) < dl->n_jobs || find_failed(dl, name);
  pthread_mutex_unlock(&dl->mu);
  return taken;
}

int dl_add_job(struct dl *dl, struct dl_job *j) {
  int rc = 0;
  pthread_mutex_lock(&dl->mu);
  if (find_loaded(dl, j->name) < dl->n_jobs || find_failed(dl, j->name)) rc = STK_EEXIST;
  struct dl_job **arr = rc ? NULL : realloc(dl->jobs, (dl->n_jobs + 1) * sizeof *arr);
  if (rc == 0 && !arr) rc = STK_ENOMEM;
  if (rc == 0) {
    j->refs = 1; /* the table's */
    dl->jobs = arr;
    dl->jobs[dl->n_jobs++] = j;
  }
  pthread_mutex_unlock(&dl->mu);
  if (rc == STK_EEXIST) stk_set_detail("dataloader job '%s' exists", j->name);
  return rc;
}

void dl_remove_job(struct dl *dl, struct dl_job *j) {
  pthread_mutex_lock(&dl->mu);
  size_t i = find_loaded(dl, j->name);
  bool held = i < dl->n_jobs && dl->jobs[i] == j;
  if (held) dl->jobs[i] = dl->jobs[--dl->n_jobs];
  pthread_mutex_unlock(&dl->mu);
  if (held) dl_job_put(dl, j);
}

int dl_add_failed(struct dl *dl, const char *name, const char *reason) {
  struct dl_failed f = {strdup(name), strdup(reason && *reason ? reason : "unknown error")};
  pthread_mutex_lock(&dl->mu);
  struct dl_failed *arr =
      f.name && f.reason ? realloc(dl->failed, (dl->n_failed + 1) * sizeof *arr) : NULL;
  if (arr) {
    dl->failed = arr;
    dl->failed[dl->n_failed++] = f;
  }
  pthread_mutex_unlock(&dl->mu);
  if (arr) return 0;
  free(f.name);
  free(f.reason);
  return STK_ENOMEM;
}

void dl_jobs_close(struct dl *dl) {
  for (size_t i = 0; i < dl->n_jobs; i++) dl_job_free(dl->jobs[i]);
  free(dl->jobs);
  for (size_t i = 0; i < dl->n_failed; i++) {
    free(dl->failed[i].name);
    free(dl->failed[i].reason);
  }
  free(dl->failed);
}

/* A failed entry's info: its name, failed, the reason. */
static int failed_info(const char *name, const char *reason, Stoker__V1__LoaderInfo **ret_info) {
  Stoker__V1__LoaderInfo info = STOKER__V1__LOADER_INFO__INIT;
  Stoker__V1__LoaderSpec spec = STOKER__V1__LOADER_SPEC__INIT;
  spec.job = (char *)name;
  info.spec = &spec;
  info.committed_step = -1;
  info.failed = true;
  info.failure = (char *)reason;
  size_t n = stoker__v1__loader_info__get_packed_size(&info);
  uint8_t *buf = malloc(n + 1);
  if (!buf) return STK_ENOMEM;
  stoker__v1__loader_info__pack(&info, buf);
  *ret_info = stoker__v1__loader_info__unpack(NULL, n, buf);
  free(buf);
  return *ret_info ? 0 : STK_ENOMEM;
}

int dl_failed_info(struct dl *dl, const char *job, Stoker__V1__LoaderInfo **ret_info) {
  pthread_mutex_lock(&dl->mu);
  struct dl_failed *f = find_failed(dl, job);
  int rc = f ? failed_info(f->name, f->reason, ret_info) : STK_ENOENT;
  pthread_mutex_unlock(&dl->mu);
  return rc;
}

int dl_delete_failed(struct dl *dl, const char *job) {
  pthread_mutex_lock(&dl->mu);
  struct dl_failed *f = find_failed(dl, job);
  int rc = f ? dl_store_delete(dl, job) : STK_ENOENT;
  if (rc == 0) {
    free(f->name);
    free(f->reason);
    *f = dl->failed[--dl->n_failed];
  }
  pthread_mutex_unlock(&dl->mu);
  if (rc == STK_ENOENT) stk_set_detail("no dataloader job '%s'", job);
  return rc;
}

static int cmp_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int dl_job_names(struct dl *dl, char ***ret, size_t *ret_n) {
  pthread_mutex_lock(&dl->mu);
  size_t n = dl->n_jobs + dl->n_failed, k = 0;
  char **v = calloc(n + 1, sizeof *v);
  for (size_t i = 0; v && i < dl->n_jobs; i++) v[k++] = strdup(dl->jobs[i]->name);
  for (size_t i = 0; v && i < dl->n_failed; i++) v[k++] = strdup(dl->failed[i].name);
  pthread_mutex_unlock(&dl->mu);
  bool ok = v != NULL;
  for (size_t i = 0; ok && i < k; i++) ok = v[i] != NULL;
  if (!ok) {
    for (size_t i = 0; v && i < k; i++) free(v[i]);
    free(v);
    return STK_ENOMEM;
  }
  qsort(v, k, sizeof *v, cmp_name);
  *ret = v;
  *ret_n = k;
  return 0;
}
