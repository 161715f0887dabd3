/* The data roots of the dataloader (dl_roots.h). */
#include "dl_roots.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stk_error.h"

#define MAX_ROOTS 64

static bool restricted;
static size_t n_roots;
static char *given[MAX_ROOTS];    /* As the operator wrote them, normalized. */
static char *resolved[MAX_ROOTS]; /* realpath() of each. */

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
  for (size_t i = 0; i < n_roots; i++) free(given[i]), free(resolved[i]);
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
      given[n_roots] = strdup(norm);
      resolved[n_roots] = strdup(real);
      if (!given[n_roots] || !resolved[n_roots]) return STK_ENOMEM;
      n_roots++;
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

bool dl_roots_allows(const char *path) {
  if (!restricted) return true;
  char norm[PATH_MAX];
  if (!path || normalize(path, norm, sizeof norm) != 0) return false;
  for (size_t i = 0; i < n_roots; i++)
    if (under(norm, given[i]) || under(norm, resolved[i])) return true;
  return false;
}

int dl_roots_resolve(const char *path, char *out, size_t out_len) {
  if (!path || strlen(path) >= out_len) {
    stk_set_detail("path too long");
    return STK_EINVAL;
  }
  if (!restricted) {
    strcpy(out, path);
    return 0;
  }
  if (path[0] != '/') {
    stk_set_detail("%s: not an absolute path", path);
    return STK_EINVAL;
  }
  if (!dl_roots_allows(path)) return refuse(path, "outside");
  char real[PATH_MAX];
  if (!realpath(path, real)) {
    int e = errno;
    stk_set_detail("%s: %s", path, strerror(e));
    return e == ENOENT || e == ENOTDIR ? STK_ENOENT : e == EACCES ? STK_EPERM : STK_EINVAL;
  }
  for (size_t i = 0; i < n_roots; i++) {
    if (under(real, resolved[i])) {
      if (strlen(real) >= out_len) return STK_EINVAL;
      strcpy(out, real);
      return 0;
    }
  }
  return refuse(path, "a link leads out of");
}
