/*
 * What the checkpoint parts of libstoker-client share: the method names and
 * the conversion of a caller's box into a Box message.
 */
#ifndef STK_CKPT_INTERNAL_H
#define STK_CKPT_INTERNAL_H

#include "client_internal.h"
#include "stoker/v1/checkpoint.pb-c.h"
#include "stoker_ckpt.h"

/* CKPT_METHOD(begin, &req): as COORD_METHOD (client_internal.h). */
#define CKPT_METHOD(field, req) RPC_METHOD_PATH(stoker__v1__checkpoint, field, req)
#define CKPT_CALL(c, field, req, timeout_ms, ret)                                                  \
  CLIENT_CALL(stoker__v1__checkpoint, c, field, req, timeout_ms, ret)

/* True when box has 1..STK_CKPT_MAX_DIMS dims, each size > 0, and (when
 * shape is not NULL) lies inside shape. */
bool ckpt_box_valid(const struct stk_ckpt_box *box, const uint64_t *shape);

/* Points msg at box's arrays (no copy; msg lives no longer than box). */
void ckpt_box_msg(const struct stk_ckpt_box *box, Stoker__V1__Box *msg);

/* Splits an attempt handle ("ID" or "ID@OWNER", stk_ckpt_begin) into the
 * id the messages carry and the client to call: c, or the client of the
 * replica OWNER (client_peer). */
int ckpt_route(struct stk_client *c, const char *handle, char ret_id[STK_CKPT_ATTEMPT_MAX],
               struct stk_client **ret_client);

/* ---- ckpt_write.c: the save with hooks (ckpt_stage.c runs it) ---- */

struct ckpt_save_hooks {
  /* Before tensor i's bytes are read; i = n after the last one. May block. */
  void (*before_tensor)(void *arg, size_t i);
  /* Once, when the caller's buffers are no longer read: every byte copied
   * into a segment or packed into a sent message, or the save failed. */
  void (*released)(void *arg);
  void *arg;
};

/* stk_ckpt_save with hooks (h may be NULL). */
int ckpt_save_hooked(struct stk_client *c, const char *attempt, uint32_t rank,
                     const struct stk_ckpt_tensor *tensors, size_t n_tensors,
                     const struct ckpt_save_hooks *h, uint64_t *ret_bytes);

/* ---- ckpt_seg.c: zero-copy staging segments of one write stream ---- */

struct ckpt_seg;

/* Sends one chunk message on the stream (0 or a negative error). */
typedef int (*ckpt_seg_send_fn)(void *arg, Stoker__V1__WriteChunk *msg);

/* STK_CKPT_SHM_* from $STOKER_CKPT_SHM (auto when unset). */
int ckpt_seg_mode_from_env(void);

/* Asks the service (GetStagingInfo) whether rank can stage through shared
 * memory. 0 with *ret_shm NULL when it cannot and mode is AUTO (or OFF);
 * STK_ENOTSUP (or the call's error) when it cannot and mode is ON. */
int ckpt_seg_open(struct stk_client *c, const char *attempt, uint32_t rank, int mode,
                  struct ckpt_seg **ret_shm);

/* Staging into the directory dirfd (which m owns from now on, closed even
 * on failure) in segments of at most max_bytes (and 64 MiB): what
 * ckpt_seg_open makes once the service answered, and what the test vectors
 * (tests/vectors) drive without a service. Errors: STK_ENOMEM. */
int ckpt_seg_new(int dirfd, const char *attempt, uint32_t rank, uint64_t max_bytes,
                 struct ckpt_seg **ret_shm);

/* Most bytes of one chunk (a segment's capacity). */
uint64_t ckpt_seg_segment_bytes(const struct ckpt_seg *m);

/* Copies a chunk's len bytes (len <= the segment size) into the current
 * segment and holds msg's metadata (copied) for it; a full segment is
 * first completed and its messages sent with send. STK_EIO: the segment
 * could not be written (the caller may send the bytes instead). */
int ckpt_seg_append(struct ckpt_seg *m, const Stoker__V1__WriteChunk *msg, const void *data,
                    size_t len, ckpt_seg_send_fn send, void *arg);

/* Completes the current segment and sends its held messages. */
int ckpt_seg_flush(struct ckpt_seg *m, ckpt_seg_send_fn send, void *arg);

/* Frees m; a segment whose messages were never sent is removed. Accepts
 * NULL. */
void ckpt_seg_free(struct ckpt_seg *m);

/* ---- ckpt_segmap.c: segment files this process keeps mapped ---- */

/* A segment file claimed or created by one writer, mapped for cap bytes. */
struct ckpt_segfile {
  int fd;
  uint8_t *map;
  uint64_t cap;   /* Bytes mapped: the most the segment may hold. */
  uint64_t alloc; /* Leading bytes known allocated (stores there cannot fault). */
  bool cached;    /* The mapping stays in the process cache after hand-over. */
};

/* Names a segment `name` in dirfd (the service's shm directory): claims a
 * recycled free-* file (preferring one already mapped here) by renaming
 * it, else creates the file; maps it for cap bytes. STK_EIO: neither. */
int ckpt_segmap_acquire(int dirfd, const char *name, uint64_t cap, struct ckpt_segfile *ret);

/* Copies len bytes to offset off (off + len <= cap), reserving pages the
 * file does not have yet first. STK_EIO: no room (tmpfs full). */
int ckpt_segmap_write(struct ckpt_segfile *f, uint64_t off, const void *data, size_t len);

/* Sets the file's size to used before it is handed over to the service
 * (the mapping stays cached for the next claim). STK_EIO on failure. */
int ckpt_segmap_complete(struct ckpt_segfile *f, uint64_t used);

/* Removes a segment never handed over and forgets its mapping. */
void ckpt_segmap_discard(struct ckpt_segfile *f, int dirfd, const char *name);

/* Unmaps cached files that no longer have a link (the service removed
 * them). Called at each writer's first segment. */
void ckpt_segmap_prune(void);

/* Mappings cached (tests). */
size_t ckpt_segmap_cached(void);

#endif
