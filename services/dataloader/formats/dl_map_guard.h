/*
 * dl_map_guard: a dataset file shrunk under a live memory map must cost the
 * job that reads it, never the process. Reading a page of a MAP_SHARED file
 * mapping beyond the file's new end raises SIGBUS; checking the size with
 * fstat before reading cannot help, since the truncation can land between
 * the check and the read.
 *
 * Every map the readers open is registered here. A SIGBUS handler
 * (installed once, process-wide, on the first registration) looks the
 * faulting address up: when it lies in a registered map it marks that map's
 * fault group broken and maps anonymous zero pages over the map from the
 * faulting page to its end (MAP_FIXED), so the interrupted read resumes and
 * finishes on zeros, and returns. A SIGBUS anywhere else keeps its previous
 * meaning (the previous handler, or the default action: the process dies).
 *
 * Readers are unchanged: whoever reads through maps checks the group after
 * reading (dl_fault_group_broken) and throws away what it read. A group is
 * whatever the caller wants charged together; the dataloader core uses one
 * per dataset of a job. Maps are put in a group by opening them on a thread
 * inside dl_fault_scope_enter(group) ... dl_fault_scope_leave(): the readers
 * need not know about groups.
 *
 * Threading: every function may be called from any thread. The handler runs
 * on the faulting thread and only reads the registry (lock-free).
 */
#ifndef STK_DL_MAP_GUARD_H
#define STK_DL_MAP_GUARD_H

#include <stdbool.h>
#include <stddef.h>

struct dl_fault_group;
struct dl_map_slot;

/* A group, not broken. NULL when out of memory. Free it only once no map
 * registered in it remains (dl_map_guard_remove). Accepts NULL. */
struct dl_fault_group *dl_fault_group_new(void);
void dl_fault_group_free(struct dl_fault_group *g);

/* Whether a read through one of the group's maps faulted (any thread, any
 * time since the group was made). When it did and ret_path is not NULL,
 * *ret_path is the path of the first map that faulted (owned by the group). */
bool dl_fault_group_broken(const struct dl_fault_group *g, const char **ret_path);

/* Maps registered on this thread until dl_fault_scope_leave belong to g
 * (NULL: to no group; their faults are still survived, and only the
 * thread-local count below tells). Scopes do not nest. */
void dl_fault_scope_enter(struct dl_fault_group *g);
void dl_fault_scope_leave(void);

/* Registers [addr, addr + bytes) mapped from path (copied) in the current
 * scope's group. *ret_slot stays NULL on failure (out of memory: the map is
 * then unguarded and works as before). */
int dl_map_guard_add(const void *addr, size_t bytes, const char *path,
                     struct dl_map_slot **ret_slot);
/* Unregisters before the map is unmapped. Accepts NULL. */
void dl_map_guard_remove(struct dl_map_slot *slot);

/* Faults survived on this thread since it started (tests, diagnostics). */
unsigned long dl_map_guard_thread_faults(void);

#endif
