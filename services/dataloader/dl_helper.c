/*
 * dl_helper: one spare thread that generates part of a batch while the
 * caller generates the rest. Lanes are independent streams with a lock
 * each, so a step's lines split by lane into two halves that need no
 * coordination; on a 2-core host this doubles what one dl_get_batch call
 * gets done. The helper serves one call at a time: a call that finds it
 * busy (another thread is using it) simply does all the work itself.
 */
#include <pthread.h>
#include <stdlib.h>

#include "dl_internal.h"
#include "stk_error.h"

struct dl_helper {
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  void (*fn)(void *);
  void *arg;
  bool busy;    /* claimed by a caller, from start until wait returns */
  bool pending; /* fn set, not yet finished */
  bool stop;
};

static void *helper_main(void *p) {
  struct dl_helper *h = p;
  pthread_mutex_lock(&h->mu);
  for (;;) {
    while (!h->pending && !h->stop) pthread_cond_wait(&h->cv, &h->mu);
    if (h->stop) break;
    pthread_mutex_unlock(&h->mu);
    h->fn(h->arg);
    pthread_mutex_lock(&h->mu);
    h->pending = false;
    pthread_cond_broadcast(&h->cv);
  }
  pthread_mutex_unlock(&h->mu);
  return NULL;
}

int dl_helper_new(struct dl_helper **ret_helper) {
  struct dl_helper *h = calloc(1, sizeof *h);
  if (!h) return STK_ENOMEM;
  pthread_mutex_init(&h->mu, NULL);
  pthread_cond_init(&h->cv, NULL);
  if (pthread_create(&h->th, NULL, helper_main, h) != 0) {
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
    stk_set_detail("dl_helper: cannot start a thread");
    return STK_ENOMEM;
  }
  *ret_helper = h;
  return 0;
}

void dl_helper_free(struct dl_helper *h) {
  if (!h) return;
  pthread_mutex_lock(&h->mu);
  h->stop = true;
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
  pthread_join(h->th, NULL);
  pthread_cond_destroy(&h->cv);
  pthread_mutex_destroy(&h->mu);
  free(h);
}

bool dl_helper_start(struct dl_helper *h, void (*fn)(void *), void *arg) {
  if (!h) return false;
  pthread_mutex_lock(&h->mu);
  bool ok = !h->busy;
  if (ok) {
    h->busy = h->pending = true;
    h->fn = fn;
    h->arg = arg;
    pthread_cond_broadcast(&h->cv);
  }
  pthread_mutex_unlock(&h->mu);
  return ok;
}

void dl_helper_wait(struct dl_helper *h) {
  pthread_mutex_lock(&h->mu);
  while (h->pending) pthread_cond_wait(&h->cv, &h->mu);
  h->busy = false;
  pthread_mutex_unlock(&h->mu);
}
