/*
 * ckpt_shm_read: checking, opening and writing the read files of
 * shared-memory reads (see ckpt_shm_read.h).
 */
#include "ckpt_shm_read.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "stk_error.h"

#define PREFIX     "read-"
#define PREFIX_LEN 5

int ckpt_shm_read_check_name(const char *name) {
  size_t len = name ? strnlen(name, PREFIX_LEN + CKPT_SHM_READ_TAG_MAX + 1) : 0;
  bool ok =
      len > PREFIX_LEN && len <= PREFIX_LEN + CKPT_SHM_READ_TAG_MAX && ckpt_shm_read_is_name(name);
  for (size_t i = PREFIX_LEN; ok && i < len; i++)
    ok = (name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f');
  if (!ok) {
    stk_set_detail("shm read file %.80s: not a read file name (read- and 1..%d hex digits)",
                   name ? name : "", CKPT_SHM_READ_TAG_MAX);
    return STK_EINVAL;
  }
  return 0;
}

static int check_file(const struct ckpt_shm *m, const char *name, int fd, uint64_t *ret_size) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    stk_set_detail("shm read file %s is not a regular file", name);
    return STK_EINVAL;
  }
  if (st.st_uid != geteuid() || st.st_nlink != 1) {
    stk_set_detail("shm read file %s must be owned by uid %u and linked once", name,
                   (unsigned)geteuid());
    return STK_EINVAL;
  }
  uint64_t max = ckpt_shm_read_max_bytes(m);
  if (st.st_size < CKPT_SHM_READ_DATA || (uint64_t)st.st_size > max) {
    stk_set_detail("shm read file %s: %lld bytes, outside %d..%" PRIu64, name,
                   (long long)st.st_size, CKPT_SHM_READ_DATA, max);
    return STK_EINVAL;
  }
  *ret_size = (uint64_t)st.st_size;
  return 0;
}

/* The header is the magic then the nonce; compared without an early exit. */
static int check_header(const char *name, int fd, const uint8_t *nonce) {
  uint8_t want[CKPT_SHM_READ_MAGIC_LEN + CKPT_SHM_READ_NONCE_LEN], got[sizeof(want)];
  memcpy(want, CKPT_SHM_READ_MAGIC, CKPT_SHM_READ_MAGIC_LEN);
  memcpy(want + CKPT_SHM_READ_MAGIC_LEN, nonce, CKPT_SHM_READ_NONCE_LEN);
  ssize_t n = pread(fd, got, sizeof(got), 0);
  uint8_t diff = n == (ssize_t)sizeof(got) ? 0 : 1;
  for (size_t i = 0; i < sizeof(want); i++) diff |= (uint8_t)(want[i] ^ got[i]);
  if (diff) {
    stk_set_detail("shm read file %s: its header does not hold the request's nonce", name);
    return STK_EINVAL;
  }
  return 0;
}

int ckpt_shm_read_open(struct ckpt_shm *m, const char *name, const uint8_t *nonce, size_t nonce_len,
                       int *ret_fd, uint64_t *ret_size) {
  int err = ckpt_shm_read_check_name(name);
  if (err) return err;
  if (!nonce || nonce_len != CKPT_SHM_READ_NONCE_LEN) {
    stk_set_detail("shm read file %s: the nonce must be %d bytes, not %zu", name,
                   CKPT_SHM_READ_NONCE_LEN, nonce ? nonce_len : 0);
    return STK_EINVAL;
  }
  int fd = openat(ckpt_shm_dirfd(m), name, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    stk_set_detail("shm read file %s: %s", name,
                   errno == ELOOP ? "a symbolic link" : strerror(errno));
    return STK_EINVAL;
  }
  uint64_t size = 0;
  err = check_file(m, name, fd, &size);
  if (!err) err = check_header(name, fd, nonce);
  if (err) {
    close(fd);
    return err;
  }
  *ret_fd = fd;
  *ret_size = size;
  return 0;
}

int ckpt_shm_read_putv(int fd, struct iovec *iov, int n, uint64_t off) {
  while (n > 0) {
    ssize_t w = pwritev(fd, iov, n, (off_t)off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      stk_set_detail("shm read file: write at %" PRIu64 ": %s", off,
                     w < 0 ? strerror(errno) : "no progress");
      return STK_EIO;
    }
    off += (uint64_t)w;
    while (n > 0 && (size_t)w >= iov->iov_len) {
      w -= (ssize_t)iov->iov_len;
      iov++;
      n--;
    }
    if (n > 0) {
      iov->iov_base = (uint8_t *)iov->iov_base + w;
      iov->iov_len -= (size_t)w;
    }
  }
  return 0;
}
