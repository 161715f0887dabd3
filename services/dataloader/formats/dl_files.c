/* Memory maps and directory listings for the readers (see dl_files.h). */
#include "dl_files.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dl_map_guard.h"
#include "dl_roots.h"
#include "stk_error.h"

/* A client's path that cannot be opened is the client's error (NOT_FOUND,
 * PERMISSION_DENIED, INVALID_ARGUMENT), not the daemon's. */
static int open_error(int e) {
  switch (e) {
  case ENOENT:
  case ENOTDIR:
    return STK_ENOENT;
  case EACCES:
  case EPERM:
    return STK_EPERM;
  case EISDIR:
  case ELOOP:
  case ENAMETOOLONG:
  case ENXIO:
    return STK_EINVAL;
  default:
    return STK_EIO;
  }
}

int dl_map_open(const char *path, struct dl_map *ret_map) {
  /* Only under the data roots; the resolved path is what gets opened, so a
   * link swapped in after the check leads nowhere new. */
  char real[PATH_MAX];
  int rc = dl_roots_resolve(path, real, sizeof real);
  if (rc) return rc;
  /* Non-blocking: opening a FIFO or a device must never park the worker
   * (only regular files are mapped, checked right after). */
  int fd = open(real, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW);
  if (fd < 0) {
    int e = errno;
    stk_set_detail("%s: %s", path, strerror(e));
    return open_error(e);
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    stk_set_detail("%s: not a regular file", path);
    close(fd);
    return STK_EINVAL;
  }
  struct dl_map m = {NULL, (size_t)st.st_size, NULL};
  if (m.size > 0) {
    void *p = mmap(NULL, m.size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      stk_set_detail("%s: mmap: %s", path, strerror(errno));
      close(fd);
      return STK_EIO;
    }
    m.data = p;
    if ((rc = dl_map_guard_add(p, m.size, path, &m.guard)) < 0) {
      munmap(p, m.size);
      close(fd);
      return rc;
    }
  }
  close(fd);
  *ret_map = m;
  return 0;
}

void dl_map_close(struct dl_map *m) {
  dl_map_guard_remove(m->guard); /* before the range can be mapped again */
  m->guard = NULL;
  if (m->data) munmap((void *)m->data, m->size);
  m->data = NULL;
  m->size = 0;
}

bool dl_is_dir(const char *path) {
  struct stat st;
  return dl_roots_allows(path) && stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

char *dl_strcat2(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  char *s = malloc(la + lb + 1);
  if (!s) return NULL;
  memcpy(s, a, la);
  memcpy(s + la, b, lb + 1);
  return s;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool wanted(const char *dir, const char *name, const char *suffix) {
  size_t ln = strlen(name), ls = suffix ? strlen(suffix) : 0;
  if (name[0] == '.' || ln < ls || (suffix && strcmp(name + ln - ls, suffix) != 0)) return false;
  char *full = malloc(strlen(dir) + ln + 2);
  if (!full) return false;
  strcpy(full, dir);
  strcat(full, "/");
  strcat(full, name);
  struct stat st;
  bool ok = stat(full, &st) == 0 && S_ISREG(st.st_mode);
  free(full);
  return ok;
}

int dl_list_dir(const char *dir, const char *suffix, char ***ret_paths, size_t *ret_n) {
  char real[PATH_MAX];
  int checked = dl_roots_resolve(dir, real, sizeof real);
  if (checked) return checked;
  DIR *d = opendir(real);
  if (!d) {
    stk_set_detail("%s: %s", dir, strerror(errno));
    return STK_ENOENT;
  }
  char **paths = NULL;
  size_t n = 0, cap = 0;
  int rc = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (!wanted(dir, e->d_name, suffix)) continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 16;
      char **p = realloc(paths, cap * sizeof *p);
      if (!p) {
        rc = STK_ENOMEM;
        break;
      }
      paths = p;
    }
    char *slash = dl_strcat2(dir, "/");
    paths[n] = slash ? dl_strcat2(slash, e->d_name) : NULL;
    free(slash);
    if (!paths[n]) {
      rc = STK_ENOMEM;
      break;
    }
    n++;
  }
  closedir(d);
  if (rc < 0) {
    dl_paths_free(paths, n);
    return rc;
  }
  if (n) qsort(paths, n, sizeof *paths, cmp_str);
  *ret_paths = paths;
  *ret_n = n;
  return 0;
}

void dl_paths_free(char **paths, size_t n) {
  for (size_t i = 0; i < n; i++) free(paths[i]);
  free(paths);
}
