/*
 * ckpt_shm: the shared-memory segment directory (see ckpt_shm.h): its
 * safety checks, the strict segment-name check, mapping, the recycling pool
 * and the sweeps that keep segments from outliving their attempts.
 */
#include "ckpt_shm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "map_guard.h"
#include "shm_ring.h"
#include "stk_error.h"

struct pooled {
  char name[32];
  uint64_t size;
};

struct ckpt_shm {
  char *dir;
  int dirfd;
  char token[CKPT_ATTEMPT_MAX_BYTES + 1];
  uint64_t max_bytes, pool_cap;
  struct pooled *pool;
  size_t n_pool, cap_pool;
  uint64_t pool_bytes, next_free;
};

/* ---- Names ---- */

static bool is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

int ckpt_shm_check_name(const char *name, const char *attempt, uint32_t rank) {
  char want[CKPT_SHM_NAME_MAX + 1];
  int n = snprintf(want, sizeof(want), "seg-%s-%" PRIu32 "-", attempt ? attempt : "", rank);
  size_t len = name ? strnlen(name, CKPT_SHM_NAME_MAX + 1) : 0;
  if (!attempt || !attempt[0] || n < 0 || (size_t)n >= sizeof(want) || len > CKPT_SHM_NAME_MAX ||
      len <= (size_t)n || strncmp(name, want, (size_t)n) != 0) {
    stk_set_detail("shm segment %.80s: not a segment name of attempt %.64s rank %" PRIu32,
                   name ? name : "", attempt ? attempt : "", rank);
    return STK_EINVAL;
  }
  const char *tag = name + n;
  size_t tlen = len - (size_t)n;
  for (size_t i = 0; i < tlen; i++)
    if (!is_hex(tag[i]) || tlen > CKPT_SHM_TAG_MAX) {
      stk_set_detail("shm segment %.80s: the tag must be 1..%d hex digits", name, CKPT_SHM_TAG_MAX);
      return STK_EINVAL;
    }
  return 0;
}

/* The attempt of a "seg-<attempt>-..." directory entry, or false. */
static bool entry_attempt(const char *name, char ret[CKPT_ATTEMPT_MAX_BYTES + 1]) {
  if (strncmp(name, "seg-", 4) != 0) return false;
  const char *a = name + 4, *dash = strchr(a, '-');
  if (!dash || dash == a || (size_t)(dash - a) > CKPT_ATTEMPT_MAX_BYTES) return false;
  memcpy(ret, a, (size_t)(dash - a));
  ret[dash - a] = '\0';
  return true;
}

/* ---- Directory ---- */

/* The private-directory rules of shm_ring.h: absolute, created 0700, a
 * real directory of this user without group or other access. */
static int dir_open(const char *dir, int *ret_fd) {
  return shm_ring_dir_open(dir, NULL, ret_fd);
}

/* Calls fn for each entry name of the directory (a snapshot). */
static void dir_each(struct ckpt_shm *m,
                     void (*fn)(struct ckpt_shm *m, const char *name, void *arg), void *arg) {
  int fd = openat(m->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (!d) {
    if (fd >= 0) close(fd);
    return;
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') fn(m, e->d_name, arg);
  closedir(d);
}

bool ckpt_shm_read_is_name(const char *name) {
  return name && strncmp(name, "read-", 5) == 0;
}

static bool ours(const char *name) {
  return strncmp(name, "seg-", 4) == 0 || strncmp(name, "free-", 5) == 0 ||
         strncmp(name, "instance-", 9) == 0 || ckpt_shm_read_is_name(name);
}

static void remove_stale(struct ckpt_shm *m, const char *name, void *arg) {
  (void)arg;
  if (ours(name)) unlinkat(m->dirfd, name, 0);
}

static int announce(struct ckpt_shm *m) {
  int err = ckpt_attempt_generate(m->token);
  if (err) return err;
  char name[16 + CKPT_ATTEMPT_MAX_BYTES];
  snprintf(name, sizeof(name), "instance-%s", m->token);
  int fd = openat(m->dirfd, name, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) {
    stk_set_detail("shm dir %s: cannot create %s: %s", m->dir, name, strerror(errno));
    return STK_EIO;
  }
  close(fd);
  return 0;
}

int ckpt_shm_open(const char *dir, uint64_t max_bytes, uint64_t pool_bytes,
                  struct ckpt_shm **ret_shm) {
  struct ckpt_shm *m = calloc(1, sizeof(*m));
  if (!m || !(m->dir = strdup(dir ? dir : ""))) {
    free(m);
    return STK_ENOMEM;
  }
  m->max_bytes = max_bytes;
  m->pool_cap = pool_bytes;
  int err = dir_open(dir, &m->dirfd);
  if (err) {
    free(m->dir);
    free(m);
    return err;
  }
  dir_each(m, remove_stale, NULL);
  err = announce(m);
  if (err) {
    close(m->dirfd);
    free(m->dir);
    free(m);
    return err;
  }
  *ret_shm = m;
  return 0;
}

/* A clean stop leaves nothing in /dev/shm: the pool, the instance file,
 * and segments ranks wrote but never handed over (the next open would
 * remove them anyway, and until then they hold memory). */
void ckpt_shm_close(struct ckpt_shm *m) {
  if (!m) return;
  dir_each(m, remove_stale, NULL);
  close(m->dirfd);
  rmdir(m->dir); /* Only when empty: entries that are not ours stay. */
  free(m->pool);
  free(m->dir);
  free(m);
}

const char *ckpt_shm_dir(const struct ckpt_shm *m) {
  return m->dir;
}
const char *ckpt_shm_token(const struct ckpt_shm *m) {
  return m->token;
}
uint64_t ckpt_shm_max_bytes(const struct ckpt_shm *m) {
  return m->max_bytes;
}
uint64_t ckpt_shm_read_max_bytes(const struct ckpt_shm *m) {
  return m->max_bytes;
}
int ckpt_shm_dirfd(const struct ckpt_shm *m) {
  return m->dirfd;
}
uint64_t ckpt_shm_pool_bytes(const struct ckpt_shm *m) {
  return m->pool_bytes;
}

/* ---- Segments ---- */

static int seg_check(const struct ckpt_shm *m, const char *name, int fd, uint64_t *ret_size) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    stk_set_detail("shm segment %s is not a regular file", name);
    return STK_EINVAL;
  }
  if (st.st_uid != geteuid() || st.st_nlink != 1) {
    stk_set_detail("shm segment %s must be owned by uid %u and linked once", name,
                   (unsigned)geteuid());
    return STK_EINVAL;
  }
  if (st.st_size <= 0 || (uint64_t)st.st_size > m->max_bytes) {
    stk_set_detail("shm segment %s: %lld bytes, outside 1..%" PRIu64, name, (long long)st.st_size,
                   m->max_bytes);
    return STK_EINVAL;
  }
  *ret_size = (uint64_t)st.st_size;
  return 0;
}

int ckpt_shm_map(struct ckpt_shm *m, const char *name, struct ckpt_shm_seg **ret_seg) {
  if (!name || !name[0] || strchr(name, '/') || strstr(name, "..") ||
      strlen(name) > CKPT_SHM_NAME_MAX) {
    stk_set_detail("shm segment name %.80s is not a bare file name", name ? name : "");
    return STK_EINVAL;
  }
  int fd = openat(m->dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    stk_set_detail("shm segment %s: %s", name,
                   errno == ELOOP ? "a symbolic link" : strerror(errno));
    return errno == ENOMEM ? STK_ENOMEM : STK_EINVAL;
  }
  uint64_t size = 0;
  int err = seg_check(m, name, fd, &size);
  struct ckpt_shm_seg *seg = err ? NULL : calloc(1, sizeof(*seg));
  if (!err && !seg) err = STK_ENOMEM;
  void *p = err ? MAP_FAILED : mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (!err && p == MAP_FAILED) {
    stk_set_detail("shm segment %s: mmap: %s", name, strerror(errno));
    err = STK_ENOMEM;
  }
  if (err) {
    free(seg);
    return err;
  }
  snprintf(seg->name, sizeof(seg->name), "%s", name);
  seg->map = p;
  seg->size = size;
  if (!(seg->faults = map_guard_group_new())) {
    munmap(p, size);
    free(seg);
    return STK_ENOMEM;
  }
  map_guard_scope_enter(seg->faults);
  err = map_guard_add(p, size, name, &seg->guard);
  map_guard_scope_leave();
  if (err) {
    ckpt_shm_unmap(seg);
    return err;
  }
  *ret_seg = seg;
  return 0;
}

bool ckpt_shm_seg_broken(const struct ckpt_shm_seg *seg) {
  return map_guard_group_broken(seg->faults, NULL);
}

/* Unmaps (the guard first, so the range is never watched while reused). */
static void seg_unmap(struct ckpt_shm_seg *seg) {
  map_guard_remove(seg->guard);
  munmap((void *)seg->map, seg->size);
  map_guard_group_free(seg->faults);
}

void ckpt_shm_unmap(struct ckpt_shm_seg *seg) {
  if (!seg) return;
  seg_unmap(seg);
  free(seg);
}

/* Forgets pooled files that a client claimed (renamed away). */
static void pool_prune(struct ckpt_shm *m) {
  size_t k = 0;
  for (size_t i = 0; i < m->n_pool; i++) {
    if (faccessat(m->dirfd, m->pool[i].name, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
      m->pool[k++] = m->pool[i];
    else
      m->pool_bytes -= m->pool[i].size;
  }
  m->n_pool = k;
}

static bool pool_add(struct ckpt_shm *m, const struct ckpt_shm_seg *seg) {
  pool_prune(m);
  if (m->pool_bytes + seg->size > m->pool_cap) return false;
  if (m->n_pool == m->cap_pool) {
    size_t cap = m->cap_pool ? m->cap_pool * 2 : 16;
    struct pooled *n = realloc(m->pool, cap * sizeof(*n));
    if (!n) return false;
    m->pool = n;
    m->cap_pool = cap;
  }
  struct pooled *p = &m->pool[m->n_pool];
  snprintf(p->name, sizeof(p->name), "free-%016" PRIx64, m->next_free++);
  if (renameat(m->dirfd, seg->name, m->dirfd, p->name) != 0) return false;
  p->size = seg->size;
  m->pool_bytes += p->size;
  m->n_pool++;
  return true;
}

void ckpt_shm_release(struct ckpt_shm *m, struct ckpt_shm_seg *seg) {
  if (!seg) return;
  bool broken = ckpt_shm_seg_broken(seg);
  seg_unmap(seg);
  if (broken || !pool_add(m, seg)) unlinkat(m->dirfd, seg->name, 0);
  free(seg);
}

/* ---- Sweep ---- */

struct sweep_arg {
  ckpt_shm_keep_fn keep;
  void *arg;
  int removed;
};

static bool read_file_stale(const struct ckpt_shm *m, const char *name) {
  struct stat st;
  return ckpt_shm_read_is_name(name) && fstatat(m->dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
         st.st_mtime + CKPT_SHM_READ_STALE_S < time(NULL);
}

static void sweep_one(struct ckpt_shm *m, const char *name, void *arg) {
  struct sweep_arg *sa = arg;
  char attempt[CKPT_ATTEMPT_MAX_BYTES + 1];
  if (read_file_stale(m, name)) {
    if (unlinkat(m->dirfd, name, 0) == 0) sa->removed++;
    return;
  }
  if (!entry_attempt(name, attempt) || sa->keep(sa->arg, attempt)) return;
  if (unlinkat(m->dirfd, name, 0) == 0) sa->removed++;
}

int ckpt_shm_sweep(struct ckpt_shm *m, ckpt_shm_keep_fn keep, void *arg) {
  struct sweep_arg sa = {.keep = keep, .arg = arg};
  dir_each(m, sweep_one, &sa);
  return sa.removed;
}
