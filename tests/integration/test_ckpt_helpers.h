/*
 * test_ckpt_helpers: what the checkpoint integration tests share on top of
 * harness.h: a small model (a float matrix, a byte matrix large enough for
 * multipart uploads, one blob per rank) whose every byte is a function of
 * its position, written by a rank over the Write stream and read back over
 * the Read stream at any world size, checked byte for byte; the calls
 * around it, a one-dimensional u8 chunk for hand-made streams, and the
 * shared-memory setup of the staging tests.
 */
#ifndef STK_TEST_CKPT_HELPERS_H
#define STK_TEST_CKPT_HELPERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "harness.h"
#include "stoker/v1/checkpoint.pb-c.h"

/* Setup and teardown (cmocka) of a test staging through shared memory:
 * tck_shm_root is a fresh directory (harness_shm_tmpdir_new: /dev/shm where
 * there is one), tck_shm_dir "ROOT/ckpt" in it for the daemon's --shm-dir
 * (the daemon creates it); the teardown removes the root. */
extern char tck_shm_root[256], tck_shm_dir[300];
int tck_shm_setup(void **state);
int tck_shm_teardown(void **state);

/* Sentinel answer of tck_read_rank when the bytes differ. */
#define TCK_MISMATCH (-1000)

/* A unary Checkpoint method ("Begin") with a 30 s deadline; returns the
 * gRPC status code as harness_call does. */
int tck_call(struct rpc_client *rc, const char *method, const ProtobufCMessage *req,
             const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **ret_resp,
             char *ret_msg, size_t msg_len);

/* Begin; ret_attempt (64 bytes) gets the attempt id on RPC_OK. */
int tck_begin(struct rpc_client *rc, const char *job, int64_t step, uint32_t world,
              char *ret_attempt);
/* Commit; the committed step in *ret_step (may be NULL) on RPC_OK. */
int tck_commit(struct rpc_client *rc, const char *attempt, int64_t *ret_step, char *msg,
               size_t msg_len);

/* A one-dimensional u8 WriteChunk of rank in attempt in caller storage:
 * bytes [off, off + len) of a tensor of shape bytes, no data yet (set
 * ch.data, ch.shm_name, ch.last as needed; off and len may be changed in
 * place, the box points at them). Not to be copied once set. */
struct tck_chunk {
  Stoker__V1__WriteChunk ch;
  Stoker__V1__Box box;
  uint64_t shape, off, len;
};
void tck_chunk_u8(struct tck_chunk *c, const char *attempt, uint32_t rank, const char *tensor,
                  uint64_t shape, uint64_t off, uint64_t len);

/* Ends a Write stream: the chunk marked "last" (and wait_durable) of rank,
 * then the call's status code; msg (may be NULL) gets its message. */
int tck_write_finish(struct rpc_client_cstream *s, const char *attempt, uint32_t rank,
                     bool wait_durable, char *msg, size_t msg_len);

/* Writes rank's share of the model (world ranks) in chunks of at most
 * 1 MiB, then "last". Returns the Write call's status code. */
int tck_write_rank(struct rpc_client *rc, const char *attempt, uint32_t rank, uint32_t world,
                   bool wait_durable, char *msg, size_t msg_len);

/* Writes every rank of world from its own thread and rpc client. Returns
 * RPC_OK or the first failing status. */
int tck_write_all(const char *addr, const char *attempt, uint32_t world);

/* Begin of job's step at world ranks, tck_write_all and Commit, each
 * asserted (cmocka) to answer RPC_OK. */
void tck_save_ok(struct rpc_client *rc, const char *addr, const char *job, int64_t step,
                 uint32_t world);

/* What a Read asks for, and so the form every message must have. */
enum tck_form {
  TCK_ONE_PER_MESSAGE, /* Neither field (a client from before them): a piece a message. */
  TCK_PACK_PIECES,     /* pack_pieces: pieces listed, fields 1-5 of the message empty. */
  TCK_PACK_DATA,       /* And pack_data: their bytes in packed_data, none in a piece's data. */
  TCK_PACK_DATA_ALONE, /* pack_data without pack_pieces (refused). */
  TCK_PACK_DATA_SHM,   /* pack_pieces, pack_data and a read file's name (refused). */
};

/* Reads rank's share at world (rows split evenly, every old rank's blob)
 * and compares every byte: RPC_OK, the stream's status, or TCK_MISMATCH.
 * Asks for neither pack_pieces nor pack_data (TCK_ONE_PER_MESSAGE). */
int tck_read_rank(struct rpc_client *rc, const char *job, int64_t step, uint32_t rank,
                  uint32_t world, uint32_t write_world, char *msg, size_t msg_len);
/* The same asking for form; every message's form is checked too. */
int tck_read_rank_form(struct rpc_client *rc, const char *job, int64_t step, uint32_t rank,
                       uint32_t world, uint32_t write_world, enum tck_form form, char *msg,
                       size_t msg_len);

/* One Read of the first `rows` rows (at most 64) of the model's float
 * matrix, each row a wanted box of its own (4 KiB), the request asking for
 * form; every byte and every message's form is checked. RPC_OK, the
 * stream's status or TCK_MISMATCH; the messages and pieces received. */
int tck_read_rows(struct rpc_client *rc, const char *job, int64_t step, uint32_t rows,
                  enum tck_form form, uint64_t *ret_messages, uint64_t *ret_pieces);

/* The model's ranks were written at write_world: every rank of world reads. */
int tck_read_all(struct rpc_client *rc, const char *job, int64_t step, uint32_t world,
                 uint32_t write_world);

/* Steps of List(job) into ret_steps (at most max); -1 when the call fails. */
int tck_list(struct rpc_client *rc, const char *job, int64_t *ret_steps, size_t max);

#endif
