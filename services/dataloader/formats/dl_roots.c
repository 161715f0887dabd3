/* The data roots of the dataloader (dl_roots.h). */
#include "dl_roots.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dl_beneath.h"
#include "stk_error.h"

#define MAX_ROOTS 64

static bool restricted;
static size_t n_roots;
static char *given[MAX_ROOTS];    /* As the operator wrote them, normalized. */
static char *resolved[MAX_ROOTS]; /* realpath() of each. */
static int root_fd[MAX_ROOTS];    /* O_PATH descriptor of each, opened at set. */

/* Collapses "//", "." and ".." of an absolute path as text, into out. */
static int normalize(const char *path, char *out, size_t out_len) {
  if (path[0] != '/' || strlen(path) >= out_len) return STK_EINVAL;
  size_t len = 0;
  out[0] = '\0';
  for (const char *p = path; *p;) {
    while (*p == '/') p++;
    const char *end = strchr(p, '/');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n == 0) break;
    if (n == 1 && p[0] == '.') {
      /* "." names the directory already in out. */
    } else if (n == 2 && p[0] == '.' && p[1] == '.') {
      while (len > 0 && out[len - 1] != '/') len--;
      if (len > 0) len--;
    } else {
      out[len++] = '/';
      memcpy(out + len, p, n);
      len += n;
    }
    out[len] = '\0';
    p += n;
  }
  if (len == 0) out[len++] = '/', out[len] = '\0';
  return 0;
}

/* True when path equals root or lies below it. */
static bool under(const char *path, const char *root) {
  size_t n = strlen(root);
  if (n == 1) return true; /* "/" */
  return strncmp(path, root, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

static void clear(void) {
  for (size_t i = 0; i < n_roots; i++) free(given[i]), free(resolved[i]), close(root_fd[i]);
  n_roots = 0;
}

int dl_roots_set(const char *list) {
  clear();
  restricted = true;
  for (const char *p = list ? list : ""; *p;) {
    const char *end = strchr(p, ':');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    char dir[PATH_MAX], norm[PATH_MAX], real[PATH_MAX];
    if (n > 0) {
      if (n >= sizeof(dir) || n_roots == MAX_ROOTS) {
        stk_set_detail("data root '%.*s': too long, or more than %d roots", (int)n, p, MAX_ROOTS);
        return STK_EINVAL;
      }
      memcpy(dir, p, n);
      dir[n] = '\0';
      if (normalize(dir, norm, sizeof norm) != 0 || !realpath(dir, real)) {
        stk_set_detail("data root '%s': %s", dir,
                       dir[0] != '/' ? "not an absolute path" : strerror(errno));
        return STK_EINVAL;
      }
      int fd = open(real, O_PATH | O_DIRECTORY | O_CLOEXEC);
      if (fd < 0) {
        stk_set_detail("data root '%s': %s", dir, strerror(errno));
        return STK_EINVAL;
      }
      given[n_roots] = strdup(norm);
      resolved[n_roots] = strdup(real);
      root_fd[n_roots] = fd;
      n_roots++;
      if (!given[n_roots - 1] || !resolved[n_roots - 1]) return STK_ENOMEM;
    }
    p += n + (end != NULL);
  }
  return 0;
}

/* The detail of a refusal: which rule, and where files may come from. */
static int refuse(const char *path, const char *why) {
  if (n_roots == 0) {
    stk_set_detail("%s: this dataloader serves no files (it was started without --data-root)",
                   path);
    return STK_EPERM;
  }
  char list[1024] = "";
  for (size_t i = 0; i < n_roots; i++) {
    size_t used = strlen(list);
    snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", given[i]);
  }
  stk_set_detail("%s: %s the data roots of this dataloader (--data-root %s)", path, why, list);
  return STK_EPERM;
}

/* The root a normalized path lies under, with the part below it in
 * *ret_rest (no leading '/'); -1 when none. */
static int match(const char *norm, const char **ret_rest) {
  for (size_t i = 0; i < n_roots; i++) {
    const char *root = under(norm, given[i])      ? given[i]
                       : under(norm, resolved[i]) ? resolved[i]
                                                  : NULL;
    if (!root) continue;
    const char *rest = norm + (strlen(root) == 1 ? 0 : strlen(root));
    while (*rest == '/') rest++;
    *ret_rest = rest;
    return (int)i;
  }
  return -1;
}

/* dl_beneath's policy for an absolute link: on under a root, as written. */
static int absolute_in_roots(void *ctx, const char *target, int *ret_dirfd, char *rest,
                             size_t rest_len) {
  (void)ctx;
  char norm[PATH_MAX];
  const char *below;
  int i;
  if (normalize(target, norm, sizeof norm) != 0 || (i = match(norm, &below)) < 0) return -EXDEV;
  if (strlen(below) >= rest_len) return -ENAMETOOLONG;
  strcpy(rest, below);
  *ret_dirfd = root_fd[i];
  return 0;
}

/* A client's path that cannot be opened is the client's error (NOT_FOUND,
 * PERMISSION_DENIED, INVALID_ARGUMENT), not the daemon's. */
static int open_error(const char *path, int e) {
  stk_set_detail("%s: %s", path, strerror(e));
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

int dl_roots_open(const char *path, int flags, int *ret_fd) {
  if (!path || strlen(path) >= PATH_MAX) {
    stk_set_detail("path too long");
    return STK_EINVAL;
  }
  if (!restricted) {
    int fd = open(path, flags | O_CLOEXEC);
    if (fd < 0) return open_error(path, errno);
    *ret_fd = fd;
    return 0;
  }
  char norm[PATH_MAX];
  if (path[0] != '/' || normalize(path, norm, sizeof norm) != 0) {
    stk_set_detail("%s: not an absolute path", path);
    return STK_EINVAL;
  }
  const char *rest;
  int i = match(norm, &rest);
  if (i < 0) return refuse(path, "outside");
  int fd = dl_beneath_open(root_fd[i], rest, flags, absolute_in_roots, NULL);
  if (fd == -EXDEV) return refuse(path, "a link leads out of");
  if (fd < 0) return open_error(path, -fd);
  *ret_fd = fd;
  return 0;
}
