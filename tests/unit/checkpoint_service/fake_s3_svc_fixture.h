/*
 * fake_s3_svc_fixture: a checkpoint service over the loopback fake S3 of
 * ../checkpoint_storage (fake_s3.h), for the tests that need answers the
 * real test servers cannot give or requests counted: the fake, the storage
 * on it and the service's fixture set up and torn down in one call each.
 */
#ifndef STK_TEST_FAKE_S3_SVC_FIXTURE_H
#define STK_TEST_FAKE_S3_SVC_FIXTURE_H

#include <stdint.h>

#include "ckpt_svc_fixture.h"
#include "fake_s3.h"

struct fx_fake_s3 {
  struct fake_s3 *srv;
  struct storage *st; /* The service's storage (f->opts.storage). */
};

/* fx_init(f), a fake S3 answering with fn, and f storing on it
 * (fx_fake_s3_use). Set f->opts, then fx_open. */
void fx_fake_s3_init(struct fx *f, struct fx_fake_s3 *s, fake_s3_handler fn, uint32_t max_attempts);
/* Opens s->st on s->srv under prefix "store" (fake_s3_config: max_attempts
 * tries, 1-5 ms back-off) and makes f store there. Call before fx_open; a
 * restart frees s->st after fx_close and calls this again. */
void fx_fake_s3_use(struct fx *f, struct fx_fake_s3 *s, uint32_t max_attempts);
/* fx_fini(f), then the storage freed and the fake stopped. */
void fx_fake_s3_fini(struct fx *f, struct fx_fake_s3 *s);

#endif
