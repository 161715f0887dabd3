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

/* What a step-sized call answers when it could not go on without waiting
 * (positive: never an error): the caller steps again once what it waits
 * for moved (the writer's notify runs then). */
#define CKPT_LATER 1

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

/* ---- ckpt_save.c: the save machine (ckpt_stage.c runs it on the engine) ---- */

struct ckpt_save_hooks {
  /* Before tensor i's bytes are read; i = n after the last one. May block
   * (on the engine's thread it holds the client's other saves). */
  void (*before_tensor)(void *arg, size_t i);
  /* Once, when the caller's buffers are no longer read: every byte copied
   * into a segment or packed into a sent message, or the save failed. */
  void (*released)(void *arg);
  /* Once, on the engine's thread, when a submitted save is done
   * (ckpt_save_result tells how); the owner may free it here. */
  void (*done)(void *arg);
  void *arg;
};

/* One rank's save of tensors[0..n) of attempt (ckpt_save.c's opening
 * comment has the states). */
struct ckpt_save;

/* A save not started: the tensor array, names, shapes and boxes are copied
 * (the data is read in place). h may be NULL. STK_EINVAL (a bad argument or
 * tensor), STK_ENOMEM; the last error says which. */
int ckpt_save_new(struct stk_client *c, const char *attempt, uint32_t rank,
                  const struct stk_ckpt_tensor *tensors, size_t n_tensors,
                  const struct ckpt_save_hooks *h, struct ckpt_save **ret_save);
/* Steps s to its end on this thread (the blocking save). */
void ckpt_save_run(struct ckpt_save *s);
/* Hands s to its client's engine, which steps it and then calls h->done.
 * On failure (the client is closing: STK_ECANCELED) s is the caller's and
 * done never runs. */
int ckpt_save_submit(struct ckpt_save *s);
/* Once done: 0 or the save's error, whose status becomes this thread's last
 * error; *ret_bytes (may be NULL) the bytes the service took. */
int ckpt_save_result(const struct ckpt_save *s, uint64_t *ret_bytes);
/* Frees a save that is done or was never run. Accepts NULL. */
void ckpt_save_free(struct ckpt_save *s);

/* ---- ckpt_write.c: a rank's Write stream ---- */

/* The geometry of cutting one box into runs of whole rows along dim d. */
struct ckpt_cut {
  size_t d;           /* Dims before d are taken one index at a time. */
  uint64_t row_bytes; /* Bytes of one index of dim d (whole trailing dims). */
  uint64_t rows;      /* Indices of dim d per piece. */
};

/* One tensor's box being written a piece at a time (ckpt_put_*): what
 * stk_ckpt_write_chunk does in one go, for a machine that must not wait
 * between pieces. The fields are ckpt_write.c's; the box, shape, name and
 * data stay the caller's and must live until done. */
struct ckpt_put {
  const char *tensor;
  enum stk_dtype dtype;
  const uint64_t *global_shape;
  const struct stk_ckpt_box *box;
  const uint8_t *data;
  size_t len;
  bool shm;          /* Pieces cut to the segment size (the stream's path then). */
  bool whole;        /* One piece: the box as it is. */
  struct ckpt_cut k; /* Else runs of rows; the next one starts at: */
  uint64_t idx[STK_CKPT_MAX_DIMS];
  uint64_t j;
  bool done; /* Every piece emitted. */
};

/* Checks a tensor's box as stk_ckpt_write_chunk does (the first one decides
 * the stream's path: GetStagingInfo, waited for here unless
 * ckpt_writer_decide answered 0 before) and sets p up to write it. */
int ckpt_put_start(struct stk_ckpt_writer *w, struct ckpt_put *p, const char *tensor,
                   enum stk_dtype dtype, const uint64_t *global_shape,
                   const struct stk_ckpt_box *box, const void *data, size_t len);
/* Emits p's next piece: one message over gRPC (which waits only if the
 * stream is not ready), or one copy into a segment. p->done after the last.
 * CKPT_LATER (p unchanged): the writer holds messages that go first (a
 * completed segment's: ckpt_writer_holds). */
int ckpt_put_next(struct stk_ckpt_writer *w, struct ckpt_put *p);
/* Starts GetStagingInfo, the question that decides the stream's path, at
 * the first call, without waiting: 0 once decided (or the error of a path
 * that must be and cannot: STK_CKPT_SHM_ON), CKPT_LATER until the answer is
 * in (the notify runs then). ckpt_writer_cancel ends the call at once. */
int ckpt_writer_decide(struct stk_ckpt_writer *w);
/* Messages wait to be sent: a completed segment's chunk messages, or the
 * runs after the first of a piece that fell back to bytes; the stream's
 * next messages (before any other piece and before "last"). */
bool ckpt_writer_holds(const struct stk_ckpt_writer *w);
/* Sends the next of them (call once ready). */
int ckpt_writer_send_held(struct stk_ckpt_writer *w);
/* Completes the current segment: its messages are held from now on (the
 * save machine's FINISH sends them one a step before "last"). Does nothing
 * when no segment is open. STK_EIO: the segment could not be completed
 * (its chunks are lost: end the stream without "last"). */
int ckpt_writer_seal(struct stk_ckpt_writer *w);
/* A write would not wait on flow control now (the message in flight was
 * taken). */
bool ckpt_writer_ready(struct stk_ckpt_writer *w);
/* notify(arg) runs on the rpc client's thread whenever w moved (a message
 * taken, the reply, the status, GetStagingInfo's answer), possibly under
 * the stream's lock: it must not call the writer. Set before the first
 * ckpt_writer_decide. */
void ckpt_writer_set_notify(struct stk_ckpt_writer *w, void (*notify)(void *arg), void *arg);
/* Sends what is left of a segment and "last" (call once ready; it waits on
 * flow control for each held message unless ckpt_writer_seal and
 * ckpt_writer_send_held sent them before). An error here (a segment not
 * sent) ends the stream without "last". */
int ckpt_writer_send_last(struct stk_ckpt_writer *w, bool wait_durable);
/* Starts the half-close after "last" (call once ready again); then
 * ckpt_writer_ended tells when ckpt_writer_end(w, true, ...) returns at
 * once with the reply. */
void ckpt_writer_close_send(struct stk_ckpt_writer *w);
bool ckpt_writer_ended(struct stk_ckpt_writer *w);

/* Ends w's stream: with "last" (the reply's staged bytes and durability
 * answered as stk_ckpt_writer_finish does) or without (abandoned, as
 * stk_ckpt_writer_abort). w stays allocated, so that ckpt_writer_cancel
 * may reach a stream while another thread waits here; free it after. */
int ckpt_writer_end(struct stk_ckpt_writer *w, bool last, bool wait_durable, uint64_t *ret_bytes,
                    bool *ret_durable);
/* Cancels w's calls: a write or end waiting on its stream returns, its
 * GetStagingInfo ends (or never starts). Any thread, until w is freed. */
void ckpt_writer_cancel(struct stk_ckpt_writer *w);
void ckpt_writer_free(struct stk_ckpt_writer *w);
/* True once the service ended w's call (a write failed): ending it with
 * "last" tells why. */
bool ckpt_writer_failed(const struct stk_ckpt_writer *w);

/* ---- ckpt_seg.c: zero-copy staging segments of one write stream ---- */

struct ckpt_seg;

/* Sends one chunk message on the stream (0 or a negative error). */
typedef int (*ckpt_seg_send_fn)(void *arg, Stoker__V1__WriteChunk *msg);

/* STK_CKPT_SHM_* from $STOKER_CKPT_SHM (auto when unset). */
int ckpt_seg_mode_from_env(void);

/* Asks the service whether this host can stage through its shared memory
 * (GetStagingInfo, asynchronous on w: w's notify runs at the answer).
 * 0 or the start's error (w is then done with it). */
int ckpt_seg_ask(struct stk_client *c, struct waiter *w);
/* What the answer of a done ckpt_seg_ask means for rank: 0 with *ret_shm
 * NULL when it cannot stage through shared memory and mode is AUTO (or
 * OFF); STK_ENOTSUP (or the call's error) when it cannot and mode is ON. */
int ckpt_seg_open(struct waiter *asked, const char *attempt, uint32_t rank, int mode,
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
 * segment and holds msg's metadata (copied) for it. CKPT_LATER (nothing
 * copied): messages of a completed segment are held (a full segment is
 * completed here first); send them, then append again. STK_EIO: the
 * segment could not be written (the caller may send the bytes instead). */
int ckpt_seg_append(struct ckpt_seg *m, const Stoker__V1__WriteChunk *msg, const void *data,
                    size_t len);

/* Completes the current segment (none open: nothing; one holding no
 * chunk is removed): its messages are held until sent. STK_EIO: it could
 * not be, it is removed and its chunks are lost. */
int ckpt_seg_complete(struct ckpt_seg *m);
/* Messages of the completed segment wait to be sent. */
bool ckpt_seg_holds(const struct ckpt_seg *m);
/* Sends the next held message with send (one message: it waits only as
 * send does). On failure it stays held. */
int ckpt_seg_send_held(struct ckpt_seg *m, ckpt_seg_send_fn send, void *arg);
/* Completes the current segment and sends every held message. */
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
