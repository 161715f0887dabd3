/*
 * A rank's zero-copy staging (issue 4): when the checkpoint service runs on
 * this host, chunk bytes are copied once into a segment file of the
 * service's shm directory and only the chunk's metadata (segment name and
 * offset) goes over the Write stream; the service maps the file and owns
 * it from then on. Same host is proved by the service's instance file
 * (instance-<token>, token from GetStagingInfo), so a directory of the same
 * name on another host, or of an earlier service instance, is never used.
 *
 * A segment collects the chunks of one write stream up to SEGMENT_BYTES
 * (or the service's limit); their messages are held until the segment is
 * complete (the service maps a segment once, at its first message), then
 * sent in order, one per ckpt_seg_send_held, so that the writer's owner
 * sends each when the stream can take it and never waits on the service
 * (a save on the client's engine yields between them). The next segment
 * starts only once they are all sent: a writer is at most one segment
 * ahead of what the service took, so its back-pressure holds. Segments
 * start from a recycled free-* file when the pool has one (claimed by an
 * atomic rename; its pages already exist, so the copy allocates nothing),
 * else from a new file; the files stay mapped in this process across
 * checkpoints (ckpt_segmap.c), so in the steady state a chunk's copy is
 * one memcpy into mapped pages.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_internal.h"
#include "client_internal.h"

#define SEGMENT_BYTES ((uint64_t)64 << 20)
#define NAME_MAX_LEN  128

/* A chunk message held until its segment is complete. */
struct pending {
  char *tensor;
  Stoker__V1__DType dtype;
  size_t ndim;
  uint64_t shape[STK_CKPT_MAX_DIMS], off[STK_CKPT_MAX_DIMS], size[STK_CKPT_MAX_DIMS];
  uint64_t shm_offset;
};

struct ckpt_seg {
  int dirfd;
  char attempt[STK_CKPT_ATTEMPT_MAX];
  uint32_t rank;
  uint64_t cap;          /* Bytes per segment. */
  uint32_t tag_hi;       /* Random: segment names of two writers never collide. */
  uint32_t counter;      /* Segments started. */
  struct ckpt_segfile f; /* Current segment (f.fd -1 if none). */
  char name[NAME_MAX_LEN];
  uint64_t used;
  struct pending *pend;
  size_t n_pend, cap_pend;
  size_t n_held; /* pend[0..n_held): the completed segment's, to send. */
  size_t n_sent; /* Of those, sent. */
};

int ckpt_seg_mode_from_env(void) {
  const char *v = getenv(STK_CKPT_SHM_ENV);
  if (!v || !v[0] || strcmp(v, "auto") == 0) return STK_CKPT_SHM_AUTO;
  if (strcmp(v, "0") == 0 || strcmp(v, "off") == 0) return STK_CKPT_SHM_OFF;
  return STK_CKPT_SHM_ON;
}

static bool token_ok(const char *t) {
  size_t n = strlen(t);
  if (n == 0 || n > 64) return false;
  for (size_t i = 0; i < n; i++)
    if (!((t[i] >= '0' && t[i] <= '9') || (t[i] >= 'a' && t[i] <= 'f'))) return false;
  return true;
}

/* The service's directory, if it is this host's and this instance's. */
static int open_dir(const Stoker__V1__StagingInfo *info) {
  if (!info->shm_dir || info->shm_dir[0] != '/' || !info->shm_token || !token_ok(info->shm_token))
    return -1;
  int fd = open(info->shm_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  char inst[NAME_MAX_LEN];
  snprintf(inst, sizeof(inst), "instance-%s", info->shm_token);
  if (faccessat(fd, inst, F_OK, AT_SYMLINK_NOFOLLOW) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int ckpt_seg_ask(struct stk_client *c, struct waiter *w) {
  Stoker__V1__StagingInfoRequest req = STOKER__V1__STAGING_INFO_REQUEST__INIT;
  return waiter_start(w, c, CKPT_METHOD(get_staging_info, &req), &req.base,
                      &stoker__v1__staging_info__descriptor, 0);
}

/* The answer of a done ask: the directory and its limit, or the call's
 * error (its status the last error). */
static int answer(struct waiter *w, int *ret_dirfd, uint64_t *ret_max) {
  if (w->st.code != RPC_OK) {
    client_set_error(w->st.code, "%s", w->st.message);
    return stk_error_from_grpc(w->st.code);
  }
  const Stoker__V1__StagingInfo *info = (const Stoker__V1__StagingInfo *)w->resp;
  *ret_dirfd = open_dir(info);
  *ret_max = info->shm_max_bytes;
  return 0;
}

int ckpt_seg_open(struct waiter *asked, const char *attempt, uint32_t rank, int mode,
                  struct ckpt_seg **ret_shm) {
  *ret_shm = NULL;
  if (mode == STK_CKPT_SHM_OFF) return 0;
  int dirfd = -1;
  uint64_t max = 0;
  int err = answer(asked, &dirfd, &max);
  if (err < 0 && mode == STK_CKPT_SHM_AUTO) return 0; /* An older service: no such call. */
  if (!err && (dirfd < 0 || max == 0)) {
    if (dirfd >= 0) close(dirfd);
    if (mode == STK_CKPT_SHM_AUTO) return 0;
    return client_fail(STK_ENOTSUP, "shm staging: the service is not on this host or has it off");
  }
  if (err < 0) return err;
  err = ckpt_seg_new(dirfd, attempt, rank, max, ret_shm);
  return err < 0 ? client_fail(err, "shm staging") : 0;
}

int ckpt_seg_new(int dirfd, const char *attempt, uint32_t rank, uint64_t max_bytes,
                 struct ckpt_seg **ret_shm) {
  struct ckpt_seg *m = calloc(1, sizeof(*m));
  if (!m) {
    close(dirfd);
    return STK_ENOMEM;
  }
  m->dirfd = dirfd;
  m->f.fd = -1;
  snprintf(m->attempt, sizeof(m->attempt), "%s", attempt);
  m->rank = rank;
  m->cap = max_bytes < SEGMENT_BYTES ? max_bytes : SEGMENT_BYTES;
  if (getrandom(&m->tag_hi, sizeof(m->tag_hi), 0) != (ssize_t)sizeof(m->tag_hi))
    m->tag_hi = (uint32_t)getpid();
  *ret_shm = m;
  return 0;
}

uint64_t ckpt_seg_segment_bytes(const struct ckpt_seg *m) {
  return m->cap;
}

/* ---- Segments ---- */

static int segment_start(struct ckpt_seg *m) {
  snprintf(m->name, sizeof(m->name), "seg-%s-%" PRIu32 "-%08" PRIx32 "%08" PRIx32, m->attempt,
           m->rank, m->tag_hi, m->counter++);
  if (m->counter == 1) ckpt_segmap_prune();
  m->used = 0;
  return ckpt_segmap_acquire(m->dirfd, m->name, m->cap, &m->f);
}

static void pending_clear(struct ckpt_seg *m) {
  for (size_t i = 0; i < m->n_pend; i++) free(m->pend[i].tensor);
  m->n_pend = m->n_held = m->n_sent = 0;
}

static int pending_add(struct ckpt_seg *m, const Stoker__V1__WriteChunk *msg, uint64_t off) {
  if (m->n_pend == m->cap_pend) {
    size_t cap = m->cap_pend ? m->cap_pend * 2 : 8;
    struct pending *n = realloc(m->pend, cap * sizeof(*n));
    if (!n) return STK_ENOMEM;
    m->pend = n;
    m->cap_pend = cap;
  }
  struct pending *p = &m->pend[m->n_pend];
  if (!(p->tensor = strdup(msg->tensor))) return STK_ENOMEM;
  p->dtype = msg->dtype;
  p->ndim = msg->n_global_shape;
  memcpy(p->shape, msg->global_shape, p->ndim * sizeof(uint64_t));
  memcpy(p->off, msg->box->offsets, p->ndim * sizeof(uint64_t));
  memcpy(p->size, msg->box->sizes, p->ndim * sizeof(uint64_t));
  p->shm_offset = off;
  m->n_pend++;
  return 0;
}

int ckpt_seg_complete(struct ckpt_seg *m) {
  if (m->f.fd < 0) return 0;
  if (m->n_pend == 0) { /* Nothing in it (its first copy failed): nothing to announce. */
    ckpt_segmap_discard(&m->f, m->dirfd, m->name);
    return 0;
  }
  int err = ckpt_segmap_complete(&m->f, m->used);
  if (err) { /* Never announced: its chunks are lost (the commit's coverage check tells). */
    unlinkat(m->dirfd, m->name, 0);
    pending_clear(m);
    return err;
  }
  m->n_held = m->n_pend, m->n_sent = 0;
  return 0;
}

bool ckpt_seg_holds(const struct ckpt_seg *m) {
  return m->n_sent < m->n_held;
}

int ckpt_seg_send_held(struct ckpt_seg *m, ckpt_seg_send_fn send, void *arg) {
  if (!ckpt_seg_holds(m)) return 0;
  struct pending *p = &m->pend[m->n_sent];
  Stoker__V1__WriteChunk msg = STOKER__V1__WRITE_CHUNK__INIT;
  Stoker__V1__Box box = STOKER__V1__BOX__INIT;
  box.n_offsets = box.n_sizes = p->ndim;
  box.offsets = p->off;
  box.sizes = p->size;
  msg.tensor = p->tensor;
  msg.dtype = p->dtype;
  msg.n_global_shape = p->ndim;
  msg.global_shape = p->shape;
  msg.box = &box;
  msg.shm_name = m->name;
  msg.shm_offset = p->shm_offset;
  int err = send(arg, &msg);
  if (err) return err; /* Still held: ckpt_seg_free knows whether any went. */
  if (++m->n_sent == m->n_held) pending_clear(m);
  return 0;
}

int ckpt_seg_flush(struct ckpt_seg *m, ckpt_seg_send_fn send, void *arg) {
  int err = ckpt_seg_complete(m);
  while (!err && ckpt_seg_holds(m)) err = ckpt_seg_send_held(m, send, arg);
  return err;
}

int ckpt_seg_append(struct ckpt_seg *m, const Stoker__V1__WriteChunk *msg, const void *data,
                    size_t len) {
  if (len > m->cap) return STK_EINVAL;
  if (ckpt_seg_holds(m)) return CKPT_LATER;
  if (m->f.fd >= 0 && m->used + len > m->cap) {
    int err = ckpt_seg_complete(m);
    return err ? err : CKPT_LATER; /* Its messages go first. */
  }
  int err = 0;
  if (m->f.fd < 0) err = segment_start(m);
  if (!err) err = ckpt_segmap_write(&m->f, m->used, data, len);
  if (!err) err = pending_add(m, msg, m->used);
  if (!err) m->used += len;
  return err;
}

void ckpt_seg_free(struct ckpt_seg *m) {
  if (!m) return;
  ckpt_segmap_discard(&m->f, m->dirfd, m->name); /* Never announced: ours to remove. */
  if (ckpt_seg_holds(m) && m->n_sent == 0) unlinkat(m->dirfd, m->name, 0); /* Likewise. */
  pending_clear(m);
  free(m->pend);
  close(m->dirfd);
  free(m);
}
