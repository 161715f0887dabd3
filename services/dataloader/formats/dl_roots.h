/*
 * dl_roots: the directories a dataloader daemon may read datasets and
 * tokenizer files from (--data-root, repeatable). A path a client names is
 * first judged as written ("//", "." and ".." collapsed as text): outside
 * every root it is STK_EPERM naming the rule, before the file system is
 * asked anything about it. Inside one it is opened beneath the root's own
 * directory descriptor, one component at a time (dl_beneath.h): links are
 * followed while they stay under a root, and one that leads out is STK_EPERM
 * whether or not its target exists. No rename inside a root while a path is
 * opened can make the open reach outside (no check-then-open race). A
 * daemon given no root serves no files.
 *
 * The policy is process-wide: set once in main() before any thread starts.
 * Until then (in-process tests, tools) every path is allowed.
 */
#ifndef STK_DL_ROOTS_H
#define STK_DL_ROOTS_H

#include <stdbool.h>
#include <stddef.h>

/* Restricts reads to the ':'-joined directories of list ("" or NULL: none,
 * no file is served). Each must be an existing directory (absolute after
 * resolving). STK_EINVAL with a detail naming the bad one. */
int dl_roots_set(const char *list);

/* Opens a client's path with open(2) flags (O_CLOEXEC and, under the
 * roots, O_NOFOLLOW for every component are added): 0 with the descriptor
 * in *ret_fd. STK_EPERM outside the roots or through a link that leads out
 * (detail names the rule); STK_ENOENT, STK_EPERM (EACCES), STK_EINVAL (a
 * directory, a link loop, a relative or too long path) or STK_EIO for a
 * path inside them, detail naming it. Without dl_roots_set the path is
 * opened as it is. A client's bad path is the client's error, never an
 * internal one. */
int dl_roots_open(const char *path, int flags, int *ret_fd);

#endif
