/*
 * The staging segments this process keeps mapped (issue 4). Copying a
 * rank's shard into a segment with pwrite costs about twice a memcpy even
 * when the file's pages exist (the kernel looks up and locks every page),
 * and a fresh mapping costs a page fault per 4 KiB. So a segment file
 * stays mapped here after its messages are sent, and when the service has
 * uploaded it and recycled it into its pool (free-*), the next checkpoint
 * of any rank of this process claims it again and copies into pages that
 * are allocated and already mapped (non-temporal stores, ckpt_copy.h).
 *
 * Hand-over stays the one the service checks (ckpt_shm.h): a file is
 * written only between claiming it (an atomic rename of free-* to our
 * seg-* name, which succeeds only once the service gave the file up, or
 * creating it) and sending its chunk messages; the service maps it
 * read-only and validates it as any other segment. Keeping the mapping
 * afterwards gives this process no access it did not have: the directory
 * is its own user's, 0700.
 *
 * Claims prefer files mapped here (readdir's d_ino against the cache), so
 * with ranks in several processes each mostly gets its own files back; any
 * other free file is mapped with MAP_POPULATE (its pages exist). Bytes
 * beyond what the file held when claimed are reserved with fallocate
 * first, so a full tmpfs answers ENOSPC (the writer falls back to gRPC)
 * instead of SIGBUS on a store into a hole. A cached file the service
 * removed (pool full, restart, close) has no links left; it is unmapped
 * at the next claim (ckpt_segmap_prune).
 *
 * Threads: every function takes one process-wide lock.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_copy.h"
#include "ckpt_internal.h"
#include "stk_error.h"

#define MAX_CACHED 4096 /* Files kept mapped: far beyond any service's pool. */

struct ent {
  dev_t dev;
  ino_t ino;
  int fd; /* Kept open: fstat tells whether the file still has a link. */
  uint8_t *map;
  uint64_t map_len;
  bool busy; /* Claimed by a writer, not yet handed over. */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct ent *ents;
static size_t n_ents, cap_ents;

static void ent_drop(size_t i) {
  munmap(ents[i].map, ents[i].map_len);
  close(ents[i].fd);
  ents[i] = ents[--n_ents];
}

static struct ent *ent_find(dev_t dev, ino_t ino) {
  for (size_t i = 0; i < n_ents; i++)
    if (ents[i].ino == ino && ents[i].dev == dev) return &ents[i];
  return NULL;
}

void ckpt_segmap_prune(void) {
  pthread_mutex_lock(&mu);
  struct stat st;
  for (size_t i = n_ents; i-- > 0;)
    if (!ents[i].busy && (fstat(ents[i].fd, &st) != 0 || st.st_nlink == 0)) ent_drop(i);
  pthread_mutex_unlock(&mu);
}

size_t ckpt_segmap_cached(void) {
  pthread_mutex_lock(&mu);
  size_t n = n_ents;
  pthread_mutex_unlock(&mu);
  return n;
}

/* ---- Claiming ---- */

/* Renames free-* entry `from` to name; true if it is now ours. */
static bool take(int dirfd, const char *from, const char *name) {
  return renameat(dirfd, from, dirfd, name) == 0;
}

/* Claims a pool file, preferring one mapped here; -1 if none. On success
 * *ret_cached is the cache entry of the claimed file, or NULL. */
static int claim(int dirfd, const char *name, struct ent **ret_cached) {
  int dfd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
  if (!d) {
    if (dfd >= 0) close(dfd);
    return -1;
  }
  struct stat dst;
  bool claimed = false;
  fstat(dfd, &dst);
  for (int pass = 0; pass < 2 && !claimed; pass++) {
    rewinddir(d);
    struct dirent *e;
    while (!claimed && (e = readdir(d)) != NULL) {
      if (strncmp(e->d_name, "free-", 5) != 0) continue;
      struct ent *c = ent_find(dst.st_dev, e->d_ino);
      if ((pass == 0) != (c && !c->busy)) continue;
      claimed = take(dirfd, e->d_name, name);
    }
  }
  closedir(d);
  if (!claimed) return -1;
  /* Not a regular file (a symlink planted in the pool): removed, unused. */
  int fd = openat(dirfd, name, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    if (fd >= 0) close(fd);
    unlinkat(dirfd, name, 0);
    return -1;
  }
  struct ent *c = ent_find(st.st_dev, st.st_ino);
  *ret_cached = c && !c->busy ? c : NULL;
  return fd;
}

/* Bytes at the start of the file known to be allocated (no holes). */
static uint64_t allocated(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size <= 0) return 0;
  uint64_t size = (uint64_t)st.st_size, pages = (size + 4095) / 4096 * 4096;
  return (uint64_t)st.st_blocks * 512 >= pages ? size : 0;
}

/* Caches a new mapping of fd (taking fd); NULL when the cache is full. */
static struct ent *ent_add(int fd, uint8_t *map, uint64_t len) {
  struct stat st;
  if (n_ents == MAX_CACHED || fstat(fd, &st) != 0) return NULL;
  if (n_ents == cap_ents) {
    size_t cap = cap_ents ? cap_ents * 2 : 32;
    struct ent *n = realloc(ents, cap * sizeof(*n));
    if (!n) return NULL;
    ents = n;
    cap_ents = cap;
  }
  ents[n_ents] = (struct ent){st.st_dev, st.st_ino, fd, map, len, true};
  return &ents[n_ents++];
}

/* Maps a claimed or new file for cap bytes, populating what it holds. */
static int map_new(int fd, uint64_t cap, uint64_t alloc, struct ckpt_segfile *f) {
  uint8_t *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return STK_EIO;
#ifdef MADV_POPULATE_WRITE
  if (alloc > 0) madvise(p, alloc, MADV_POPULATE_WRITE); /* Best effort. */
#endif
  struct ent *e = ent_add(fd, p, cap);
  *f = (struct ckpt_segfile){.fd = fd, .map = p, .cap = cap, .alloc = alloc, .cached = e != NULL};
  return 0;
}

int ckpt_segmap_acquire(int dirfd, const char *name, uint64_t cap, struct ckpt_segfile *ret) {
  pthread_mutex_lock(&mu);
  struct ent *c = NULL;
  int fd = claim(dirfd, name, &c), err = 0;
  if (c && c->map_len >= cap) {
    close(fd);
    c->busy = true;
    *ret = (struct ckpt_segfile){
        .fd = c->fd, .map = c->map, .cap = cap, .alloc = allocated(c->fd), .cached = true};
  } else {
    if (c) ent_drop((size_t)(c - ents)); /* Mapped too short for this service. */
    if (fd < 0) fd = openat(dirfd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    err = fd < 0 ? STK_EIO : map_new(fd, cap, allocated(fd), ret);
    if (err && fd >= 0) {
      close(fd);
      unlinkat(dirfd, name, 0);
    }
  }
  pthread_mutex_unlock(&mu);
  return err;
}

/* ---- Writing and handing over ---- */

int ckpt_segmap_write(struct ckpt_segfile *f, uint64_t off, const void *data, size_t len) {
  if (off + len > f->cap) return STK_EINVAL;
  if (off + len > f->alloc) {
    int rc;
    while ((rc = fallocate(f->fd, 0, (off_t)f->alloc, (off_t)(off + len - f->alloc))) != 0 &&
           errno == EINTR) {
    }
    if (rc != 0) return STK_EIO;
    f->alloc = off + len;
  }
  ckpt_copy_stream(f->map + off, data, len);
  return 0;
}

/* Forgets f's mapping: unmapped unless cached (then just no longer busy). */
static void release(struct ckpt_segfile *f, bool keep) {
  pthread_mutex_lock(&mu);
  struct ent *c = NULL;
  for (size_t i = 0; f->cached && i < n_ents && !c; i++)
    if (ents[i].fd == f->fd) c = &ents[i];
  if (c && keep) {
    c->busy = false;
  } else if (c) {
    ent_drop((size_t)(c - ents));
  } else {
    munmap(f->map, f->cap);
    close(f->fd);
  }
  pthread_mutex_unlock(&mu);
  f->fd = -1;
}

int ckpt_segmap_complete(struct ckpt_segfile *f, uint64_t used) {
  struct stat st;
  int err = fstat(f->fd, &st) == 0 ? 0 : STK_EIO;
  if (!err && (uint64_t)st.st_size != used) /* The service maps the file whole. */
    err = ftruncate(f->fd, (off_t)used) == 0 ? 0 : STK_EIO;
  release(f, err == 0);
  return err;
}

void ckpt_segmap_discard(struct ckpt_segfile *f, int dirfd, const char *name) {
  if (f->fd < 0) return;
  unlinkat(dirfd, name, 0);
  release(f, false);
}
