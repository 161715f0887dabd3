/*
 * shm_ring: the shared-memory slot ring of shm_ring.h (creation and safety
 * checks on both sides, the release words).
 */
#include "shm_ring.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "stk_error.h"

#define MAGIC       "STKRING1"
#define PAGE        4096u
#define RELEASED_AT 64u

struct shm_ring {
  uint8_t *map;
  uint64_t map_bytes;
  uint32_t slots;
  uint64_t slot_bytes;
  uint64_t *released; /* [slots], in the mapping */
  uint64_t *written;  /* Daemon: [slots], the last sequence written to each (0: none). */
  uint64_t last_seq;  /* Daemon: the highest sequence handed out. */
  int fd;             /* Daemon: the file, to reserve a slot's pages when first written; else -1. */
  bool *reserved;     /* Daemon: [slots], whether the slot's pages are reserved. */
  uint64_t reserved_bytes; /* Daemon: the header's page and the slots reserved. */
  char path[SHM_RING_PATH_MAX];
};

/* ---- The directory ---- */

static int dir_check(const char *dir, int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
      (st.st_mode & 077) != 0) {
    stk_set_detail("shm dir %s must be a directory of uid %u without group or other access", dir,
                   (unsigned)geteuid());
    return STK_EINVAL;
  }
  return 0;
}

static void remove_rings(int dirfd) {
  int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (!d) {
    if (fd >= 0) close(fd);
    return;
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (strncmp(e->d_name, "ring-", 5) == 0) unlinkat(dirfd, e->d_name, 0);
  closedir(d);
}

/* Empties and removes an orphaned private directory: everything in it is
 * a daemon's (it is 0700 and ours), links are removed, never followed. */
static void remove_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  int fd2 = dir_check(dir, fd) == 0 ? dup(fd) : -1;
  DIR *d = fd2 >= 0 ? fdopendir(fd2) : NULL;
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') unlinkat(fd, e->d_name, 0);
  if (d)
    closedir(d);
  else if (fd2 >= 0)
    close(fd2);
  close(fd);
  rmdir(dir);
}

/* The directory's recorded owner names a path that no longer exists. */
static bool orphaned(const char *dir) {
  char path[PATH_MAX + 16], owner[PATH_MAX];
  snprintf(path, sizeof(path), "%s/owner", dir);
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false; /* Not recorded (yet): leave it. */
  ssize_t n = read(fd, owner, sizeof(owner) - 1);
  close(fd);
  if (n <= 0 || owner[0] != '/') return false;
  owner[n] = '\0';
  struct stat st;
  return stat(owner, &st) != 0 && errno == ENOENT;
}

static void sweep_orphans(const char *kind) {
  char prefix[64];
  snprintf(prefix, sizeof(prefix), "stoker-%s-", kind);
  DIR *d = opendir("/dev/shm");
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "/dev/shm/%s", e->d_name);
    if (orphaned(path)) remove_dir(path);
  }
  closedir(d);
}

int shm_ring_auto_dir(const char *kind, const char *data_dir, char *ret_dir, size_t dir_len,
                      char *ret_owner, size_t owner_len) {
  char abs[PATH_MAX];
  mkdir(data_dir, 0755);
  if (!realpath(data_dir, abs)) {
    stk_set_detail("data dir %s: cannot resolve: %s", data_dir, strerror(errno));
    return STK_EINVAL;
  }
  uint64_t h = 1469598103934665603ull;
  for (const char *p = abs; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  struct stat st;
  snprintf(ret_dir, dir_len, "%s", "");
  snprintf(ret_owner, owner_len, "%s", abs);
  if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode)) {
    snprintf(ret_dir, dir_len, "/dev/shm/stoker-%s-%016llx", kind, (unsigned long long)h);
    sweep_orphans(kind);
  }
  return 0;
}

/* Writes owner into dir/owner (replacing an older record). */
static void record_owner_at(int dirfd, const char *owner) {
  int fd = openat(dirfd, "owner.tmp", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return;
  bool ok = write(fd, owner, strlen(owner)) == (ssize_t)strlen(owner);
  close(fd);
  if (ok) renameat(dirfd, "owner.tmp", dirfd, "owner");
}

int shm_ring_dir_open(const char *dir, const char *owner, int *ret_dirfd) {
  if (!dir || dir[0] != '/' || strlen(dir) > SHM_RING_PATH_MAX - 64) {
    stk_set_detail("shm dir %.200s must be an absolute path", dir ? dir : "(null)");
    return STK_EINVAL;
  }
  if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
    stk_set_detail("shm dir %s: %s", dir, strerror(errno));
    return STK_EIO;
  }
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    stk_set_detail("shm dir %s: %s", dir, strerror(errno));
    return errno == ELOOP || errno == ENOTDIR ? STK_EINVAL : STK_EIO;
  }
  int err = dir_check(dir, fd);
  if (err) {
    close(fd);
    return err;
  }
  remove_rings(fd);
  if (owner && owner[0]) record_owner_at(fd, owner);
  *ret_dirfd = fd;
  return 0;
}

void shm_ring_record_owner(const char *dir, const char *owner) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  if (dir_check(dir, fd) == 0) record_owner_at(fd, owner);
  close(fd);
}

void shm_ring_forget_owner(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  if (dir_check(dir, fd) == 0) unlinkat(fd, "owner", 0);
  close(fd);
  rmdir(dir); /* Fails, harmlessly, while anything else is left. */
}

void shm_ring_dir_close(const char *dir, int dirfd) {
  remove_rings(dirfd);
  unlinkat(dirfd, "owner", 0);
  close(dirfd);
  rmdir(dir);
}

/* ---- Daemon side ---- */

static uint64_t round_pages(uint64_t n) {
  return (n + PAGE - 1) / PAGE * PAGE;
}

/* Opens a fresh ring-<hex> in dirfd; its name goes to ret_name. */
static int create_file(int dirfd, char ret_name[48]) {
  for (int tries = 0; tries < 8; tries++) {
    uint8_t raw[12];
    if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw)) {
      stk_set_detail("getrandom failed");
      return STK_EIO;
    }
    int n = snprintf(ret_name, 48, "ring-");
    for (size_t i = 0; i < sizeof(raw); i++)
      n += snprintf(ret_name + n, 48 - (size_t)n, "%02x", raw[i]);
    int fd = openat(dirfd, ret_name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) return fd;
    if (errno != EEXIST) {
      stk_set_detail("shm ring %s: %s", ret_name, strerror(errno));
      return errno == ENOSPC || errno == ENOMEM ? STK_ENOMEM : STK_EIO;
    }
  }
  stk_set_detail("shm ring: no free name");
  return STK_EIO;
}

static void write_header(struct shm_ring *r, const uint8_t nonce[SHM_RING_NONCE_BYTES]) {
  memcpy(r->map, MAGIC, 8);
  memcpy(r->map + 8, nonce, SHM_RING_NONCE_BYTES);
  memcpy(r->map + 24, &r->slots, 4);
  memcpy(r->map + 32, &r->slot_bytes, 8);
  const uint64_t data_offset = PAGE;
  memcpy(r->map + 40, &data_offset, 8);
}

int shm_ring_create(int dirfd, const char *dir, const uint8_t nonce[SHM_RING_NONCE_BYTES],
                    uint32_t slots, uint64_t slot_bytes, struct shm_ring **ret_ring) {
  if (slots == 0 || slots > SHM_RING_MAX_SLOTS || slot_bytes == 0 || slot_bytes > (1ull << 40)) {
    stk_set_detail("shm ring: %u slots of %llu bytes", slots, (unsigned long long)slot_bytes);
    return STK_EINVAL;
  }
  struct shm_ring *r = calloc(1, sizeof(*r));
  if (r) r->written = calloc(slots, sizeof(*r->written));
  if (r) r->reserved = calloc(slots, sizeof(*r->reserved));
  if (!r || !r->written || !r->reserved) {
    if (r) free(r->written);
    free(r);
    return STK_ENOMEM;
  }
  r->slots = slots;
  r->slot_bytes = round_pages(slot_bytes);
  r->map_bytes = PAGE + (uint64_t)slots * r->slot_bytes;
  char name[48];
  int fd = create_file(dirfd, name);
  if (fd < 0) {
    free(r->reserved);
    free(r->written);
    free(r);
    return fd;
  }
  snprintf(r->path, sizeof(r->path), "%s/%s", dir, name);
  /* The file has its whole size but only the header's page now: a slot's
   * pages are reserved when it is first written (shm_ring_reserve), so a
   * stream whose client never maps the ring holds no more than it wrote,
   * and a full tmpfs is an error there, never a SIGBUS. */
  int err = 0, rc = ftruncate(fd, (off_t)r->map_bytes) != 0 ? errno : posix_fallocate(fd, 0, PAGE);
  if (rc != 0) {
    stk_set_detail("shm ring %s: cannot size or reserve its header: %s", r->path, strerror(rc));
    err = STK_ENOMEM;
  }
  void *p = err ? MAP_FAILED : mmap(NULL, r->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (!err && p == MAP_FAILED) {
    stk_set_detail("shm ring %s: mmap: %s", r->path, strerror(errno));
    err = STK_ENOMEM;
  }
  if (err) {
    close(fd);
    unlinkat(dirfd, name, 0);
    free(r->reserved);
    free(r->written);
    free(r);
    return err;
  }
  r->fd = fd;
  r->reserved_bytes = PAGE;
  r->map = p;
  r->released = (uint64_t *)(void *)(r->map + RELEASED_AT);
  write_header(r, nonce);
  *ret_ring = r;
  return 0;
}

uint64_t shm_ring_next_free(const struct shm_ring *r, uint64_t after) {
  /* Sequence s lives in slot (s - 1) % slots; the turn covers the `slots`
   * sequences after the last written, each in a slot of its own. Starting
   * above `after` (not counting free slots from the start, as an earlier
   * version did) keeps answers growing when the client releases a slot
   * between two probes: counting again would answer the same sequence
   * twice, and two batches would be written into one slot. */
  uint64_t from = after > r->last_seq ? after : r->last_seq;
  for (uint64_t seq = from + 1; seq <= r->last_seq + r->slots; seq++) {
    uint32_t slot = (uint32_t)((seq - 1) % r->slots);
    uint64_t done = __atomic_load_n(&r->released[slot], __ATOMIC_ACQUIRE);
    if (r->written[slot] != 0 && done < r->written[slot]) continue; /* The client's. */
    return seq;
  }
  return 0;
}

void shm_ring_written(struct shm_ring *r, uint64_t seq) {
  r->written[(seq - 1) % r->slots] = seq;
  r->last_seq = seq;
}

void shm_ring_unlink(struct shm_ring *r) {
  if (r && r->path[0]) unlink(r->path);
}

/* ---- Client side ---- */

/* The header's geometry, checked against the file's size. */
static int read_header(struct shm_ring *r, const uint8_t *h, uint64_t file_bytes,
                       const uint8_t nonce[SHM_RING_NONCE_BYTES]) {
  uint64_t data_offset = 0;
  memcpy(&r->slots, h + 24, 4);
  memcpy(&r->slot_bytes, h + 32, 8);
  memcpy(&data_offset, h + 40, 8);
  if (memcmp(h, MAGIC, 8) != 0 || memcmp(h + 8, nonce, SHM_RING_NONCE_BYTES) != 0) {
    stk_set_detail("shm ring %s: not the ring this stream asked for", r->path);
    return STK_EINVAL;
  }
  if (r->slots == 0 || r->slots > SHM_RING_MAX_SLOTS || data_offset != PAGE || r->slot_bytes == 0 ||
      r->slot_bytes % PAGE != 0 || r->slot_bytes > (file_bytes - PAGE) / r->slots) {
    stk_set_detail("shm ring %s: geometry does not fit the file", r->path);
    return STK_EINVAL;
  }
  return 0;
}

/* Opens path as a regular file of this user, at least a header long. */
static int open_ring(const char *path, uint64_t *ret_bytes) {
  int fd = open(path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    stk_set_detail("shm ring %s: %s", path, e == ELOOP ? "a symbolic link" : strerror(e));
    return e == ENOENT || e == EACCES || e == ENOTDIR ? STK_ENOENT : STK_EINVAL;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
      st.st_size < (off_t)(2 * PAGE)) {
    stk_set_detail("shm ring %s: not a ring file of uid %u", path, (unsigned)geteuid());
    close(fd);
    return STK_EINVAL;
  }
  *ret_bytes = (uint64_t)st.st_size;
  return fd;
}

int shm_ring_attach(const char *path, const uint8_t nonce[SHM_RING_NONCE_BYTES],
                    struct shm_ring **ret_ring) {
  if (!path || path[0] != '/' || strlen(path) >= SHM_RING_PATH_MAX) {
    stk_set_detail("shm ring path %.200s is not absolute", path ? path : "");
    return STK_EINVAL;
  }
  uint64_t bytes = 0;
  int fd = open_ring(path, &bytes);
  if (fd < 0) return fd;
  struct shm_ring *r = calloc(1, sizeof(*r));
  void *p = r ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  close(fd);
  if (!r || p == MAP_FAILED) {
    free(r);
    stk_set_detail("shm ring %s: cannot map", path);
    return STK_ENOMEM;
  }
  snprintf(r->path, sizeof(r->path), "%s", path);
  r->fd = -1;
  r->map = p;
  r->map_bytes = bytes;
  int err = read_header(r, r->map, bytes, nonce);
  if (err) {
    munmap(p, bytes);
    free(r);
    return err;
  }
  r->released = (uint64_t *)(void *)(r->map + RELEASED_AT);
  unlink(path); /* Ours now: the memory goes with the last mapping. */
  r->path[0] = '\0';
  *ret_ring = r;
  return 0;
}

void shm_ring_release(struct shm_ring *r, uint64_t seq) {
  uint64_t *w = &r->released[(seq - 1) % r->slots];
  /* Releases can come out of order: keep the highest. */
  uint64_t cur = __atomic_load_n(w, __ATOMIC_RELAXED);
  while (cur < seq &&
         !__atomic_compare_exchange_n(w, &cur, seq, true, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
  }
}

/* ---- Both ---- */

const char *shm_ring_path(const struct shm_ring *r) {
  return r->path;
}
uint32_t shm_ring_slots(const struct shm_ring *r) {
  return r->slots;
}
uint64_t shm_ring_slot_bytes(const struct shm_ring *r) {
  return r->slot_bytes;
}

uint8_t *shm_ring_slot(const struct shm_ring *r, uint64_t seq) {
  return r->map + PAGE + ((seq - 1) % r->slots) * r->slot_bytes;
}

int shm_ring_reserve(struct shm_ring *r, uint64_t seq) {
  uint32_t slot = (uint32_t)((seq - 1) % r->slots);
  if (r->reserved[slot]) return 0;
  int rc =
      posix_fallocate(r->fd, (off_t)(PAGE + (uint64_t)slot * r->slot_bytes), (off_t)r->slot_bytes);
  if (rc != 0) {
    stk_set_detail("shm ring %s: cannot reserve slot %u (%llu bytes): %s", r->path, slot,
                   (unsigned long long)r->slot_bytes, strerror(rc));
    return STK_ENOMEM;
  }
  r->reserved[slot] = true;
  r->reserved_bytes += r->slot_bytes;
  return 0;
}

uint64_t shm_ring_reserved_bytes(const struct shm_ring *r) {
  return r->reserved_bytes;
}

void shm_ring_free(struct shm_ring *r) {
  if (!r) return;
  munmap(r->map, r->map_bytes);
  if (r->fd >= 0) close(r->fd);
  free(r->reserved);
  free(r->written);
  free(r);
}
