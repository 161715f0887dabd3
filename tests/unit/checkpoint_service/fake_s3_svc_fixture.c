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
  fx_use_s3(f, fake_s3_port(s->srv), max_attempts, &s->st);
}

void fx_fake_s3_fini(struct fx *f, struct fx_fake_s3 *s) {
  fx_fini(f);
  storage_free(s->st);
  fake_s3_stop(s->srv);
}
