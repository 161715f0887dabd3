/*
 * A dataset file truncated under a live job (issue 12, item 7): the reads
 * that hit the lost pages raise SIGBUS, which must cost that job its data
 * (STK_ECORRUPT naming the file, on every later call that reads) and nothing
 * else: the process lives, other jobs serve. Every reader maps its files
 * through dl_map_open, so llm.c (read straight from the map) and Megatron
 * (copied out of it) are both covered; a SIGBUS outside any dataset map
 * still ends the process.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "dl_files.h"
#include "dl_synthetic.h"
#include "dl_test.h"
#include "stk_error.h"

#define N_DOCS 3000 /* x ~1000 tokens x 4 bytes: ~12 MB per file */

static void create(struct dl *dl, const char *job, const char *path, int format) {
  Stoker__V1__StorageRef src = STOKER__V1__STORAGE_REF__INIT;
  Stoker__V1__DatasetSpec ds = STOKER__V1__DATASET_SPEC__INIT, *dsp = &ds;
  Stoker__V1__LoaderSpec s = STOKER__V1__LOADER_SPEC__INIT;
  src.uri = (char *)path;
  ds.name = "d";
  ds.source = &src;
  ds.weight = 1;
  ds.format = format;
  ds.block_tokens = 4096;
  s.job = (char *)job;
  s.datasets = &dsp;
  s.n_datasets = 1;
  s.seq_len = 511;
  s.global_batch = 8;
  s.seed = 3;
  s.logical_shards = 16;
  s.lanes = 2;
  assert_int_equal(dl_create_job(dl, &s), 0);
}

static int batch(struct dl *dl, const char *job, int64_t step) {
  struct dl_batch b;
  int rc = dl_get_batch(dl, job, step, 0, 1, &b);
  if (rc == 0) dl_batch_free(&b);
  return rc;
}

/* Serves "bad" and "good" from two files, truncates bad_file, and checks that
 * only "bad" loses its data, with a reason naming the file. */
static void check_truncation(const char *bad_file, const char *bad_path, const char *good_path,
                             int format) {
  char *dir = t_tmpdir();
  char db[300];
  snprintf(db, sizeof db, "%s/db", dir);
  struct dl *dl = t_open(db, 0);
  create(dl, "bad", bad_path, format);
  create(dl, "good", good_path, format);
  assert_int_equal(batch(dl, "bad", 0), 0);
  assert_int_equal(batch(dl, "good", 0), 0);

  assert_int_equal(truncate(bad_file, 8192), 0);
  int rc = 0;
  int64_t step = 1;
  for (; step < 400 && rc == 0; step++) rc = batch(dl, "bad", step);
  assert_int_equal(rc, STK_ECORRUPT);
  assert_non_null(strstr(stk_detail(), bad_file));
  assert_non_null(strstr(stk_detail(), "job bad"));

  /* The job stays broken, even for a step read before the truncation (its
   * lines would now be regenerated from zeros), and cannot commit or export. */
  assert_int_equal(batch(dl, "bad", 0), STK_ECORRUPT);
  assert_int_equal(dl_commit(dl, "bad", 0), STK_ECORRUPT);
  uint8_t *blob = NULL;
  size_t len = 0;
  assert_int_equal(dl_export_state(dl, "bad", 0, &blob, &len), STK_ECORRUPT);
  Stoker__V1__ExplainResponse *ex = NULL;
  assert_int_equal(dl_explain(dl, "bad", 1, 0, 1, &ex), STK_ECORRUPT);

  /* The other job is untouched. */
  for (int64_t s = 1; s < step + 8; s++) assert_int_equal(batch(dl, "good", s), 0);
  assert_int_equal(dl_commit(dl, "good", step), 0);
  dl_close(dl);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
  free(dir);
}

static void test_truncated_llmc(void **state) {
  (void)state;
  char *dir = t_tmpdir();
  char a[300], b[300];
  snprintf(a, sizeof a, "%s/a.bin", dir);
  snprintf(b, sizeof b, "%s/b.bin", dir);
  assert_int_equal(dl_synthetic_write_llmc(a, 0, N_DOCS, 500, 1500, 7), 0);
  assert_int_equal(dl_synthetic_write_llmc(b, 0, N_DOCS, 500, 1500, 8), 0);
  check_truncation(a, a, b, STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_LLMC);
  unlink(a);
  unlink(b);
  rmdir(dir);
  free(dir);
}

static void test_truncated_megatron(void **state) {
  (void)state;
  char *dir = t_tmpdir();
  char a[300], b[300], abin[320];
  snprintf(a, sizeof a, "%s/a", dir);
  snprintf(b, sizeof b, "%s/b", dir);
  snprintf(abin, sizeof abin, "%s.bin", a);
  assert_int_equal(dl_synthetic_write_megatron(a, N_DOCS, 500, 1500, 7, 4, 0), 0);
  assert_int_equal(dl_synthetic_write_megatron(b, N_DOCS, 500, 1500, 8, 4, 0), 0);
  check_truncation(abin, a, b, STOKER__V1__DATASET_FORMAT__DATASET_FORMAT_MEGATRON);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
  free(dir);
}

/* The handler claims only faults inside dataset maps: a SIGBUS from any
 * other mapping keeps its meaning (here, the process dies). */
static void test_foreign_sigbus_still_fatal(void **state) {
  (void)state;
  char *dir = t_tmpdir();
  char path[300], other[300];
  snprintf(path, sizeof path, "%s/f", dir);
  snprintf(other, sizeof other, "%s/g", dir);
  int fd = open(path, O_RDWR | O_CREAT, 0600), gd = open(other, O_RDWR | O_CREAT, 0600);
  assert_true(fd >= 0 && gd >= 0);
  assert_int_equal(ftruncate(fd, 1 << 16), 0);
  assert_int_equal(ftruncate(gd, 1 << 16), 0);
  const volatile uint8_t *p = mmap(NULL, 1 << 16, PROT_READ, MAP_SHARED, fd, 0);
  assert_true(p != MAP_FAILED);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    /* The default action is what our handler passes a foreign fault on to
     * (the test framework's own handler would catch it otherwise). */
    signal(SIGBUS, SIG_DFL);
    struct dl_map m;
    if (dl_map_open(other, &m) != 0) _exit(2); /* puts the handler in place */
    if (ftruncate(fd, 0) != 0) _exit(3);
    uint8_t x = p[40000];
    _exit(x == 0 ? 0 : 4); /* reached only if the fault was swallowed */
  }
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFSIGNALED(st));
  assert_int_equal(WTERMSIG(st), SIGBUS);
  munmap((void *)p, 1 << 16);
  close(fd);
  close(gd);
  unlink(path);
  unlink(other);
  rmdir(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_truncated_llmc),
      cmocka_unit_test(test_truncated_megatron),
      cmocka_unit_test(test_foreign_sigbus_still_fatal),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
