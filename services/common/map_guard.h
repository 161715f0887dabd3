/*
 * map_guard: a file shrunk under a live memory map must cost the job that
 * reads it, never the process (a dataset file in the dataloader, a client's
 * shared-memory segment in the checkpoint service). Reading a page of a
 * MAP_SHARED file mapping beyond the file's new end raises SIGBUS; checking the size with
 * fstat before reading cannot help, since the truncation can land between
 * the check and the read.
 *
 * Every map such a reader opens is registered here. A SIGBUS handler
 * (installed once, process-wide, on the first registration) looks the
 * faulting address up: when it lies in a registered map it marks that map's
 * fault group broken and maps anonymous zero pages over the map from the
 * faulting page to its end (MAP_FIXED), so the interrupted read resumes and
 * finishes on zeros, and returns. A SIGBUS anywhere else keeps its previous
 * meaning (the previous handler, or the default action: the process dies).
 *
 * Readers are unchanged: whoever reads through maps checks the group after
 * reading (map_guard_group_broken) and throws away what it read. A group is
 * whatever the caller wants charged together; the dataloader core uses one
 * per dataset of a job, the checkpoint service one per segment. Maps are put in a group by opening
 * them on a thread inside map_guard_scope_enter(group) ... map_guard_scope_leave(): the readers
 * need not know about groups.
 *
 * Threading: every function may be called from any thread. The handler runs
 * on the faulting thread and only reads the registry (lock-free).
 */
#ifndef STK_MAP_GUARD_H
#define STK_MAP_GUARD_H

#include <stdbool.h>
#include <stddef.h>

struct map_guard_group;
struct map_guard_slot;

/* A group, not broken. NULL when out of memory. Free it only once no map
 * registered in it remains (map_guard_remove). Accepts NULL. */
struct map_guard_group *map_guard_group_new(void);
void map_guard_group_free(struct map_guard_group *g);

/* Whether a read through one of the group's maps faulted (any thread, any
 * time since the group was made). When it did and ret_path is not NULL,
 * *ret_path is the path of the first map that faulted (owned by the group). */
bool map_guard_group_broken(const struct map_guard_group *g, const char **ret_path);

/* Maps registered on this thread until map_guard_scope_leave belong to g
 * (NULL: to no group; their faults are still survived, and only the
 * thread-local count below tells). Scopes do not nest. */
void map_guard_scope_enter(struct map_guard_group *g);
void map_guard_scope_leave(void);

/* Registers [addr, addr + bytes) mapped from path (copied) in the current
 * scope's group. *ret_slot stays NULL on failure (out of memory: the map is
 * then unguarded and works as before). */
int map_guard_add(const void *addr, size_t bytes, const char *path,
                  struct map_guard_slot **ret_slot);
/* Unregisters before the map is unmapped. Accepts NULL. */
void map_guard_remove(struct map_guard_slot *slot);

/* Faults survived on this thread since it started (tests, diagnostics). */
unsigned long map_guard_thread_faults(void);

#endif
