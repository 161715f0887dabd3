/*
 * The shared-memory protocols against the checked-in test vectors
 * (tests/vectors, read with the path in STOKER_VECTORS), which pytest holds
 * the Python implementation to as well (tests/python/test_shm_vectors.py):
 *
 *   - the dataloader daemon's ring writer (shm_ring_create, next_free,
 *     reserve, written) leaves ring-daemon.bin byte for byte;
 *   - the client's end (loader_ring_attach on a copy of ring-daemon.bin)
 *     reads each sequence's tokens in its slot and, once it releases them,
 *     leaves ring-released.bin;
 *   - the client's checkpoint staging (ckpt_seg_new, ckpt_seg_append,
 *     ckpt_seg_send_held, ckpt_seg_flush) places the chunks of
 *     segments.json at the offsets and in the segments the vector names,
 *     and each segment file holds exactly segment-<i>.bin.
 *
 * The vectors are little-endian (the layouts are host order): on another
 * host the tests skip.
 */
#include <cJSON.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "ckpt_internal.h"
#include "loader_internal.h"
#include "shm_ring.h"
#include "stk_error.h"

static char dir[128];
static int dirfd_;

static bool little_endian(void) {
  const uint16_t one = 1;
  return *(const uint8_t *)&one == 1;
}

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof(dir), "/dev/shm/stoker-vectors-XXXXXX");
  if (!mkdtemp(dir)) {
    snprintf(dir, sizeof(dir), "/tmp/stoker-vectors-XXXXXX");
    if (!mkdtemp(dir)) return -1;
  }
  chmod(dir, 0700);
  dirfd_ = open(dir, O_RDONLY | O_DIRECTORY);
  return dirfd_ < 0 ? -1 : 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[200];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  close(dirfd_);
  int rc = system(cmd);
  ckpt_segmap_prune();
  return rc;
}

/* The bytes of a file (vector name under $STOKER_VECTORS, or a path). */
static uint8_t *slurp(const char *path, size_t *ret_len) {
  char full[512];
  if (path[0] != '/') {
    const char *d = getenv("STOKER_VECTORS");
    assert_non_null(d);
    snprintf(full, sizeof(full), "%s/%s", d, path);
    path = full;
  }
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc((size_t)n + 1);
  assert_non_null(buf);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  buf[n] = 0;
  *ret_len = (size_t)n;
  return buf;
}

static cJSON *load_json(const char *name) {
  size_t n;
  uint8_t *text = slurp(name, &n);
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

/* The bytes now in the file open as fd, against vector name. */
static void assert_file_is(int fd, const char *name) {
  size_t want_len;
  uint8_t *want = slurp(name, &want_len);
  struct stat st;
  assert_int_equal(fstat(fd, &st), 0);
  assert_int_equal((size_t)st.st_size, want_len);
  uint8_t *got = malloc(want_len);
  assert_int_equal(pread(fd, got, want_len, 0), (ssize_t)want_len);
  for (size_t i = 0; i < want_len; i++)
    if (got[i] != want[i])
      fail_msg("%s: byte %zu is %02x, the vector's %02x", name, i, got[i], want[i]);
  free(got);
  free(want);
}

static void ring_nonce(const cJSON *ring, uint8_t nonce[SHM_RING_NONCE_BYTES]) {
  const char *hex = cJSON_GetObjectItemCaseSensitive(ring, "nonce_hex")->valuestring;
  assert_int_equal(strlen(hex), 2 * SHM_RING_NONCE_BYTES);
  for (int i = 0; i < SHM_RING_NONCE_BYTES; i++) {
    unsigned v;
    assert_int_equal(sscanf(hex + 2 * i, "%2x", &v), 1);
    nonce[i] = (uint8_t)v;
  }
}

/* ---- the ring ---- */

static void daemon_writes_the_ring_vector(void **state) {
  (void)state;
  if (!little_endian()) skip();
  cJSON *ring = load_json("ring.json");
  uint8_t nonce[SHM_RING_NONCE_BYTES];
  ring_nonce(ring, nonce);
  struct shm_ring *r = NULL;
  assert_int_equal(shm_ring_create(dirfd_, dir, nonce, (uint32_t)num(ring, "slots"),
                                   num(ring, "slot_bytes"), &r),
                   0);
  uint64_t prev = 0;
  const cJSON *seqs = cJSON_GetObjectItemCaseSensitive(ring, "sequences"), *s;
  cJSON_ArrayForEach(s, seqs) {
    uint64_t seq = shm_ring_next_free(r, prev);
    assert_int_equal(seq, strtoull(s->string, NULL, 10)); /* 1, 2: every slot free. */
    assert_int_equal(shm_ring_reserve(r, seq), 0);
    uint32_t *slot = (uint32_t *)(void *)shm_ring_slot(r, seq);
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, s) slot[i++] = (uint32_t)t->valuedouble;
    shm_ring_written(r, seq);
    prev = seq;
  }
  int fd = open(shm_ring_path(r), O_RDONLY);
  assert_true(fd >= 0);
  assert_file_is(fd, "ring-daemon.bin");
  close(fd);
  shm_ring_unlink(r);
  shm_ring_free(r);
  cJSON_Delete(ring);
}

static void client_reads_and_releases_the_ring_vector(void **state) {
  (void)state;
  if (!little_endian()) skip();
  cJSON *ring = load_json("ring.json");
  uint8_t nonce[SHM_RING_NONCE_BYTES];
  ring_nonce(ring, nonce);
  size_t n;
  uint8_t *bytes = slurp("ring-daemon.bin", &n);
  char path[256];
  snprintf(path, sizeof(path), "%s/ring-vector", dir);
  int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, bytes, n), (ssize_t)n);
  free(bytes);

  struct loader_ring *lr = NULL;
  assert_int_equal(loader_ring_attach(path, nonce, &lr), 0);
  assert_int_equal(access(path, F_OK), -1); /* The client removed the name. */
  assert_int_equal(loader_ring_slots(lr), num(ring, "slots"));
  assert_int_equal(loader_ring_slot_bytes(lr), num(ring, "slot_bytes"));
  const cJSON *seqs = cJSON_GetObjectItemCaseSensitive(ring, "sequences"), *s;
  cJSON_ArrayForEach(s, seqs) {
    uint64_t seq = strtoull(s->string, NULL, 10);
    assert_int_equal(loader_ring_take(lr, seq), 0);
    const uint8_t *slot = loader_ring_slot(lr, seq);
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, s) {
      uint32_t v;
      memcpy(&v, slot + 4 * i++, 4);
      assert_int_equal(v, (uint32_t)t->valuedouble);
    }
  }
  const cJSON *rel = cJSON_GetObjectItemCaseSensitive(ring, "released"), *x;
  cJSON_ArrayForEach(x, rel) loader_ring_release(lr, (uint64_t)x->valuedouble);
  assert_file_is(fd, "ring-released.bin");
  loader_ring_unref(lr);
  close(fd);
  cJSON_Delete(ring);
}

/* ---- checkpoint staging segments ---- */

struct sent {
  char name[8][256];
  char tensor[8][64];
  uint64_t offset[8];
  int n;
};

static int record(void *arg, Stoker__V1__WriteChunk *msg) {
  struct sent *s = arg;
  assert_true(s->n < 8);
  snprintf(s->name[s->n], sizeof(s->name[0]), "%s", msg->shm_name);
  snprintf(s->tensor[s->n], sizeof(s->tensor[0]), "%s", msg->tensor);
  s->offset[s->n] = msg->shm_offset;
  s->n++;
  return 0;
}

static void staging_writes_the_segment_vectors(void **state) {
  (void)state;
  cJSON *v = load_json("segments.json");
  const char *attempt = cJSON_GetObjectItemCaseSensitive(v, "attempt")->valuestring;
  uint32_t rank = (uint32_t)num(v, "rank");
  struct ckpt_seg *m = NULL;
  assert_int_equal(ckpt_seg_new(dup(dirfd_), attempt, rank, num(v, "cap"), &m), 0);
  struct sent sent = {0};
  const cJSON *c;
  cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(v, "chunks")) {
    size_t len = num(c, "length");
    uint8_t *data = malloc(len);
    for (size_t i = 0; i < len; i++) data[i] = (uint8_t)((num(c, "fill") + i) % 251);
    uint64_t shape = len, off = 0, size = len;
    Stoker__V1__Box box = STOKER__V1__BOX__INIT;
    box.n_offsets = box.n_sizes = 1;
    box.offsets = &off;
    box.sizes = &size;
    Stoker__V1__WriteChunk msg = STOKER__V1__WRITE_CHUNK__INIT;
    msg.tensor = cJSON_GetObjectItemCaseSensitive(c, "tensor")->valuestring;
    msg.dtype = STOKER__V1__DTYPE__DTYPE_U8;
    msg.n_global_shape = 1;
    msg.global_shape = &shape;
    msg.box = &box;
    int err = ckpt_seg_append(m, &msg, data, len);
    if (err == CKPT_LATER) { /* The segment is full: its messages go first, one a call. */
      assert_true(ckpt_seg_holds(m));
      while (ckpt_seg_holds(m)) assert_int_equal(ckpt_seg_send_held(m, record, &sent), 0);
      err = ckpt_seg_append(m, &msg, data, len);
    }
    assert_int_equal(err, 0);
    free(data);
  }
  assert_int_equal(ckpt_seg_flush(m, record, &sent), 0);

  char prefix[128];
  snprintf(prefix, sizeof(prefix), "seg-%s-%u-", attempt, rank);
  int i = 0, segment = -1;
  const char *names[8] = {0};
  cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(v, "placed")) {
    assert_true(i < sent.n);
    assert_string_equal(sent.tensor[i], cJSON_GetObjectItemCaseSensitive(c, "tensor")->valuestring);
    assert_int_equal(sent.offset[i], num(c, "offset"));
    assert_memory_equal(sent.name[i], prefix, strlen(prefix));
    int want = (int)num(c, "segment");
    if (want != segment) { /* A new segment starts: a new name. */
      assert_int_equal(want, segment + 1);
      segment = want;
      names[segment] = sent.name[i];
      assert_true(segment == 0 || strcmp(names[segment], names[segment - 1]) != 0);
    }
    assert_string_equal(sent.name[i], names[segment]);
    i++;
  }
  assert_int_equal(i, sent.n);
  for (int s = 0; s <= segment; s++) {
    char vec[32];
    snprintf(vec, sizeof(vec), "segment-%d.bin", s);
    int fd = openat(dirfd_, names[s], O_RDONLY);
    assert_true(fd >= 0);
    assert_file_is(fd, vec);
    close(fd);
  }
  ckpt_seg_free(m);
  cJSON_Delete(v);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(daemon_writes_the_ring_vector, setup, teardown),
      cmocka_unit_test_setup_teardown(client_reads_and_releases_the_ring_vector, setup, teardown),
      cmocka_unit_test_setup_teardown(staging_writes_the_segment_vectors, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
