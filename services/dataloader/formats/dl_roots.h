/*
 * dl_roots: the directories a dataloader daemon may read datasets and
 * tokenizer files from (--data-root, repeatable). Every path a client names
 * is resolved (symlinks, "..", ".") and served only when it lies under a
 * root; anything else is STK_EPERM naming the rule, decided from the path
 * alone before the file system is asked anything about it (so no one learns
 * what exists outside the roots), and again after resolving (so no symlink
 * leads out). A daemon given no root serves no files.
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

/* The path to open for a client's path: 0 with the resolved path in out;
 * STK_EPERM outside the roots (detail says why), STK_ENOENT and the like
 * from resolving a path inside them, STK_EINVAL for a relative or too long
 * path. Without dl_roots_set, out is path itself. */
int dl_roots_resolve(const char *path, char *out, size_t out_len);

/* False when path is outside the roots as written (no file system access). */
bool dl_roots_allows(const char *path);

#endif
