/*
 * dl_beneath: opening a path beneath a directory descriptor so that nothing
 * outside it is ever reached, whatever a writer inside it renames meanwhile.
 *
 * Checking a resolved path and then opening it again by name is a race: a
 * parent directory swapped for a link between the two leads anywhere. Here
 * every component is opened with O_NOFOLLOW from the descriptor of the one
 * before, so what was checked is what is opened. Links are followed by the
 * walk itself: a relative target continues from the link's directory, ".."
 * steps back to a directory the walk already holds and never above the
 * start, and an absolute target is handed to the caller's policy, which
 * names the directory to continue beneath or refuses.
 *
 * Linux's openat2(RESOLVE_BENEATH) gives the same confinement in one call,
 * but refuses every absolute link (also those that stay inside a data root)
 * and is blocked by some container seccomp profiles; the walk runs
 * everywhere and costs a few system calls per component, at open time only.
 *
 * A refused link never touches its target: a link out answers the same
 * whether or not what it names exists (no existence oracle).
 */
#ifndef STK_DL_BENEATH_H
#define STK_DL_BENEATH_H

#include <stddef.h>

/* The caller's policy for an absolute link target: 0 with the directory to
 * continue beneath in *ret_dirfd (borrowed: it stays open while the walk
 * runs) and the rest of the path below it in rest (relative, NUL-ended);
 * -EXDEV to refuse. */
typedef int (*dl_beneath_absolute_fn)(void *ctx, const char *target, int *ret_dirfd, char *rest,
                                      size_t rest_len);

/* Opens rel (relative; "" or "." is dirfd itself) beneath dirfd with flags
 * (O_NOFOLLOW and O_CLOEXEC are added; O_PATH and O_DIRECTORY work).
 * Returns the new descriptor, or a negative errno: -EXDEV when a link or
 * ".." leads out, -ELOOP after 40 links, -ENAMETOOLONG, or the error of the
 * component that failed. absolute may be NULL (every absolute link is
 * refused). Thread-safe; dirfd is borrowed. */
int dl_beneath_open(int dirfd, const char *rel, int flags, dl_beneath_absolute_fn absolute,
                    void *ctx);

#endif
