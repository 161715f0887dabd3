/*
 * A trainer that embeds the service cores and has functions of its own
 * under generic names the tree's static libraries define (kv_open,
 * log_event, crc32c, strbuf_append, metrics_new, storage_open; and
 * attempt_find, which the checkpoint core once defined before its
 * internals took the ckpt__ prefix): linked against
 * the embeddable libraries of services/embed (all three in one program), it
 * builds and runs, and each side calls its own code. The dataloader core
 * opens its RocksDB state, creates a synthetic job, serves the same batch
 * twice and exports and re-imports its state (checksummed with its own
 * crc32c); the checkpoint and coordinator cores open and close on a
 * libuv loop; the program's functions are reached by its own calls and
 * never by the cores (their call counters stay as the program left them).
 * Linked against the plain static libraries instead, the same program
 * fails to link: multiple definition of `kv_open' and the others
 * (link_check.py shows it, and the silent case: a program defining all of
 * crc32c.o's names links, and the core calls the program's crc32c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <uv.h>

#include "ckpt_service.h"
#include "coord.h"
#include "dl_core.h"
#include "stk_error.h"

/* ---- the program's own functions, named as the cores' internals ---- */

static int own_calls; /* Calls of the functions below. */

/* Prototypes: the program's own API (as a header of its own would have). */
int kv_open(const char *name);
void log_event(int level, const char *what);
unsigned crc32c(unsigned seed);
int strbuf_append(int a, int b);
const char *metrics_new(void);
int storage_open(void);
int attempt_find(int id);

int kv_open(const char *name) {
  own_calls++;
  return (int)strlen(name);
}
void log_event(int level, const char *what) {
  (void)level;
  (void)what;
  own_calls++;
}
unsigned crc32c(unsigned seed) {
  own_calls++;
  return seed * 2654435761u;
}
int strbuf_append(int a, int b) {
  own_calls++;
  return a + b;
}
const char *metrics_new(void) {
  own_calls++;
  return "the trainer's metrics";
}
int storage_open(void) {
  own_calls++;
  return 7;
}
int attempt_find(int id) {
  own_calls++;
  return -id;
}

static char tmp[64];

static int make_tmp(void **state) {
  (void)state;
  snprintf(tmp, sizeof(tmp), "/tmp/stoker-embed-XXXXXX");
  return mkdtemp(tmp) ? 0 : -1;
}

static int remove_tmp(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf %s", tmp);
  return system(cmd) == 0 ? 0 : -1;
}

static void test_program_calls_its_own(void **state) {
  (void)state;
  own_calls = 0;
  assert_int_equal(kv_open("abc"), 3);
  assert_int_equal(strbuf_append(2, 3), 5);
  assert_string_equal(metrics_new(), "the trainer's metrics");
  assert_int_equal(crc32c(1), 2654435761u);
  log_event(1, "x");
  assert_int_equal(storage_open(), 7);
  assert_int_equal(attempt_find(4), -4);
  assert_int_equal(own_calls, 7);
}

static void test_dataloader_core(void **state) {
  (void)state;
  own_calls = 0;
  char dir[128];
  snprintf(dir, sizeof(dir), "%s/dl", tmp);
  struct dl_opts o = {.dir = dir};
  struct dl *dl = NULL;
  assert_int_equal(dl_open(&o, &dl), 0);
  Stoker__V1__DatasetSpec ds = STOKER__V1__DATASET_SPEC__INIT;
  Stoker__V1__StorageRef ref = STOKER__V1__STORAGE_REF__INIT;
  ref.uri = "synthetic:4000:16:4000:3";
  ds.name = "syn";
  ds.weight = 1;
  ds.source = &ref;
  Stoker__V1__DatasetSpec *dsp[1] = {&ds};
  Stoker__V1__LoaderSpec spec = STOKER__V1__LOADER_SPEC__INIT;
  spec.job = "embedded";
  spec.seq_len = 63;
  spec.global_batch = 8;
  spec.n_datasets = 1;
  spec.datasets = dsp;
  spec.seed = 7;
  spec.logical_shards = 64;
  spec.lanes = 4;
  assert_int_equal(dl_create_job(dl, &spec), 0);
  struct dl_batch a, b;
  assert_int_equal(dl_get_batch(dl, "embedded", 5, 0, 2, &a), 0);
  assert_int_equal(dl_get_batch(dl, "embedded", 5, 0, 2, &b), 0);
  assert_int_equal(a.lines, 4);
  assert_int_equal(a.line_tokens, 64);
  assert_memory_equal(a.tokens, b.tokens, (size_t)a.lines * a.line_tokens * sizeof(*a.tokens));
  dl_batch_free(&a);
  dl_batch_free(&b);
  /* The state blob carries a CRC32C: the core's own crc32c, not the program's. */
  assert_int_equal(dl_commit(dl, "embedded", 0), 0);
  uint8_t *blob = NULL;
  size_t len = 0;
  assert_int_equal(dl_export_state(dl, "embedded", 0, &blob, &len), 0);
  int64_t step = -1;
  assert_int_equal(dl_import_state(dl, blob, len, &step), 0);
  assert_int_equal(step, 0);
  free(blob);
  assert_int_equal(dl_get_batch(dl, "nope", 0, 0, 1, &a), STK_ENOENT);
  assert_string_equal(stk_strerror(STK_ENOENT), stk_strerror(STK_ENOENT));
  dl_close(dl);
  assert_int_equal(own_calls, 0); /* The core used its own kv_open, crc32c, ... */
}

static void set_flag(void *arg) {
  *(bool *)arg = true;
}

static void test_checkpoint_and_coordinator_cores(void **state) {
  (void)state;
  own_calls = 0;
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  char db[128], data[128], url[160], coord_dir[128];
  snprintf(db, sizeof(db), "%s/ckpt-db", tmp);
  snprintf(data, sizeof(data), "%s/ckpt-data", tmp);
  snprintf(url, sizeof(url), "file://%s", data);
  snprintf(coord_dir, sizeof(coord_dir), "%s/coord", tmp);
  assert_int_equal(uv_fs_mkdir(NULL, &(uv_fs_t){0}, data, 0755, NULL), 0);
  struct ckpt_service_opts co = {.db_dir = db,
                                 .storage_url = url,
                                 .staging_budget_bytes = 64 << 20,
                                 .upload_concurrency = 2,
                                 .part_bytes = 5 << 20};
  struct ckpt_service *svc = NULL;
  assert_int_equal(ckpt_service_open(&loop, &co, &svc), 0);
  struct coord_opts oo = {.dir = coord_dir};
  struct coord *c = NULL;
  assert_int_equal(coord_open(&loop, &oo, &c), 0);
  bool ckpt_closed = false, coord_closed = false;
  ckpt_service_close(svc, set_flag, &ckpt_closed);
  coord_close(c, set_flag, &coord_closed);
  while (!ckpt_closed || !coord_closed) uv_run(&loop, UV_RUN_ONCE);
  uv_run(&loop, UV_RUN_NOWAIT);
  assert_int_equal(uv_loop_close(&loop), 0);
  assert_int_equal(own_calls, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_program_calls_its_own),
      cmocka_unit_test(test_dataloader_core),
      cmocka_unit_test(test_checkpoint_and_coordinator_cores),
  };
  return cmocka_run_group_tests(tests, make_tmp, remove_tmp);
}
