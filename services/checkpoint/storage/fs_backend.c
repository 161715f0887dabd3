/*
 * fs_backend: the storage interface on a local directory (file:///dir),
 * the embedded default and the reference the S3 backend is tested against.
 *
 * Layout under the root:
 *   <key>                         objects, as plain files (key '/' = directories)
 *   .stk-tmp/<random>             files being written; renamed or linked into place
 *   .stk-uploads/<id>/key         the key a multipart upload targets (written
 *                                 last at begin; its mtime is the begin time)
 *   .stk-uploads/<id>/<number>    its parts
 * The uploads in progress are listed from .stk-uploads (storage_mpu_list).
 * Writes are durable before they are visible: data is written to a temp
 * file and fsync'ed, then renamed (or link()ed, which refuses an existing
 * name: the conditional put) into place, and the directory is fsync'ed.
 * Keys cannot name the ".stk-" entries (storage_key_check). Requests
 * complete inline, in the thread that submits them (fs_submit).
 */
#include "storage_internal.h"

#include "stk_error.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#define TMP_DIR     ".stk-tmp"
#define UPLOADS_DIR ".stk-uploads"
#define ID_HEX      32

struct fs {
  int root_fd; /* O_DIRECTORY descriptor of the root; all paths are relative to it. */
};

static int errno_to_stk(int e) {
  switch (e) {
  case ENOENT:
  case ENOTDIR:
    return STK_ENOENT;
  case EEXIST:
    return STK_EEXIST;
  case ENOMEM:
    return STK_ENOMEM;
  case EACCES:
  case EPERM:
    return STK_EPERM;
  case ENAMETOOLONG:
    return STK_EINVAL;
  case ENOSPC:
  case EDQUOT:
    return STK_EBUSY;
  default:
    return STK_EIO;
  }
}

static int fail(const char *what, const char *path) {
  int e = errno;
  stk_set_detail("%s %s: %s", what, path, strerror(e));
  return errno_to_stk(e);
}

static void random_hex(char *out, size_t n_hex) {
  unsigned char bytes[32];
  size_t n = (n_hex + 1) / 2;
  if (getrandom(bytes, n, 0) != (ssize_t)n) {
    /* getrandom on Linux does not fail for small requests once seeded. */
    for (size_t i = 0; i < n; i++) bytes[i] = (unsigned char)rand();
  }
  for (size_t i = 0; i < n_hex; i++)
    out[i] = "0123456789abcdef"[(bytes[i / 2] >> (i % 2 ? 0 : 4)) & 15];
  out[n_hex] = '\0';
}

/* fsync of the directory holding path (the root for top-level names). */
static int fsync_parent(int root_fd, const char *path) {
  const char *slash = strrchr(path, '/');
  int fd = root_fd;
  char dir[STORAGE_KEY_MAX + 64];
  if (slash) {
    snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
    fd = openat(root_fd, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return fail("open", dir);
  }
  int rc = fsync(fd);
  int err = rc ? fail("fsync", slash ? dir : ".") : 0;
  if (slash) close(fd);
  return err;
}

/* Creates the directories leading to path, fsyncing the parent of each new one. */
static int make_parents(int root_fd, const char *path) {
  char dir[STORAGE_KEY_MAX + 64];
  for (const char *s = strchr(path, '/'); s; s = strchr(s + 1, '/')) {
    snprintf(dir, sizeof(dir), "%.*s", (int)(s - path), path);
    if (mkdirat(root_fd, dir, 0755) == 0) {
      int err = fsync_parent(root_fd, dir);
      if (err) return err;
    } else if (errno != EEXIST) {
      return fail("mkdir", dir);
    }
  }
  return 0;
}

static int write_all(int fd, const void *data, size_t len) {
  const char *p = data;
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* Opens a fresh temp file; its relative name goes to ret_name (64 bytes). */
static int temp_open(struct fs *fs, char ret_name[64], int *ret_fd) {
  snprintf(ret_name, 64, "%s/", TMP_DIR);
  random_hex(ret_name + strlen(ret_name), ID_HEX);
  int fd = openat(fs->root_fd, ret_name, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return fail("create", ret_name);
  *ret_fd = fd;
  return 0;
}

/* Syncs and closes a temp file; on failure it is removed. */
static int temp_finish(struct fs *fs, const char *name, int fd, int err) {
  if (!err && fsync(fd) != 0) err = fail("fsync", name);
  close(fd);
  if (err) unlinkat(fs->root_fd, name, 0);
  return err;
}

/* Moves a synced temp file to dest: link() when exclusive (EEXIST if taken),
 * rename() otherwise; then makes the directory entry durable. */
static int publish(struct fs *fs, const char *tmp, const char *dest, bool exclusive) {
  int err = make_parents(fs->root_fd, dest);
  if (!err && exclusive) {
    if (linkat(fs->root_fd, tmp, fs->root_fd, dest, 0) != 0) err = fail("link", dest);
    unlinkat(fs->root_fd, tmp, 0);
  } else if (!err) {
    if (renameat(fs->root_fd, tmp, fs->root_fd, dest) != 0) err = fail("rename", dest);
  }
  if (err) {
    unlinkat(fs->root_fd, tmp, 0);
    return err;
  }
  return fsync_parent(fs->root_fd, dest);
}

static int fs_put(void *impl, const char *key, const void *data, size_t len, unsigned flags) {
  struct fs *fs = impl;
  char tmp[64];
  int fd;
  int err = temp_open(fs, tmp, &fd);
  if (err) return err;
  err = write_all(fd, data, len) ? fail("write", tmp) : 0;
  err = temp_finish(fs, tmp, fd, err);
  return err ? err : publish(fs, tmp, key, flags & STORAGE_IF_ABSENT);
}

static int open_object(struct fs *fs, const char *key, int *ret_fd, uint64_t *ret_size) {
  int fd = openat(fs->root_fd, key, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail("open", key);
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    stk_set_detail("%s is not an object", key);
    return STK_ENOENT;
  }
  *ret_fd = fd;
  *ret_size = (uint64_t)st.st_size;
  return 0;
}

static int fs_get(void *impl, const char *key, uint64_t offset, void *buf, size_t len,
                  size_t *ret_len) {
  struct fs *fs = impl;
  int fd = -1;
  uint64_t size = 0;
  int err = open_object(fs, key, &fd, &size);
  if (err) return err;
  if (offset > size || (offset == size && size > 0 && len > 0)) {
    close(fd);
    return STK_ERANGE;
  }
  size_t want = size - offset < len ? (size_t)(size - offset) : len, got = 0;
  while (got < want) {
    ssize_t n = pread(fd, (char *)buf + got, want - got, (off_t)(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? fail("read", key) : STK_EIO;
      break;
    }
    got += (size_t)n;
  }
  close(fd);
  if (!err) *ret_len = got;
  return err;
}

static int fs_head(void *impl, const char *key, uint64_t *ret_size) {
  struct fs *fs = impl;
  struct stat st;
  if (fstatat(fs->root_fd, key, &st, 0) != 0) return fail("stat", key);
  if (!S_ISREG(st.st_mode)) return STK_ENOENT;
  *ret_size = (uint64_t)st.st_size;
  return 0;
}

static int fs_del(void *impl, const char *key) {
  struct fs *fs = impl;
  if (unlinkat(fs->root_fd, key, 0) != 0) {
    if (errno == ENOENT || errno == ENOTDIR || errno == EISDIR) return 0;
    return fail("unlink", key);
  }
  return fsync_parent(fs->root_fd, key);
}

/* Walks dir (relative to the root; "" for the root itself), reporting files
 * whose key starts with prefix. Directories that cannot hold such keys are
 * skipped. */
static int list_dir(struct fs *fs, const char *dir, const char *prefix, storage_list_cb cb,
                    void *arg) {
  int fd = openat(fs->root_fd, dir[0] ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT || errno == ENOTDIR ? 0 : fail("open", dir);
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return fail("opendir", dir);
  }
  int rc = 0;
  struct dirent *e;
  size_t plen = strlen(prefix);
  while (rc == 0 && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.' && (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
                                strncmp(e->d_name, ".stk-", 5) == 0))
      continue;
    char path[STORAGE_KEY_MAX + 2];
    int n = snprintf(path, sizeof(path), "%s%s%s", dir, dir[0] ? "/" : "", e->d_name);
    if (n < 0 || (size_t)n >= sizeof(path)) continue;
    struct stat st;
    if (fstatat(fs->root_fd, path, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    size_t cmp = (size_t)n < plen ? (size_t)n : plen;
    if (strncmp(path, prefix, cmp) != 0) continue;
    if (S_ISDIR(st.st_mode))
      rc = list_dir(fs, path, prefix, cb, arg);
    else if (S_ISREG(st.st_mode) && (size_t)n >= plen)
      rc = cb(arg, path, (uint64_t)st.st_size);
  }
  closedir(d);
  return rc;
}

static int fs_list(void *impl, const char *prefix, storage_list_cb cb, void *arg) {
  return list_dir(impl, "", prefix, cb, arg);
}

/* ---- Multipart: parts as files in the upload's directory. ---- */

static int upload_dir(const char *upload_id, char ret[96]) {
  if (strlen(upload_id) != ID_HEX) return STK_ENOENT;
  for (const char *p = upload_id; *p; p++)
    if (!strchr("0123456789abcdef", *p)) return STK_ENOENT;
  snprintf(ret, 96, "%s/%s", UPLOADS_DIR, upload_id);
  return 0;
}

/* STK_ENOENT unless the upload exists and targets key. */
static int upload_check(struct fs *fs, const char *key, const char *upload_id, char ret_dir[96]) {
  int err = upload_dir(upload_id, ret_dir);
  if (err) return err;
  char path[128], stored[STORAGE_KEY_MAX + 1];
  snprintf(path, sizeof(path), "%s/key", ret_dir);
  int fd = openat(fs->root_fd, path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail("open", path);
  ssize_t n = read(fd, stored, sizeof(stored) - 1);
  close(fd);
  if (n < 0) return fail("read", path);
  stored[n] = '\0';
  return strcmp(stored, key) == 0 ? 0 : STK_ENOENT;
}

static int fs_mpu_begin(void *impl, const char *key, char **ret_upload_id) {
  struct fs *fs = impl;
  char id[ID_HEX + 1], dir[96], tmp[64];
  random_hex(id, ID_HEX);
  upload_dir(id, dir);
  if (mkdirat(fs->root_fd, dir, 0755) != 0) return fail("mkdir", dir);
  int fd;
  int err = temp_open(fs, tmp, &fd);
  if (!err) {
    err = write_all(fd, key, strlen(key)) ? fail("write", tmp) : 0;
    err = temp_finish(fs, tmp, fd, err);
  }
  char key_path[128];
  snprintf(key_path, sizeof(key_path), "%s/key", dir);
  if (!err) err = publish(fs, tmp, key_path, true);
  if (!err) err = fsync_parent(fs->root_fd, dir);
  char *copy = err ? NULL : strdup(id);
  if (!err && !copy) err = STK_ENOMEM;
  if (err) {
    unlinkat(fs->root_fd, key_path, 0);
    unlinkat(fs->root_fd, dir, AT_REMOVEDIR);
    return err;
  }
  *ret_upload_id = copy;
  return 0;
}

/* A part's ETag: its inode, size and modification time, so a part written
 * again gets a new one, and complete() notices a stale list. */
static char *etag_of(const struct stat *st) {
  char buf[96];
  snprintf(buf, sizeof(buf), "\"%" PRIx64 "-%" PRIx64 "-%" PRIx64 ".%09ld\"", (uint64_t)st->st_ino,
           (uint64_t)st->st_size, (uint64_t)st->st_mtim.tv_sec, st->st_mtim.tv_nsec);
  return strdup(buf);
}

static int fs_mpu_part(void *impl, const char *key, const char *upload_id, int number,
                       const void *data, size_t len, char **ret_etag) {
  struct fs *fs = impl;
  char dir[96], tmp[64], dest[128];
  int fd, err = upload_check(fs, key, upload_id, dir);
  if (err) return err;
  err = temp_open(fs, tmp, &fd);
  if (err) return err;
  err = write_all(fd, data, len) ? fail("write", tmp) : 0;
  struct stat st = {0};
  if (!err && fstat(fd, &st) != 0) err = fail("stat", tmp);
  err = temp_finish(fs, tmp, fd, err);
  snprintf(dest, sizeof(dest), "%s/%05d", dir, number);
  if (!err) err = publish(fs, tmp, dest, false);
  if (err) return err;
  char *etag = etag_of(&st);
  if (!etag) return STK_ENOMEM;
  *ret_etag = etag;
  return 0;
}

/* Appends one part file to out_fd after checking its ETag. */
static int append_part(struct fs *fs, const char *dir, const struct storage_part *part,
                       int out_fd) {
  char path[128];
  snprintf(path, sizeof(path), "%s/%05d", dir, part->number);
  int in = openat(fs->root_fd, path, O_RDONLY | O_CLOEXEC);
  if (in < 0) return errno == ENOENT ? STK_EINVAL : fail("open", path);
  struct stat st;
  int err = fstat(in, &st) != 0 ? fail("stat", path) : 0;
  char *etag = err ? NULL : etag_of(&st);
  if (!err && (!etag || strcmp(etag, part->etag) != 0)) {
    stk_set_detail("part %d: ETag does not match", part->number);
    err = etag ? STK_EINVAL : STK_ENOMEM;
  }
  free(etag);
  for (off_t left = err ? 0 : st.st_size; left > 0;) {
    ssize_t n = copy_file_range(in, NULL, out_fd, NULL, (size_t)left, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? fail("copy", path) : STK_EIO;
      break;
    }
    left -= n;
  }
  close(in);
  return err;
}

static int remove_upload(struct fs *fs, const char *dir) {
  int fd = openat(fs->root_fd, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return fail("open", dir);
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return fail("opendir", dir);
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') unlinkat(dirfd(d), e->d_name, 0);
  closedir(d);
  if (unlinkat(fs->root_fd, dir, AT_REMOVEDIR) != 0) return fail("rmdir", dir);
  return fsync_parent(fs->root_fd, dir);
}

static int fs_mpu_complete(void *impl, const char *key, const char *upload_id,
                           const struct storage_part *parts, size_t n_parts, unsigned flags) {
  struct fs *fs = impl;
  char dir[96], tmp[64];
  int fd, err = upload_check(fs, key, upload_id, dir);
  if (err) return err;
  err = temp_open(fs, tmp, &fd);
  if (err) return err;
  for (size_t i = 0; i < n_parts && !err; i++) err = append_part(fs, dir, &parts[i], fd);
  err = temp_finish(fs, tmp, fd, err);
  if (!err) err = publish(fs, tmp, key, flags & STORAGE_IF_ABSENT);
  /* A refused conditional complete leaves the upload, as S3 does. */
  return err ? err : remove_upload(fs, dir);
}

static int fs_mpu_abort(void *impl, const char *key, const char *upload_id) {
  struct fs *fs = impl;
  char dir[96];
  int err = upload_check(fs, key, upload_id, dir);
  return err ? err : remove_upload(fs, dir);
}

/* Reads an upload's key and begin time (its key file's mtime). STK_ENOENT
 * when the upload is gone or not fully begun. */
static int upload_read(struct fs *fs, const char *id, char key[STORAGE_KEY_MAX + 1],
                       int64_t *ret_initiated_ms) {
  char dir[96], path[128];
  int err = upload_dir(id, dir);
  if (err) return err;
  snprintf(path, sizeof(path), "%s/key", dir);
  int fd = openat(fs->root_fd, path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? STK_ENOENT : fail("open", path);
  struct stat st;
  ssize_t n = fstat(fd, &st) == 0 ? read(fd, key, STORAGE_KEY_MAX) : -1;
  err = n < 0 ? fail("read", path) : 0;
  close(fd);
  if (err) return err;
  key[n] = '\0';
  *ret_initiated_ms = (int64_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000;
  return 0;
}

/* The uploads in progress are the directories of .stk-uploads whose key
 * file is in place (begin writes it last). */
static int fs_mpu_list(void *impl, const char *prefix, storage_upload_cb cb, void *arg) {
  struct fs *fs = impl;
  int fd = openat(fs->root_fd, UPLOADS_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return fail("open", UPLOADS_DIR);
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return fail("opendir", UPLOADS_DIR);
  }
  size_t plen = strlen(prefix);
  int rc = 0;
  struct dirent *e;
  while (rc == 0 && (e = readdir(d)) != NULL) {
    char key[STORAGE_KEY_MAX + 1];
    int64_t initiated_ms = 0;
    int err = e->d_name[0] == '.' ? STK_ENOENT : upload_read(fs, e->d_name, key, &initiated_ms);
    if (err == STK_ENOENT) continue;
    if (err) {
      rc = err;
      break;
    }
    if (strncmp(key, prefix, plen) != 0 || storage_key_check(key) != 0) continue;
    struct storage_upload u = {key, e->d_name, initiated_ms};
    rc = cb(arg, &u);
  }
  closedir(d);
  return rc;
}

static void fs_free(void *impl) {
  struct fs *fs = impl;
  if (!fs) return;
  close(fs->root_fd);
  free(fs);
}

/* Runs rq inline in the caller's thread (a worker's: file I/O blocks) and
 * answers before returning. */
static void fs_submit(void *impl, const struct storage_req *rq, storage_done_fn done, void *arg) {
  struct storage_result res = {0};
  switch (rq->op) {
  case STORAGE_OP_PUT:
    res.err = fs_put(impl, rq->key, rq->data, rq->len, rq->flags);
    break;
  case STORAGE_OP_GET:
    res.err = fs_get(impl, rq->key, rq->offset, rq->buf, rq->len, &res.len);
    break;
  case STORAGE_OP_HEAD:
    res.err = fs_head(impl, rq->key, &res.size);
    break;
  case STORAGE_OP_DELETE:
    res.err = fs_del(impl, rq->key);
    break;
  case STORAGE_OP_MPU_BEGIN:
    res.err = fs_mpu_begin(impl, rq->key, &res.upload_id);
    break;
  case STORAGE_OP_MPU_PART:
    res.err = fs_mpu_part(impl, rq->key, rq->upload_id, rq->number, rq->data, rq->len, &res.etag);
    break;
  case STORAGE_OP_MPU_COMPLETE:
    res.err = fs_mpu_complete(impl, rq->key, rq->upload_id, rq->parts, rq->n_parts, rq->flags);
    break;
  case STORAGE_OP_MPU_ABORT:
    res.err = fs_mpu_abort(impl, rq->key, rq->upload_id);
    break;
  }
  storage_answer(done, arg, &res);
}

static const struct storage_backend fs_backend = {
    .submit = fs_submit,
    .list = fs_list,
    .mpu_list = fs_mpu_list,
    .free = fs_free,
};

static int make_dir(const char *path) {
  char buf[4096];
  if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf)) return STK_EINVAL;
  for (char *p = buf + 1;; p++) {
    if (*p == '/' || *p == '\0') {
      char c = *p;
      *p = '\0';
      if (mkdir(buf, 0755) != 0 && errno != EEXIST) return fail("mkdir", buf);
      if (c == '\0') return 0;
      *p = c;
    }
  }
}

int fs_backend_open(const char *root_dir, struct storage **ret) {
  int err = make_dir(root_dir);
  if (err) return err;
  struct fs *fs = calloc(1, sizeof(*fs));
  if (!fs) return STK_ENOMEM;
  fs->root_fd = open(root_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fs->root_fd < 0) {
    err = fail("open", root_dir);
    free(fs);
    return err;
  }
  if ((mkdirat(fs->root_fd, TMP_DIR, 0755) != 0 && errno != EEXIST) ||
      (mkdirat(fs->root_fd, UPLOADS_DIR, 0755) != 0 && errno != EEXIST)) {
    err = fail("mkdir", root_dir);
    fs_free(fs);
    return err;
  }
  struct storage_caps caps = {.conditional_put = true,
                              .multipart_abort = true,
                              .multipart_list = false,
                              .multipart_list_uploads = true,
                              .completes_inline = true};
  struct storage *st = storage_wrap(&fs_backend, fs, &caps);
  if (!st) {
    fs_free(fs);
    return STK_ENOMEM;
  }
  *ret = st;
  return 0;
}
