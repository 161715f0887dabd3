/*
 * dl_files: the file plumbing the readers share — read-only memory maps
 * (so opening never reads token pages) and directory listings in name order.
 */
#ifndef STK_DL_FILES_H
#define STK_DL_FILES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct map_guard_slot;

struct dl_map {
  const uint8_t *data; /* NULL when size is 0 */
  size_t size;
  struct map_guard_slot *guard; /* registration with map_guard.h (services/common) */
};

/* Maps path read-only, registered with map_guard (in the calling
 * thread's fault scope): a read past the end of a file truncated later
 * gives zeros and marks the scope's group broken instead of killing the
 * process. Errors: STK_ENOENT, STK_EIO (detail names the file), STK_ENOMEM. */
int dl_map_open(const char *path, struct dl_map *ret_map);
void dl_map_close(struct dl_map *m);

bool dl_is_dir(const char *path);
/* Regular files in dir whose names end with suffix (NULL: any, hidden files
 * skipped), as full paths sorted by name. The caller frees with
 * dl_paths_free. Errors: STK_ENOENT, STK_ENOMEM. */
int dl_list_dir(const char *dir, const char *suffix, char ***ret_paths, size_t *ret_n);
void dl_paths_free(char **paths, size_t n);
/* malloc'd "a" followed by "b". */
char *dl_strcat2(const char *a, const char *b);

#endif
