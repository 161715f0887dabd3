/*
 * ckpt_journal: the checkpoint service's records in RocksDB, so that a
 * restarted service knows every attempt it had begun, every multipart upload
 * it had opened (to resume or abort it), every part it had uploaded, and
 * every checkpoint it had committed. All writes that precede an
 * acknowledgement are synced.
 *
 * Keys (attempt ids are [A-Za-z0-9-], jobs have no '/'; numbers are 8 hex
 * digits so that keys sort numerically, steps big-endian u64):
 *   A/<attempt>                              JournalAttempt  (open attempt)
 *   R/<attempt>/<rank>                       JournalRank     (rank finished)
 *   O/<attempt>/<rank>/<index>               JournalObject
 *   P/<attempt>/<rank>/<index>/<part>        JournalPart
 *   C/<job>/<step u64be>                     JournalAttempt  (committed)
 *   D/<job>/<step u64be>                     JournalAttempt  (being deleted)
 *
 * Blocking: call from worker threads (or at open).
 */
#ifndef STK_CKPT_JOURNAL_H
#define STK_CKPT_JOURNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv.h"
#include "stoker/v1/checkpoint.pb-c.h"

#define CKPT_JKEY_MAX 256

struct ckpt_jkey {
  size_t len;
  char b[CKPT_JKEY_MAX];
};

void ckpt_jkey_attempt(struct ckpt_jkey *k, const char *attempt);
/* "X/<attempt>/" for X in R, O, P: the prefix of an attempt's records. */
void ckpt_jkey_attempt_prefix(struct ckpt_jkey *k, char kind, const char *attempt);
void ckpt_jkey_rank(struct ckpt_jkey *k, const char *attempt, uint32_t rank);
void ckpt_jkey_object(struct ckpt_jkey *k, const char *attempt, uint32_t rank, uint32_t index);
void ckpt_jkey_part(struct ckpt_jkey *k, const char *attempt, uint32_t rank, uint32_t index,
                    uint32_t part);
/* kind 'C' (committed) or 'D' (deleting); step < 0 gives the job's prefix. */
void ckpt_jkey_step(struct ckpt_jkey *k, char kind, const char *job, int64_t step);
/* The step of a C/ or D/ key. */
int64_t ckpt_jkey_step_of(const void *key, size_t len);

/* Packs msg and writes it under k. */
int ckpt_journal_put(struct kv *kv, const struct ckpt_jkey *k, const ProtobufCMessage *msg,
                     bool sync);
void ckpt_journal_batch_put(struct kv_batch *b, const struct ckpt_jkey *k,
                            const ProtobufCMessage *msg);
/* Reads and unpacks the record under k (free with protobuf_c_message_free_unpacked).
 * STK_ENOENT when absent, STK_ECORRUPT when undecodable. */
int ckpt_journal_get(struct kv *kv, const struct ckpt_jkey *k, const ProtobufCMessageDescriptor *d,
                     ProtobufCMessage **ret_msg);
ProtobufCMessage *ckpt_journal_unpack(const ProtobufCMessageDescriptor *d, const void *v,
                                      size_t len);
/* Adds the deletion of every record of an attempt (A, R, O, P) to b. */
void ckpt_journal_drop_attempt(struct kv_batch *b, const char *attempt);

#endif
