/*
 * ckpt_shm: the shared-memory segment directory of one service instance
 * (zero-copy staging for ranks on the same host, issue 4). A rank writes
 * its chunk bytes once into a file of this directory (on tmpfs) and sends
 * only the file's name; the service maps the file read-only, takes
 * ownership, uploads from the mapping and finally recycles or removes it.
 *
 * gRPC cannot pass file descriptors, so the reference is a name, and every
 * name from the network is checked before it touches the file system: a
 * bare name "seg-<attempt>-<rank>-<tag>" naming exactly the writer's
 * attempt and rank (no '/', no "..", tag 1..16 hex digits), opened relative
 * to the directory with O_NOFOLLOW (no symlinks), a regular file with one
 * link owned by the service's user, 1..max_bytes long.
 *
 * Directory entries (everything else in it is left alone):
 *   instance-<token>   proves to a client that it shares this host and
 *                      this service instance (the token comes from
 *                      GetStagingInfo);
 *   seg-<attempt>-...  segments written by ranks;
 *   free-<n>           segments kept for reuse (their pages are already
 *                      allocated, so a rank that claims one by renaming it
 *                      copies without page allocation), at most pool_bytes;
 *   read-<tag>         files clients read checkpoints through
 *                      (ckpt_shm_read.h), removed by the client; the sweep
 *                      removes those untouched for CKPT_SHM_READ_STALE_S.
 * Opening removes every entry of a previous instance (after a kill -9 no
 * segment outlives the restart); closing removes every entry of these
 * four kinds (the pool, the instance file, segments never handed over)
 * and the directory if it is then empty.
 *
 * Trust: segments are written by processes of the service's own user (the
 * directory is 0700). Such a process can corrupt only its own attempt's
 * bytes (CRCs are computed from what is uploaded). A segment truncated
 * after hand-over (a buggy client reusing its file) must not end the
 * service: every map is registered with map_guard (services/common), so a
 * read past the new end finds zeros instead of SIGBUS and the segment is
 * marked broken (ckpt_shm_seg_broken); its attempt is then aborted, and a
 * broken segment is removed, never pooled.
 *
 * Threads: one thread (the service loop) uses a struct ckpt_shm.
 */
#ifndef STK_CKPT_SHM_H
#define STK_CKPT_SHM_H

#include <stdbool.h>
#include <stdint.h>

#include "ckpt_names.h"

struct map_guard_group;
struct map_guard_slot;

/* "seg-" + attempt + "-" + rank + "-" + tag. */
#define CKPT_SHM_NAME_MAX (4 + CKPT_ATTEMPT_MAX_BYTES + 1 + 10 + 1 + 16)
#define CKPT_SHM_TAG_MAX  16

struct ckpt_shm;

/* A mapped segment owned by the service. */
struct ckpt_shm_seg {
  char name[CKPT_SHM_NAME_MAX + 1];
  const uint8_t *map; /* PROT_READ, size bytes. */
  uint64_t size;
  struct map_guard_group *faults; /* This segment's SIGBUS record. */
  struct map_guard_slot *guard;
};

/* Whether a read of the segment's map found it shrunk (any thread, since it
 * was mapped): what was read from it since is zeros, not the client's. */
bool ckpt_shm_seg_broken(const struct ckpt_shm_seg *seg);

/* Opens dir (created 0700 if missing; an existing one must be a real
 * directory of this user without group or other access), removes the
 * entries of previous instances and announces a new token. Errors:
 * STK_EINVAL (unsafe directory, with a detail), STK_EIO. */
int ckpt_shm_open(const char *dir, uint64_t max_bytes, uint64_t pool_bytes,
                  struct ckpt_shm **ret_shm);

/* Removes the pool and the instance file (segments still named seg-* are
 * left to the next open). Accepts NULL. */
void ckpt_shm_close(struct ckpt_shm *m);

const char *ckpt_shm_dir(const struct ckpt_shm *m);
const char *ckpt_shm_token(const struct ckpt_shm *m);
uint64_t ckpt_shm_max_bytes(const struct ckpt_shm *m);
/* Largest read file accepted (ckpt_shm_read.h), header included. */
uint64_t ckpt_shm_read_max_bytes(const struct ckpt_shm *m);
/* The directory, for ckpt_shm_read's openat. */
int ckpt_shm_dirfd(const struct ckpt_shm *m);
/* True for a read file's name ("read-", any tag; ckpt_shm_read.h checks
 * the tag): the directory knows every kind of name it holds, for its
 * sweeps; ckpt_shm_read.c, above this file, uses it too. */
bool ckpt_shm_read_is_name(const char *name);
/* Bytes in recycled free-* files (as the service last saw them). */
uint64_t ckpt_shm_pool_bytes(const struct ckpt_shm *m);

/* 0 if name is a segment name of exactly (attempt, rank); else STK_EINVAL
 * with a detail. */
int ckpt_shm_check_name(const char *name, const char *attempt, uint32_t rank);

/* Checks and maps segment name (see above). Errors: STK_EINVAL (with a
 * detail: missing, a symlink, not a regular file, wrong owner, linked
 * twice, empty or too large), STK_ENOMEM. */
int ckpt_shm_map(struct ckpt_shm *m, const char *name, struct ckpt_shm_seg **ret_seg);

/* Unmaps without touching the file (the service did not take it).
 * Accepts NULL. */
void ckpt_shm_unmap(struct ckpt_shm_seg *seg);

/* Unmaps and gives the file up: renamed into the pool while it has room,
 * else removed. Accepts NULL. */
void ckpt_shm_release(struct ckpt_shm *m, struct ckpt_shm_seg *seg);

/* A read file no one wrote for this long is a dead client's. */
#define CKPT_SHM_READ_STALE_S 600

/* Removes every seg-* file whose attempt keep() does not claim (attempts
 * that ended, or that this instance never knew), and read-* files not
 * written for CKPT_SHM_READ_STALE_S (their reader, if any, keeps its
 * mapping). Returns the count. */
typedef bool (*ckpt_shm_keep_fn)(void *arg, const char *attempt);
int ckpt_shm_sweep(struct ckpt_shm *m, ckpt_shm_keep_fn keep, void *arg);

#endif
