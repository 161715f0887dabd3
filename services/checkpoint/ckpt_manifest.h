/*
 * ckpt_manifest: the record that makes a checkpoint exist. It lists every
 * object (name relative to the attempt directory, size, CRC32C per 1 MiB
 * block) and every chunk (tensor, dtype, global shape, box, where its bytes
 * are). On storage it is a stoker.v1.Manifest protobuf (manifest.pb); for
 * humans it renders as JSON (`stokerctl checkpoint show`).
 *
 * A manifest read from storage is hostile until proven otherwise: parse
 * bounds the input, then checks every name, count, size and offset against
 * the shapes and object sizes (integer overflow included) and the coverage of
 * every tensor before the result is handed out. The service runs the same
 * check before it writes a manifest (commit).
 *
 * The struct is public for reading; change it only through the functions
 * below. Not thread-safe; a finished manifest may be read from many threads.
 */
#ifndef STK_CKPT_MANIFEST_H
#define STK_CKPT_MANIFEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt_box.h"
#include "ckpt_plan.h"

#define CKPT_MANIFEST_FORMAT      1
#define CKPT_MANIFEST_MAX_BYTES   ((size_t)256 << 20)
#define CKPT_MANIFEST_MAX_CHUNKS  ((size_t)1 << 20)
#define CKPT_MANIFEST_MAX_OBJECTS ((size_t)1 << 20)
#define CKPT_MANIFEST_MAX_WORLD   (UINT32_C(1) << 20)

struct ckpt_object {
  char *key;           /* Relative to the attempt directory (ckpt_names). */
  uint64_t size_bytes; /* Object size. */
  uint32_t *block_crc32c;
  size_t n_blocks; /* == ckpt_crc_block_count(size_bytes). */
};

struct ckpt_chunk {
  char *tensor;
  int dtype; /* Stoker__V1__DType value. */
  struct ckpt_shape shape;
  struct ckpt_box box;
  uint32_t object;        /* Index into objects. */
  uint64_t object_offset; /* Where the box's row-major bytes start. */
  uint64_t length;        /* Box elements x dtype size. */
};

struct ckpt_manifest {
  char *job;
  int64_t step;
  uint32_t world;
  char *attempt;
  int64_t created_at_ms;
  struct ckpt_object *objects;
  size_t n_objects;
  struct ckpt_chunk *chunks;
  size_t n_chunks;
  size_t cap_objects, cap_chunks; /* Private. */
  size_t *by_tensor; /* Private: chunk indices by tensor name (ckpt_manifest_index), or NULL. */
};

/* A new, empty manifest; the names are checked and copied. 0, STK_EINVAL,
 * STK_ENOMEM. */
int ckpt_manifest_new(const char *job, int64_t step, uint32_t world, const char *attempt,
                      struct ckpt_manifest **ret_manifest);
void ckpt_manifest_free(struct ckpt_manifest *m);

/* Adds an object with its block CRCs (copied; n_crcs must match its size).
 * ret_index (may be NULL) gets its index. STK_EINVAL for a bad name or a
 * wrong CRC count (duplicate names are found by ckpt_manifest_check). */
int ckpt_manifest_add_object(struct ckpt_manifest *m, const char *key, uint64_t size_bytes,
                             const uint32_t *crcs, size_t n_crcs, uint32_t *ret_index);

/* Adds a chunk; its length follows from box and dtype. Checks the tensor
 * name, dtype, shape, box and that the bytes lie inside the object (not the
 * cross-chunk rules: ckpt_manifest_check does those). */
int ckpt_manifest_add_chunk(struct ckpt_manifest *m, const char *tensor, int dtype,
                            const struct ckpt_shape *shape, const struct ckpt_box *box,
                            uint32_t object, uint64_t object_offset);

/* Checks one chunk (index i, for the detail) against its shape, dtype and
 * object: length == box elements x dtype size, bytes inside the object. */
int ckpt_manifest_check_chunk(const struct ckpt_manifest *m, const struct ckpt_chunk *c, size_t i);

/* The whole-manifest check: names, every chunk against its shape and object,
 * consistent dtype and shape per tensor, no two chunks sharing object bytes,
 * every tensor covered exactly once. 0 or STK_EINVAL/STK_ECORRUPT with detail;
 * STK_ENOMEM. */
int ckpt_manifest_check(const struct ckpt_manifest *m);

/* Serializes (after ckpt_manifest_check) to protobuf; free() the buffer. */
int ckpt_manifest_pack(const struct ckpt_manifest *m, uint8_t **ret_buf, size_t *ret_len);

/* Decodes and fully checks a manifest. STK_ETOOBIG over
 * CKPT_MANIFEST_MAX_BYTES, STK_ECORRUPT for undecodable or invalid content
 * (detail says what), STK_ENOTSUP for a newer format, STK_ENOMEM. */
int ckpt_manifest_parse(const uint8_t *buf, size_t len, struct ckpt_manifest **ret_manifest);

/* Indexes the chunks by tensor name, so that ckpt_manifest_tensor finds a
 * tensor's chunks by binary search instead of a pass over every chunk (a
 * restore looks up every tensor it wants: a pass each was quadratic in the
 * tensors of a state dict). Adding a chunk drops the index. 0 or STK_ENOMEM
 * (the manifest is unchanged, lookups stay linear). */
int ckpt_manifest_index(struct ckpt_manifest *m);

/* The chunks of one tensor in the planner's form (free() the array), in
 * their order in the manifest, with the tensor's dtype and shape.
 * STK_ENOENT if the tensor is not there. */
int ckpt_manifest_tensor(const struct ckpt_manifest *m, const char *tensor,
                         struct ckpt_stored_chunk **ret_chunks, size_t *ret_count, int *ret_dtype,
                         struct ckpt_shape *ret_shape);

/* JSON for humans and tools: job, step, world, attempt, totals, tensors with
 * their chunks, objects (with hex CRCs if with_crcs). free() the string. */
int ckpt_manifest_to_json(const struct ckpt_manifest *m, bool with_crcs, char **ret_json);

#endif
