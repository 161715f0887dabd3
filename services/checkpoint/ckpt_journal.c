/*
 * ckpt_journal: key construction and protobuf (un)packing of the service's
 * RocksDB records. Key layout in ckpt_journal.h.
 */
#include "ckpt_journal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stk_error.h"

static void jkey_fmt(struct ckpt_jkey *k, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void jkey_fmt(struct ckpt_jkey *k, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(k->b, sizeof(k->b), fmt, ap);
  va_end(ap);
  k->len = n < 0 ? 0 : ((size_t)n < sizeof(k->b) ? (size_t)n : sizeof(k->b) - 1);
}

void ckpt_jkey_attempt(struct ckpt_jkey *k, const char *attempt) {
  jkey_fmt(k, "A/%s", attempt);
}

void ckpt_jkey_attempt_prefix(struct ckpt_jkey *k, char kind, const char *attempt) {
  jkey_fmt(k, "%c/%s/", kind, attempt);
}

void ckpt_jkey_rank(struct ckpt_jkey *k, const char *attempt, uint32_t rank) {
  jkey_fmt(k, "R/%s/%08x", attempt, rank);
}

void ckpt_jkey_object(struct ckpt_jkey *k, const char *attempt, uint32_t rank, uint32_t index) {
  jkey_fmt(k, "O/%s/%08x/%08x", attempt, rank, index);
}

void ckpt_jkey_part(struct ckpt_jkey *k, const char *attempt, uint32_t rank, uint32_t index,
                    uint32_t part) {
  jkey_fmt(k, "P/%s/%08x/%08x/%08x", attempt, rank, index, part);
}

void ckpt_jkey_step(struct ckpt_jkey *k, char kind, const char *job, int64_t step) {
  jkey_fmt(k, "%c/%s/", kind, job);
  if (step >= 0 && k->len + 8 <= sizeof(k->b)) {
    kv_put_u64be((uint8_t *)k->b + k->len, (uint64_t)step);
    k->len += 8;
  }
}

int64_t ckpt_jkey_step_of(const void *key, size_t len) {
  return len < 8 ? -1 : (int64_t)kv_get_u64be((const uint8_t *)key + len - 8);
}

void ckpt_journal_batch_put(struct kv_batch *b, const struct ckpt_jkey *k,
                            const ProtobufCMessage *msg) {
  size_t n = protobuf_c_message_get_packed_size(msg);
  uint8_t small[512], *buf = n <= sizeof(small) ? small : malloc(n);
  if (!buf) return; /* kv_write then misses it; callers treat ENOMEM as fatal anyway. */
  protobuf_c_message_pack(msg, buf);
  kv_batch_put(b, k->b, k->len, buf, n);
  if (buf != small) free(buf);
}

int ckpt_journal_put(struct kv *kv, const struct ckpt_jkey *k, const ProtobufCMessage *msg,
                     bool sync) {
  size_t n = protobuf_c_message_get_packed_size(msg);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) return STK_ENOMEM;
  protobuf_c_message_pack(msg, buf);
  int err = kv_put(kv, k->b, k->len, buf, n, sync);
  free(buf);
  return err;
}

ProtobufCMessage *ckpt_journal_unpack(const ProtobufCMessageDescriptor *d, const void *v,
                                      size_t len) {
  return protobuf_c_message_unpack(d, NULL, len, v);
}

int ckpt_journal_get(struct kv *kv, const struct ckpt_jkey *k, const ProtobufCMessageDescriptor *d,
                     ProtobufCMessage **ret_msg) {
  void *v;
  size_t len;
  int err = kv_get(kv, NULL, k->b, k->len, &v, &len);
  if (err) return err;
  ProtobufCMessage *m = ckpt_journal_unpack(d, v, len);
  free(v);
  if (!m) {
    stk_set_detail("journal record %.*s is undecodable", (int)k->len, k->b);
    return STK_ECORRUPT;
  }
  *ret_msg = m;
  return 0;
}

/* Deletes every key starting with the prefix in k. */
static void drop_prefix(struct kv_batch *b, const struct ckpt_jkey *k) {
  struct ckpt_jkey end = *k;
  end.b[end.len - 1]++; /* The prefix ends in '/'; '0' is the next byte. */
  kv_batch_delete_range(b, k->b, k->len, end.b, end.len);
}

void ckpt_journal_drop_attempt(struct kv_batch *b, const char *attempt) {
  struct ckpt_jkey k;
  ckpt_jkey_attempt(&k, attempt);
  kv_batch_delete(b, k.b, k.len);
  static const char kinds[] = {'R', 'O', 'P'};
  for (size_t i = 0; i < sizeof(kinds); i++) {
    ckpt_jkey_attempt_prefix(&k, kinds[i], attempt);
    drop_prefix(b, &k);
  }
}
