/*
 * Decoding a received message with one copy of its bulk bytes instead of
 * two. gRPC hands us a message as a chain of slices; protobuf-c wants it
 * contiguous and then copies every bytes field again. Token batches and
 * tensor chunks are megabytes, so the top-level bytes fields of 64 KiB and
 * more are copied straight from the slices into their own malloc'd buffer
 * (which protobuf-c's default allocator frees like any field it unpacked),
 * and only the small rest of the message goes through protobuf-c. The
 * result is the message protobuf_c_message_unpack would have returned.
 */
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>
#include <stdlib.h>
#include <string.h>

#include "rpc_internal.h"
#include "utf8.h"

#define BULK_MIN_BYTES (64u << 10)
#define MAX_BULK       4

/* A forward-only reader over the slices of a byte buffer. */
struct cursor {
  grpc_byte_buffer_reader reader;
  grpc_slice *slice; /* Current slice (peeked: not owned), or NULL at the end. */
  const uint8_t *p;
  size_t left;  /* Bytes left in the current slice. */
  size_t total; /* Bytes left in the message. */
};

static bool cursor_fill(struct cursor *c) {
  while (c->left == 0) {
    if (!grpc_byte_buffer_reader_peek(&c->reader, &c->slice)) return false;
    c->p = GRPC_SLICE_START_PTR(*c->slice);
    c->left = GRPC_SLICE_LENGTH(*c->slice);
  }
  return true;
}

/* Copies n bytes to out (NULL: skips them); false if the message ends first. */
static bool cursor_take(struct cursor *c, uint8_t *out, size_t n) {
  while (n > 0) {
    if (!cursor_fill(c)) return false;
    size_t k = n < c->left ? n : c->left;
    if (out) {
      memcpy(out, c->p, k);
      out += k;
    }
    c->p += k;
    c->left -= k;
    c->total -= k;
    n -= k;
  }
  return true;
}

/* A varint; its raw bytes (for copying it into the head) in raw. */
static bool cursor_varint(struct cursor *c, uint64_t *ret, uint8_t raw[10], size_t *ret_raw_len) {
  uint64_t v = 0;
  for (size_t i = 0; i < 10; i++) {
    if (!cursor_fill(c)) return false;
    uint8_t b = *c->p++;
    c->left--;
    c->total--;
    raw[i] = b;
    v |= (uint64_t)(b & 0x7f) << (7 * i);
    if (!(b & 0x80)) {
      *ret = v;
      *ret_raw_len = i + 1;
      return true;
    }
  }
  return false;
}

/* The small part of the message, re-assembled contiguously. */
struct head {
  uint8_t *b;
  size_t len, cap;
};

static uint8_t *head_grow(struct head *h, size_t n) {
  if (h->len + n > h->cap) {
    size_t cap = h->cap ? h->cap : 256;
    while (cap < h->len + n) cap *= 2;
    uint8_t *b = realloc(h->b, cap);
    if (!b) return NULL;
    h->b = b;
    h->cap = cap;
  }
  uint8_t *at = h->b + h->len;
  h->len += n;
  return at;
}

struct bulk {
  const ProtobufCFieldDescriptor *field;
  uint8_t *data;
  size_t len;
};

/* The field's descriptor when it is a plain (not repeated, not oneof)
 * bytes field, which may be taken out of the head. */
static const ProtobufCFieldDescriptor *bulk_field(const ProtobufCMessageDescriptor *desc,
                                                  uint64_t number) {
  if (number == 0 || number > UINT32_MAX) return NULL;
  const ProtobufCFieldDescriptor *f =
      protobuf_c_message_descriptor_get_field(desc, (unsigned)number);
  if (!f || f->type != PROTOBUF_C_TYPE_BYTES || f->label == PROTOBUF_C_LABEL_REPEATED ||
      (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
    return NULL;
  return f;
}

static void bulk_drop(struct bulk *bulks, size_t n, const ProtobufCFieldDescriptor *f) {
  for (size_t i = 0; i < n; i++) {
    if (bulks[i].field == f) {
      free(bulks[i].data);
      bulks[i] = (struct bulk){0};
    }
  }
}

static struct bulk *bulk_slot(struct bulk *bulks, size_t *n, const ProtobufCFieldDescriptor *f) {
  for (size_t i = 0; i < *n; i++) {
    if (bulks[i].field == f) { /* Repeated occurrence: the last one wins. */
      free(bulks[i].data);
      bulks[i].data = NULL;
      return &bulks[i];
    }
  }
  if (*n == MAX_BULK) return NULL;
  bulks[*n] = (struct bulk){.field = f};
  return &bulks[(*n)++];
}

/* Splits the message into head and bulk fields; false if malformed. */
static bool split(struct cursor *c, const ProtobufCMessageDescriptor *desc, struct head *h,
                  struct bulk *bulks, size_t *n_bulks) {
  uint8_t raw[10];
  size_t raw_len;
  uint64_t tag;
  while (cursor_fill(c)) {
    if (!cursor_varint(c, &tag, raw, &raw_len)) return false;
    unsigned wire = (unsigned)(tag & 7);
    uint64_t len = 0;
    uint8_t len_raw[10];
    size_t len_raw_len = 0;
    switch (wire) {
    case 0:
      len = 0;
      break; /* The varint value is copied below. */
    case 1:
      len = 8;
      break;
    case 5:
      len = 4;
      break;
    case 2:
      if (!cursor_varint(c, &len, len_raw, &len_raw_len)) return false;
      break;
    default:
      return false; /* Groups are not proto3. */
    }
    if (len > c->total) return false; /* Checked before anything is allocated. */
    const ProtobufCFieldDescriptor *f = wire == 2 ? bulk_field(desc, tag >> 3) : NULL;
    if (f && len < BULK_MIN_BYTES) bulk_drop(bulks, *n_bulks, f); /* This later value wins. */
    struct bulk *slot = f && len >= BULK_MIN_BYTES ? bulk_slot(bulks, n_bulks, f) : NULL;
    if (slot) {
      slot->data = malloc(len);
      slot->len = len;
      if (!slot->data || !cursor_take(c, slot->data, len)) return false;
      continue;
    }
    uint8_t *at = head_grow(h, raw_len + len_raw_len);
    if (!at) return false;
    memcpy(at, raw, raw_len);
    memcpy(at + raw_len, len_raw, len_raw_len);
    if (wire == 0) {
      uint64_t v;
      if (!cursor_varint(c, &v, raw, &raw_len) || !(at = head_grow(h, raw_len))) return false;
      memcpy(at, raw, raw_len);
    } else if (len > 0) {
      if (!(at = head_grow(h, len)) || !cursor_take(c, at, len)) return false;
    }
  }
  return true;
}

/* ---- Strings with a NUL byte, or not UTF-8 ----
 * protobuf-c gives a string field to C as a NUL-terminated copy, so a
 * string with a NUL inside reaches handlers cut short ("a\0/../x" would be
 * job "a"). Such strings are refused here, once for every service, by
 * reading the wire bytes of the message (the head: bulk fields are bytes,
 * never strings) and every nested message, repeated field and map entry.
 * A request's strings must also be UTF-8, as proto3 says and as every
 * other protobuf runtime checks at parse (protobuf-c does not): a string
 * that is not would be stored and answered back (a job's reason, an
 * event, a tensor name in a manifest), and the Python clients, which
 * refuse such a message, could then read no listing that holds it. */

#define MAX_DEPTH 32

static bool wire_varint(const uint8_t **p, const uint8_t *end, uint64_t *ret) {
  uint64_t v = 0;
  for (unsigned i = 0; i < 10 && *p < end; i++) {
    uint8_t b = *(*p)++;
    v |= (uint64_t)(b & 0x7f) << (7 * i);
    if (!(b & 0x80)) {
      *ret = v;
      return true;
    }
  }
  return false;
}

/* False, with why naming the field, if a string holds a NUL or (utf8) is
 * not UTF-8 (or the bytes are malformed: protobuf-c refuses those too). */
static bool strings_ok(const uint8_t *p, size_t len, const ProtobufCMessageDescriptor *desc,
                       bool utf8, int depth, char *why, size_t why_len) {
  const uint8_t *end = p + len;
  while (p < end) {
    uint64_t tag, n = 0;
    if (!wire_varint(&p, end, &tag)) return false;
    switch (tag & 7) {
    case 0:
      if (!wire_varint(&p, end, &n)) return false;
      continue;
    case 1:
      n = 8;
      break;
    case 5:
      n = 4;
      break;
    case 2:
      if (!wire_varint(&p, end, &n)) return false;
      break;
    default:
      return false;
    }
    if (n > (uint64_t)(end - p)) return false;
    const ProtobufCFieldDescriptor *f =
        (tag & 7) == 2 && tag >> 3 <= UINT32_MAX
            ? protobuf_c_message_descriptor_get_field(desc, (unsigned)(tag >> 3))
            : NULL;
    if (f && f->type == PROTOBUF_C_TYPE_STRING && memchr(p, 0, n)) {
      if (why) snprintf(why, why_len, "string field %s.%s holds a NUL byte", desc->name, f->name);
      return false;
    }
    if (utf8 && f && f->type == PROTOBUF_C_TYPE_STRING && !utf8_valid(p, n)) {
      if (why) snprintf(why, why_len, "string field %s.%s is not UTF-8", desc->name, f->name);
      return false;
    }
    if (f && f->type == PROTOBUF_C_TYPE_MESSAGE &&
        (depth >= MAX_DEPTH || !strings_ok(p, n, f->descriptor, utf8, depth + 1, why, why_len)))
      return false;
    p += n;
  }
  return true;
}

static void attach(ProtobufCMessage *msg, struct bulk *b) {
  if (!b->field) return; /* Dropped: a later small value won. */
  ProtobufCBinaryData *d = (ProtobufCBinaryData *)((char *)msg + b->field->offset);
  const ProtobufCBinaryData *dflt = b->field->default_value;
  if (d->data && (!dflt || d->data != dflt->data)) free(d->data); /* An earlier, smaller value. */
  d->data = b->data;
  d->len = b->len;
  if (b->field->quantifier_offset)
    *(protobuf_c_boolean *)((char *)msg + b->field->quantifier_offset) = 1;
  b->data = NULL;
}

static ProtobufCMessage *unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                                bool utf8, char *why, size_t why_len);

ProtobufCMessage *rpc_unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                             char *why, size_t why_len) {
  return unpack(bb, desc, false, why, why_len);
}

ProtobufCMessage *rpc_unpack_request(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                                     char *why, size_t why_len) {
  return unpack(bb, desc, true, why, why_len);
}

static ProtobufCMessage *unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                                bool utf8, char *why, size_t why_len) {
  if (why && why_len) why[0] = 0;
  struct cursor c = {0};
  if (!bb || !grpc_byte_buffer_reader_init(&c.reader, bb)) return NULL;
  c.total = grpc_byte_buffer_length(bb);
  struct head h = {0};
  struct bulk bulks[MAX_BULK];
  size_t n_bulks = 0;
  ProtobufCMessage *msg = NULL;
  if (split(&c, desc, &h, bulks, &n_bulks) && strings_ok(h.b, h.len, desc, utf8, 0, why, why_len)) {
    msg = protobuf_c_message_unpack(desc, NULL, h.len, h.b ? h.b : (const uint8_t *)"");
    for (size_t i = 0; msg && i < n_bulks; i++) attach(msg, &bulks[i]);
  }
  for (size_t i = 0; i < n_bulks; i++) free(bulks[i].data);
  free(h.b);
  grpc_byte_buffer_reader_destroy(&c.reader);
  return msg;
}
