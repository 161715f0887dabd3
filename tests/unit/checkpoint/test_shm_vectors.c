/*
 * The checkpoint service's ends of the shared-memory protocols against the
 * checked-in vectors (tests/vectors, path in STOKER_VECTORS), which the C
 * client (tests/unit/client/test_shm_vectors.c) and the Python package
 * (tests/python/test_shm_vectors.py) are held to as well:
 *
 *   - each segment a rank staged (segment-<i>.bin) is accepted and mapped
 *     (ckpt_shm_map) and holds every chunk of segments.json at its offset;
 *   - a read file as the client made it (read-client.bin) is accepted with
 *     its nonce (ckpt_shm_read_open), and the pieces of read.json written
 *     with ckpt_shm_read_putv leave read-served.bin byte for byte.
 */
#include <cJSON.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cmocka.h>

#include "ckpt_shm.h"
#include "ckpt_shm_read.h"

static char root[256], dir[300];
static struct ckpt_shm *shm;

static int setup(void **state) {
  (void)state;
  snprintf(root, sizeof(root), "/tmp/ckpt-vectors-XXXXXX");
  if (!mkdtemp(root)) return -1;
  snprintf(dir, sizeof(dir), "%s/shm", root);
  return ckpt_shm_open(dir, 1 << 20, 0, &shm) == 0 ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  ckpt_shm_close(shm);
  char cmd[400];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
  return system(cmd) == 0 ? 0 : -1;
}

static uint8_t *vector(const char *name, size_t *ret_len) {
  const char *d = getenv("STOKER_VECTORS");
  assert_non_null(d);
  char path[512];
  snprintf(path, sizeof(path), "%s/%s", d, name);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc((size_t)n + 1);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  buf[n] = 0;
  *ret_len = (size_t)n;
  return buf;
}

static cJSON *json(const char *name) {
  size_t n;
  uint8_t *text = vector(name, &n);
  cJSON *j = cJSON_Parse((const char *)text);
  free(text);
  assert_non_null(j);
  return j;
}

static uint64_t num(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  assert_true(cJSON_IsNumber(v));
  return (uint64_t)v->valuedouble;
}

/* Copies vector name into the shm directory as file (mode 0600). */
static void place(const char *name, const char *file) {
  size_t n;
  uint8_t *b = vector(name, &n);
  char path[700];
  snprintf(path, sizeof(path), "%s/%s", dir, file);
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, b, n), (ssize_t)n);
  close(fd);
  free(b);
}

static void service_reads_the_segment_vectors(void **state) {
  (void)state;
  cJSON *v = json("segments.json");
  const char *attempt = cJSON_GetObjectItemCaseSensitive(v, "attempt")->valuestring;
  unsigned rank = (unsigned)num(v, "rank");
  const cJSON *chunks = cJSON_GetObjectItemCaseSensitive(v, "chunks");
  const cJSON *placed = cJSON_GetObjectItemCaseSensitive(v, "placed");
  struct ckpt_shm_seg *segs[8] = {0};
  for (int i = 0; i < cJSON_GetArraySize(placed); i++) {
    const cJSON *c = cJSON_GetArrayItem(chunks, i), *p = cJSON_GetArrayItem(placed, i);
    int s = (int)num(p, "segment");
    assert_true(s < 8);
    if (!segs[s]) {
      char file[160], vec[32];
      snprintf(file, sizeof(file), "seg-%s-%u-%x", attempt, rank, s);
      snprintf(vec, sizeof(vec), "segment-%d.bin", s);
      place(vec, file);
      assert_int_equal(ckpt_shm_map(shm, file, &segs[s]), 0);
    }
    uint64_t off = num(p, "offset"), len = num(c, "length"), fill = num(c, "fill");
    assert_true(off + len <= segs[s]->size);
    for (uint64_t b = 0; b < len; b++)
      if (segs[s]->map[off + b] != (uint8_t)((fill + b) % 251))
        fail_msg("chunk %d byte %llu differs", i, (unsigned long long)b);
  }
  for (int s = 0; s < 8; s++) ckpt_shm_unmap(segs[s]);
  cJSON_Delete(v);
}

static void service_serves_into_the_read_vector(void **state) {
  (void)state;
  cJSON *v = json("read.json");
  const char *hex = cJSON_GetObjectItemCaseSensitive(v, "nonce_hex")->valuestring;
  uint8_t nonce[CKPT_SHM_READ_NONCE_LEN];
  assert_int_equal(strlen(hex), 2 * sizeof(nonce));
  for (size_t i = 0; i < sizeof(nonce); i++) {
    unsigned x;
    assert_int_equal(sscanf(hex + 2 * i, "%2x", &x), 1);
    nonce[i] = (uint8_t)x;
  }
  assert_int_equal(num(v, "data_offset"), CKPT_SHM_READ_DATA);
  place("read-client.bin", "read-0123abcd");
  int fd = -1;
  uint64_t size = 0;
  assert_int_equal(ckpt_shm_read_open(shm, "read-0123abcd", nonce, sizeof(nonce), &fd, &size), 0);
  assert_int_equal(size, num(v, "size"));
  uint8_t *bufs[8];
  struct iovec iov[8];
  int n = 0;
  const cJSON *p;
  cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(v, "pieces")) {
    size_t len = num(p, "length");
    bufs[n] = malloc(len);
    for (size_t b = 0; b < len; b++) bufs[n][b] = (uint8_t)((num(p, "fill") + b) % 251);
    iov[n].iov_base = bufs[n];
    iov[n].iov_len = len;
    n++;
  }
  assert_int_equal(ckpt_shm_read_putv(fd, iov, n, CKPT_SHM_READ_DATA), 0);
  size_t want_len;
  uint8_t *want = vector("read-served.bin", &want_len);
  uint8_t *got = malloc(want_len);
  assert_int_equal(size, want_len);
  assert_int_equal(pread(fd, got, want_len, 0), (ssize_t)want_len);
  assert_memory_equal(got, want, want_len);
  /* Another nonce is refused: the file is the client's alone. */
  int fd2 = -1;
  nonce[0] ^= 1;
  assert_int_not_equal(ckpt_shm_read_open(shm, "read-0123abcd", nonce, sizeof(nonce), &fd2, &size),
                       0);
  for (int i = 0; i < n; i++) free(bufs[i]);
  free(got);
  free(want);
  close(fd);
  cJSON_Delete(v);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(service_reads_the_segment_vectors, setup, teardown),
      cmocka_unit_test_setup_teardown(service_serves_into_the_read_vector, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
