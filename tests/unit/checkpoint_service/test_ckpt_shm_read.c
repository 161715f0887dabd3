/*
 * Reads through shared memory (ckpt_shm_read, ckpt_restore): the wanted
 * boxes land in the client's read file one after the other from byte
 * CKPT_SHM_READ_DATA on, each piece announced with its offset and length
 * and no bytes; a sub-box of rows and one of columns land right too. Every
 * hostile request (a segment, pool or instance file named, bad names, a
 * symlink, a hard link, a FIFO, a wrong or short nonce, a file too small,
 * too large or missing, reads on a service without a shm directory) is
 * refused with STK_EINVAL (STK_ESTATE for the last) and writes nothing. An
 * inline read of the same service still works.
 */
#include <errno.h>
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

#include "ckpt_dtype.h"
#include "ckpt_shm_read.h"
#include "ckpt_svc_fixture.h"
#include "stk_error.h"

#define ATT  "0123456789abcdef0123456789abcdef"
#define FILL 0xEE

static char shm_dir[200];
static const uint8_t NONCE[CKPT_SHM_READ_NONCE_LEN] = "0123456789abcdefghijklmnopqrstu";

/* A read file: header (magic, nonce), then size - header bytes of FILL. */
static void put_read_file(const char *name, uint64_t size, const uint8_t *nonce) {
  char path[400];
  snprintf(path, sizeof(path), "%s/%s", shm_dir, name);
  int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0600);
  assert_true(fd >= 0);
  uint8_t *b = malloc(size ? size : 1);
  memset(b, FILL, size);
  if (size >= CKPT_SHM_READ_MAGIC_LEN + CKPT_SHM_READ_NONCE_LEN) {
    memcpy(b, CKPT_SHM_READ_MAGIC, CKPT_SHM_READ_MAGIC_LEN);
    memcpy(b + CKPT_SHM_READ_MAGIC_LEN, nonce, CKPT_SHM_READ_NONCE_LEN);
  }
  assert_int_equal(write(fd, b, size), (ssize_t)size);
  free(b);
  close(fd);
}

/* The file's bytes (*ret_len of them), or NULL when it is not there. */
static uint8_t *file_bytes(const char *name, uint64_t *ret_len) {
  char path[400];
  snprintf(path, sizeof(path), "%s/%s", shm_dir, name);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return NULL;
  struct stat st;
  assert_int_equal(fstat(fd, &st), 0);
  uint8_t *b = malloc((size_t)st.st_size + 1);
  assert_int_equal(pread(fd, b, (size_t)st.st_size, 0), st.st_size);
  close(fd);
  *ret_len = (uint64_t)st.st_size;
  return b;
}

/* True if every byte after the header is still FILL. */
static bool untouched(const char *name) {
  uint64_t len;
  uint8_t *b = file_bytes(name, &len);
  bool same = b != NULL;
  for (uint64_t i = CKPT_SHM_READ_DATA; same && i < len; i++) same = b[i] == FILL;
  free(b);
  return same;
}

struct want {
  const struct tspec *t;
  struct ckpt_box box;
};

struct rd {
  bool done;
  int err;
  char msg[512];
  uint64_t next; /* Where the next piece must start. */
  unsigned pieces, inline_bytes;
  const struct want *w;
  size_t n_w;
};

static bool on_piece(void *arg, const Stoker__V1__ReadChunk *p) {
  struct rd *r = arg;
  struct ckpt_box b = {.ndim = (uint32_t)p->box->n_offsets};
  memcpy(b.offsets, p->box->offsets, b.ndim * sizeof(uint64_t));
  memcpy(b.sizes, p->box->sizes, b.ndim * sizeof(uint64_t));
  const struct want *w = NULL;
  for (size_t i = 0; i < r->n_w && !w; i++)
    if (strcmp(r->w[i].t->name, p->tensor) == 0) w = &r->w[i];
  assert_non_null(w);
  assert_int_equal(p->shm_offset, r->next);
  assert_int_equal(p->shm_length, ckpt_box_numel(&b) * ckpt_dtype_bytes(w->t->dtype));
  r->inline_bytes += (unsigned)p->data.len;
  r->next += p->shm_length;
  r->pieces++;
  return true;
}

static void on_done(void *arg, int err, const char *msg, const ProtobufCMessage *resp) {
  (void)resp;
  struct rd *r = arg;
  r->done = true;
  r->err = err;
  snprintf(r->msg, sizeof(r->msg), "%s", msg ? msg : "");
}

/* A Read of the wanted boxes naming file `name` and `nonce` (nonce_len
 * bytes); returns the call's error, *r filled. */
static int read_shm(struct fx *f, const struct want *w, size_t n_w, const char *name,
                    const uint8_t *nonce, size_t nonce_len, struct rd *r) {
  *r = (struct rd){.next = CKPT_SHM_READ_DATA, .w = w, .n_w = n_w};
  Stoker__V1__ChunkEntry ce[8], *cep[8];
  Stoker__V1__Box box[8];
  assert_true(n_w <= 8);
  for (size_t i = 0; i < n_w; i++) {
    stoker__v1__chunk_entry__init(&ce[i]);
    stoker__v1__box__init(&box[i]);
    box[i].n_offsets = box[i].n_sizes = w[i].box.ndim;
    box[i].offsets = (uint64_t *)w[i].box.offsets;
    box[i].sizes = (uint64_t *)w[i].box.sizes;
    ce[i].tensor = (char *)w[i].t->name;
    ce[i].box = &box[i];
    cep[i] = &ce[i];
  }
  Stoker__V1__ReadRequest req = STOKER__V1__READ_REQUEST__INIT;
  req.job = "j";
  req.step = 5;
  req.n_wanted = n_w;
  req.wanted = cep;
  req.shm_name = (char *)name;
  req.shm_nonce.data = (uint8_t *)nonce;
  req.shm_nonce.len = nonce_len;
  ckpt_read(f->svc, &req, on_piece, on_done, r);
  fx_run_until(f, &r->done, 30000);
  return r->err;
}

static void commit_model(struct fx *f, const struct model *m) {
  char att[65], msg[256];
  assert_int_equal(fx_begin(f, "j", 5, 2, att), 0);
  struct write_opts wo = {.world = 2, .skip_last_rank = -1};
  assert_int_equal(fx_write_model(f, att, m, &wo, NULL), 0);
  int rc = fx_commit(f, att, msg, sizeof(msg));
  if (rc) fail_msg("commit: %s", msg);
}

static const struct tspec *tensor(const struct model *m, const char *name) {
  for (size_t i = 0; i < m->n; i++)
    if (strcmp(m->t[i].name, name) == 0) return &m->t[i];
  fail_msg("no tensor %s", name);
  return NULL;
}

/* The bytes of a box of a 2-D tensor, row-major. */
static uint8_t *box_bytes_2d(const struct tspec *t, const struct ckpt_box *b, uint64_t *ret_len) {
  uint64_t e = ckpt_dtype_bytes(t->dtype), cols = t->shape.dims[1];
  uint64_t row = b->sizes[1] * e, n = b->sizes[0] * row;
  uint8_t *out = malloc(n);
  for (uint64_t i = 0; i < b->sizes[0]; i++)
    memcpy(out + i * row, t->full + ((b->offsets[0] + i) * cols + b->offsets[1]) * e, row);
  *ret_len = n;
  return out;
}

struct svc {
  struct fx f;
  struct model *m;
};

static int setup(void **state) {
  struct svc *s = calloc(1, sizeof(*s));
  fx_init(&s->f);
  snprintf(shm_dir, sizeof(shm_dir), "%s/shm", s->f.dir);
  s->f.opts.shm_dir = shm_dir;
  s->f.opts.read_piece_bytes = 4096; /* Several pieces per box. */
  assert_int_equal(fx_open(&s->f), 0);
  s->m = model_new(2, 3000, 7);
  commit_model(&s->f, s->m);
  *state = s;
  return 0;
}

static int teardown(void **state) {
  struct svc *s = *state;
  fx_fini(&s->f);
  model_free(s->m);
  free(s);
  return 0;
}

static void test_boxes_land_in_order(void **state) {
  struct svc *s = *state;
  const struct tspec *embed = tensor(s->m, "model/embed"), *flat = tensor(s->m, "model/flat0"),
                     *step = tensor(s->m, "optim/step");
  struct want w[4] = {{.t = embed}, {.t = flat}, {.t = step}, {.t = embed}};
  ckpt_box_of_shape(&embed->shape, &w[0].box);
  ckpt_box_of_shape(&flat->shape, &w[1].box);
  ckpt_box_of_shape(&step->shape, &w[2].box);
  /* Rows 5..24, columns 3..12: a copy per row, gathered by pwritev. */
  w[3].box = (struct ckpt_box){.ndim = 2, .offsets = {5, 3}, .sizes = {20, 10}};
  uint64_t sub_len;
  uint8_t *sub = box_bytes_2d(embed, &w[3].box, &sub_len);
  uint64_t need = embed->bytes + flat->bytes + step->bytes + sub_len;
  put_read_file("read-00aa", CKPT_SHM_READ_DATA + need + 100, NONCE);
  struct rd r;
  assert_int_equal(read_shm(&s->f, w, 4, "read-00aa", NONCE, sizeof(NONCE), &r), 0);
  assert_true(r.pieces > 4); /* 4 KiB pieces. */
  assert_int_equal(r.inline_bytes, 0);
  assert_int_equal(r.next, CKPT_SHM_READ_DATA + need);
  uint64_t len;
  uint8_t *b = file_bytes("read-00aa", &len);
  assert_memory_equal(b, CKPT_SHM_READ_MAGIC, CKPT_SHM_READ_MAGIC_LEN); /* Header kept. */
  uint8_t *at = b + CKPT_SHM_READ_DATA;
  assert_memory_equal(at, embed->full, embed->bytes);
  at += embed->bytes;
  assert_memory_equal(at, flat->full, flat->bytes);
  at += flat->bytes;
  assert_memory_equal(at, step->full, step->bytes);
  at += step->bytes;
  assert_memory_equal(at, sub, sub_len);
  at += sub_len;
  for (int i = 0; i < 100; i++) assert_int_equal(at[i], FILL); /* Nothing past the boxes. */
  free(b);
  free(sub);
  /* The same service still answers inline reads. */
  assert_int_equal(fx_read_all(&s->f, "j", 5, s->m, 3), 0);
}

static void expect_refused(struct fx *f, const struct want *w, const char *name,
                           const uint8_t *nonce, size_t nonce_len, int code, const char *why) {
  struct rd r;
  int err = read_shm(f, w, 1, name, nonce, nonce_len, &r);
  if (err != code) fail_msg("%s: %d (%s), wanted %d", name, err, r.msg, code);
  assert_int_equal(r.pieces, 0);
  if (!strstr(r.msg, why)) fail_msg("%s: message '%s' lacks '%s'", name, r.msg, why);
}

static void test_hostile_requests_write_nothing(void **state) {
  struct svc *s = *state;
  const struct tspec *embed = tensor(s->m, "model/embed");
  struct want w = {.t = embed};
  ckpt_box_of_shape(&embed->shape, &w.box);
  uint64_t size = CKPT_SHM_READ_DATA + embed->bytes;
  char path[400], target[400];

  /* The service's own files, by any name that is not a read file's. */
  const char *others[] = {"seg-" ATT "-0-1", "free-0000000000000001", "instance-" ATT, "x"};
  for (size_t i = 0; i < 4; i++) {
    put_read_file(others[i], size, NONCE);
    expect_refused(&s->f, &w, others[i], NONCE, sizeof(NONCE), STK_EINVAL, "not a read file name");
    assert_true(untouched(others[i]));
  }
  const char *bad_names[] = {"",
                             "read-",
                             "read-xyz",
                             "../read-1",
                             "read-1/../../x",
                             "read-AB",
                             "read-0 ",
                             "read-0123456789abcdef0123456789abcdef0"};
  for (size_t i = 0; i < 8; i++)
    expect_refused(&s->f, &w, bad_names[i], NONCE, sizeof(NONCE), STK_EINVAL, "read file");

  put_read_file("read-01", size, NONCE); /* The file the others try to reach. */
  snprintf(target, sizeof(target), "%s/read-01", shm_dir);
  snprintf(path, sizeof(path), "%s/read-02", shm_dir);
  assert_int_equal(symlink(target, path), 0);
  expect_refused(&s->f, &w, "read-02", NONCE, sizeof(NONCE), STK_EINVAL, "symbolic link");
  snprintf(path, sizeof(path), "%s/read-03", shm_dir);
  assert_int_equal(link(target, path), 0);
  expect_refused(&s->f, &w, "read-03", NONCE, sizeof(NONCE), STK_EINVAL, "linked once");
  assert_int_equal(unlink(path), 0);
  snprintf(path, sizeof(path), "%s/read-04", shm_dir);
  assert_int_equal(mkfifo(path, 0600), 0);
  expect_refused(&s->f, &w, "read-04", NONCE, sizeof(NONCE), STK_EINVAL, "regular file");
  expect_refused(&s->f, &w, "read-05", NONCE, sizeof(NONCE), STK_EINVAL, "No such file");

  /* Another client's file, or a guess: the nonce must match in full. */
  uint8_t other[CKPT_SHM_READ_NONCE_LEN];
  memcpy(other, NONCE, sizeof(other));
  other[sizeof(other) - 1] ^= 1;
  expect_refused(&s->f, &w, "read-01", other, sizeof(other), STK_EINVAL, "nonce");
  expect_refused(&s->f, &w, "read-01", NONCE, sizeof(NONCE) - 1, STK_EINVAL, "nonce");
  expect_refused(&s->f, &w, "read-01", NULL, 0, STK_EINVAL, "nonce");
  expect_refused(&s->f, &w, "", NONCE, sizeof(NONCE), STK_EINVAL, "not a read file name");

  /* Sizes: one byte short of the wanted box, shorter than the header,
   * larger than the service accepts. */
  put_read_file("read-06", size - 1, NONCE);
  expect_refused(&s->f, &w, "read-06", NONCE, sizeof(NONCE), STK_EINVAL, "need");
  assert_true(untouched("read-06"));
  put_read_file("read-07", CKPT_SHM_READ_DATA - 1, NONCE);
  expect_refused(&s->f, &w, "read-07", NONCE, sizeof(NONCE), STK_EINVAL, "bytes, outside");
  snprintf(path, sizeof(path), "%s/read-08", shm_dir);
  put_read_file("read-08", CKPT_SHM_READ_DATA, NONCE);
  assert_int_equal(truncate(path, (off_t)s->f.opts.staging_budget_bytes + 1), 0);
  expect_refused(&s->f, &w, "read-08", NONCE, sizeof(NONCE), STK_EINVAL, "bytes, outside");
  assert_true(untouched("read-01"));

  /* And the file itself, asked properly, is written. */
  struct rd r;
  assert_int_equal(read_shm(&s->f, &w, 1, "read-01", NONCE, sizeof(NONCE), &r), 0);
  assert_false(untouched("read-01"));
}

static void test_off_without_a_shm_dir(void **state) {
  (void)state;
  struct fx f;
  fx_init(&f);
  snprintf(shm_dir, sizeof(shm_dir), "%s", f.dir); /* Files there, but the service has none. */
  assert_int_equal(fx_open(&f), 0);
  struct model *m = model_new(2, 100, 3);
  commit_model(&f, m);
  const struct tspec *embed = tensor(m, "model/embed");
  struct want w = {.t = embed};
  ckpt_box_of_shape(&embed->shape, &w.box);
  put_read_file("read-0a", CKPT_SHM_READ_DATA + embed->bytes, NONCE);
  expect_refused(&f, &w, "read-0a", NONCE, sizeof(NONCE), STK_ESTATE, "read inline");
  assert_true(untouched("read-0a"));
  assert_int_equal(fx_read_all(&f, "j", 5, m, 2), 0);
  fx_fini(&f);
  model_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_boxes_land_in_order, setup, teardown),
      cmocka_unit_test_setup_teardown(test_hostile_requests_write_nothing, setup, teardown),
      cmocka_unit_test(test_off_without_a_shm_dir),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
