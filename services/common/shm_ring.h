/*
 * shm_ring: a ring of equal slots in a shared-memory file, written by a
 * daemon and read in place by a client on the same host (the dataloader's
 * batch stream, issue 3). gRPC carries only "sequence n is ready"; the
 * bytes of sequence n (n = 1, 2, ...) live in slot (n - 1) % slots.
 *
 * File layout (integers in host byte order: both ends share the host;
 * header in the first page):
 *   0   magic "STKRING1"
 *   8   nonce[16]      the client's random bytes from its request: a client
 *                      that finds them proves it shares the daemon's host
 *   24  u32 slots      1..SHM_RING_MAX_SLOTS
 *   28  u32 reserved
 *   32  u64 slot_bytes multiple of the page size
 *   40  u64 data_offset one page
 *   64  u64 released[slots]  written by the client only: the highest
 *                      sequence of that slot it no longer reads
 *   data_offset + i * slot_bytes: slot i
 *
 * Sequences only grow, and sequence n always lives in slot (n - 1) % slots,
 * but they need not be consecutive: the daemon writes into a free slot
 * (never used, or the client released the last sequence written there),
 * trying the slots in turn from the one after the last written, and gives
 * the data the next sequence that maps to that slot. With prompt releases
 * that is 1, 2, 3, ...; a slot the client keeps (a tensor over its memory
 * still in use) is passed over instead of stopping the stream. The daemon
 * trusts nothing in the file: geometry and what it wrote where are its own
 * copies. A client that releases early or scribbles on the file only
 * corrupts what it reads itself.
 *
 * The daemon creates rings in a directory of its own (0700: only its user
 * can open them), the client opens the ring by path and removes the name at
 * once, so the memory lives exactly as long as the two mappings; a ring
 * nobody attached is removed by the daemon when its stream ends, and
 * shm_ring_dir_open() removes rings a killed daemon left behind.
 */
#ifndef STK_SHM_RING_H
#define STK_SHM_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SHM_RING_NONCE_BYTES 16
#define SHM_RING_MAX_SLOTS   256
#define SHM_RING_PATH_MAX    4096

struct shm_ring;

/* The default ring directory of a daemon: /dev/shm/stoker-<kind>-<FNV-1a
 * of the absolute data dir> (one per daemon on the host, as two daemons
 * cannot share a data dir), or "" where /dev/shm is missing; ret_owner
 * gets the absolute data dir, to be recorded by shm_ring_dir_open. Also
 * empties and removes the directories of this kind whose recorded data dir
 * no longer exists (left by killed daemons of deleted data dirs, tests'
 * above all).
 * Creates data_dir if needed. Errors: STK_EINVAL (data_dir cannot be
 * resolved). */
int shm_ring_auto_dir(const char *kind, const char *data_dir, char *ret_dir, size_t dir_len,
                      char *ret_owner, size_t owner_len);

/* Opens (creating it 0700 if missing) the directory rings are made in: an
 * absolute path, a real directory of this user without group or other
 * access. Removes every ring-* entry (left by a killed instance) and, with
 * an owner (may be NULL), records it in the file "owner". Errors:
 * STK_EINVAL (unsafe or relative path, with a detail), STK_EIO. */
int shm_ring_dir_open(const char *dir, const char *owner, int *ret_dirfd);

/* Records owner in a private directory another module opened (the
 * checkpoint service's segment directory), as shm_ring_dir_open does. */
void shm_ring_record_owner(const char *dir, const char *owner);

/* Removes the owner record shm_ring_record_owner wrote and then the
 * directory, if nothing else is left in it: a clean stop of a daemon whose
 * own module already removed its entries. */
void shm_ring_forget_owner(const char *dir);

/* Removes the ring entries, the owner record and the directory itself;
 * closes dirfd. For a daemon shutting down once its streams ended. */
void shm_ring_dir_close(const char *dir, int dirfd);

/* Daemon: creates dir/ring-<random hex> (0600) with slots x slot_bytes
 * (rounded up to pages) and maps it; only the header's page is reserved
 * (STK_ENOMEM when the file system is full), each slot's when it is first
 * written (shm_ring_reserve). dir is the path of dirfd. */
int shm_ring_create(int dirfd, const char *dir, const uint8_t nonce[SHM_RING_NONCE_BYTES],
                    uint32_t slots, uint64_t slot_bytes, struct shm_ring **ret_ring);

/* Client: opens path (no symlinks; a regular file of this user), checks
 * magic, nonce and geometry against the file's size, maps it and removes
 * the name. Errors: STK_ENOENT (no such file: not the daemon's host),
 * STK_EINVAL (anything else wrong, with a detail), STK_ENOMEM. */
int shm_ring_attach(const char *path, const uint8_t nonce[SHM_RING_NONCE_BYTES],
                    struct shm_ring **ret_ring);

const char *shm_ring_path(const struct shm_ring *r);
uint32_t shm_ring_slots(const struct shm_ring *r);
uint64_t shm_ring_slot_bytes(const struct shm_ring *r);

/* The slot that holds sequence seq (>= 1). */
uint8_t *shm_ring_slot(const struct shm_ring *r, uint64_t seq);

/* Daemon: the smallest sequence above `after` (and above the last
 * written) whose slot is free, among the next `slots` sequences; 0 when
 * none is. Nothing is reserved: probing with after = 0, then each answer
 * in turn, gives growing sequences of distinct slots, valid until
 * shm_ring_written, however the client releases slots meanwhile (a slot it
 * frees behind the probe is passed over, and reused on a later turn). */
uint64_t shm_ring_next_free(const struct shm_ring *r, uint64_t after);

/* Daemon: reserves the pages of the slot of sequence seq, before it is
 * written into (once per slot; later calls cost nothing). STK_ENOMEM with a
 * detail when the file system is full: the slot must not be written then
 * (a write to an unreserved page of a full tmpfs is a SIGBUS). */
int shm_ring_reserve(struct shm_ring *r, uint64_t seq);
/* Daemon: the file's pages reserved so far (the header's and each slot
 * first written), what the ring holds of the file system. */
uint64_t shm_ring_reserved_bytes(const struct shm_ring *r);

/* Daemon: sequence seq (from shm_ring_next_free, in growing order) is
 * written and handed to the client. */
void shm_ring_written(struct shm_ring *r, uint64_t seq);

/* Client: it no longer reads sequence seq. */
void shm_ring_release(struct shm_ring *r, uint64_t seq);

/* Daemon: removes the file's name if the client has not (ENOENT is fine). */
void shm_ring_unlink(struct shm_ring *r);

/* Unmaps; accepts NULL. */
void shm_ring_free(struct shm_ring *r);

#endif
