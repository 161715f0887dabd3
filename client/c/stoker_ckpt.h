/*
 * libstoker-client, checkpoint part: the calls a trainer rank (and
 * stokerctl) makes to stoker-checkpoint. A checkpoint client is an ordinary
 * struct stk_client opened on the checkpoint service's address; everything
 * in stoker_client.h about threads, errors and stk_client_last_error() holds.
 *
 * Saving a checkpoint: one process calls stk_ckpt_begin() for (job, step,
 * world) and hands the attempt id to every rank; each rank saves its shard
 * with stk_ckpt_save() (or a writer: open, write_chunk..., finish), which
 * returns as soon as the service holds the bytes ("staged"): the rank may
 * change its tensors and go on training while the service uploads. Someone
 * then calls stk_ckpt_commit(), which waits until every rank's bytes are
 * durable and the manifest is written. A checkpoint exists iff it committed.
 *
 * Restoring: stk_ckpt_read() fetches the boxes a rank needs at its own
 * world size (any world size: the service reshards) straight into the
 * caller's buffers.
 *
 * Installed; the catalogue calls (list, manifest, delete, verify) answer
 * protobuf-c messages and are in the in-tree stoker_admin.h. timeout_ms 0:
 * the client's default.
 */
#ifndef STOKER_CKPT_H
#define STOKER_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "stoker_client.h"

#define STK_CKPT_DEFAULT_ADDRESS "127.0.0.1:7072"
#define STK_CKPT_ENV             "STOKER_CHECKPOINT"
#define STK_CKPT_ATTEMPT_MAX     64 /* Bytes for an attempt id, NUL included. */
#define STK_CKPT_MAX_DIMS        8

/* Opens a client to the checkpoint service: opts->address, else
 * $STOKER_CHECKPOINT, else STK_CKPT_DEFAULT_ADDRESS (opts may be NULL).
 * Several replicas behind one address (issue 26): the address may resolve
 * to several (the headless Service's name, or a gRPC target such as
 * "ipv4:10.0.0.1:7072,10.0.0.2:7072"); calls are spread over them
 * (round robin), and the attempt handle stk_ckpt_begin answers routes the
 * attempt's writes, commit and abort to the replica that owns it. */
int stk_ckpt_connect(const struct stk_client_opts *opts, struct stk_client **ret_client);

/* Element type of a stored tensor; the numbers are the proto's DType
 * (stoker/v1/checkpoint.proto) and never change. Little-endian; BOOL is
 * one byte, 0 or 1; BYTES is an opaque blob (RNG, dataloader state). */
enum stk_dtype {
  STK_DTYPE_UNSPECIFIED = 0,
  STK_DTYPE_F32 = 1,
  STK_DTYPE_BF16 = 2,
  STK_DTYPE_F16 = 3,
  STK_DTYPE_I64 = 4,
  STK_DTYPE_U8 = 5,
  STK_DTYPE_BYTES = 6,
  STK_DTYPE_F64 = 7,
  STK_DTYPE_I32 = 8,
  STK_DTYPE_I16 = 9,
  STK_DTYPE_I8 = 10,
  STK_DTYPE_BOOL = 11,
  STK_DTYPE_U16 = 12,
  STK_DTYPE_U32 = 13,
  STK_DTYPE_U64 = 14,
};

/* Bytes per element of dtype (1 for STK_DTYPE_BYTES); 0 for unknown ones. */
size_t stk_ckpt_dtype_size(enum stk_dtype dtype);

/* One box of a tensor: ndim dims (1..STK_CKPT_MAX_DIMS), offsets and sizes
 * inside the global shape. The arrays are the caller's. */
struct stk_ckpt_box {
  size_t ndim;
  const uint64_t *offsets;
  const uint64_t *sizes;
};

/* Elements in the box (0 if ndim is 0 or out of range). */
uint64_t stk_ckpt_box_elems(const struct stk_ckpt_box *box);

/* ------------------------------------------------------------- write path */

/* Starts an attempt; ret_attempt gets its handle (STK_CKPT_ATTEMPT_MAX
 * bytes): the attempt id, or "ID@OWNER" when the service runs as replicas
 * (BeginResponse.owner): hand it to the ranks as it is, and every call
 * given it (writer, save, stage, commit, abort) goes to the owner. A
 * replica that is draining answers UNAVAILABLE and the begin is tried
 * again (another replica answers) until timeout_ms.
 * Errors: STK_EEXIST (step already committed), STK_EINVAL, STK_ETOOBIG (the
 * owner's address does not fit the handle). */
int stk_ckpt_begin(struct stk_client *c, const char *job, int64_t step, uint32_t world,
                   int64_t timeout_ms, char ret_attempt[STK_CKPT_ATTEMPT_MAX]);

/* The coordinator generation the ranks writing through this client are in
 * (0: not known, the default); later begins name it, and the service lists
 * each checkpoint with the generation that wrote it. Any thread. */
void stk_ckpt_set_generation(struct stk_client *c, uint64_t generation);

struct stk_ckpt_writer;

/* Opens rank's Write stream of attempt. The writer belongs to one thread at
 * a time; the client must outlive it. timeout_ms bounds the whole stream
 * (0: none, since a shard may take long). */
int stk_ckpt_writer_open(struct stk_client *c, const char *attempt, uint32_t rank,
                         int64_t timeout_ms, struct stk_ckpt_writer **ret_writer);

/* Largest message the writer sends; bigger boxes are cut into runs of
 * whole rows (each a box of its own). Default 4 MiB; at least one element. */
void stk_ckpt_writer_set_max_chunk(struct stk_ckpt_writer *w, size_t max_chunk_bytes);

/*
 * Zero-copy staging: when the service runs on this host (it announces a
 * shared-memory directory and proves it is the same instance), a writer
 * copies each chunk's bytes once into a segment file there (tmpfs) and
 * sends only the chunk's metadata; the service maps the file and owns it
 * from then on, so the rank is blocked for about one memcpy of its shard.
 * Otherwise the bytes go over gRPC. The default mode comes from
 * $STOKER_CKPT_SHM: "auto" (or unset), "off" (or "0"): always gRPC, "on"
 * (anything else): shared memory or fail with STK_ENOTSUP.
 */
enum stk_ckpt_shm_mode {
  STK_CKPT_SHM_AUTO = 0, /* Shared memory when the service is on this host. */
  STK_CKPT_SHM_OFF = 1,  /* Always bytes over gRPC. */
  STK_CKPT_SHM_ON = 2,   /* Shared memory, else the first write fails STK_ENOTSUP. */
};
#define STK_CKPT_SHM_ENV "STOKER_CKPT_SHM"

/* Sets w's mode; before the first write only (later calls are ignored). */
void stk_ckpt_writer_set_shm(struct stk_ckpt_writer *w, enum stk_ckpt_shm_mode mode);

/* True once w's writes go through shared memory (known after the first
 * write_chunk). */
bool stk_ckpt_writer_shm_active(const struct stk_ckpt_writer *w);

/* Sends the box of tensor (row-major bytes, len = box elements x dtype
 * size). Blocks while the service holds back (gRPC flow control: the
 * service's staging memory is full). global_shape has box->ndim dims.
 * Errors: STK_EINVAL (bad arguments, checked here first), or the call
 * failed (STK_ECANCELED: stk_ckpt_writer_finish tells the server's reason). */
int stk_ckpt_write_chunk(struct stk_ckpt_writer *w, const char *tensor, enum stk_dtype dtype,
                         const uint64_t *global_shape, const struct stk_ckpt_box *box,
                         const void *data, size_t len);

/* Ends the stream ("last") and waits for the reply: once the rank's bytes
 * are staged, or durable (uploaded) when wait_durable. Frees w in every
 * case. ret_bytes / ret_durable may be NULL. */
int stk_ckpt_writer_finish(struct stk_ckpt_writer *w, bool wait_durable, uint64_t *ret_bytes,
                           bool *ret_durable);

/* Abandons the stream without "last" (the rank does not finish; the
 * attempt is aborted by its timeout unless another writer completes the
 * rank). Accepts NULL. */
void stk_ckpt_writer_abort(struct stk_ckpt_writer *w);

/* A tensor shard to save: the box of tensor with its bytes. */
struct stk_ckpt_tensor {
  const char *name;
  enum stk_dtype dtype;
  const uint64_t *global_shape; /* box.ndim dims. */
  struct stk_ckpt_box box;
  const void *data;
  size_t len;
};

/* Saves rank's shard: open, every tensor, finish (through shared memory
 * per $STOKER_CKPT_SHM, see above). Returns once staged: the caller may
 * reuse the buffers. ret_bytes: bytes the service took. */
int stk_ckpt_save(struct stk_client *c, const char *attempt, uint32_t rank,
                  const struct stk_ckpt_tensor *tensors, size_t n_tensors, uint64_t *ret_bytes);

/* The same, handed back at once (a trainer's checkpoint thread goes on):
 * the save runs on the client's engine, one thread per client that steps
 * every save in flight of the client in turn, and done runs once on that
 * thread when the shard is staged (err 0) or failed. The buffers must stay
 * unchanged until then; the tensor array, names, shapes and boxes are
 * copied. The client owns the save: freeing the client with the save in
 * flight cancels it, and done runs (STK_ECANCELED) before stk_client_free
 * returns (so done must not free the client itself). If this call fails,
 * done never runs. */
typedef void (*stk_ckpt_saved_fn)(void *arg, int err, const char *msg, uint64_t bytes);
int stk_ckpt_save_async(struct stk_client *c, const char *attempt, uint32_t rank,
                        const struct stk_ckpt_tensor *tensors, size_t n_tensors,
                        stk_ckpt_saved_fn done, void *arg);

/*
 * Staging in the background, for checkpoints that cost the training loop
 * (almost) nothing: stk_ckpt_stage_start saves rank's shard as
 * stk_ckpt_save does, on the client's engine (as stk_ckpt_save_async),
 * reading the caller's buffers in place: no snapshot copy. The caller goes
 * on (a trainer runs the next step's forward and backward) and must not
 * change the buffers until stk_ckpt_stage_fence returned: a trainer calls
 * it right before its optimizer update overwrites the parameters and
 * optimizer state. The fence returns once every byte is in staging (copied
 * into the service's shared memory, or packed into a sent gRPC message),
 * before the service's "staged" reply; stk_ckpt_stage_finish waits for that
 * reply and frees the stage. The checkpoint thus holds exactly the buffers'
 * contents at start.
 */
struct stk_ckpt_stage;

struct stk_ckpt_stage_opts {
  /* The engine thread runs at nice 19 while it stages, so that its copy
   * takes only the CPU time the caller's threads leave; a fence that has to
   * wait, and the stage's end, put it back at nice 0 (needs RLIMIT_NICE >= 20
   * or CAP_SYS_NICE; otherwise it stays at 19, and so do the client's later
   * saves). */
  bool low_priority;
  /* Called on the engine thread before tensor i's bytes are read, and
   * with i = n_tensors after the last one (before the fence lets go); it
   * may block (the client's other saves wait meanwhile). For tests
   * (forcing interleavings) and progress. NULL: none. */
  void (*before_tensor)(void *arg, size_t i);
  void *hook_arg;
};

/* Starts staging tensors[0..n_tensors) of rank's shard of attempt. The
 * tensor array, names, shapes and boxes are copied; the data buffers are
 * read in place. opts may be NULL (defaults: normal priority, no hook).
 * The client owns the staging: freeing it with the stage in flight cancels
 * the save (the fence lets go, wait and finish answer STK_ECANCELED); the
 * stage itself stays the caller's, and finish may come after the client is
 * freed. */
int stk_ckpt_stage_start(struct stk_client *c, const char *attempt, uint32_t rank,
                         const struct stk_ckpt_tensor *tensors, size_t n_tensors,
                         const struct stk_ckpt_stage_opts *opts, struct stk_ckpt_stage **ret_stage);

/* Waits until the stage no longer reads the buffers: every byte staged, or
 * the save failed (the buffers are free either way; stk_ckpt_stage_finish
 * tells which). Returns 0 (STK_EINVAL for NULL). May be called any number
 * of times. */
int stk_ckpt_stage_fence(struct stk_ckpt_stage *s);

/* True once the buffers are free (stk_ckpt_stage_fence would not wait). */
bool stk_ckpt_stage_released(struct stk_ckpt_stage *s);

/* Waits for the service's reply (the shard staged) without freeing s, so
 * that another thread may still fence on it: 0 or the save's error (its
 * message in stk_client_last_error on this thread). ret_bytes may be
 * NULL. */
int stk_ckpt_stage_wait(struct stk_ckpt_stage *s, uint64_t *ret_bytes);

/* Waits for the service's reply (the shard staged), joins the thread and
 * frees s. 0, or the save's error (stk_client_last_error tells the
 * service's reason on this thread). ret_bytes may be NULL. Accepts NULL
 * (returns 0). */
int stk_ckpt_stage_finish(struct stk_ckpt_stage *s, uint64_t *ret_bytes);

/* A committed checkpoint: its step, where its manifest lives, when it
 * committed (Unix ms) and the coordinator generation that wrote it. */
struct stk_ckpt_ref {
  int64_t step;
  int64_t committed_at_ms;
  uint64_t generation;
  char uri[1024]; /* Cut (NUL-terminated) if longer. */
};

/* Waits until every rank's bytes are durable and the manifest written.
 * *ret_ref (may be NULL) is filled on success. Errors: STK_EABORTED,
 * STK_EINVAL (coverage), STK_ETIMEDOUT, STK_ENOENT. */
int stk_ckpt_commit(struct stk_client *c, const char *attempt, int64_t timeout_ms,
                    struct stk_ckpt_ref *ret_ref);

/* A detached commit (issue 23: a rank leaving on a preemption notice):
 * returns once the service has decided the commit, not once it is done:
 * every rank's bytes are staged there and validated, the chunks cover every
 * tensor, and the decision is journaled. The service then uploads and
 * writes the manifest with no caller left; the checkpoint is visible (List,
 * restore, the coordinator's report) only once committed. *ret_ref (may be
 * NULL) gets step and generation, uri "" and committed_at_ms 0 (filled
 * in full when the attempt had already committed). Not promised: storage
 * refusing the uploads, or the service dying before every byte is
 * uploaded, aborts the attempt (logged by the service) instead. Errors as
 * stk_ckpt_commit until the commit is decided. */
int stk_ckpt_commit_detached(struct stk_client *c, const char *attempt, int64_t timeout_ms,
                             struct stk_ckpt_ref *ret_ref);

/* Aborts an open attempt (reason, may be NULL, is named in the writers'
 * error): its writers fail with STK_EABORTED, what it staged and uploaded
 * is freed and deleted. Returns once that is done; 0 also for an attempt
 * already aborted. Errors: STK_ENOENT (unknown to the service), STK_ESTATE
 * (committing or committed: delete the step instead). */
int stk_ckpt_abort(struct stk_client *c, const char *attempt, const char *reason,
                   int64_t timeout_ms);

/* ------------------------------------------------------------- restore */

/* A box to fetch and where its row-major bytes go (len = box elements x
 * dtype size of the stored tensor). */
struct stk_ckpt_want {
  const char *tensor;
  struct stk_ckpt_box box;
  void *dst;
  size_t len;
};

/* Fetches every wanted box of checkpoint (job, step) into its dst. Every
 * byte arrives CRC-checked by the service; the client checks that the
 * pieces cover each box exactly once. *ret_bytes (may be NULL): bytes
 * received. Errors: STK_ENOENT, STK_ECORRUPT (service or a piece outside
 * the boxes), STK_EINVAL. */
int stk_ckpt_read(struct stk_client *c, const char *job, int64_t step,
                  const struct stk_ckpt_want *wanted, size_t n_wanted, int64_t timeout_ms,
                  uint64_t *ret_bytes);

#endif
