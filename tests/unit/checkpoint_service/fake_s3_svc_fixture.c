/*
 * fake_s3_svc_fixture: a checkpoint service over the loopback fake S3 (see
 * the header).
 */
#include "fake_s3_svc_fixture.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "storage.h"

void fx_fake_s3_init(struct fx *f, struct fx_fake_s3 *s, fake_s3_handler fn,
                     uint32_t max_attempts) {
  s->srv = fake_s3_start(fn, NULL);
  assert_non_null(s->srv);
  fx_init(f);
  fx_fake_s3_use(f, s, max_attempts);
}

void fx_fake_s3_use(struct fx *f, struct fx_fake_s3 *s, uint32_t max_attempts) {
  struct s3_config cfg = fake_s3_config(s->srv, max_attempts);
  assert_int_equal(storage_open_s3(&cfg, "store", &s->st), 0);
  f->opts.storage = s->st;
  f->opts.storage_url = "s3://" FAKE_S3_BUCKET "/store";
}

void fx_fake_s3_fini(struct fx *f, struct fx_fake_s3 *s) {
  fx_fini(f);
  storage_free(s->st);
  fake_s3_stop(s->srv);
}
