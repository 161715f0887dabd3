/* The confined walk of dl_beneath.h: one component at a time, links and
 * ".." resolved by the walk, never by the kernel across a component. */
#include "dl_beneath.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* As the kernel's own limit on links followed in one lookup. */
#define MAX_LINKS 40

struct walk {
  int base;                /* borrowed: the directory everything stays beneath */
  int *held;               /* directories entered below base, innermost last (owned) */
  size_t depth, cap;       /* entries used and allocated in held */
  int links;               /* links followed so far */
  char path[2 * PATH_MAX]; /* what is left to walk, from at */
  size_t at;
};

static int here(const struct walk *w) {
  return w->depth ? w->held[w->depth - 1] : w->base;
}

static void leave_all(struct walk *w) {
  while (w->depth) close(w->held[--w->depth]);
}

static int enter(struct walk *w, int fd) {
  if (w->depth == w->cap) {
    size_t cap = w->cap ? 2 * w->cap : 16;
    int *p = realloc(w->held, cap * sizeof *p);
    if (!p) {
      close(fd);
      return -ENOMEM;
    }
    w->held = p;
    w->cap = cap;
  }
  w->held[w->depth++] = fd;
  return 0;
}

/* "..": back to the directory entered before, never above base. */
static int step_up(struct walk *w) {
  if (w->depth == 0) return -EXDEV;
  close(w->held[--w->depth]);
  return 0;
}

/* The next component into name: 1 (last says whether more follow), 0 when
 * none is left, or -ENAMETOOLONG. */
static int next_component(struct walk *w, char name[NAME_MAX + 1], bool *last) {
  const char *p = w->path + w->at;
  while (*p == '/') p++;
  size_t n = strcspn(p, "/");
  if (n == 0) return 0;
  if (n > NAME_MAX) return -ENAMETOOLONG;
  memcpy(name, p, n);
  name[n] = '\0';
  p += n;
  w->at = (size_t)(p - w->path);
  while (*p == '/') p++;
  *last = *p == '\0';
  return 1;
}

/* Replaces the walked part of the path with the target of the link open
 * as linkfd (which stays the caller's): relative targets continue from the
 * current directory, absolute ones beneath what the policy names. */
static int follow(struct walk *w, int linkfd, dl_beneath_absolute_fn absolute, void *ctx) {
  if (++w->links > MAX_LINKS) return -ELOOP;
  char target[PATH_MAX];
  ssize_t n = readlinkat(linkfd, "", target, sizeof target);
  if (n < 0) return -errno;
  if ((size_t)n >= sizeof target) return -ENAMETOOLONG;
  target[n] = '\0';
  char prefix[PATH_MAX];
  if (target[0] == '/') {
    int dirfd;
    int rc = absolute ? absolute(ctx, target, &dirfd, prefix, sizeof prefix) : -EXDEV;
    if (rc < 0) return rc;
    leave_all(w);
    w->base = dirfd;
  } else {
    memcpy(prefix, target, (size_t)n + 1);
  }
  const char *rest = w->path + w->at;
  size_t lp = strlen(prefix), lr = strlen(rest);
  if (lp + 1 + lr >= sizeof w->path) return -ENAMETOOLONG;
  memmove(w->path + lp + 1, rest, lr + 1);
  memcpy(w->path, prefix, lp);
  w->path[lp] = '/';
  w->at = 0;
  return 0;
}

static bool is_link(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 && S_ISLNK(st.st_mode);
}

/* A directory on the way: entered, or followed when it is a link. */
static int pass(struct walk *w, const char *name, dl_beneath_absolute_fn absolute, void *ctx) {
  int fd = openat(here(w), name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -errno;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  if (S_ISDIR(st.st_mode)) return enter(w, fd);
  int rc = S_ISLNK(st.st_mode) ? follow(w, fd, absolute, ctx) : -ENOTDIR;
  close(fd);
  return rc;
}

/* The last component: 0 with its descriptor in *ret_fd, or -1 there when
 * it was a link that was followed (the walk goes on); a negative errno. */
static int arrive(struct walk *w, const char *name, int flags, dl_beneath_absolute_fn absolute,
                  void *ctx, int *ret_fd) {
  *ret_fd = -1;
  int fd = openat(here(w), name, flags | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0 && !((flags & O_PATH) && is_link(fd))) {
    *ret_fd = fd;
    return 0;
  }
  int e = errno;
  if (fd < 0) {
    /* O_NOFOLLOW refuses a link with ELOOP (ENOTDIR with O_DIRECTORY):
     * look at the entry itself to tell a link from a real refusal. */
    if (e != ELOOP && e != ENOTDIR) return -e;
    fd = openat(here(w), name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -e;
    if (!is_link(fd)) {
      close(fd);
      return -e;
    }
  }
  int rc = follow(w, fd, absolute, ctx);
  close(fd);
  return rc;
}

int dl_beneath_open(int dirfd, const char *rel, int flags, dl_beneath_absolute_fn absolute,
                    void *ctx) {
  struct walk w = {.base = dirfd};
  if (strlen(rel) >= sizeof w.path) return -ENAMETOOLONG;
  strcpy(w.path, rel);
  int rc, fd = -1;
  for (;;) {
    char name[NAME_MAX + 1];
    bool last = false;
    rc = next_component(&w, name, &last);
    if (rc == 0) {
      /* Nothing left: the directory the walk stands in is the answer. */
      fd = openat(here(&w), ".", flags | O_CLOEXEC);
      rc = fd < 0 ? -errno : 0;
      break;
    }
    if (rc < 0) break;
    if (strcmp(name, ".") == 0) continue;
    if (strcmp(name, "..") == 0)
      rc = step_up(&w);
    else if (!last)
      rc = pass(&w, name, absolute, ctx);
    else
      rc = arrive(&w, name, flags, absolute, ctx, &fd);
    if (rc < 0 || fd >= 0) break;
  }
  leave_all(&w);
  free(w.held);
  return rc < 0 ? rc : fd;
}
