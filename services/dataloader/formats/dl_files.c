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

#include "dl_roots.h"
#include "map_guard.h"
#include "stk_error.h"

int dl_map_open(const char *path, struct dl_map *ret_map) {
  /* Only beneath the data roots, opened by descriptor (dl_roots.h), so no
   * rename inside a root while this runs leads out of it. Non-blocking:
   * opening a FIFO or a device must never park the worker (only regular
   * files are mapped, checked right after). */
  int fd;
  int rc = dl_roots_open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY, &fd);
  if (rc) return rc;
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
    if ((rc = map_guard_add(p, m.size, path, &m.guard)) < 0) {
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
  map_guard_remove(m->guard); /* before the range can be mapped again */
  m->guard = NULL;
  if (m->data) munmap((void *)m->data, m->size);
  m->data = NULL;
  m->size = 0;
}

bool dl_is_dir(const char *path) {
  int fd;
  if (dl_roots_open(path, O_PATH | O_DIRECTORY, &fd) != 0) return false;
  close(fd);
  return true;
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

/* A regular file, or a link that reaches one without leaving the roots
 * (an entry whose link leads out is skipped whether or not its target
 * exists). */
static bool wanted(DIR *d, const char *dir, const char *name, const char *suffix) {
  size_t ln = strlen(name), ls = suffix ? strlen(suffix) : 0;
  if (name[0] == '.' || ln < ls || (suffix && strcmp(name + ln - ls, suffix) != 0)) return false;
  struct stat st;
  if (fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) != 0) return false;
  if (!S_ISLNK(st.st_mode)) return S_ISREG(st.st_mode);
  char *slash = dl_strcat2(dir, "/");
  char *full = slash ? dl_strcat2(slash, name) : NULL;
  free(slash);
  int fd;
  bool ok = full && dl_roots_open(full, O_PATH, &fd) == 0;
  free(full);
  if (ok) {
    ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    close(fd);
  }
  return ok;
}

int dl_list_dir(const char *dir, const char *suffix, char ***ret_paths, size_t *ret_n) {
  int fd;
  int opened = dl_roots_open(dir, O_RDONLY | O_DIRECTORY, &fd);
  if (opened) return opened;
  DIR *d = fdopendir(fd);
  if (!d) {
    stk_set_detail("%s: %s", dir, strerror(errno));
    close(fd);
    return STK_EIO;
  }
  char **paths = NULL;
  size_t n = 0, cap = 0;
  int rc = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (!wanted(d, dir, e->d_name, suffix)) continue;
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
